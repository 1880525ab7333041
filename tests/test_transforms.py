"""Augmentation: MMPose's distributions over many draws, and geometry (dots move with keypoints)."""

import cv2
import numpy as np
import pytest

from vitpose.coco_meta import FLIP_INDICES
from vitpose.data import transforms as T

N = 20000


def rngs(n, seed=0):
    return (np.random.default_rng((seed, 0, i)) for i in range(n))


def test_truncated_normal_matches_scipy_truncnorm():
    t = T.truncated_normal(np.random.default_rng(0), N * 4)
    assert t.dtype == np.float32 and t.min() >= -1 and t.max() <= 1
    # scipy.stats.truncnorm(-1, 1): mean 0, std 0.53956; 4 sigma of the estimate ~0.004
    assert abs(t.mean()) < 0.01
    assert abs(t.std() - 0.53956) < 0.006
    # Shape: P(|t| < 0.5) = (Phi(.5) - Phi(-.5)) / (Phi(1) - Phi(-1)) = 0.5614
    assert abs(np.mean(np.abs(t) < 0.5) - 0.5614) < 0.01


def test_bbox_transform_rates_and_ranges():
    center = np.array([100.0, 200.0], np.float32)
    scale = np.array([50.0, 80.0], np.float32)
    out = [T.random_bbox_transform(r, center, scale) for r in rngs(N)]
    shift = np.stack([c - center for c, _, _ in out])
    factor = np.stack([s / scale for _, s, _ in out])
    rot = np.array([r for _, _, r in out])
    assert all(c.dtype == np.float32 and s.dtype == np.float32 for c, s, _ in out)
    # rotation: gate 0.6, 80 x truncated normal
    applied = rot != 0
    assert abs(applied.mean() - 0.6) < 0.015
    assert np.abs(rot).max() <= 80
    assert abs(rot[applied].std() / 80 - 0.53956) < 0.01
    # shift: one gate (0.3) for both axes, 0.16 x scale x truncated normal
    shifted = np.any(shift != 0, axis=1)
    assert abs(shifted.mean() - 0.3) < 0.015
    assert np.all((shift[:, 0] != 0) == (shift[:, 1] != 0))
    assert np.all(np.abs(shift) <= 0.16 * scale + 1e-3)
    assert abs(shift[shifted, 0].std() / (0.16 * 50) - 0.53956) < 0.02
    # scale: always, 1 + 0.5 x truncated normal, the same factor on w and h
    np.testing.assert_allclose(factor[:, 0], factor[:, 1], rtol=1e-6)
    assert factor.min() >= 0.5 - 1e-6 and factor.max() <= 1.5 + 1e-6
    assert abs(factor[:, 0].std() / 0.5 - 0.53956) < 0.01


def test_flip_rate_and_mapping():
    kpts = np.random.default_rng(1).uniform(0, 300, (17, 2)).astype(np.float32)
    vis = (np.arange(17) % 3 != 0).astype(np.float32)
    center = np.array([120.0, 80.0], np.float32)
    width = 321
    flips = [T.random_flip(r, center, kpts, vis, width) for r in rngs(N)]
    assert abs(np.mean([f[0] for f in flips]) - 0.5) < 0.015
    flipped, c, k, v = next(f for f in flips if f[0])
    assert c[0] == width - 1 - 120.0 and c[1] == 80.0
    for dst, src in enumerate(FLIP_INDICES):
        assert k[dst, 0] == width - 1 - kpts[src, 0] and k[dst, 1] == kpts[src, 1]
        assert v[dst] == vis[src]
    unflipped = next(f for f in flips if not f[0])
    assert unflipped[1] is center and unflipped[2] is kpts


def _half_body_runs(vis, n=N):
    kpts = np.random.default_rng(2).uniform(0, 300, (17, 2)).astype(np.float32)
    center, scale = np.array([150.0, 150.0], np.float32), np.array([300.0, 300.0], np.float32)
    return kpts, [T.random_half_body(r, center, scale, kpts, vis) for r in rngs(n)]


def test_half_body_rates_and_box():
    kpts, runs = _half_body_runs(np.ones(17, np.float32))
    parts = np.array([p for _, _, p in runs], dtype=object)
    applied = parts != None  # noqa: E711
    assert abs(applied.mean() - 0.3) < 0.015
    assert abs(np.mean(parts[applied] == "upper") - 0.7) < 0.03
    c, s, p = next(r for r in runs if r[2] == "upper")
    up = kpts[:11]
    np.testing.assert_allclose(c, up.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(s, (up.max(axis=0) - up.min(axis=0)) * 1.5, rtol=1e-6)
    c, s, p = next(r for r in runs if r[2] == "lower")
    np.testing.assert_allclose(c, kpts[11:].mean(axis=0), rtol=1e-6)


def test_half_body_eligibility():
    # fewer than 9 labelled keypoints: never
    vis = np.zeros(17, np.float32)
    vis[:8] = 1
    _, runs = _half_body_runs(vis, 2000)
    assert all(p is None for _, _, p in runs)
    # 9 upper, 0 lower (lower < 3): the upper body whenever applied
    vis = np.zeros(17, np.float32)
    vis[:9] = 1
    _, runs = _half_body_runs(vis, 4000)
    parts = [p for _, _, p in runs]
    assert set(parts) == {None, "upper"} and abs(parts.count("upper") / 4000 - 0.3) < 0.03
    # 3 upper + 6 lower: both qualify, upper preferred with p 0.7
    vis = np.zeros(17, np.float32)
    vis[[0, 5, 6]] = 1
    vis[11:] = 1
    _, runs = _half_body_runs(vis, 8000)
    parts = [p for _, _, p in runs]
    assert abs(parts.count("upper") / 8000 - 0.3 * 0.7) < 0.02
    assert abs(parts.count("lower") / 8000 - 0.3 * 0.3) < 0.015


def _dot_image(h, w, x, y):
    yy, xx = np.mgrid[:h, :w]
    blob = np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / (2 * 2.5 ** 2)) * 255
    return np.repeat(np.round(blob).astype(np.uint8)[..., None], 3, axis=2)


