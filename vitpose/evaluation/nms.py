"""Keypoint non-maximum suppression by OKS (object keypoint similarity), per image.

Top-down evaluation crops every detected box, so one person is often predicted several times
from overlapping boxes. MMPose (and so ViTPose's published numbers) removes these duplicates
with a greedy OKS-NMS before COCOeval; the arithmetic here follows MMPose's `oks_iou` term by
term (float32 sigmas, OKS stored as float32, quicksort order on score ties) so that the kept set
is the same, not just nearly the same. SPEC.md §7.
"""

from __future__ import annotations

import numpy as np

from vitpose.coco_meta import SIGMAS


def pairwise_oks(keypoints: np.ndarray, areas: np.ndarray, sigmas=None) -> np.ndarray:
    """OKS between every pair of instances of one image, all keypoints counted.

    keypoints (N, K, 2) image px, areas (N,) px^2 -> (N, N) float32, symmetric.
    e_k = d_k^2 / (2 sigma_k)^2 / ((a_i + a_j) / 2 + eps) / 2 and OKS = mean_k exp(-e_k).
    """
    keypoints = np.asarray(keypoints, dtype=np.float64)
    areas = np.asarray(areas, dtype=np.float64)
    # MMPose keeps dataset sigmas as float32; (2 sigma)^2 is then float32 as well.
    sigmas = np.asarray(SIGMAS if sigmas is None else sigmas, dtype=np.float32)
    variances = (sigmas * 2) ** 2
    num_keypoints = keypoints.shape[1]
    if len(sigmas) != num_keypoints:
        raise ValueError(f"{len(sigmas)} sigmas for {num_keypoints} keypoints")
    dx = keypoints[None, :, :, 0] - keypoints[:, None, :, 0]  # (N, N, K), K contiguous
    dy = keypoints[None, :, :, 1] - keypoints[:, None, :, 1]
    mean_area = (areas[:, None] + areas[None, :]) / 2 + np.spacing(1)
    e = (dx**2 + dy**2) / variances / mean_area[:, :, None] / 2
    # A reduction over the contiguous last axis sums in the same order as MMPose's 1-D sums.
    return (np.sum(np.exp(-e), axis=-1) / num_keypoints).astype(np.float32)


def _descending(scores: np.ndarray) -> np.ndarray:
    # MMPose's order: ascending quicksort, reversed (decides which of two equal scores wins).
    return np.argsort(scores, kind="quicksort")[::-1]


def oks_nms(keypoints, scores, areas, thr: float = 0.9, sigmas=None) -> np.ndarray:
    """Greedy OKS-NMS: keep the best instance, drop those with OKS > thr to it, repeat.

    keypoints (N, K, 2), scores (N,), areas (N,) -> indices of the kept instances, best first.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if len(scores) == 0:
        return np.zeros(0, dtype=np.int64)
    oks = pairwise_oks(keypoints, areas, sigmas)
    order = _descending(scores)
    keep = []
    while len(order) > 0:
        best = order[0]
        keep.append(best)
        rest = order[1:]
        order = rest[oks[best, rest] <= float(thr)]  # compared in float32, as MMPose does
    return np.asarray(keep, dtype=np.int64)


def soft_oks_nms(keypoints, scores, areas, thr: float = 0.9, max_dets: int = 20, sigmas=None) -> np.ndarray:
    """Soft OKS-NMS (Gaussian): instead of dropping, scale the others' scores by exp(-OKS^2 / thr).

    Returns the indices of at most `max_dets` instances in the order they were picked. As in
    MMPose the decayed scores only decide that order; the instances keep their own scores.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if len(scores) == 0:
        return np.zeros(0, dtype=np.int64)
    oks = pairwise_oks(keypoints, areas, sigmas)
    order = _descending(scores)
    remaining = scores[order]
    keep = []
    while len(order) > 0 and len(keep) < max_dets:
        best = order[0]
        keep.append(best)
        order = order[1:]
        decay = np.exp(-oks[best, order] ** 2 / float(thr))  # float32, as in MMPose
        remaining = remaining[1:] * decay
        resort = _descending(remaining)
        order, remaining = order[resort], remaining[resort]
    return np.asarray(keep, dtype=np.int64)
