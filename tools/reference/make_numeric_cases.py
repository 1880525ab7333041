"""Write tests/fixtures/numeric_cases.npz: MMPose's warp matrices, DARK decodes and warmup factors.

Run it in the MMPose reference environment (MMPose 1.3.2, mmengine 0.10.7, NumPy 1.x), never in
vitpose's own:

    ~/.cache/mmpose-ref-venv/bin/python tools/reference/make_numeric_cases.py \
        [--out tests/fixtures/numeric_cases.npz]

Three groups of keys, each read by one test file:

* `warp/*` (tests/test_geometry.py): `get_udp_warp_matrix` and `get_warp_matrix` on seeded boxes
  and angles given as a Python float with float64 boxes (`*_f64`, the angle in float64), and as
  float32 values (`*_f32`, the training pipeline's dtypes, the angle in float32).
* `dark/*` (tests/test_codecs.py): `MSRAHeatmap(unbiased=True).decode` on a few heatmaps, whose
  DARK step MMPose computes one keypoint at a time in float64 (NumPy 1.x scalar promotion).
* `warmup/*` (tests/test_schedule.py): the learning-rate factor that mmengine's `LinearLR`
  (start_factor 0.001, by_epoch=False) gives at iteration t, for several `end` values.

`info_json` (a 0-d string) records the versions, the seed and which cases tell the float32 and
float64 computations apart.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SEED = 20240918
INPUT_SIZE = (192, 256)  # (w, h)
HEATMAP_SIZE = (48, 64)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "tests/fixtures/numeric_cases.npz")
    return p.parse_args()


def warp_cases(rng):
    """Seeded boxes and angles, with MMPose's matrices for float64 and for float32 inputs."""
    from mmpose.structures.bbox import get_udp_warp_matrix, get_warp_matrix

    n = 48
    center = np.round(rng.uniform(-50, 700, (n, 2)), 3)
    scale = np.round(rng.uniform(20, 900, (n, 2)), 3)
    rot = np.round(rng.uniform(-180, 180, n), 4)
    rot[:6] = (0.0, 90.0, -90.0, 180.0, 30.0, -45.0)  # angles whose float32 and float64 radians differ
    out = {"warp/center": center, "warp/scale": scale, "warp/rot": rot}
    for suffix, cast_box, cast_angle in (("f64", np.float64, float), ("f32", np.float32, np.float32)):
        udp, plain, plain_free = [], [], []
        for c, s, r in zip(center.astype(cast_box), scale.astype(cast_box), rot):
            angle = cast_angle(r)
            udp.append(get_udp_warp_matrix(c, s, angle, INPUT_SIZE))
            plain.append(get_warp_matrix(c, s, angle, INPUT_SIZE))
            plain_free.append(get_warp_matrix(c, s, angle, INPUT_SIZE, fix_aspect_ratio=False))
        out[f"warp/udp_{suffix}"] = np.stack(udp)
        out[f"warp/plain_{suffix}"] = np.stack(plain)
        out[f"warp/plain_no_aspect_fix_{suffix}"] = np.stack(plain_free)
    differ = {key: int(np.sum(np.any(out[f"warp/{key}_f64"] != out[f"warp/{key}_f32"], axis=(1, 2))))
              for key in ("udp", "plain", "plain_no_aspect_fix")}
    assert all(differ.values()), f"float32 and float64 inputs give the same matrices: {differ}"
    return out, {"warp_cases_where_f32_and_f64_differ": differ}


