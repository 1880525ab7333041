"""Train-pipeline throughput per core: decode -> augment -> warp -> targets, one process.

    python benchmarks/bench_data.py [--quick] [--mmpose] [--samples 600]

Runs CocoKeypoints(train=True) over coco-mini (12 instances, repeated over epochs to >= 500
samples) with cv2.setNumThreads(1) and torch.set_num_threads(1), in three configurations:
  exact      reduced_decode=False, encode_targets=True   (MMPose-equivalent work)
  default    reduced_decode=True,  encode_targets=True
  device     reduced_decode=True,  encode_targets=False  (heatmaps made on the accelerator)
and prints samples/s and the share of each stage (timed by re-running the stages by hand).
`--mmpose` runs MMPose 1.3.2's pipeline (LoadImage, GetBBoxCenterScale, RandomFlip,
RandomHalfBody, RandomBBoxTransform, TopdownAffine(use_udp), GenerateTarget(UDPHeatmap),
PackPoseInputs) on the same data in a subprocess of /root/.cache/mmpose-ref-venv and prints
the ratios. The machine is shared and noisy: compare figures from one run only.
"""

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cv2
import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vitpose.data import transforms as T  # noqa: E402
from vitpose.data.coco import CocoKeypoints  # noqa: E402

SHARED = Path(os.environ.get("VITPOSE_SHARED", REPO.parent / "shared"))
COCO_MINI = SHARED / "data" / "coco-mini"
MMPOSE_PY = Path("/root/.cache/mmpose-ref-venv/bin/python")


def keys(n, length):
    """(index, epoch) pairs covering n samples, as a sampler would yield them."""
    return [(k % length, k // length) for k in range(n)]


def run_dataset(ds, pairs, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for key in pairs:
            ds[key]
        best = min(best, time.perf_counter() - t0)
    return len(pairs) / best


def stage_shares(ds, pairs):
    """Re-run the train sample's stages by hand with a timer around each."""
    t = dict(decode=0.0, augment=0.0, warp=0.0, targets=0.0, pack=0.0)
    for i, epoch in pairs:
        c0 = time.perf_counter()
        geo = ds.augment_geometry(i, np.random.default_rng((ds.seed, epoch, i)))
        c1 = time.perf_counter()
        if ds.reduced_decode:
            f = T.choose_reduction(geo["scale_fixed"], ds.input_size)
            image, f = ds._load(i, reduce=f)
            c2 = time.perf_counter()
            m = T.source_matrix(geo["matrix"], geo["image_width"] if geo["flipped"] else None, f)
            crop = T.warp_crop(image, m, ds.input_size)
        else:
            image, _ = ds._load(i)
            c2 = time.perf_counter()
            if geo["flipped"]:
                image = T.flip_image(image)
            crop = T.warp_crop(image, geo["matrix"], ds.input_size)
        kpts = T.transform_points(geo["keypoints"], geo["matrix"])
        c3 = time.perf_counter()
        vis = geo["keypoints_visible"]
        if ds._codec is not None:
            ds._codec.encode(kpts[None], vis[None])
        else:
            ds._udp_weights(kpts, vis)
        c4 = time.perf_counter()
        ds._image_tensor(crop)
        ds._meta(i, geo["center"], geo["scale_fixed"])
        c5 = time.perf_counter()
        t["augment"] += c1 - c0
        t["decode"] += c2 - c1
        t["warp"] += c3 - c2
        t["targets"] += c4 - c3
        t["pack"] += c5 - c4
    total = sum(t.values())
    return {k: v / total for k, v in t.items()}


MMPOSE_SCRIPT = textwrap.dedent(r"""
    import sys, time, json, collections
    sys.path.insert(0, sys.argv[1]); import mmcompat  # noqa
    import cv2, numpy as np, torch
    cv2.setNumThreads(1); torch.set_num_threads(1)
    from mmpose.datasets import CocoDataset
    from mmpose.utils import register_all_modules
    register_all_modules()
    from mmcv.transforms import LoadImageFromFile  # noqa
    from mmpose.datasets.transforms import (LoadImage, GetBBoxCenterScale, RandomFlip,
        RandomHalfBody, RandomBBoxTransform, TopdownAffine, GenerateTarget, PackPoseInputs)
    root, n, repeats = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    codec = dict(type='UDPHeatmap', input_size=(192, 256), heatmap_size=(48, 64), sigma=2)
    steps = [LoadImage(), GetBBoxCenterScale(), RandomFlip(direction='horizontal'), RandomHalfBody(),
             RandomBBoxTransform(), TopdownAffine(input_size=(192, 256), use_udp=True),
             GenerateTarget(encoder=codec), PackPoseInputs()]
    ds = CocoDataset(ann_file='test_coco.json', data_root=root, data_prefix=dict(img=''),
                     pipeline=[], test_mode=False)
    infos = [ds.get_data_info(i) for i in range(len(ds))]
    np.random.seed(0)
    times = collections.Counter()
    best = float('inf')
    for r in range(repeats):
        t0 = time.perf_counter()
        for k in range(n):
            res = dict(infos[k % len(infos)])
            for s in steps:
                c = time.perf_counter()
                res = s(res)
                times[type(s).__name__] += time.perf_counter() - c
        best = min(best, time.perf_counter() - t0)
    total = sum(times.values())
    print(json.dumps({'samples_per_s': n / best, 'shares': {k: v / total for k, v in times.items()}}))
""")


def run_mmpose(n, repeats):
    if not MMPOSE_PY.exists():
        return None
    out = subprocess.run([str(MMPOSE_PY), "-c", MMPOSE_SCRIPT, str(SHARED / "mmpose-ref"), str(COCO_MINI),
                          str(n), str(repeats)], capture_output=True, text=True)
    if out.returncode != 0:
        print("MMPose run failed:\n" + out.stderr[-3000:])
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: 60 samples, 1 repeat")
    ap.add_argument("--mmpose", action="store_true", help="measure MMPose 1.3.2 in the same run")
    args = ap.parse_args()
    if args.quick:
        args.samples, args.repeats = 60, 1
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    ann, root = COCO_MINI / "test_coco.json", COCO_MINI
    configs = {
        "exact": dict(reduced_decode=False, encode_targets=True),
        "default": dict(reduced_decode=True, encode_targets=True),
        "device": dict(reduced_decode=True, encode_targets=False),
    }
    results = {}
    for name, kw in configs.items():
        ds = CocoKeypoints(ann, root, train=True, **kw)
        pairs = keys(args.samples, len(ds))
        rate = run_dataset(ds, pairs, args.repeats)
        shares = stage_shares(ds, pairs)
        results[name] = rate
        print(f"{name:8s} {rate:7.1f} samples/s per core   "
              + "  ".join(f"{k} {v:4.0%}" for k, v in shares.items()))
    if args.mmpose:
        ref = run_mmpose(args.samples, args.repeats)
        if ref is not None:
            print(f"{'mmpose':8s} {ref['samples_per_s']:7.1f} samples/s per core   "
                  + "  ".join(f"{k} {v:4.0%}" for k, v in ref["shares"].items()))
            for name, rate in results.items():
                print(f"ratio {name} / mmpose: {rate / ref['samples_per_s']:.2f}x")


if __name__ == "__main__":
    main()
