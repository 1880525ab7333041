"""Peak host memory across train -> val -> train: one worker pool vs the usual two loaders.

    python benchmarks/bench_memory.py [--quick] [--workers 4] [--ballast-mib 200] [--images 96]

Why: a run died at its first validation because its 32 persistent training workers stayed
alive while the validation DataLoader started 32 more. Two setups run the same three phases
(training epoch 0, validation, training epoch 1) with the same worker count, each in a fresh
Python process so that neither inherits the other's memory:

  one pool     vitpose.data.build_loaders: training and validation batches from one persistent
               pool of `--workers` processes;
  two loaders  a persistent training DataLoader plus a separate validation DataLoader (the usual
               PyTorch/MMEngine arrangement), `--workers` each.

Memory is the total PSS (proportional set size: shared pages split among their users) of the
benchmark process and all its children, read with psutil after every batch. The training steady
state is the median over the second half of epoch 0; the figure to quote is peak / steady.
Goal: <= 1.1x for one pool, where two loaders roughly double the workers' share.

Data: a synthetic COCO set (vitpose.data.synthetic.make_coco, 640x480 JPEGs) read by
CocoKeypoints (training: full augmentation; validation: GT boxes). A real COCO worker holds far
more private memory than a synthetic one (decode buffers, pages of the 150k-record index
dirtied by reference counting, allocator slack: 150-400 MiB each is typical), so each worker
allocates and touches `--ballast-mib` of private memory at its first sample, as a stand-in.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SETUPS = ("one-pool", "two-loaders")


# ----------------------------------------------------------------------------------------------
# Child process: one setup, three phases, PSS after every batch


class Ballast:
    """Wraps a `ds[(index, epoch)]` dataset; each worker holds `mib` MiB of private memory."""

    def __init__(self, dataset, mib):
        self.dataset, self.mib = dataset, mib

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        import numpy as np
        from torch.utils.data import get_worker_info

        global _BALLAST
        if get_worker_info() is not None and _BALLAST is None:
            _BALLAST = np.ones(self.mib * 2**20, dtype=np.uint8)  # ones: every page is written
        return self.dataset[key]


_BALLAST = None


class FixedEpoch:
    """Plain `ds[i]` view for the two-loader setup (epoch 0: the layout of memory is the point)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return self.dataset[(i, 0)]


def _init_worker(worker_id):
    import cv2
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(1)


def run_child(args) -> dict:
    import cv2
    import torch
    from torch.utils.data import DataLoader

    from vitpose.cli.tune import total_pss_bytes
    from vitpose.data.coco import CocoKeypoints

    torch.set_num_threads(1)
    cv2.setNumThreads(1)  # the two-loader workers call it after fork; keep the parent's pool empty
    root = Path(args.root)
    ann, img = root / "annotations/person_keypoints_train2017.json", root / "train2017"
    train_set = Ballast(CocoKeypoints(ann, img, train=True, encode_targets=True), args.ballast_mib)
    val_set = Ballast(CocoKeypoints(ann, img, train=False), args.ballast_mib)

    samples = []  # (phase, total PSS, main PSS)

    def record(phase):
        import psutil

        me = psutil.Process()
        main = me.memory_full_info().pss
        samples.append((phase, total_pss_bytes(me), main))

    def run_phase(phase, batches, limit=None):
        for i, _ in enumerate(batches):
            record(phase)
            if limit is not None and i + 1 >= limit:
                break

    record("start")
    if args.child == "one-pool":
        from vitpose.config import LoaderConfig
        from vitpose.data import build_loaders

        cfg = LoaderConfig(batch_size=args.batch_size, val_batch_size=args.batch_size,
                           num_workers=args.workers, pin_memory=False, prefetch_factor=2)
        loaders = build_loaders(train_set, val_set, cfg, available_ram=2**50)
        run_phase("train0", loaders.train(0), args.train_batches)
        run_phase("val", loaders.val())
        run_phase("train1", loaders.train(1), args.train_batches)
        loaders.close()
    else:
        common = {"batch_size": args.batch_size, "num_workers": args.workers, "prefetch_factor": 2,
                  "worker_init_fn": _init_worker}
        train_loader = DataLoader(FixedEpoch(train_set), shuffle=True, persistent_workers=True, **common)
        val_loader = DataLoader(FixedEpoch(val_set), shuffle=False, **common)
        run_phase("train0", train_loader, args.train_batches)
        run_phase("val", val_loader)
        run_phase("train1", train_loader, args.train_batches)
        del train_loader, val_loader
    return {"setup": args.child, "samples": samples}


