"""MSRA heatmap codec (Xiao et al., "Simple Baselines", 2018), plain and DARK, as MMPose 1.x runs it.

The published ViTPose models use UDP; `model.codec: msra` trains with this one (plain, not DARK;
docs/model.md "Codec"), and it is the contrast case of docs/data.md §7.4. Stride is exactly
input / heatmap (4 for 192x256 -> 48x64).

* plain (unbiased=False): Gaussian centred on the integer cell int(x / 4 + 0.5); decode = argmax
  plus 0.25 cell toward the larger neighbour, then x 4.
* DARK (unbiased=True): Gaussian centred on the exact sub-pixel location over the whole map;
  decode = blur (kernel 11) + log + one second-order Taylor step, only away from the borders.
"""

import numpy as np

from .udp import (
    GaussianHeatmapCodec,
    _check_heatmaps,
    _check_keypoints,
    blur_heatmaps,
    heatmap_maximum,
    window_gaussian_heatmaps,
)

__all__ = ["MSRAHeatmap"]


def _unbiased_gaussian_heatmaps(heatmap_size, keypoints_hm, keypoints_visible, sigma):
    """MMPose's `generate_unbiased_gaussian_heatmaps`, vectorised: (K, H, W) f32, (N, K) f32."""
    W, H = heatmap_size
    weights = np.array(keypoints_visible, dtype=np.float32, copy=True)
    radius = sigma * 3
    drawn = keypoints_visible >= 0.5
    low = keypoints_hm - radius
    high = keypoints_hm + radius + 1
    with np.errstate(invalid="ignore"):
        misses = (low[..., 0] >= W) | (low[..., 1] >= H) | (high[..., 0] < 0) | (high[..., 1] < 0)
    weights[drawn & misses] = 0
    drawn &= ~misses
    x = np.arange(W, dtype=np.float32)
    y = np.arange(H, dtype=np.float32)
    mu = keypoints_hm.astype(np.float32)
    dx = x - mu[..., 0, None]
    dy = y - mu[..., 1, None]
    exponent = (dx[..., None, :] ** 2 + dy[..., :, None] ** 2) / np.float32(2 * sigma ** 2)
    gauss = np.where(drawn[..., None, None], np.exp(-exponent), np.float32(0))
    heatmaps = gauss.max(axis=0) if gauss.shape[0] else np.zeros((mu.shape[1], H, W), np.float32)
    return heatmaps.astype(np.float32, copy=False), weights


def _refine_quarter_pixel(locations, heatmaps):
    """Move each argmax 0.25 cell toward the larger neighbour (MMPose's `refine_keypoints`).

    The x step needs 1 < x < W-1 and 0 < y < H; the y step 1 < y < H-1 and 0 < x < W.
    """
    B, K, H, W = heatmaps.shape
    x = locations[..., 0].astype(np.int64)
    y = locations[..., 1].astype(np.int64)
    b, k = np.indices((B, K))

    def value(yy, xx):
        return heatmaps[b, k, np.clip(yy, 0, H - 1), np.clip(xx, 0, W - 1)]

    use_x = (x > 1) & (x < W - 1) & (y > 0) & (y < H)
    use_y = (y > 1) & (y < H - 1) & (x > 0) & (x < W)
    dx = np.where(use_x, value(y, x + 1) - value(y, x - 1), np.float32(0))
    dy = np.where(use_y, value(y + 1, x) - value(y - 1, x), np.float32(0))
    step = np.sign(np.stack([dx, dy], axis=-1)).astype(np.float32) * np.float32(0.25)
    return locations + step


