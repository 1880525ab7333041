"""Keypoint non-maximum suppression by OKS (object keypoint similarity), per image.

Top-down evaluation crops every detected box, so one person is often predicted several times
from overlapping boxes. MMPose (and so ViTPose's published numbers) removes these duplicates
with a greedy OKS-NMS before COCOeval; the arithmetic here follows MMPose's `oks_iou` term by
term (float32 sigmas, OKS stored as float32, quicksort order on score ties) so that the kept set
is the same, not just nearly the same. docs/evaluation.md §5.
"""

from __future__ import annotations

import numpy as np

from vitpose.coco_meta import SIGMAS


def _variances(sigmas, num_keypoints: int) -> np.ndarray:
    # MMPose keeps dataset sigmas as float32; (2 sigma)^2 is then float32 as well.
    sigmas = np.asarray(SIGMAS if sigmas is None else sigmas, dtype=np.float32)
    if len(sigmas) != num_keypoints:
        raise ValueError(f"{len(sigmas)} sigmas for {num_keypoints} keypoints")
    return (sigmas * 2) ** 2


def _mean_area(area_sum: np.ndarray) -> np.ndarray:
    # MMPose adds the two areas in their own dtype (two float32 scalars give a float32 sum), then
    # NumPy 1.x divides that scalar by the Python int 2 in float64.
    return area_sum.astype(np.float64) / 2 + np.spacing(1)


def oks_one_to_many(keypoints: np.ndarray, areas: np.ndarray, i: int, others: np.ndarray,
                    variances: np.ndarray) -> np.ndarray:
    """OKS of instance i against instances `others`, all keypoints counted -> (len(others),) float32.

    e_k = d_k^2 / (2 sigma_k)^2 / ((a_i + a_j) / 2 + eps) / 2 and OKS = mean_k exp(-e_k), with
    a_i + a_j added in the areas' dtype (float32 areas: a float32 sum, as in MMPose).
    """
    d2 = ((keypoints[others] - keypoints[i]) ** 2).sum(-1)  # (M, K), K contiguous
    mean_area = _mean_area(areas[i] + areas[others])
    e = d2 / variances / mean_area[:, None] / 2
    # A reduction over the contiguous last axis sums in the same order as MMPose's 1-D sums.
    return (np.sum(np.exp(-e), axis=-1) / keypoints.shape[1]).astype(np.float32)


def pairwise_oks(keypoints, areas, sigmas=None) -> np.ndarray:
    """OKS between every pair of instances: keypoints (N, K, 2) px, areas (N,) px^2 -> (N, N) float32.

    Row i equals `oks_one_to_many(..., i, all)` bit for bit (same operations in the same order).
    float32 areas are added in float32 (MMPose's top-down areas are float32); others in float64.
    """
    keypoints = np.asarray(keypoints, dtype=np.float64)
    return _pairwise(keypoints, _as_areas(areas), _variances(sigmas, keypoints.shape[1]))


def _as_areas(areas) -> np.ndarray:
    areas = np.asarray(areas)
    return areas if areas.dtype == np.float32 else areas.astype(np.float64)


def _pairwise(keypoints, areas, variances):
    d2 = ((keypoints[None, :] - keypoints[:, None]) ** 2).sum(-1)  # [i, j] = |kpt_j - kpt_i|^2, (N, N, K)
    mean_area = _mean_area(areas[:, None] + areas[None, :])
    e = d2 / variances / mean_area[:, :, None] / 2
    return (np.sum(np.exp(-e), axis=-1) / keypoints.shape[1]).astype(np.float32)


# Up to this many instances in one image the whole OKS matrix is computed at once (fast);
# beyond it, one row per kept instance (memory O(N K) instead of O(N^2 K)).
DENSE_MAX = 256


def _oks_rows(keypoints, areas, variances):
    """A function (i, others) -> OKS of i against others, dense or row by row.

    An instance with a non-finite keypoint (a diverged model decodes NaN) has OKS 0 with every
    other: it neither suppresses nor is suppressed by anyone (MMPose's NaN comparisons would let
    one such instance remove every other of its image).
    """
    if len(keypoints) <= DENSE_MAX:
        matrix = _finite_or_zero(_pairwise(keypoints, areas, variances))
        return lambda i, others: matrix[i, others]
    return lambda i, others: _finite_or_zero(oks_one_to_many(keypoints, areas, i, others, variances))


def _finite_or_zero(oks: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(oks), oks, oks.dtype.type(0))


def _prepare(keypoints, scores, areas, sigmas):
    keypoints = np.asarray(keypoints, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    areas = _as_areas(areas)
    if not len(keypoints) == len(scores) == len(areas):
        raise ValueError(f"{len(keypoints)} keypoint sets, {len(scores)} scores and {len(areas)} areas")
    variances = _variances(sigmas, keypoints.shape[1]) if len(keypoints) else None
    return keypoints, scores, areas, variances


def _descending(scores: np.ndarray) -> np.ndarray:
    # MMPose's order: ascending quicksort, reversed (decides which of two equal scores wins).
    return np.argsort(scores, kind="quicksort")[::-1]


def oks_nms(keypoints, scores, areas, thr: float = 0.9, sigmas=None) -> np.ndarray:
    """Greedy OKS-NMS: keep the best instance, drop those with OKS > thr to it, repeat.

    keypoints (N, K, 2), scores (N,), areas (N,) -> indices of the kept instances, best first.
    Give the areas as float32 to reproduce MMPose's top-down metric, whose areas are float32.
    """
    keypoints, scores, areas, variances = _prepare(keypoints, scores, areas, sigmas)
    if len(scores) == 0:
        return np.zeros(0, dtype=np.int64)
    oks_rows = _oks_rows(keypoints, areas, variances)
    order = _descending(scores)
    keep = []
    while len(order) > 0:
        best = order[0]
        keep.append(best)
        rest = order[1:]
        order = rest[oks_rows(best, rest) <= float(thr)]  # compared in float32, as MMPose does
    return np.asarray(keep, dtype=np.int64)


def soft_oks_nms(keypoints, scores, areas, thr: float = 0.9, max_dets: int = 20, sigmas=None) -> np.ndarray:
    """Soft OKS-NMS (Gaussian): instead of dropping, scale the others' scores by exp(-OKS^2 / thr).

    Returns the indices of at most `max_dets` instances in the order they were picked. As in
    MMPose the decayed scores only decide that order; the instances keep their own scores.
    """
    keypoints, scores, areas, variances = _prepare(keypoints, scores, areas, sigmas)
    if len(scores) == 0:
        return np.zeros(0, dtype=np.int64)
    oks_rows = _oks_rows(keypoints, areas, variances)
    order = _descending(scores)
    remaining = scores[order]
    keep = []
    while len(order) > 0 and len(keep) < max_dets:
        best = order[0]
        keep.append(best)
        order = order[1:]
        decay = np.exp(-(oks_rows(best, order) ** 2) / float(thr))  # float32, as in MMPose
        remaining = remaining[1:] * decay
        resort = _descending(remaining)
        order, remaining = order[resort], remaining[resort]
    return np.asarray(keep, dtype=np.int64)
