"""What a keypoint score means: the calibrated probability `p` and COCO's three-state visibility.

A heatmap peak is not a probability. `vitpose calibrate` fits, on held-out labelled images, per
keypoint type the probability that a prediction lies within its tolerance (the skeleton's OKS
tolerance at keypoint similarity 0.5, or its PCK threshold) and a three-state visibility (0 absent,
1 occluded, 2 visible), both from features a forward pass gives. The fit is plain data recorded
in the model file's `ModelSpec` (`calibration`), and every runtime (eager, ONNX, int8, OpenVINO,
serve, Ray) turns its features into (p, visibility) with the one function here, `calibrated`,
called by the shared post-processing of `vitpose.inference.pipeline.TopDown`.

Numpy only: the ONNX runtime and the model spec use it without torch.

Features of one keypoint (`keypoint_features`), per variant of the forward pass:
- `flip_views` (the flip test's two views apart: eager and ONNX files without the flip test
  inside, the default): the flip-averaged heatmap's peak (as a logit), its sharpness (the share of
  the positive heatmap mass within `SHARPNESS_RADIUS` cells of the peak), the person's other
  keypoints (the mean peak logit of the rest), how far inside the image it lies (`scene_features`),
  how far apart the two views put it (over the box's size) and the gap of their peaks;
- `flip_average` (a graph with the flip test inside gives the average only): the first four;
- `plain` (no flip test): the first four, of the plain view.
Each variant is fitted on its own features, so a runtime applies the fit of what it computes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

__all__ = ["CALIBRATION_VERSION", "FEATURE_NAMES", "VARIANTS", "CalibrationError", "calibrated", "check_calibration",
           "fit_logistic", "fit_monotone_logistic", "fit_softmax", "heatmap_sharpness", "keypoint_features",
           "logistic", "scene_features", "softmax_probabilities", "type_columns", "variant_of"]

CALIBRATION_VERSION = 1
VARIANTS = ("flip_views", "flip_average", "plain")
SCENE_FEATURES = ("inside the image",)
FEATURE_NAMES = {
    "flip_views": ("peak logit", "sharpness", "person's other peaks", *SCENE_FEATURES, "views apart",
                   "views' peak gap"),
    "flip_average": ("peak logit", "sharpness", "person's other peaks", *SCENE_FEATURES),
    "plain": ("peak logit", "sharpness", "person's other peaks", *SCENE_FEATURES),
}
SHARPNESS_RADIUS = 2  # heatmap cells either side of the peak
VISIBILITY_STATES = 3  # COCO: 0 absent, 1 occluded, 2 visible


class CalibrationError(ValueError):
    """A recorded calibration that is malformed or does not fit the model (K, variants)."""


# ---------------------------------------------------------------------------------------------
# Features


def heatmap_sharpness(heatmaps: np.ndarray, radius: int = SHARPNESS_RADIUS) -> np.ndarray:
    """(N, K) share of each heatmap's positive mass within `radius` cells of its peak (1: all of
    it at the peak, small: spread or several peaks) of heatmaps (N, K, H, W)."""
    h = np.maximum(np.asarray(heatmaps, np.float64), 0.0)
    n, k, rows, cols = h.shape
    flat = h.reshape(n, k, -1)
    peak = flat.argmax(-1)
    y, x = np.divmod(peak, cols)
    integral = np.zeros((n, k, rows + 1, cols + 1))
    integral[:, :, 1:, 1:] = h.cumsum(2).cumsum(3)
    y0, y1 = np.clip(y - radius, 0, rows), np.clip(y + radius + 1, 0, rows)
    x0, x1 = np.clip(x - radius, 0, cols), np.clip(x + radius + 1, 0, cols)
    ni, ki = np.meshgrid(np.arange(n), np.arange(k), indexing="ij")
    window = (integral[ni, ki, y1, x1] - integral[ni, ki, y0, x1] - integral[ni, ki, y1, x0]
              + integral[ni, ki, y0, x0])
    total = flat.sum(-1)
    return np.where(total > 0, window / np.maximum(total, 1e-12), 0.0)


def _logit(scores) -> np.ndarray:
    s = np.clip(np.nan_to_num(np.asarray(scores, np.float64), nan=0.0), 1e-3, 1 - 1e-3)
    return np.log(s / (1 - s))


def scene_features(keypoints, scene) -> list[np.ndarray]:
    """Where each keypoint (N, K, 2) lies in its image: how far inside it (the distance to the
    nearest edge over the person box's size sqrt(w h), negative outside, clipped to [-1, 1]; an
    absent keypoint is often guessed at the edge). scene: (image sizes (N, 2) w, h; person boxes
    (N, 4) xyxy) of each person: nothing of the other people, so that a request cut into slices
    of boxes (`vitpose serve`) gets the numbers of the whole image."""
    sizes, boxes = (np.asarray(a, np.float64) for a in scene[:2])
    x, y = np.moveaxis(np.asarray(keypoints, np.float64), -1, 0)
    w, h = sizes[:, :1], sizes[:, 1:2]
    extent = np.sqrt(np.maximum((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]), 1.0))[:, None]
    return [np.clip(np.minimum(np.minimum(x, w - x), np.minimum(y, h - y)) / extent, -1.0, 1.0)]


def keypoint_features(scores, sharpness, scale, keypoints, scene, views=None) -> np.ndarray:
    """(N, K, F) features of N people's K keypoints (`FEATURE_NAMES`): scores (N, K) the decoded
    peaks, sharpness (N, K) (`heatmap_sharpness`), scale (N, 2) the crops' extent in image pixels,
    keypoints (N, K, 2) image pixels and their `scene` (`scene_features`); views: None, or (plain
    keypoints (N, K, 2), plain scores (N, K), mirrored keypoints, mirrored scores) in image pixels,
    the flip test's two views apart."""
    peak = _logit(scores)
    n, k = peak.shape
    others = (peak.sum(1, keepdims=True) - peak) / max(k - 1, 1)
    columns = [peak, np.asarray(sharpness, np.float64).reshape(n, k), others, *scene_features(keypoints, scene)]
    if views is not None:
        plain, plain_scores, mirrored, mirrored_scores = (np.asarray(v, np.float64) for v in views)
        size = np.sqrt(np.prod(np.maximum(np.asarray(scale, np.float64).reshape(n, 2), 1e-6), 1))[:, None]
        apart = np.hypot(*np.moveaxis(plain - mirrored, -1, 0)) / size
        columns += [np.log(np.nan_to_num(apart, nan=1.0, posinf=1.0) + 1e-3),
                    np.abs(np.nan_to_num(plain_scores - mirrored_scores, nan=1.0))]
    return np.nan_to_num(np.stack(columns, -1), nan=0.0, posinf=0.0, neginf=0.0)


