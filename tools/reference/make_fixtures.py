"""Regenerates the parity fixtures in tests/fixtures/ with MMPose 1.3.2, HF transformers and xtcocotools.

Run it with the reference venv's interpreter (tools/reference/README.md), from anywhere:

    ~/.cache/mmpose-ref-venv/bin/python tools/reference/make_fixtures.py --cases-from tests/fixtures

`--cases-from DIR` keeps the cases (keypoint sets, boxes, model inputs, metric predictions) of an
existing fixture set and recomputes every reference output from them; without it, fresh cases are
drawn from fixed seeds (cases.py). `--full` writes the uncompacted arrays (every case of every
file, no rounding), which is the form to compare with another full set (compare_fixtures.py).
tests/fixtures/README.md describes every file; §2 names the function that makes each one.
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mmcompat  # noqa: E402, F401  (before any mm* import)
import torch  # noqa: E402
from common import DEFAULT_COCO_MINI, DEFAULT_OUT  # noqa: E402

STAGES = ("codecs", "geometry", "specs", "models", "train", "llrd", "metric")


def run_stage(name, args):
    """Imports and runs one stage; returns the names of the files it wrote."""
    if name == "codecs":
        import ref_codecs
        return ref_codecs.write(args.out, args.cases_from, compact=not args.full)
    if name == "geometry":
        import ref_geometry
        return ref_geometry.write(args.out, args.cases_from, args.coco_mini, compact=not args.full)
    if name == "specs":
        import ref_models
        return ref_models.write_specs(args.out)
    if name == "models":
        import ref_models
        return ref_models.write_models(args.out, args.cases_from, args.coco_mini, compact=not args.full)
    if name == "train":
        import ref_models
        return ref_models.write_train(args.out, args.cases_from, args.coco_mini, compact=not args.full)
    if name == "llrd":
        import ref_models
        return ref_models.write_llrd(args.out)
    if name == "metric":
        import ref_metric
        return ref_metric.write(args.out, args.cases_from, args.coco_mini)
    raise ValueError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default tests/fixtures)")
    parser.add_argument("--cases-from", type=Path, default=None,
                        help="reuse the cases of this fixture set (full or compact) instead of drawing new ones")
    parser.add_argument("--coco-mini", type=Path, default=DEFAULT_COCO_MINI, help="the coco-mini folder")
    parser.add_argument("--full", action="store_true", help="write every case uncompacted (for comparisons)")
    parser.add_argument("--only", nargs="+", choices=STAGES, default=None,
                        help="run only these stages (later stages read files of earlier ones from --out)")
    parser.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1), help="torch CPU threads")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or STAGES:
        start = time.perf_counter()
        written = run_stage(name, args)
        print(f"{name:9s} {time.perf_counter() - start:6.1f} s  {' '.join(written)}", flush=True)


if __name__ == "__main__":
    main()