# ----------------------------------------------------------------------------------------------
# Parent: data, both setups, report


def summarize(result: dict) -> dict:
    by_phase = {}
    for phase, total, main in result["samples"]:
        by_phase.setdefault(phase, []).append((total, main))
    train0 = [t for t, _ in by_phase["train0"]]
    steady = statistics.median(train0[len(train0) // 2:])
    everything = [s for phase in by_phase.values() for s in phase]
    peak = max(t for t, _ in everything)
    mib = 2**20
    return {
        "setup": result["setup"],
        "train_steady_mib": steady / mib,
        "val_peak_mib": max(t for t, _ in by_phase["val"]) / mib,
        "train1_peak_mib": max(t for t, _ in by_phase["train1"]) / mib,
        "peak_mib": peak / mib,
        "main_peak_mib": max(m for _, m in everything) / mib,
        "peak_over_steady": peak / steady,
        # The workers' share: total minus the main process, at the same instant.
        "workers_steady_mib": statistics.median(t - m for t, m in by_phase["train0"][len(train0) // 2:]) / mib,
        "workers_val_peak_mib": max(t - m for t, m in by_phase["val"]) / mib,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small set, small ballast (a minute)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--images", type=int, default=None, help="synthetic images (default 96, quick 24)")
    p.add_argument("--batch-size", type=int, default=None, help="default 16, quick 8")
    p.add_argument("--train-batches", type=int, default=None, help="per training phase (default 16, quick 6)")
    p.add_argument("--ballast-mib", type=int, default=None, help="private MiB per worker (default 200, quick 64)")
    p.add_argument("--child", choices=SETUPS, help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    args = p.parse_args()
    quick = args.quick
    args.images = args.images or (24 if quick else 96)
    args.batch_size = args.batch_size or (8 if quick else 16)
    args.train_batches = args.train_batches or (6 if quick else 16)
    args.ballast_mib = args.ballast_mib or (64 if quick else 200)

    if args.child:
        print(json.dumps(run_child(args)))
        return

    from vitpose.data.synthetic import make_coco

    with tempfile.TemporaryDirectory(prefix="vitpose-bench-memory-") as tmp:
        make_coco(tmp, args.images, seed=0, split="train", image_size=(640, 480))
        summaries = []
        for setup in SETUPS:
            cmd = [sys.executable, __file__, "--child", setup, "--root", tmp, "--workers", str(args.workers),
                   "--images", str(args.images), "--batch-size", str(args.batch_size),
                   "--train-batches", str(args.train_batches), "--ballast-mib", str(args.ballast_mib)]
            start = time.perf_counter()
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            summary = summarize(json.loads(out.strip().splitlines()[-1]))
            summary["seconds"] = time.perf_counter() - start
            summaries.append(summary)

    print(f"train -> val -> train, {args.workers} workers, batch {args.batch_size}, {args.images} synthetic "
          f"images, {args.ballast_mib} MiB private per worker; total PSS (main + workers)")
    header = f"{'setup':<12} {'train steady':>13} {'val peak':>9} {'train 2 peak':>13} {'peak':>7} {'peak/steady':>12}"
    print(header)
    for s in summaries:
        print(f"{s['setup']:<12} {s['train_steady_mib']:>9.0f} MiB {s['val_peak_mib']:>5.0f} MiB "
              f"{s['train1_peak_mib']:>9.0f} MiB {s['peak_mib']:>7.0f} {s['peak_over_steady']:>11.2f}x")
    ours, theirs = summaries
    for s in summaries:
        print(f"  {s['setup']}: workers' share {s['workers_steady_mib']:.0f} MiB in training, "
              f"{s['workers_val_peak_mib']:.0f} MiB at most during validation "
              f"({s['workers_val_peak_mib'] / s['workers_steady_mib']:.2f}x)")
    print(f"peak, two loaders / one pool: {theirs['peak_mib'] / ours['peak_mib']:.2f}x; "
          f"one pool peak/steady {ours['peak_over_steady']:.2f}x (goal <= 1.10x): "
          f"{'PASS' if ours['peak_over_steady'] <= 1.10 else 'FAIL'}")
    print(json.dumps({"bench": "memory", "workers": args.workers, "quick": quick, "results": summaries}))


if __name__ == "__main__":
    main()