# ---------------------------------------------------------------------------------------------
# Fitting: logistic regression (binary, monotone in one feature, multinomial)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1.0, steps: int = 50) -> np.ndarray:
    """L2-regularised logistic regression by Newton's method on standardised features: returns
    (F + 1,) weights on the raw features and the bias (the standardisation folded in; `logistic`)."""
    mean, scale = x.mean(0), x.std(0) + 1e-9
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    w = np.zeros(z.shape[1])
    ridge = np.full(z.shape[1], l2)
    ridge[-1] = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-z @ w))
        gradient = z.T @ (p - y) + ridge * w
        hessian = (z * (p * (1 - p))[:, None]).T @ z + np.diag(ridge + 1e-9)
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.abs(step).max() < 1e-7:
            break
    return np.concatenate([w[:-1] / scale, [w[-1] - (w[:-1] * mean / scale).sum()]])


def logistic(weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(x @ weights[:-1] + weights[-1])))


def fit_monotone_logistic(x: np.ndarray, y: np.ndarray, increasing: int = 0, l2: float = 1.0) -> np.ndarray:
    """`fit_logistic` whose weight on feature `increasing` is at least 0 (P rises with the peak):
    where the free fit gives it a negative weight, the best fit with that weight 0 (the constraint's
    one active set), so the answer is the constrained optimum. A set of one class: its rate, as a bias."""
    if y.min() == y.max():
        rate = np.clip(y.mean(), 1e-3, 1 - 1e-3)
        return np.concatenate([np.zeros(x.shape[1]), [math.log(rate / (1 - rate))]])
    weights = fit_logistic(x, y, l2)
    if weights[increasing] >= 0:
        return weights
    rest = [i for i in range(x.shape[1]) if i != increasing]
    reduced = fit_logistic(x[:, rest], y, l2)
    weights = np.zeros(x.shape[1] + 1)
    weights[rest] = reduced[:-1]
    weights[-1] = reduced[-1]
    return weights


