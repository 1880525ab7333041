"""How alike two poses of one person are, in COCO's terms (object keypoint similarity).

A keypoint's similarity is exp(-d^2 / (2 s^2 k^2)) with d its distance in pixels, s^2 the
person's area and k = 2 sigma (the skeleton's per-keypoint sigma): 1 at the same place, 0.5 at
about 1.2 k s, so an error is measured against how precisely people place that keypoint and
against the person's size. OKS is the mean over the keypoints that count. Both `select` (the
two flip views, one frame and the next) and `audit` (a label and the prediction) use it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["keypoint_similarity", "oks"]


def keypoint_similarity(a, b, area, sigmas) -> np.ndarray:
    """Per-keypoint similarity of poses a, b (..., K, 2) pixels for a person of `area` px^2 (...,)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    variances = (2 * np.asarray(sigmas, np.float64)) ** 2
    d2 = ((a - b) ** 2).sum(-1)
    area = np.maximum(np.asarray(area, np.float64), 1.0)[..., None]  # a degenerate box: 1 px^2, not a division by 0
    return np.exp(-d2 / variances / area / 2)


def oks(a, b, area, sigmas, counted=None) -> np.ndarray:
    """OKS of poses a, b (..., K, 2): the mean similarity over the `counted` keypoints (..., K)
    bool (default all); 0 where none counts."""
    ks = keypoint_similarity(a, b, area, sigmas)
    counted = np.ones(ks.shape, bool) if counted is None else np.asarray(counted, bool)
    n = counted.sum(-1)
    return np.where(n > 0, (ks * counted).sum(-1) / np.maximum(n, 1), 0.0)
