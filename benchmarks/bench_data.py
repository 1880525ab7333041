"""Train-pipeline throughput per core: decode -> augment -> warp -> targets, one process.

    python benchmarks/bench_data.py [--quick] [--mmpose] [--samples 600] [--rounds 3]

Runs CocoKeypoints(train=True) over coco-mini (12 instances, repeated over epochs to >= 500
samples) with cv2.setNumThreads(1) and torch.set_num_threads(1), in these variants:
  exact     full JPEG decode + flip + warp + numpy UDP targets   (the work MMPose does)
  reduced   reduced-resolution JPEG decode (flip folded into the warp) + numpy targets
  cache     crop cache (no decode, bit-exact crops) + targets on the device   [default fast path]
  cache+np  crop cache + numpy targets (to separate the two gains)
"Targets on the device" means the worker returns keypoints and weights and the trainer draws
the heatmaps with udp_encode_torch on the accelerator; that GPU time is not counted here.
`--mmpose` runs MMPose 1.3.2's pipeline (LoadImage, GetBBoxCenterScale, RandomFlip,
RandomHalfBody, RandomBBoxTransform, TopdownAffine(use_udp), GenerateTarget(UDPHeatmap),
PackPoseInputs) on the same data in the MMPose reference venv ($VITPOSE_MMPOSE_PYTHON, default
~/.cache/mmpose-ref-venv/bin/python; tools/reference/README.md), in the same rounds.

samples/s per core = samples / CPU seconds of the process (time.process_time), which a loaded
machine disturbs less than wall time; wall-clock rates are printed too. Rounds alternate the
variants and MMPose and each keeps its best round. Stage shares come from a second pass that
times each stage by hand. The crop cache of coco-mini (4 images, ~2.9 MB) stays in the page
cache; a COCO-size cache needs RAM or a fast SSD to do the same.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import cv2
import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mmpose_reference import MMCOMPAT_DIR, missing_message, mmpose_python

from vitpose.data import crop_cache as C
from vitpose.data import transforms as T
from vitpose.data.coco import CocoKeypoints, image_tensor

COCO_MINI = REPO / "tests" / "data" / "coco-mini"
STAGES = ("decode", "augment", "warp", "targets", "pack")


def keys(n, length):
    """(index, epoch) pairs covering n samples, as a sampler would yield them."""
    return [(k % length, k // length) for k in range(n)]


def run_once(ds, pairs):
    """(CPU seconds, wall seconds) to produce the samples."""
    c0, w0 = time.process_time(), time.perf_counter()
    for key in pairs:
        ds[key]
    return time.process_time() - c0, time.perf_counter() - w0


def _read_from_cache(ds, i, geo):
    """The cache path's 'decode': slice the window the warp reads, flip it if needed."""
    cache = ds.crop_cache
    pixels, (rx0, ry0, _, _) = cache.region(i)
    wh = ds.index.image_size(i)
    inverse = C.inverse_affine(geo["matrix"])
    x0, y0, x1, y1 = C.read_window(inverse, ds.input_size, wh)
    ox0, ox1 = (int(wh[0]) - x1, int(wh[0]) - x0) if geo["flipped"] else (x0, x1)
    window = pixels[y0 - ry0:y1 - ry0, ox0 - rx0:ox1 - rx0]
    if geo["flipped"]:
        window = cv2.flip(window, 1)
    return window, (x0, y0), inverse


def stage_times(ds, pairs):
    """Re-run the train sample's stages by hand with a CPU timer around each (seconds)."""
    t = dict.fromkeys(STAGES, 0.0)
    clock = time.process_time
    for i, epoch in pairs:
        c0 = clock()
        geo = ds.augment_geometry(i, np.random.default_rng((ds.seed, epoch, i)))
        c1 = clock()
        if ds.crop_cache is not None:
            window, origin, inverse = _read_from_cache(ds, i, geo)
            c2 = clock()
            crop = C.warp_window(window, origin, inverse, ds.input_size)
        elif ds.reduced_decode:
            f = T.choose_reduction(geo["scale_fixed"], ds.input_size)
            image, f = ds.read_image(i, reduce=f)
            c2 = clock()
            m = T.source_matrix(geo["matrix"], geo["image_width"] if geo["flipped"] else None, f)
            crop = T.warp_crop(image, m, ds.input_size)
        else:
            image, _ = ds.read_image(i)
            if geo["flipped"]:
                image = T.flip_image(image)
            c2 = clock()
            crop = T.warp_crop(image, geo["matrix"], ds.input_size)
        kpts = T.transform_points(geo["keypoints"], geo["matrix"])
        c3 = clock()
        vis = geo["keypoints_visible"].astype(np.float32)
        ds.targets(kpts, vis)
        c4 = clock()
        image_tensor(crop)
        ds.sample_meta(i, geo["center"], geo["scale_fixed"])
        c5 = clock()
        for name, dt in zip(STAGES, (c2 - c1, c1 - c0, c3 - c2, c4 - c3, c5 - c4)):
            t[name] += dt
    return t


