"""What every prediction path hands on: person boxes (`Detections`), results (`Poses`), stage times.

Numpy only (no torch), so that `vitpose.inference.onnx` and the pipeline steps shared with it can
use these without importing torch. `FullFrame` is the one "whole image is the person" box source.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = ["Detections", "FlipViews", "FullFrame", "Poses", "StageTimer"]


class Detections(NamedTuple):
    """Person boxes of one image: boxes (M, 4) float32 xyxy pixels, scores (M,) float32."""

    boxes: np.ndarray
    scores: np.ndarray

    def as_array(self) -> np.ndarray:
        """(M, 5) float32: xyxy and the score, the caller-box form every predictor's call takes."""
        return np.concatenate([self.boxes, self.scores[:, None]], axis=1).astype(np.float32, copy=False)


class FlipViews(NamedTuple):
    """One image's people with the flip test's two views kept apart (`TopDown.flip_views`):
    `poses` the flip-averaged prediction; `plain` / `mirrored` keypoints (M, K, 2) image pixels and
    their scores (M, K), decoded from the plain forward and the mirrored one flipped back."""

    poses: Poses
    plain: np.ndarray
    plain_scores: np.ndarray
    mirrored: np.ndarray
    mirrored_scores: np.ndarray


class FullFrame:
    """The whole image as one person box with score 1 (single-person clips, pre-cropped images)."""

    def __call__(self, images: Sequence[np.ndarray], channels: str = "rgb") -> list[Detections]:
        out = []
        for image in images:
            h, w = image.shape[:2]
            out.append(Detections(np.array([[0, 0, w, h]], np.float32), np.ones(1, np.float32)))
        return out


@dataclass
class Poses:
    """The people of one image or video frame.

    boxes: (M, 4) float32 person boxes, xyxy image pixels. box_scores: (M,) float32 (detector
    scores; 1 for full-frame boxes and for caller boxes without a 5th column).
    keypoints: (M, K, 2) float64 image pixels (x, y). keypoint_scores: (M, K) float32
    (heatmap maxima; ~0.3 is a usual display threshold).
    frame: the frame index in its video (None for an image). track_ids: (M,) int identities
    across frames (set by tracking; None otherwise). follows: (M,) int, for people carried from
    the frame before on their poses (`--det-every`), each one's index in that frame's `Poses`
    (None when the detector found them).
    keypoint_p: (M, K) float32, the calibrated probability that each keypoint lies within its
    tolerance (the skeleton's OKS tolerance, or its PCK threshold); keypoint_visibility: (M, K)
    int8, COCO's three states (0 absent, 1 occluded, 2 visible). Both None when the model file
    records no calibration (`vitpose calibrate`): never invented.
    """

    boxes: np.ndarray
    box_scores: np.ndarray
    keypoints: np.ndarray
    keypoint_scores: np.ndarray
    frame: int | None = None
    track_ids: np.ndarray | None = None
    follows: np.ndarray | None = None
    keypoint_p: np.ndarray | None = None
    keypoint_visibility: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.boxes)


class StageTimer:
    """Seconds spent per named stage, added up over calls (`with timer.stage("pose"): ...`).

    Each stage is timed in one thread (the video pipeline times its reader, model and writer
    stages in three), so plain adds per key are safe."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def reset(self) -> None:
        self.seconds.clear()

    def ordered(self, stages: Sequence[str]) -> dict[str, float]:
        """The stages in the given order first (those timed), then any others."""
        first = {name: self.seconds[name] for name in stages if name in self.seconds}
        return {**first, **{k: v for k, v in self.seconds.items() if k not in first}}

    def summary(self, count: int, unit: str = "image") -> str:
        """One line per stage: seconds, share of the total and milliseconds per `unit`."""
        total = sum(self.seconds.values())
        lines = [f"{'stage':<15} {'seconds':>8} {'share':>6} {'ms/' + unit:>10}"]
        for name, seconds in self.seconds.items():
            lines.append(f"{name:<15} {seconds:8.2f} {100 * seconds / max(total, 1e-12):5.1f}% "
                         f"{1000 * seconds / max(count, 1):10.1f}")
        lines.append(f"{'total':<15} {total:8.2f} {100.0 if total else 0.0:5.1f}% {1000 * total / max(count, 1):10.1f}")
        return "\n".join(lines)
