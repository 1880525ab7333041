"""Points from several views: the linear triangulation (DLT) weighted by confidence, and the views
whose reprojection error marks them as outliers dropped.

Arrays are batched over N points and C cameras: observations in undistorted normalised image
coordinates (N, C, 2), weights (N, C) (0: the camera does not see the point), each camera's
extrinsics [R | t] (C, 3, 4) and focal lengths (C, 2) (to count errors in pixels).

Why these steps:
- A DLT row pair of camera c is its algebraic error, which is the image error times the point's
  depth in c; each row pair is scaled by weight * focal / depth (the depth from a first, unweighted
  pass), so that the least squares minimises confidence-weighted pixel errors. With noise whose
  size goes as 1/confidence, weighting by the confidence is the maximum-likelihood weighting.
- The world is shifted and scaled to the cameras' centroid and spread before the SVD (Hartley's
  normalisation): calibrations in millimetres otherwise leave the homogeneous system ill-conditioned.
- An outlier (a left/right swap in one camera, another person's wrist) pulls the DLT towards itself,
  so the view with the largest error is not always the wrong one. While the worst error of a point
  is above `max_error` pixels and more than two views remain, every view is tried out in turn and
  the one whose removal leaves the smallest worst error is dropped (at most C - 2 rounds; C <= 10 in
  practice, so the C trial triangulations per round are cheap). A point whose last two views still
  disagree by more than `max_error` is left out (NaN), as Pose2Sim does: one of them is wrong and
  nothing says which.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Triangulated:
    """points (N, 3) (NaN: fewer than two views), errors (N, C) pixels (NaN: view not used), used (N, C)."""

    points: np.ndarray
    errors: np.ndarray
    used: np.ndarray

    def mean_error(self) -> np.ndarray:
        """Each point's mean reprojection error over the views used (N,), NaN where none."""
        with np.errstate(invalid="ignore"):
            return np.nansum(self.errors, 1) / np.where(self.used.sum(1) > 0, self.used.sum(1), np.nan)


def world_normalization(extrinsics: np.ndarray) -> tuple[np.ndarray, float]:
    """(centre, scale) of the cameras' positions: the frame the SVD runs in."""
    rotations, translations = extrinsics[:, :, :3], extrinsics[:, :, 3]
    centres = -np.einsum("cji,cj->ci", rotations, translations)
    centre = centres.mean(0)
    scale = float(np.linalg.norm(centres - centre, axis=1).mean()) or 1.0
    return centre, scale


def dlt(observed: np.ndarray, weights: np.ndarray, extrinsics: np.ndarray) -> np.ndarray:
    """The weighted linear triangulation of N points: (N, 3), NaN where fewer than two weights > 0."""
    centre, scale = world_normalization(extrinsics)
    to_world = np.eye(4)
    to_world[:3, :3] *= scale
    to_world[:3, 3] = centre
    cams = extrinsics @ to_world  # (C, 3, 4): normalised world -> camera
    obs = np.nan_to_num(observed)
    w = np.where(np.isfinite(observed).all(-1), weights, 0.0)
    rows_u = obs[..., 0, None] * cams[None, :, 2] - cams[None, :, 0]  # (N, C, 4)
    rows_v = obs[..., 1, None] * cams[None, :, 2] - cams[None, :, 1]
    system = np.concatenate([rows_u * w[..., None], rows_v * w[..., None]], 1)  # (N, 2C, 4)
    enough = (w > 0).sum(1) >= 2
    points = np.full((len(obs), 3), np.nan)
    if enough.any():
        vectors = np.linalg.svd(system[enough])[2][:, -1]  # (n, 4)
        with np.errstate(divide="ignore", invalid="ignore"):
            homogeneous = vectors[:, :3] / vectors[:, 3:]
        points[enough] = homogeneous * scale + centre
    return points


def depths(points: np.ndarray, extrinsics: np.ndarray) -> np.ndarray:
    """Each point's depth in each camera (N, C)."""
    return np.einsum("cj,nj->nc", extrinsics[:, 2, :3], points) + extrinsics[None, :, 2, 3]


def reprojection_errors(points: np.ndarray, observed: np.ndarray, extrinsics: np.ndarray,
                        focal: np.ndarray) -> np.ndarray:
    """Pixel distance between each observation and its point's projection (N, C), in the undistorted
    image (normalised coordinates times the focal lengths); inf behind the camera, NaN unobserved."""
    in_camera = np.einsum("cij,nj->nci", extrinsics[:, :, :3], points) + extrinsics[None, :, :, 3]
    with np.errstate(divide="ignore", invalid="ignore"):
        projected = in_camera[..., :2] / in_camera[..., 2:]
        errors = np.linalg.norm((projected - observed) * focal[None], axis=-1)
    seen = np.isfinite(observed).all(-1) & np.isfinite(points).all(-1)[:, None]
    return np.where(in_camera[..., 2] > 0, errors, np.where(seen, np.inf, np.nan))


def weighted_dlt(observed: np.ndarray, weights: np.ndarray, extrinsics: np.ndarray,
                 focal: np.ndarray) -> np.ndarray:
    """`dlt` with each camera's rows scaled to pixel errors (focal / depth of a first pass)."""
    first = dlt(observed, (weights > 0).astype(np.float64), extrinsics)
    z = depths(first, extrinsics)
    with np.errstate(invalid="ignore"):
        scale = np.where(np.isfinite(z) & (z > 0), focal.mean(1)[None] / np.where(z > 0, z, 1.0), 0.0)
    scale = np.where((scale > 0).sum(1, keepdims=True) >= 2, scale, focal.mean(1)[None])
    return dlt(observed, weights * scale, extrinsics)


def _worst(errors: np.ndarray, used: np.ndarray) -> np.ndarray:
    return np.where(used, np.nan_to_num(errors, nan=np.inf), -np.inf).max(1)


def triangulate(observed: np.ndarray, weights: np.ndarray, extrinsics: np.ndarray, focal: np.ndarray,
                max_error: float | None = 15.0) -> Triangulated:
    """Weighted DLT, then views dropped while a point's worst error is above `max_error` pixels
    (None: no view dropped) and more than two remain."""
    used = (weights > 0) & np.isfinite(observed).all(-1)
    weights = np.where(used, weights, 0.0)
    points = weighted_dlt(observed, weights, extrinsics, focal)
    errors = reprojection_errors(points, observed, extrinsics, focal)
    for _ in range(max(extrinsics.shape[0] - 2, 0) if max_error is not None else 0):
        bad = np.flatnonzero((_worst(errors, used) > max_error) & (used.sum(1) > 2))
        if not len(bad):
            break
        best = np.full(len(bad), np.inf)
        best_used, best_points = used[bad].copy(), points[bad].copy()
        for c in range(extrinsics.shape[0]):
            trial = used[bad].copy()
            trial[:, c] = False
            candidates = used[bad, c]
            trial_points = weighted_dlt(observed[bad], np.where(trial, weights[bad], 0.0), extrinsics, focal)
            worst = _worst(reprojection_errors(trial_points, observed[bad], extrinsics, focal), trial)
            better = candidates & (worst < best)
            best = np.where(better, worst, best)
            best_used[better], best_points[better] = trial[better], trial_points[better]
        used[bad], points[bad] = best_used, best_points
        errors = reprojection_errors(points, observed, extrinsics, focal)
    if max_error is not None:  # two views that disagree: no telling which is wrong, so neither is kept
        unresolved = _worst(errors, used) > max_error
        points[unresolved], used[unresolved] = np.nan, False
    errors = np.where(used, errors, np.nan)
    return Triangulated(points, errors, used)
