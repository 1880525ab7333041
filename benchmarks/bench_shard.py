"""Images/s of `vitpose predict` in 1 process, `--nproc-per-node N` and `--engine ray --workers N` (issue 29).

    python benchmarks/bench_shard.py --images 96 --procs 2 [--model vitpose-s] [--skip-ray]

A folder of random 320x240 images, random ViTPose weights of `--model` size saved with
`vitpose.save_weights` (the speed does not depend on the values), full-frame boxes, fp32, flip test:
each configuration is run as a fresh command (`python -m vitpose predict ...`), timed from start to
exit (so the model load and, for Ray, the cluster start are included: what a user waits for), and
its merged records are checked to equal the single process's. Prints one table row per
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=96)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--model", default="vitpose-s")
    p.add_argument("--skip-ray", action="store_true")
    args = p.parse_args()

    import vitpose

    work = Path(tempfile.mkdtemp(prefix="bench-shard-"))
    rng = np.random.default_rng(0)
    (work / "images").mkdir()
    for i in range(args.images):
        cv2.imwrite(str(work / "images" / f"img_{i:05d}.jpg"), rng.integers(0, 256, (240, 320, 3), dtype=np.uint8))
    vitpose.save_weights(vitpose.build_model(args.model), work / "model.safetensors")
    env = dict(os.environ, PYTHONPATH=str(REPO), TQDM_DISABLE="1")
    env.pop("OMP_NUM_THREADS", None)  # each configuration splits the CPUs its own way (spawn_shards: CPUs / N)
    threads = max(1, (os.cpu_count() or 1))
    common = [sys.executable, "-m", "vitpose", "predict", str(work / "images"), "--model", str(work / "model.safetensors"),
              "--detector", "full-frame", "--device", "cpu", "--precision", "fp32"]
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} CPUs; {args.images} images; {args.model}")
    rows = []
    seconds = run([*common, "--json", str(work / "one.jsonl")], dict(env, OMP_NUM_THREADS=str(threads)))
    rows.append(("1 process", seconds))
    reference = keypoints(work / "one.jsonl")
    runs = [(f"--nproc-per-node {args.procs}", ["--nproc-per-node", str(args.procs), "--json", str(work / "procs")],
             work / "procs")]
    if not args.skip_ray:
        runs.append((f"--engine ray --workers {args.procs}",
                     ["--engine", "ray", "--workers", str(args.procs), "--json", str(work / "ray")], work / "ray"))
    for name, extra, folder in runs:
        seconds = run([*common, *extra], env)
        run([sys.executable, "-m", "vitpose", "merge", str(folder), "--json", str(folder / "merged.out")], env)
        merged = keypoints(folder / "merged.out")
        assert merged.shape == reference.shape, (name, merged.shape, reference.shape)
        rows.append((name, seconds, float(np.abs(merged - reference).max())))
    print("| run | seconds | images/s | max keypoint difference to 1 process (px) |")
    print("|---|---|---|---|")
    for row in rows:
        diff = f"{row[2]:.2g}" if len(row) > 2 else "-"
        print(f"| {row[0]} | {row[1]:.1f} | {args.images / row[1]:.2f} | {diff} |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