def _refine_dark(locations, heatmaps, kernel_size):
    """DARK Taylor step (MMPose's `refine_keypoints_dark`) with MMPose's arithmetic.

    The log of the blurred map is float32, as in MMPose. MMPose then takes the derivatives one
    keypoint at a time from numpy float32 scalars and Python numbers, which NumPy 1.x (what
    MMPose ran under) promotes to float64: the first differences and the mixed second difference
    are float32 subtractions scaled in float64, the pure second differences (which double the
    centre value) are float64 throughout, and the Newton step solves the 2x2 Hessian with
    np.linalg.inv in float64 before adding it to the float32 location
    (docs/mmpose-edge-cases.md §6). Applied only where 1 < x < W-2 and 1 < y < H-2 and the
    Hessian's determinant is not 0.
    """
    B, K, H, W = heatmaps.shape
    logmaps = blur_heatmaps(heatmaps.reshape(B * K, H, W), kernel_size).reshape(B, K, H, W)
    with np.errstate(invalid="ignore", divide="ignore"):
        np.maximum(logmaps, np.float32(1e-10), out=logmaps)
        np.log(logmaps, out=logmaps)
    x = locations[..., 0].astype(np.int64)
    y = locations[..., 1].astype(np.int64)
    inside = (x > 1) & (x < W - 2) & (y > 1) & (y < H - 2)
    x = np.where(inside, x, 2)
    y = np.where(inside, y, 2)
    b, k = np.indices((B, K))

    def at(dy_, dx_):  # float32 values, as MMPose indexes them
        return logmaps[b, k, y + dy_, x + dx_]

    def f64(values):
        return values.astype(np.float64)

    dx = 0.5 * f64(at(0, 1) - at(0, -1))
    dy = 0.5 * f64(at(1, 0) - at(-1, 0))
    dxx = 0.25 * ((f64(at(0, 2)) - 2 * f64(at(0, 0))) + f64(at(0, -2)))
    dyy = 0.25 * ((f64(at(2, 0)) - 2 * f64(at(0, 0))) + f64(at(-2, 0)))
    dxy = 0.25 * f64(((at(1, 1) - at(-1, 1)) - at(1, -1)) + at(-1, -1))
    usable = inside & (dxx * dyy - dxy ** 2 != 0)
    refined = locations.copy()
    if usable.any():
        hessian = np.stack([np.stack([dxx, dxy], -1), np.stack([dxy, dyy], -1)], -2)[usable]  # (M, 2, 2)
        derivative = np.stack([dx, dy], -1)[usable][..., None]  # (M, 2, 1)
        offset = (-np.linalg.inv(hessian) @ derivative)[..., 0]
        refined[usable] = (f64(locations[usable]) + offset).astype(np.float32)
    return refined


class MSRAHeatmap(GaussianHeatmapCodec):
    """Keypoints <-> MSRA Gaussian heatmaps (plain or DARK).

    Args:
        input_size: (w, h) of the model input crop.
        heatmap_size: (W, H) of the heatmaps.
        sigma: Gaussian sigma in heatmap cells.
        unbiased: DARK encoding and decoding (Zhang et al., 2020).
        blur_kernel_size: kernel of the DARK blur at decode time (11 matches sigma 2).
    """

    # The flip test shifts the flipped-back maps one cell right (MMPose's shift_heatmap=True for
    # MSRA configs): input x -> x / s cells, so a mirrored crop's w - 1 - x flips back to
    # x / s - (s - 1) / s cells, 0.75 of a cell left of the unflipped peak for s = 4; the shift
    # leaves 0.25 of a cell to the right.
    flip_shift = True
    repr_fields = ("input_size", "heatmap_size", "sigma", "unbiased", "blur_kernel_size")

    def __init__(self, input_size=(192, 256), heatmap_size=(48, 64), sigma=2.0, unbiased=False,
                 blur_kernel_size=11):
        self.input_size = tuple(int(v) for v in input_size)
        self.heatmap_size = tuple(int(v) for v in heatmap_size)
        self.sigma = sigma
        self.unbiased = unbiased
        self.blur_kernel_size = blur_kernel_size
        self.scale_factor = (np.array(self.input_size) / np.array(self.heatmap_size)).astype(np.float32)

    def encode(self, keypoints, keypoints_visible=None):
        """keypoints (N, K, 2) in input-crop pixels, keypoints_visible (N, K) ->
        heatmaps (K, H, W) float32 (instances merged by max), keypoint_weights (N, K) float32."""
        keypoints, keypoints_visible = _check_keypoints(keypoints, keypoints_visible, type(self).__name__)
        keypoints_hm = keypoints / self.scale_factor
        if self.unbiased:
            return _unbiased_gaussian_heatmaps(self.heatmap_size, keypoints_hm, keypoints_visible, self.sigma)
        return window_gaussian_heatmaps(self.heatmap_size, keypoints_hm, keypoints_visible, self.sigma,
                                        subpixel=False)

    def keypoint_weights(self, keypoints, keypoints_visible=None):
        """The keypoint_weights of `encode` (N, K) float32 (without drawing heatmaps when plain)."""
        if self.unbiased:  # DARK's own 3-sigma rule, without integer cells: what encode computes
            return self.encode(keypoints, keypoints_visible)[1]
        return super().keypoint_weights(keypoints, keypoints_visible)

    def batch_decode(self, heatmaps):
        """heatmaps (B, K, H, W) -> keypoints (B, K, 2) float32 in input pixels, scores (B, K) float32."""
        heatmaps = _check_heatmaps(self, heatmaps, batched=True)
        locations, scores = heatmap_maximum(heatmaps)
        if self.unbiased:
            locations = _refine_dark(locations, heatmaps, self.blur_kernel_size)
        else:
            locations = _refine_quarter_pixel(locations, heatmaps)
        return locations * self.scale_factor, scores