def _centroid(crop):
    g = crop[..., 0].astype(np.float64)
    g = np.where(g > 0.3 * g.max(), g, 0)
    yy, xx = np.mgrid[: g.shape[0], : g.shape[1]]
    return np.array([(g * xx).sum() / g.sum(), (g * yy).sum() / g.sum()])


@pytest.mark.parametrize("case", range(6))
def test_dot_lands_on_transformed_keypoint(case):
    """Draw a dot at a keypoint, run flip -> half body -> box transform -> warp, find the dot."""
    rng = np.random.default_rng((7, case))
    h, w = 300, 400
    kpts = rng.uniform([60, 60], [w - 60, h - 60], (17, 2)).astype(np.float32)
    vis = np.ones(17, np.float32)
    center = np.array([w / 2, h / 2], np.float32)
    scale = np.array([w * 0.9, h * 0.9], np.float32)
    flipped, center, kp, v = T.random_flip(rng, center, kpts, vis, w)
    if case < 2:  # make sure both branches run
        flipped, center, kp, v = (True, T.flip_center(center, w), *T.flip_keypoints(kpts, vis, w)) \
            if case == 0 else (False, np.array([w / 2, h / 2], np.float32), kpts, vis)
    center, scale, _ = T.random_half_body(rng, center, scale, kp, v)
    center, scale, rot = T.random_bbox_transform(rng, center, scale)
    # The geometry does not depend on pixels: pick the keypoint nearest the crop centre, then
    # draw its dot in the original (unflipped) image.
    _, matrix = T.crop_geometry(center, scale, rot)
    crop_kpts = T.transform_points(kp, matrix)
    kk = int(np.argmin(np.abs(crop_kpts - [95.5, 127.5]).max(axis=1)))
    k = FLIP_INDICES[kk] if flipped else kk
    image = _dot_image(h, w, kpts[k, 0], kpts[k, 1])
    img = T.flip_image(image) if flipped else image
    crop, crop_kpts, _, matrix = T.topdown_affine(img, center, scale, rot, (192, 256), kp)
    want = crop_kpts[kk]
    assert 8 < want[0] < 183 and 8 < want[1] < 247
    assert np.abs(_centroid(crop) - want).max() < 0.35
    # The fast path (flip folded into the matrix, image never flipped) puts it in the same place.
    fast = T.warp_crop(image, T.source_matrix(matrix, flip_width=w if flipped else None), (192, 256))
    assert np.abs(_centroid(fast) - want).max() < 0.35


def test_reduced_source_matrix_keeps_the_dot():
    h, w = 480, 640
    x, y = 301.3, 207.8
    image = _dot_image(h, w, x, y)
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 100])
    center, scale = np.array([320.0, 240.0], np.float32), np.array([200.0, 260.0], np.float32)
    scale_fixed, matrix = T.crop_geometry(center, scale * 2.0, 0.0)  # ~2 image px per crop px
    want = T.transform_points(np.array([[x, y]], np.float32), matrix)[0]
    for f in (1, 2):
        small = cv2.imdecode(buf, {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2}[f])
        crop = T.warp_crop(small, T.source_matrix(matrix, reduce=f))
        assert np.abs(_centroid(crop) - want).max() < 0.3, f
    assert T.choose_reduction(scale_fixed) == 2
    assert T.choose_reduction(scale_fixed / 2) == 1
    assert T.choose_reduction(scale_fixed * 4) == 8


def test_defaults_come_from_the_one_augmentation_constant():
    """The transforms' defaults are AUGMENTATION_LIMITS' fields (the crop cache reads the same
    constant to bound its regions), and they are MMPose's values."""
    import inspect

    limits = T.AUGMENTATION_LIMITS
    defaults = {name: p.default for fn in (T.random_flip, T.random_half_body, T.random_bbox_transform)
                for name, p in inspect.signature(fn).parameters.items() if name != "prob"}
    assert inspect.signature(T.random_flip).parameters["prob"].default == limits.flip_prob == 0.5
    assert inspect.signature(T.random_half_body).parameters["prob"].default == limits.half_body_prob == 0.3
    pairs = {"min_total_keypoints": (limits.half_body_min_keypoints, 9),
             "min_upper_keypoints": (limits.half_body_min_upper_keypoints, 2),
             "min_lower_keypoints": (limits.half_body_min_lower_keypoints, 3),
             "padding": (limits.half_body_padding, 1.5),
             "upper_prioritized_prob": (limits.half_body_upper_prob, 0.7),
             "shift_factor": (limits.shift_factor, 0.16), "shift_prob": (limits.shift_prob, 0.3),
             "scale_factor": (limits.scale_range, (0.5, 1.5)), "scale_prob": (limits.scale_prob, 1.0),
             "rotate_factor": (limits.rotate_limit, 80.0), "rotate_prob": (limits.rotate_prob, 0.6)}
    for name, (field_value, mmpose_value) in pairs.items():
        assert defaults[name] == field_value == mmpose_value, name
