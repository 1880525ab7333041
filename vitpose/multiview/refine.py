"""`--refine`: one person's triangulated track made smooth and its limbs constant in length.

- Smoothness: each coordinate of each keypoint is a Whittaker smoother's solution, min over x of
  sum_t w_t (x_t - y_t)^2 + lam * sum_t (x_{t-1} - 2 x_t + x_{t+1})^2: zero lag (it is symmetric
  in time), gaps of up to `max_gap` frames filled by the same solve (w = 0 there), and every point
  weighted by its confidence: the summed weights of its views over (1 + (error / 5 px)^2). lam is
  set from a cut-off frequency: the filter's gain is 1 / (1 + lam (2 - 2 cos w)^2), one half at
  w = 2 pi cutoff / fps. Twice: points further from the first solution than 4 robust standard
  deviations of their keypoint's residuals (a wrong point two views agreed on) are given weight 0
  in the second.
- Limb lengths: each limb's length is its weighted median over the track; a few rounds move the
  two ends of each limb along it towards that length, the less confident end the more.
The system is pentadiagonal, solved by a banded Cholesky factorisation (NumPy only: a loop over
frames, vectorised over the coordinates).
"""

from __future__ import annotations

import warnings

import numpy as np

ERROR_SCALE_PX = 5.0
OUTLIER_SIGMAS = 4.0
LIMB_ROUNDS = 5


def smoothing_weight(cutoff: float, fps: float) -> float:
    """lam of the Whittaker smoother whose gain is 1/2 at `cutoff` Hz."""
    omega = 2 * np.pi * min(cutoff / fps, 0.49)
    return float(1.0 / (2 - 2 * np.cos(omega)) ** 2)


def _second_difference_bands(length: int, lam: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d0, d1, d2 = np.zeros(length), np.zeros(max(length - 1, 0)), np.zeros(max(length - 2, 0))
    rows = np.arange(max(length - 2, 0))
    for offset, value in ((0, 1.0), (1, 4.0), (2, 1.0)):
        np.add.at(d0, rows + offset, value)
    np.add.at(d1, rows, -2.0)
    np.add.at(d1, rows + 1, -2.0)
    d2 += 1.0
    return lam * d0, lam * d1, lam * d2


def banded_solve(diagonal: np.ndarray, first: np.ndarray, second: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Solve A x = rhs for symmetric positive definite pentadiagonal A: diagonal (T, M) (one per
    column), first / second off-diagonals (T-1,), (T-2,) shared by the columns; rhs (T, M)."""
    length = len(diagonal)
    l0, l1, l2 = np.zeros_like(diagonal), np.zeros_like(diagonal), np.zeros_like(diagonal)
    for i in range(length):
        if i >= 2:
            l2[i] = second[i - 2] / l0[i - 2]
        if i >= 1:
            l1[i] = (first[i - 1] - l2[i] * l1[i - 1]) / l0[i - 1]
        l0[i] = np.sqrt(diagonal[i] - l1[i] ** 2 - l2[i] ** 2)
    y = np.zeros_like(rhs)
    for i in range(length):
        y[i] = (rhs[i] - (l1[i] * y[i - 1] if i >= 1 else 0) - (l2[i] * y[i - 2] if i >= 2 else 0)) / l0[i]
    x = np.zeros_like(rhs)
    for i in reversed(range(length)):
        x[i] = (y[i] - (l1[i + 1] * x[i + 1] if i + 1 < length else 0)
                - (l2[i + 2] * x[i + 2] if i + 2 < length else 0)) / l0[i]
    return x


def whittaker(values: np.ndarray, weights: np.ndarray, lam: float) -> np.ndarray:
    """Columns of values (T, M) smoothed with weights (T, M) (0: missing)."""
    d0, d1, d2 = _second_difference_bands(len(values), lam)
    w = np.where(np.isfinite(values), weights, 0.0)
    return banded_solve(d0[:, None] + w + 1e-9, d1, d2, w * np.nan_to_num(values))


def _fillable(observed: np.ndarray, max_gap: int) -> np.ndarray:
    """Frames (T, M) inside the observed span of a column and in a gap of at most max_gap frames."""
    keep = observed.copy()
    for m in range(observed.shape[1]):
        seen = np.flatnonzero(observed[:, m])
        if len(seen) < 2:
            keep[:, m] = False
            continue
        for a, b in zip(seen[:-1], seen[1:]):
            if 1 < b - a <= max_gap + 1:
                keep[a + 1:b, m] = True
    return keep


def smooth_track(points: np.ndarray, confidence: np.ndarray, lam: float, max_gap: int) -> np.ndarray:
    """points (T, K, 3) (NaN: missing), confidence (T, K) -> the smoothed track (T, K, 3)."""
    t, k, _ = points.shape
    values = points.reshape(t, k * 3)
    weights = np.repeat(np.where(np.isfinite(points).all(-1), confidence, 0.0), 3, axis=1)
    observed = weights > 0
    if not observed.any():
        return points.copy()
    weights = weights / weights[observed].mean()
    smooth = whittaker(values, weights, lam)
    residual = np.where(observed, np.abs(values - smooth), np.nan)
    with warnings.catch_warnings():  # a column never observed: its median is NaN, and so is its test
        warnings.simplefilter("ignore", RuntimeWarning)
        scale = 1.4826 * np.nanmedian(residual, 0, keepdims=True) + 1e-9
    weights = np.where(np.nan_to_num(residual) > OUTLIER_SIGMAS * scale, 0.0, weights)
    smooth = whittaker(values, weights, lam)
    smooth[~_fillable(weights > 0, max_gap)] = np.nan
    return smooth.reshape(t, k, 3)


def fix_limbs(points: np.ndarray, confidence: np.ndarray, limbs) -> np.ndarray:
    """Move each limb's ends towards the limb's weighted median length over the track."""
    out = points.copy()
    targets = {}
    for a, b in limbs:
        length = np.linalg.norm(points[:, a] - points[:, b], axis=-1)
        w = np.minimum(confidence[:, a], confidence[:, b])
        ok = np.isfinite(length) & (w > 0)
        if ok.sum() >= 3:
            order = np.argsort(length[ok])
            cumulative = np.cumsum(w[ok][order])
            targets[a, b] = length[ok][order][np.searchsorted(cumulative, cumulative[-1] / 2)]
    for _ in range(LIMB_ROUNDS):
        for (a, b), target in targets.items():
            vector = out[:, a] - out[:, b]
            length = np.linalg.norm(vector, axis=-1, keepdims=True)
            wa, wb = confidence[:, a, None] + 1e-9, confidence[:, b, None] + 1e-9
            with np.errstate(invalid="ignore", divide="ignore"):
                delta = np.nan_to_num(0.5 * (length - target) * vector / length)
            out[:, a] -= delta * wb / (wa + wb) * 2
            out[:, b] += delta * wa / (wa + wb) * 2
    return out


def refine_track(points: np.ndarray, confidence: np.ndarray, fps: float, cutoff: float = 6.0,
                 max_gap: int = 10, limbs=()) -> np.ndarray:
    """Smoothness, then limb lengths: (T, K, 3) -> (T, K, 3)."""
    smooth = smooth_track(points, confidence, smoothing_weight(cutoff, fps), max_gap)
    filled = np.where(np.isfinite(points).all(-1), confidence, 1e-3)  # a filled gap is the first to give way
    return fix_limbs(smooth, filled, limbs) if limbs else smooth
