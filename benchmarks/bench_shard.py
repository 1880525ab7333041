"""Images/s of `vitpose predict` in 1 process, `--nproc-per-node N` and `--engine ray --workers N`.

    python benchmarks/bench_shard.py --images 96 --procs 2 --rounds 3 [--model vitpose-s] [--skip-ray]

A folder of random 320x240 images, random ViTPose weights of `--model` size saved with
`vitpose.save_weights` (the speed does not depend on the values), full-frame boxes, fp32, flip test:
each configuration is run as a fresh command (`python -m vitpose predict ...`), timed from start to
exit (so the model load and, for Ray, the cluster start are included: what a user waits for), and
its merged records are checked to equal the single process's. The configurations alternate in
`--rounds` rounds (the order reversed every other round, benchmarks/rounds.py), and each one's speed-up
is its time over the single process's in the same round, median [min-max]. Prints one table row per
configuration and the load average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import rounds  # noqa: E402  (benchmarks/rounds.py)


def run(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}")
    return seconds


def keypoints(path: Path) -> np.ndarray:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return np.asarray([r["keypoints"] for r in rows], np.float64)


def scratch_images_and_weights(prefix: str, count: int, model: str = "vitpose-s", suffix: str = ".jpg") -> Path:
    """A new scratch folder with `images/` (`count` random 320x240 images) and `model.safetensors`
    (random weights of `model`: the speed and the comparisons do not depend on the values)."""
    import vitpose

    work = Path(tempfile.mkdtemp(prefix=prefix))
    rng = np.random.default_rng(0)
    (work / "images").mkdir()
    for i in range(count):
        cv2.imwrite(str(work / "images" / f"img_{i:05d}{suffix}"), rng.integers(0, 256, (240, 320, 3), dtype=np.uint8))
    vitpose.save_weights(vitpose.build_model(model), work / "model.safetensors")
    return work


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=96)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--model", default="vitpose-s")
    p.add_argument("--skip-ray", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    work = scratch_images_and_weights("bench-shard-", args.images, args.model)
    env = dict(os.environ, PYTHONPATH=str(REPO), TQDM_DISABLE="1")
    env.pop("OMP_NUM_THREADS", None)  # each configuration splits the CPUs its own way (spawn_shards: CPUs / N)
    threads = max(1, (os.cpu_count() or 1))
    common = [sys.executable, "-m", "vitpose", "predict", str(work / "images"), "--model", str(work / "model.safetensors"),
              "--detector", "full-frame", "--device", "cpu", "--precision", "fp32"]
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} CPUs; {args.images} images; {args.model}")
    configurations = {"1 process": ([], dict(env, OMP_NUM_THREADS=str(threads))),
                      f"--nproc-per-node {args.procs}": (["--nproc-per-node", str(args.procs)], env)}
    if not args.skip_ray:
        configurations[f"--engine ray --workers {args.procs}"] = (["--engine", "ray", "--workers", str(args.procs)], env)
    calls, differences, reference = [0], {name: 0.0 for name in configurations}, []

    def contestant(name: str):
        extra, run_env = configurations[name]

        def call() -> float:
            calls[0] += 1
            out = work / f"run{calls[0]}"  # a fresh output each call: nothing is resumed
            if name == "1 process":
                seconds = run([*common, *extra, "--json", str(out.with_suffix(".jsonl"))], run_env)
                found = keypoints(out.with_suffix(".jsonl"))
            else:
                seconds = run([*common, *extra, "--json", str(out)], run_env)
                run([sys.executable, "-m", "vitpose", "merge", str(out), "--json", str(out / "merged.out")], env)
                found = keypoints(out / "merged.out")
            if not reference:
                reference.append(found)
            assert found.shape == reference[0].shape, (name, found.shape, reference[0].shape)
            differences[name] = max(differences[name], float(np.abs(found - reference[0]).max()))
            return seconds
        return call

    seconds = rounds.alternate({name: contestant(name) for name in configurations}, args.rounds, report=print)
    print("| run | seconds per run | images/s | speed-up over 1 process per round | max keypoint difference (px) |")
    print("|---|---|---|---|---|")
    for name in configurations:
        speedups = [1.0 / r for r in rounds.ratios(seconds, name, "1 process")]
        print(f"| {name} | {rounds.spread(seconds[name])} | {rounds.spread([args.images / t for t in seconds[name]])} | "
              f"{rounds.spread(speedups) if name != '1 process' else '1'} | {differences[name]:.2g} |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
