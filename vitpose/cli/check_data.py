"""Check a config's data before training: `vitpose check-data --config CFG [--all]`.

Builds the skeleton (`data.dataset_info`), the training and validation sets exactly as
`vitpose train` does (`vitpose.builders`), and runs the checks of vitpose/data/check.py on them: K of the file =
K of the model = K of the skeleton, the flip table, the images (a sample, or `--all`), per-joint
label counts, instances with no visible keypoint, box sizes, and whether the training targets
would be all zero. Prints one table; exit status 0 when there is no error, 1 when a check failed,
2 when the config or a file could not be read at all.

`vitpose.engine.preflight.preflight(cfg, train_set)` is the fast subset `vitpose train` runs
before its first step (no validation set, 16 training images).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitpose.builders import build_train_set, build_val_set, dataset_info_path
from vitpose.config import load_config
from vitpose.data import check as C
from vitpose.data.metainfo import dataset_info
from vitpose.engine.preflight import check_datasets, preflight  # noqa: F401 (preflight: the fast subset)
from vitpose.errors import UserError


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("check-data", help="check a config's skeleton, annotation files and images",
                              shared=("--config", "--set", "--debug"),
                              description="Check a config's skeleton, annotation files and images before "
                                          "training; exit status 1 when a check fails.")
    p.add_argument("--config", required=True, metavar="FILE|NAME", help="run config: a YAML file or a shipped config's name (as for vitpose train)")
    p.add_argument("--all", action="store_true", help="decode every image (default: a spread-out sample)")
    p.add_argument("--data-root", default=None, help="dataset root (default: data.root of the config)")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    cfg = load_config(args.config, args.overrides)
    root = Path(args.data_root or cfg.data.root)
    check_synthetic_set_written(cfg, root, args.config)
    # Not build_dataset_info: a model K that differs from the skeleton's is a row of the table.
    info = dataset_info(dataset_info_path(cfg, root))
    sets = {}
    report = C.CheckReport()
    for name, build in (("train", build_train_set), ("val", build_val_set)):
        try:
            sets[name] = build(cfg, root, info=info)
        except UserError as e:  # a bad file is a finding, not a crash (a bug is neither: it propagates)
            report.add(C.Finding(f"{name} set", C.ERROR, str(e)))
    checked = check_datasets(info, cfg.model.num_keypoints, sets.get("train"), sets.get("val"),
                             images="all" if args.all else "sample")
    report.add(*checked.findings)
    report.blocks += checked.blocks
    print(report.format(), end="")
    return 1 if report.errors else 0


def check_synthetic_set_written(cfg, root: Path, config) -> None:
    """A config of a synthetic set (the demos) has nothing to check until `vitpose train` wrote the
    set: say so in one line (UserError) instead of a table of missing annotation files."""
    if cfg.data.synthetic_train_images <= 0:
        return
    missing = [root / name for name in (cfg.data.train_ann, cfg.data.val_ann) if not (root / name).is_file()]
    if missing:
        raise UserError(f"--config {config}: its data is a synthetic set that `vitpose train --config {config}` "
                        f"writes to {root} before training, and it is not written yet ({missing[0]} not found): "
                        f"run that first, or check your own data (--data-root DIR with "
                        f"--set data.synthetic_train_images=0)")
