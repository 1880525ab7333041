"""A synthetic multi-camera recording with a known truth: a moving COCO-17 figure (metres, Z up)
seen by C calibrated cameras on a ring (with lens distortion), its 2D keypoints with pixel noise
whose size goes as 1/confidence, dropouts, and one outlier camera that often reports confident,
wrong points (a swap, another person). The tests, benchmarks/bench_triangulate.py and docs/3d.md's
figures use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from vitpose.multiview.calibration import Camera

# A standing COCO-17 figure facing +y, metres: x to its left... (nose, eyes, ears, shoulders,
# elbows, wrists, hips, knees, ankles; left before right as COCO orders them).
REST_POSE = np.array([
    [0.00, 0.10, 1.62], [0.03, 0.08, 1.66], [-0.03, 0.08, 1.66], [0.07, 0.02, 1.64], [-0.07, 0.02, 1.64],
    [0.19, 0.00, 1.42], [-0.19, 0.00, 1.42], [0.24, 0.00, 1.14], [-0.24, 0.00, 1.14],
    [0.26, 0.04, 0.88], [-0.26, 0.04, 0.88], [0.11, 0.00, 0.95], [-0.11, 0.00, 0.95],
    [0.12, 0.02, 0.50], [-0.12, 0.02, 0.50], [0.12, 0.00, 0.07], [-0.12, 0.00, 0.07],
])


@dataclass
class SyntheticScene:
    """cameras; truth (T, K, 3); pixels (C, T, K, 2) (NaN: dropped); scores (C, T, K)."""

    cameras: list
    truth: np.ndarray
    pixels: np.ndarray
    scores: np.ndarray

    def jsonl(self, camera: int, track_id: int | None = 0) -> str:
        """What `vitpose predict VIDEO --json` would write for camera `camera`."""
        lines = []
        for t in range(self.truth.shape[0]):
            flat = np.concatenate([self.pixels[camera, t], self.scores[camera, t, :, None]], 1).ravel()
            record = {"frame": t, "category_id": 1,
                      "keypoints": [None if not np.isfinite(v) else round(float(v), 3) for v in flat],
                      "score": float(np.mean(self.scores[camera, t]))}
            if track_id is not None:
                record["track_id"] = track_id
            lines.append(json.dumps(record))
        return "\n".join(lines) + "\n"


def moving_figure(frames: int, fps: float = 30.0) -> np.ndarray:
    """The figure walking a slow arc, swinging its arms and legs: (frames, 17, 3)."""
    t = np.arange(frames) / fps
    pose = np.repeat(REST_POSE[None], frames, 0).copy()
    swing = 0.35 * np.sin(2 * np.pi * 1.0 * t)
    for joint, sign, reach in ((7, 1, 0.26), (9, 1, 0.52), (8, -1, 0.26), (10, -1, 0.52),
                               (13, -1, 0.45), (15, -1, 0.88), (14, 1, 0.45), (16, 1, 0.88)):
        top = 1.42 if joint <= 10 else 0.95
        pose[:, joint, 1] += np.sin(sign * swing) * reach
        pose[:, joint, 2] = top - np.cos(swing) * reach
    heading = 0.4 * np.sin(2 * np.pi * 0.1 * t)
    rotation = np.stack([np.stack([np.cos(heading), -np.sin(heading)], -1),
                         np.stack([np.sin(heading), np.cos(heading)], -1)], -2)  # (T, 2, 2)
    pose[..., :2] = np.einsum("tij,tkj->tki", rotation, pose[..., :2])
    pose[..., 0] += 0.8 * np.sin(2 * np.pi * 0.15 * t)[:, None]
    pose[..., 1] += 0.5 * np.cos(2 * np.pi * 0.12 * t)[:, None]
    return pose


def ring_cameras(count: int, radius: float = 4.0, height: float = 1.4, size=(1280, 720),
                 seed: int = 0) -> list[Camera]:
    """`count` cameras on a ring looking at the origin (1 m up), each with its own radial and
    tangential distortion."""
    rng = np.random.default_rng(seed)
    cameras = []
    for i in range(count):
        angle = 2 * np.pi * i / count + rng.uniform(-0.2, 0.2)
        position = np.array([radius * np.cos(angle), radius * np.sin(angle), height + rng.uniform(-0.3, 0.6)])
        forward = np.array([0.0, 0.0, 1.0]) - position
        forward /= np.linalg.norm(forward)
        right = np.cross(forward, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        down = np.cross(forward, right)
        rotation = np.stack([right, down, forward])  # rows: the camera's axes in the world
        focal = rng.uniform(900, 1100)
        matrix = np.array([[focal, 0, size[0] / 2 + rng.uniform(-10, 10)], [0, focal, size[1] / 2 + rng.uniform(-10, 10)],
                           [0, 0, 1]])
        distortions = np.array([rng.uniform(-0.25, -0.05), rng.uniform(0.0, 0.1), rng.uniform(-1e-3, 1e-3),
                                rng.uniform(-1e-3, 1e-3), 0.0])
        cameras.append(Camera(name=f"cam{i + 1}", matrix=matrix, distortions=distortions, rotation=rotation,
                              translation=-rotation @ position, size=tuple(size)))
    return cameras


def synthetic_scene(cameras: int = 4, frames: int = 120, noise_px: float = 2.0, dropout: float = 0.1,
                    outlier_camera: bool = True, outlier_rate: float = 0.4, seed: int = 0) -> SyntheticScene:
    """The figure seen by `cameras` cameras: each observation's score s uniform in [0.3, 1], its
    noise N(0, noise_px / s) per axis; `dropout` of the observations missing; the last camera (when
    `outlier_camera`) gives `outlier_rate` of its points 40-150 px away with a score in [0.5, 1]."""
    rng = np.random.default_rng(seed)
    rig = ring_cameras(cameras, seed=seed)
    truth = moving_figure(frames)
    pixels = np.stack([camera.project(truth) for camera in rig])  # (C, T, K, 2)
    scores = rng.uniform(0.3, 1.0, pixels.shape[:-1])
    pixels = pixels + rng.normal(0.0, 1.0, pixels.shape) * (noise_px / scores)[..., None]
    if outlier_camera:
        wrong = rng.random(pixels.shape[1:-1]) < outlier_rate
        direction = rng.normal(size=pixels.shape[1:])
        direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
        offset = direction * rng.uniform(40, 150, pixels.shape[1:-1])[..., None]
        pixels[-1] = np.where(wrong[..., None], pixels[-1] + offset, pixels[-1])
        scores[-1] = np.where(wrong, rng.uniform(0.5, 1.0, wrong.shape), scores[-1])
    dropped = rng.random(scores.shape) < dropout
    pixels[dropped] = np.nan
    scores[dropped] = 0.0
    return SyntheticScene(rig, truth, pixels, scores)


__all__ = ["REST_POSE", "SyntheticScene", "moving_figure", "ring_cameras", "synthetic_scene"]