MMPOSE_SCRIPT = textwrap.dedent(r"""
    import sys, time, json, collections
    sys.path.insert(0, sys.argv[1]); import mmcompat  # noqa
    import cv2, numpy as np, torch
    cv2.setNumThreads(1); torch.set_num_threads(1)
    from mmpose.datasets import CocoDataset
    from mmpose.utils import register_all_modules
    register_all_modules()
    from mmpose.datasets.transforms import (LoadImage, GetBBoxCenterScale, RandomFlip,
        RandomHalfBody, RandomBBoxTransform, TopdownAffine, GenerateTarget, PackPoseInputs)
    root, n, first_epoch = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    codec = dict(type='UDPHeatmap', input_size=(192, 256), heatmap_size=(48, 64), sigma=2)
    steps = [LoadImage(), GetBBoxCenterScale(), RandomFlip(direction='horizontal'), RandomHalfBody(),
             RandomBBoxTransform(), TopdownAffine(input_size=(192, 256), use_udp=True),
             GenerateTarget(encoder=codec), PackPoseInputs()]
    ds = CocoDataset(ann_file='test_coco.json', data_root=root, data_prefix=dict(img=''),
                     pipeline=[], test_mode=False)
    infos = [ds.get_data_info(i) for i in range(len(ds))]
    np.random.seed(first_epoch)
    times = collections.Counter()
    for k in range(min(n, 24)):  # warm-up: imports, first allocations
        res = dict(infos[k % len(infos)])
        for s in steps:
            res = s(res)
    c0, w0 = time.process_time(), time.perf_counter()
    for k in range(n):
        res = dict(infos[k % len(infos)])
        for s in steps:
            c = time.process_time()
            res = s(res)
            times[type(s).__name__] += time.process_time() - c
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    print(json.dumps({'cpu': cpu, 'wall': wall, 'stages': times, 'instances': len(infos)}))
""")


def run_mmpose(n, round_index):
    out = subprocess.run([str(mmpose_python()), "-c", MMPOSE_SCRIPT, str(MMCOMPAT_DIR), str(COCO_MINI),
                          str(n), str(round_index)], check=False, capture_output=True, text=True)
    if out.returncode != 0:
        print("MMPose run failed:\n" + out.stderr[-3000:])
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def mmpose_shares(stages):
    """MMPose's steps grouped into our stage names."""
    groups = {"decode": ("LoadImage",), "warp": ("TopdownAffine",), "targets": ("GenerateTarget",),
              "pack": ("PackPoseInputs",),
              "augment": ("GetBBoxCenterScale", "RandomFlip", "RandomHalfBody", "RandomBBoxTransform")}
    return {k: sum(stages.get(s, 0.0) for s in v) for k, v in groups.items()}


def line(name, n, cpu, wall, stages, ref=None):
    total = sum(stages.values()) or 1.0
    shares = "  ".join(f"{k} {stages[k] / total:4.0%}" for k in STAGES)
    ratio = f"  {n / cpu / ref:5.2f}x" if ref else ""
    return f"{name:9s} {n / cpu:7.1f} /s per core (wall {n / wall:6.1f}){ratio}   {shares}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: 120 samples, 1 round")
    ap.add_argument("--mmpose", action="store_true", help="measure MMPose 1.3.2 in the same run")
    args = ap.parse_args()
    if args.quick:
        args.samples, args.rounds = 120, 1
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    ann, root = COCO_MINI / "test_coco.json", COCO_MINI
    if args.mmpose and not mmpose_python().exists():
        print(f"--mmpose: {missing_message(mmpose_python())}; skipping MMPose")
        args.mmpose = False

    with tempfile.TemporaryDirectory() as tmp:
        base = CocoKeypoints(ann, root, train=True, encode_targets=False)
        info = C.build_crop_cache(base.index, base.img_dir, Path(tmp) / "crop_cache", base.input_size, num_workers=1)
        print(f"crop cache: {info['instances']} instances in {info['regions']} regions, "
              f"{info['bytes'] / 2 ** 20:.2f} MiB ({info['bytes_per_instance'] / 1024:.0f} KiB per instance), "
              f"built in {info['seconds']:.2f} s")
        cache = C.CropCache(Path(tmp) / "crop_cache")
        variants = {
            "exact": CocoKeypoints(ann, root, train=True, reduced_decode=False, encode_targets=True),
            "reduced": CocoKeypoints(ann, root, train=True, reduced_decode=True, encode_targets=True),
            "cache": CocoKeypoints(ann, root, train=True, encode_targets=False, crop_cache=cache),
            "cache+np": CocoKeypoints(ann, root, train=True, encode_targets=True, crop_cache=cache),
        }
        pairs = keys(args.samples, len(base))
        for ds in variants.values():  # warm-up: imports, page cache, first allocations
            run_once(ds, pairs[:24])
        best = {name: (float("inf"), float("inf")) for name in variants}
        ref_best, ref_stages = None, None
        for r in range(args.rounds):
            for name, ds in variants.items():
                cpu, wall = run_once(ds, pairs)
                best[name] = min(best[name], (cpu, wall))
            if args.mmpose:
                out = run_mmpose(args.samples, r)
                if out is not None and out["instances"] != len(base):
                    print(f"note: MMPose indexed {out['instances']} instances, we index {len(base)}")
                if out is not None and (ref_best is None or out["cpu"] < ref_best[0]):
                    ref_best, ref_stages = (out["cpu"], out["wall"]), mmpose_shares(out["stages"])
        n = len(pairs)
        ref = n / ref_best[0] if ref_best else None
        load = os.getloadavg()[0]
        print(f"{n} samples, best of {args.rounds} round(s), load average {load:.1f} on "
              f"{os.cpu_count()} cores; ratio = samples/s per core over MMPose's")
        if ref_best:
            print(line("mmpose", n, *ref_best, ref_stages, ref))
        for name, ds in variants.items():
            print(line(name, n, *best[name], stage_times(ds, pairs), ref))
        misses = variants["cache"].crop_cache_misses + variants["cache+np"].crop_cache_misses
        print(f"crop cache misses (decoded instead): {misses}")


if __name__ == "__main__":
    main()
