"""MPJPE of `vitpose triangulate` against an unweighted DLT and aniposelib's triangulation, on the
same synthetic recording (vitpose.multiview.synthetic: a moving COCO-17 figure, ring cameras with
lens distortion, noise N(0, noise_px / score) per axis, dropouts, one outlier camera).

    python benchmarks/bench_triangulate.py [--cameras 3 4 6] [--seeds 2] [--frames 60] [--outlier-rate 0.4] [--aniposelib PYTHON]

Every method sees the same keypoints: those with a score >= 0.3 (aniposelib gets the others as
NaN, as anipose's score threshold gives them). aniposelib runs in its own environment (it needs
opencv-contrib): PYTHON is that environment's interpreter (default: ~/.cache/vitpose-tests/aniposelib,
used when it exists). MPJPE is in millimetres over the points a method returned; `missing` is the
share of points it left out; in brackets the MPJPE over the points every method returned. docs/3d.md §3 has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vitpose.multiview.calibration import calibration_text  # noqa: E402
from vitpose.multiview.refine import refine_track  # noqa: E402
from vitpose.multiview.run import COCO_LIMBS  # noqa: E402
from vitpose.multiview.synthetic import synthetic_scene  # noqa: E402
from vitpose.multiview.triangulation import dlt, triangulate  # noqa: E402

MIN_SCORE = 0.3
DEFAULT_ANIPOSELIB = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vitpose-tests" / "aniposelib"

ANIPOSELIB_SCRIPT = """
import sys, numpy as np
from aniposelib.cameras import CameraGroup
group = CameraGroup.load(sys.argv[1])
points = np.load(sys.argv[2])
np.save(sys.argv[3], group.triangulate(points, undistort=True))
# its RANSAC fails on a point seen by fewer than two cameras (aniposelib 0.8.0): those stay NaN
seen = (~np.isnan(points[..., 0])).sum(0) >= 2
ransac = np.full((points.shape[1], 3), np.nan)
ransac[seen] = group.triangulate_ransac(points[:, seen], undistort=True, min_cams=2)[0]
np.save(sys.argv[4], ransac)
"""


def views_of(scene):
    """(observed normalised (N, C, 2), weights (N, C), extrinsics, focal) of a scene, score >= MIN_SCORE."""
    c, t, k, _ = scene.pixels.shape
    observed = np.stack([cam.normalized(scene.pixels[i]) for i, cam in enumerate(scene.cameras)])
    observed = observed.transpose(1, 2, 0, 3).reshape(t * k, c, 2)
    weights = scene.scores.transpose(1, 2, 0).reshape(t * k, c)
    weights = np.where(weights >= MIN_SCORE, weights, 0.0)
    extrinsics = np.stack([cam.extrinsics() for cam in scene.cameras])
    focal = np.stack([cam.focal for cam in scene.cameras])
    return observed, weights, extrinsics, focal


def ours(scene, fps: float = 30.0) -> dict[str, np.ndarray]:
    """Each of this project's variants: points (N, 3)."""
    observed, weights, extrinsics, focal = views_of(scene)
    t, k = scene.truth.shape[:2]
    result = triangulate(observed, weights, extrinsics, focal, max_error=15.0)
    with np.errstate(invalid="ignore"):
        confidence = np.where(result.used, weights, 0).sum(1) / (1 + (result.mean_error() / 5.0) ** 2)
    refined = refine_track(result.points.reshape(t, k, 3), np.nan_to_num(confidence).reshape(t, k), fps,
                           limbs=COCO_LIMBS)
    return {"unweighted DLT": dlt(observed, (weights > 0).astype(float), extrinsics),
            "weighted DLT": triangulate(observed, weights, extrinsics, focal, max_error=None).points,
            "vitpose triangulate": result.points,
            "vitpose triangulate --refine": refined.reshape(-1, 3)}


def aniposelib(scene, python: str) -> dict[str, np.ndarray]:
    """aniposelib's CameraGroup.triangulate and triangulate_ransac on the same keypoints."""
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "calibration.toml").write_text(calibration_text(scene.cameras, "aniposelib"))
        c, t, k, _ = scene.pixels.shape
        pixels = np.where((scene.scores >= MIN_SCORE)[..., None], scene.pixels, np.nan).reshape(c, t * k, 2)
        np.save(folder / "points.npy", pixels)
        subprocess.run([python, "-c", ANIPOSELIB_SCRIPT, str(folder / "calibration.toml"), str(folder / "points.npy"),
                        str(folder / "plain.npy"), str(folder / "ransac.npy")], check=True, capture_output=True,
                       timeout=1800)
        return {"aniposelib triangulate": np.load(folder / "plain.npy"),
                "aniposelib triangulate_ransac": np.load(folder / "ransac.npy")}


def mpjpe(points: np.ndarray, truth: np.ndarray, common: np.ndarray) -> tuple[float, float, float]:
    """(MPJPE in mm over the points given, share of points missing, MPJPE over the `common` points)."""
    error = np.linalg.norm(points - truth.reshape(-1, 3), axis=1) * 1000
    return float(np.nanmean(error)), float(np.isnan(error).mean()), float(error[common].mean())


def compare(cameras: int = 4, seed: int = 0, frames: int = 150, noise_px: float = 2.0, dropout: float = 0.1,
            outlier_rate: float = 0.4, python: str | None = None) -> dict[str, tuple[float, float]]:
    scene = synthetic_scene(cameras=cameras, frames=frames, noise_px=noise_px, dropout=dropout, seed=seed,
                            outlier_camera=outlier_rate > 0, outlier_rate=outlier_rate)
    methods = ours(scene)
    if python:
        methods.update(aniposelib(scene, python))
    common = np.logical_and.reduce([np.isfinite(points).all(1) for points in methods.values()])
    return {name: mpjpe(points, scene.truth, common) for name, points in methods.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cameras", type=int, nargs="+", default=[3, 4, 6])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--noise-px", type=float, default=2.0)
    parser.add_argument("--outlier-rate", type=float, default=0.4, help="the last camera's share of outliers (0: none)")
    parser.add_argument("--aniposelib", default=None, help="python of an environment with aniposelib")
    args = parser.parse_args()
    python = args.aniposelib or (str(DEFAULT_ANIPOSELIB / "bin" / "python")
                                 if (DEFAULT_ANIPOSELIB / "bin" / "python").exists() else None)
    table = {}
    for cameras in args.cameras:
        runs = [compare(cameras, seed, args.frames, args.noise_px, outlier_rate=args.outlier_rate, python=python)
                for seed in range(args.seeds)]
        table[cameras] = {name: tuple(float(np.mean([r[name][i] for r in runs])) for i in range(3)) for name in runs[0]}
    outliers = f"last camera {100 * args.outlier_rate:.0f}% outliers 40-150 px" if args.outlier_rate else "no outliers"
    print(f"noise N(0, {args.noise_px}/score) px, 10% dropouts, {outliers}, "
          f"{args.seeds} seeds x {args.frames} frames; MPJPE mm (missing %) [MPJPE over the points every method gave]")
    names = list(next(iter(table.values())))
    print("| method | " + " | ".join(f"{c} cameras" for c in table) + " |")
    print("|---|" + "---|" * len(table))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{table[c][name][0]:.1f} ({100 * table[c][name][1]:.1f}%) [{table[c][name][2]:.1f}]"
                                          for c in table) + " |")
    print(json.dumps({str(c): v for c, v in table.items()}))


if __name__ == "__main__":
    main()
