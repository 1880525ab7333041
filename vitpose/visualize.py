"""Draw COCO-17 poses on an image with OpenCV."""

from __future__ import annotations

import cv2
import numpy as np

from vitpose.coco_meta import SKELETON

# Colours in RGB: left limbs green, right limbs orange, head and torso blue (as most COCO tools).
LEFT, RIGHT, CENTRE = (0, 200, 0), (255, 128, 0), (51, 153, 255)
_LEFT_IDS = {1, 3, 5, 7, 9, 11, 13, 15}
_RIGHT_IDS = {2, 4, 6, 8, 10, 12, 14, 16}


def _side_colour(a: int, b: int):
    if a in _LEFT_IDS and b in _LEFT_IDS:
        return LEFT
    if a in _RIGHT_IDS and b in _RIGHT_IDS:
        return RIGHT
    return CENTRE


def _point_colour(k: int):
    return LEFT if k in _LEFT_IDS else RIGHT if k in _RIGHT_IDS else CENTRE


def draw_pose(image: np.ndarray, keypoints, scores=None, thr: float = 0.3, skeleton=SKELETON,
              radius: int | None = None, thickness: int | None = None, channels: str = "rgb") -> np.ndarray:
    """Draw keypoints and the skeleton of one or more people; returns a new image.

    image: (H, W, 3) uint8 (RGB by default; `channels="bgr"` for OpenCV images, so the
        colours come out the same). keypoints: (K, 2) or (M, K, 2) image pixels (x, y).
    scores: (K,) or (M, K); keypoints with score <= thr (or non-finite coordinates) are not
        drawn, nor the limbs that touch them. None draws every keypoint.
    skeleton: limb index pairs (default: COCO-17, `vitpose.coco_meta.SKELETON`).
    """
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be (H, W, 3) uint8, got {image.shape} {image.dtype}")
    keypoints = np.asarray(keypoints, dtype=np.float64)
    if keypoints.ndim == 2:
        keypoints = keypoints[None]
    if keypoints.ndim != 3 or keypoints.shape[-1] != 2:
        raise ValueError(f"keypoints must be (K, 2) or (M, K, 2), got {keypoints.shape}")
    if scores is None:
        scores = np.ones(keypoints.shape[:2])
    scores = np.asarray(scores, dtype=np.float64).reshape(keypoints.shape[:2])
    if channels not in ("rgb", "bgr"):
        raise ValueError(f"channels must be 'rgb' or 'bgr', got {channels!r}")

    def colour(rgb):
        return tuple(int(c) for c in (rgb[::-1] if channels == "bgr" else rgb))

    canvas = np.ascontiguousarray(image.copy())
    size = max(image.shape[:2])
    radius = radius or max(2, size // 160)
    thickness = thickness or max(1, size // 320)
    for person, person_scores in zip(keypoints, scores):
        visible = (person_scores > thr) & np.all(np.isfinite(person), axis=-1)
        points = [tuple(round(float(v)) for v in p) if ok else None for p, ok in zip(person, visible)]
        for a, b in skeleton:
            if a < len(points) and b < len(points) and points[a] and points[b]:
                cv2.line(canvas, points[a], points[b], colour(_side_colour(a, b)), thickness, cv2.LINE_AA)
        for k, p in enumerate(points):
            if p is not None:
                cv2.circle(canvas, p, radius, colour(_point_colour(k)), -1, cv2.LINE_AA)
    return canvas