def _dark_in_float32(codec, heatmaps):
    """The contrast: the same DARK step with float32 arithmetic throughout (closed-form inverse)."""
    from mmpose.codecs.utils import gaussian_blur, get_heatmap_maximum

    locations, _ = get_heatmap_maximum(heatmaps.copy())
    logmaps = np.log(np.maximum(gaussian_blur(heatmaps.copy(), codec.blur_kernel_size), np.float32(1e-10)))
    K, H, W = heatmaps.shape
    out = locations.copy()
    half, quarter, two = np.float32(0.5), np.float32(0.25), np.float32(2)
    for k in range(K):
        x, y = locations[k].astype(int)
        if not (1 < x < W - 2 and 1 < y < H - 2):
            continue
        m = logmaps[k]
        dx, dy = half * (m[y, x + 1] - m[y, x - 1]), half * (m[y + 1, x] - m[y - 1, x])
        dxx = quarter * (m[y, x + 2] - two * m[y, x] + m[y, x - 2])
        dyy = quarter * (m[y + 2, x] - two * m[y, x] + m[y - 2, x])
        dxy = quarter * (m[y + 1, x + 1] - m[y - 1, x + 1] - m[y + 1, x - 1] + m[y - 1, x - 1])
        det = dxx * dyy - dxy * dxy
        if det != 0:
            out[k] += np.float32([-(dyy * dx - dxy * dy) / det, -(dxx * dy - dxy * dx) / det])
    return out * codec.scale_factor


def dark_cases(rng):
    """DARK decodes on which float64 (MMPose) and float32 arithmetic give different keypoints,
    a few on which they agree, and three peaks near the borders (left unrefined)."""
    from mmpose.codecs import MSRAHeatmap

    codec = MSRAHeatmap(input_size=INPUT_SIZE, heatmap_size=HEATMAP_SIZE, sigma=2.0, unbiased=True)
    differ, agree = [], []
    while len(differ) < 12:
        keypoints = rng.uniform([4, 4], [188, 252], (1, 17, 2))
        maps = codec.encode(keypoints, np.ones((1, 17), np.float32))["heatmaps"]
        maps = (maps + rng.normal(0, rng.choice([0.0, 0.02, 0.1]), maps.shape)).astype(np.float32)
        decoded = codec.decode(maps.copy())[0][0]
        contrast = _dark_in_float32(codec, maps)
        for k in range(17):
            (differ if np.any(decoded[k] != contrast[k]) else agree).append(maps[k])
    border = codec.encode(np.array([[[1.5, 100.0], [100.0, 253.0], [191.0, 0.5]]]), np.ones((1, 3)))["heatmaps"]
    heatmaps = np.concatenate([np.stack(differ[:12] + agree[:2]), border]).astype(np.float32)[None]
    keypoints, scores = codec.decode(heatmaps[0].copy())
    assert np.sum(np.any(keypoints[0] != _dark_in_float32(codec, heatmaps[0]), axis=-1)) == 12
    return ({"dark/heatmaps": heatmaps, "dark/keypoints": keypoints, "dark/scores": scores},
            {"dark_channels": "0-11: float32 arithmetic gives other keypoints; 12-13: it agrees; "
                              "14-16: near the borders, not refined"})


def warmup_cases():
    """The factor mmengine's LinearLR gives the learning rate at iteration t (0-based), stepped
    after every iteration as MMPose's ParamSchedulerHook does."""
    import torch
    from mmengine.optim.scheduler import LinearLR

    out = {}
    for end in (500, 50, 4, 2):
        param = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([param], lr=1.0)
        scheduler = LinearLR(optimizer, start_factor=0.001, by_epoch=False, begin=0, end=end)
        factors = []
        for _ in range(end + 3):
            factors.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        out[f"warmup/end_{end}"] = np.asarray(factors, np.float64)  # index t = iteration
    return out, {"warmup_start_factor": 0.001}


def main():
    args = parse_args()
    rng = np.random.default_rng(SEED)
    arrays, info = {}, {}
    for make in (lambda: warp_cases(rng), lambda: dark_cases(rng), warmup_cases):
        part, notes = make()
        arrays.update(part)
        info.update(notes)
    info.update({
        "about": "MMPose 1.3.2 warp matrices, MSRAHeatmap(unbiased=True) decodes and mmengine LinearLR "
                 "factors; written by tools/reference/make_numeric_cases.py",
        "seed": SEED, "input_size": INPUT_SIZE, "heatmap_size": HEATMAP_SIZE,
        "versions": {"python": sys.version.split()[0], "numpy": np.__version__,
                     **{name: version(name) for name in ("mmpose", "mmengine", "opencv-python-headless")}},
    })
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, info_json=np.array(json.dumps(info)), **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes): {info}")


if __name__ == "__main__":
    main()