def fit_softmax(x: np.ndarray, y: np.ndarray, classes: int, l2: float = 1.0, steps: int = 30) -> np.ndarray:
    """L2-regularised multinomial logistic regression by Newton's method on standardised features:
    (classes, F + 1) weights on the raw features and the bias (`softmax_probabilities`); class 0's
    row is fixed at zero (the reference)."""
    mean, scale = x.mean(0), x.std(0) + 1e-9
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    n, d = z.shape
    free = classes - 1
    w = np.zeros((free, d))
    ridge = np.tile(np.r_[np.full(d - 1, l2), 0.0], free)
    target = np.eye(classes)[y.astype(int)][:, 1:]
    for _ in range(steps):
        p = _softmax(np.hstack([np.zeros((n, 1)), z @ w.T]))[:, 1:]
        gradient = ((p - target).T @ z).ravel() + ridge * w.ravel()
        hessian = np.zeros((free * d, free * d))
        for a in range(free):
            for b in range(free):
                weight = p[:, a] * ((a == b) - p[:, b])
                hessian[a * d:(a + 1) * d, b * d:(b + 1) * d] = (z * weight[:, None]).T @ z
        step = np.linalg.solve(hessian + np.diag(ridge + 1e-9), gradient)
        w -= step.reshape(free, d)
        if np.abs(step).max() < 1e-7:
            break
    raw = np.hstack([w[:, :-1] / scale, (w[:, -1] - (w[:, :-1] * mean / scale).sum(1))[:, None]])
    return np.vstack([np.zeros((1, d)), raw])


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def softmax_probabilities(weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(..., classes) probabilities of `fit_softmax`'s weights (classes, F + 1) on features (..., F)."""
    return _softmax(x @ np.asarray(weights)[:, :-1].T + np.asarray(weights)[:, -1])


def type_columns(features: np.ndarray) -> np.ndarray:
    """(N, K, F + K): the features with each keypoint's type as one-hot columns (the visibility
    classifier's per-type intercepts)."""
    n, k, _ = features.shape
    return np.concatenate([features, np.broadcast_to(np.eye(k), (n, k, k))], -1)


# ---------------------------------------------------------------------------------------------
# The recorded fit and the one function every runtime applies


def check_calibration(calibration, num_keypoints: int, where: str = "calibration") -> dict:
    """The recorded calibration (plain data) checked against K: each variant's `correct` weights
    (K, F + 1) and `visibility` weights (3, F + K + 1), finite. CalibrationError naming what is wrong."""
    if not isinstance(calibration, Mapping) or calibration.get("version") != CALIBRATION_VERSION:
        raise CalibrationError(f"{where}: expected a mapping of version {CALIBRATION_VERSION}, got "
                               f"{calibration if not isinstance(calibration, Mapping) else calibration.get('version')!r}")
    variants = calibration.get("variants")
    if not isinstance(variants, Mapping) or set(variants) != set(VARIANTS):
        raise CalibrationError(f"{where}: variants must be a mapping of each of {list(VARIANTS)} (a runtime "
                               f"applies the one it computes)")
    for name, fit in variants.items():
        f = len(FEATURE_NAMES[name])
        for key, shape in (("correct", (num_keypoints, f + 1)), ("visibility", (VISIBILITY_STATES, f + num_keypoints + 1))):
            try:
                weights = np.asarray(fit[key], np.float64)
            except (KeyError, TypeError, ValueError):
                raise CalibrationError(f"{where}: variant {name!r} has no numeric {key!r} weights") from None
            if weights.shape != shape or not np.isfinite(weights).all():
                raise CalibrationError(f"{where}: variant {name!r}'s {key!r} weights must be {shape} finite numbers "
                                       f"for {num_keypoints} keypoints, got shape {weights.shape}")
    return dict(calibration)


def calibrated(calibration: Mapping, variant: str, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p (N, K) float32, visibility (N, K) int8) of features (N, K, F) (`keypoint_features` of the
    `variant`): p the per-keypoint-type logistic, visibility the most probable of COCO's three
    states. The one function every runtime applies."""
    fit = calibration["variants"][variant]
    x = np.asarray(features, np.float64)
    correct = np.asarray(fit["correct"], np.float64)  # (K, F + 1)
    p = 1.0 / (1.0 + np.exp(-((x * correct[:, :-1]).sum(-1) + correct[:, -1])))
    states = softmax_probabilities(np.asarray(fit["visibility"], np.float64), type_columns(x))
    return p.astype(np.float32), states.argmax(-1).astype(np.int8)


def variant_of(views: bool, flip_test: bool) -> str:
    """The variant a runtime computes: the two views apart, the average only, or no flip test."""
    return "flip_views" if views else "flip_average" if flip_test else "plain"
