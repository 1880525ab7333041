"""UDP heatmap codec (Huang et al., "The Devil is in the Details", CVPR 2020), as MMPose 1.x runs it.

Sizes are (w, h) and keypoints (x, y), MMPose's conventions. The numbers reproduce MMPose 1.3.2's
`UDPHeatmap` (see docs/data.md §7.1, §7.2 and tests/fixtures/README.md §4), including its quirks:

* encode divides by (input - 1) / (heatmap - 1) but decode multiplies by input / (heatmap - 1),
  so a round trip drifts by up to +1 px at the far edge. This is MMPose's behaviour and the
  published numbers contain it, so it is kept on purpose.
* keypoint_weights is a copy of the visibility (fractional values pass through); it becomes 0
  only when the whole 3-sigma window misses the heatmap (`gaussian_keypoint_weights`, the one
  copy of that rule, shared with the torch encode and the dataset's lazy-target path).
* decode refines the argmax with one Newton step on the log of a blurred map (DARK for UDP).

Everything is vectorised over instances, keypoints and batches; there is no per-joint loop.
The helpers `heatmap_maximum` and `blur_heatmaps` are shared with the MSRA codec.
"""

import math

import cv2
import numpy as np

__all__ = ["UDPHeatmap", "blur_heatmaps", "gaussian_keypoint_weights", "heatmap_maximum", "udp_stride",
           "window_gaussian_heatmaps"]

# Keypoints further than this from the map (in heatmap cells) are never drawn; they are clipped
# before the integer cast only to keep the int64 arithmetic from overflowing.
_FAR = 1.0e6


def _as_numpy_float32(heatmaps):
    """Heatmaps as a float32 numpy array (torch tensors are detached and moved to the CPU)."""
    if hasattr(heatmaps, "detach"):
        heatmaps = heatmaps.detach().cpu().float().numpy()
    return np.asarray(heatmaps, dtype=np.float32)


def _check_heatmaps(codec, heatmaps, batched: bool):
    """float32 numpy heatmaps of shape (B, K, H, W) (batched) or (K, H, W), matching the codec."""
    heatmaps = _as_numpy_float32(heatmaps)
    name = type(codec).__name__
    if heatmaps.ndim != (4 if batched else 3):
        shape = "(B, K, H, W)" if batched else "(K, H, W)"
        method = "batch_decode" if batched else "decode"
        raise ValueError(f"{name}.{method}: heatmaps must have shape {shape}, got {heatmaps.shape}")
    W, H = codec.heatmap_size
    if heatmaps.shape[-2:] != (H, W):
        raise ValueError(f"{name}: heatmaps are {heatmaps.shape[-2:]} (H, W) but the codec expects {(H, W)} "
                         f"(heatmap_size={codec.heatmap_size})")
    return heatmaps


def _check_keypoints(keypoints, keypoints_visible, codec_name):
    keypoints = np.asarray(keypoints)
    if keypoints.ndim != 3 or keypoints.shape[-1] != 2:
        raise ValueError(f"{codec_name}.encode: keypoints must have shape (N, K, 2), got {keypoints.shape}")
    if keypoints_visible is None:
        keypoints_visible = np.ones(keypoints.shape[:2], dtype=np.float32)
    keypoints_visible = np.asarray(keypoints_visible, dtype=np.float32)
    if keypoints_visible.shape != keypoints.shape[:2]:
        raise ValueError(
            f"{codec_name}.encode: keypoints_visible must have shape {keypoints.shape[:2]}, "
            f"got {keypoints_visible.shape}")
    return keypoints, keypoints_visible


def udp_stride(input_size, heatmap_size):
    """Input pixels per heatmap cell of the UDP codec, (w - 1) / (W - 1) and (h - 1) / (H - 1),
    rounded to float32 as MMPose does: keypoints are divided by this to reach heatmap cells."""
    return ((np.array(input_size) - 1) / (np.array(heatmap_size) - 1)).astype(np.float32)


def _array_module(array):
    """numpy for numpy arrays, torch for tensors (imported only when a tensor comes in)."""
    if type(array).__module__.split(".")[0] == "torch":
        import torch

        return torch
    return np


def gaussian_keypoint_weights(keypoints_hm, keypoints_visible, heatmap_size, sigma):
    """The keypoint weights of MMPose's windowed Gaussian targets (UDP, and MSRA's plain one).

    The rule, for numpy arrays and torch tensors alike (the numpy encode, the torch encode and
    the dataset's weights without heatmaps all call this): the weight is the visibility; a
    labelled keypoint (visibility >= 0.5) whose (6 sigma + 1)-cell window lies entirely off the
    map gets weight 0 and no Gaussian. A labelled keypoint with a non-finite coordinate gets the
    same treatment: MMPose casts NaN to an integer (undefined behaviour), and weight 0 is the
    only answer that cannot poison the loss.

    MMPose tests the window with integer casts: mu = int(k + 0.5), left = int(mu - 3 sigma),
    right = int(mu + 3 sigma + 1), and drops the keypoint when left >= W or right < 0 (same for
    y with H). For an integer A >= 1, int(t) >= A exactly when t >= A, and for an integer
    B <= -1, int(t) <= B exactly when t <= B; so the rule is two comparisons of t = k + 0.5
    (computed in the keypoints' dtype, as MMPose does) with integer thresholds. That needs no
    integer cast, so it is defined for any magnitude, and equals MMPose wherever MMPose's
    int64 cast is defined.

    Args:
        keypoints_hm: (..., K, 2) keypoints in heatmap cells (numpy array or torch tensor).
        keypoints_visible: (..., K) visibility, same kind and float dtype as the weights wanted.
        heatmap_size: (W, H).
        sigma: Gaussian sigma in cells (the window radius is 3 sigma).

    Returns:
        (weights (..., K), drawn (..., K) bool): the weights, and which keypoints get a Gaussian.
    """
    xp = _array_module(keypoints_hm)
    radius = float(sigma) * 3
    width, height = int(heatmap_size[0]), int(heatmap_size[1])
    # left >= W  <=>  mu >= W + radius  <=>  t >= ceil(W + radius)
    x_beyond, y_beyond = math.ceil(width + radius), math.ceil(height + radius)
    # right < 0  <=>  mu + radius + 1 <= -1  <=>  t <= floor(-radius - 2)
    before = math.floor(-radius - 2)
    t = keypoints_hm + 0.5
    x, y = t[..., 0], t[..., 1]
    off_map = (x >= x_beyond) | (y >= y_beyond) | (x <= before) | (y <= before)
    off_map = off_map | ~xp.isfinite(t).all(-1)
    labelled = keypoints_visible >= 0.5
    dropped = labelled & off_map
    weights = xp.where(dropped, xp.zeros_like(keypoints_visible), keypoints_visible)
    return weights, labelled & ~off_map


def window_gaussian_heatmaps(heatmap_size, keypoints_hm, keypoints_visible, sigma, subpixel):
    """Draw one unnormalised Gaussian per visible keypoint inside its (6 sigma + 1)^2 window.

    MMPose's `generate_udp_gaussian_heatmaps` (subpixel=True: centred on the exact location) and
    `generate_gaussian_heatmaps` (subpixel=False: centred on the integer cell), vectorised.

    keypoints_hm (N, K, 2) in heatmap cells, keypoints_visible (N, K).
    Returns heatmaps (K, H, W) float32 (instances merged by max) and weights (N, K) float32.
    """
    W, H = heatmap_size
    weights, drawn = gaussian_keypoint_weights(keypoints_hm, np.asarray(keypoints_visible, np.float32),
                                               heatmap_size, sigma)
    radius = sigma * 3
    window = 2 * radius + 1
    window_cells = len(np.arange(0, window, 1))  # what MMPose's arange gives
    centre_in_window = window // 2

    # Keypoints that are not drawn may be NaN or huge; any finite stand-in keeps the integer
    # arithmetic below defined (drawn keypoints are near the map and pass unchanged).
    kpt = np.clip(np.nan_to_num(keypoints_hm, nan=0.0), -_FAR, _FAR)
    # Python's int() of (x + 0.5): truncation toward zero, so -0.7 -> 0, not -1.
    mu = (kpt + 0.5).astype(np.int64)
    low = (mu - radius).astype(np.int64)             # left, top
    high = (mu + radius + 1).astype(np.int64)        # right, bottom (exclusive)

    # Window centre in window coordinates, rounded to float32 once as MMPose's numpy 1.x did.
    if subpixel:
        centre = (centre_in_window + (kpt.astype(np.float64) - mu)).astype(np.float32)
    else:
        centre = np.full(kpt.shape, centre_in_window, dtype=np.float32)

    # Evaluate the Gaussian on each keypoint's window only (K x 13 x 13 values, not K x H x W),
    # then scatter the cells that fall on the map.
    steps = np.arange(window_cells, dtype=np.int64)

    def axis_terms(size, axis):
        cells = low[..., axis, None] + steps                       # (N, K, window) map cells
        inside = (cells >= 0) & (cells < size) & (cells < high[..., axis, None])
        d = steps.astype(np.float32) - centre[..., axis, None]
        return d * d, cells, inside

    dx2, cells_x, in_x = axis_terms(W, 0)
    dy2, cells_y, in_y = axis_terms(H, 1)
    # Same float32 operation order as MMPose: (x - x0)^2 + (y - y0)^2, / (2 sigma^2), exp.
    exponent = (dx2[..., None, :] + dy2[..., :, None]) / np.float32(2 * sigma ** 2)
    gauss = np.exp(-exponent)
    mask = in_y[..., :, None] & in_x[..., None, :] & drawn[..., None, None]

    N, K = kpt.shape[:2]
    heatmaps = np.zeros((K, H, W), dtype=np.float32)
    k_index = np.broadcast_to(np.arange(K)[:, None, None], mask.shape[1:])
    for n in range(N):  # instances: cells of one instance never collide, so a plain max-assign works
        m = mask[n]
        where = (k_index[m], np.broadcast_to(cells_y[n][:, :, None], m.shape)[m],
                 np.broadcast_to(cells_x[n][:, None, :], m.shape)[m])
        heatmaps[where] = np.maximum(heatmaps[where], gauss[n][m])
    return heatmaps, weights


def heatmap_maximum(heatmaps):
    """Argmax location (x, y) and value of each map; location -1 where the maximum is <= 0.

    heatmaps (..., H, W) -> locations (..., 2) float32, values (...) float32.
    """
    H, W = heatmaps.shape[-2:]
    flat = heatmaps.reshape(*heatmaps.shape[:-2], H * W)
    index = flat.argmax(-1)
    values = flat.max(-1)
    locations = np.stack([index % W, index // W], axis=-1).astype(np.float32)
    locations[values <= 0] = -1
    return locations, values


def blur_heatmaps(heatmaps, kernel_size=11):
    """MMPose's `gaussian_blur`: blur each map on a zero-padded copy, rescale to its own max.

    heatmaps (C, H, W) float32 -> new (C, H, W) float32. An all-zero map becomes NaN (0/0), as
    in MMPose. The maps are stacked in one tall single-channel image with `border` zero rows
    between them, so one cv2 call blurs them all and each output equals a per-map blur exactly.
    """
    if kernel_size % 2 != 1:
        raise ValueError(f"blur kernel size must be odd, got {kernel_size}")
    border = (kernel_size - 1) // 2
    C, H, W = heatmaps.shape
    if C == 0:
        return heatmaps.copy()
    tall = np.zeros((C, H + border, W + 2 * border), dtype=np.float32)
    tall[:, border:, border:border + W] = heatmaps
    tall = np.concatenate([tall.reshape(C * (H + border), W + 2 * border),
                           np.zeros((border, W + 2 * border), np.float32)])
    blurred = cv2.GaussianBlur(tall, (kernel_size, kernel_size), 0)
    blurred = blurred[:-border].reshape(C, H + border, W + 2 * border)[:, border:, border:border + W]
    original_max = heatmaps.reshape(C, -1).max(-1)
    blurred_max = blurred.reshape(C, -1).max(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (original_max / blurred_max).astype(np.float32)
    return blurred * ratio[:, None, None]


def refine_dark_udp(locations, heatmaps, kernel_size=11):
    """One Newton step on the log of the blurred maps (MMPose's `refine_keypoints_dark_udp`).

    locations (B, K, 2) float32 integer argmax cells (or -1), heatmaps (B, K, H, W) float32.
    Returns refined locations (B, K, 2) float32.
    """
    B, K, H, W = heatmaps.shape
    blurred = blur_heatmaps(heatmaps.reshape(B * K, H, W), kernel_size)
    # MMPose clips and takes the log of whole maps; both are elementwise, so doing it on the
    # seven gathered values per keypoint (below) gives the same numbers for far less work.
    padded = np.pad(blurred, ((0, 0), (1, 1), (1, 1)), mode="edge").reshape(B, -1)
    row = W + 2
    # Flat index into each sample's (K, H+2, W+2) block, as MMPose computes it. A location of -1
    # makes index - 1 negative for keypoint 0, which numpy wraps to the block's end: the
    # modulo reproduces that.
    index = (locations[..., 0] + 1 + (locations[..., 1] + 1) * row).astype(np.int64)
    index += row * (H + 2) * np.arange(K)

    def at(shift):
        values = np.take_along_axis(padded, (index + shift) % padded.shape[1], axis=1)
        with np.errstate(invalid="ignore"):
            return np.log(np.clip(values, np.float32(1e-3), np.float32(50.0)))

    centre = at(0)
    right, left = at(1), at(-1)
    down, up = at(row), at(-row)
    down_right, up_left = at(row + 1), at(-row - 1)

    dx = 0.5 * (right - left)
    dy = 0.5 * (down - up)
    dxx = right - 2 * centre + left
    dyy = down - 2 * centre + up
    dxy = 0.5 * (down_right - right - down + centre + centre - left - up + up_left)

    # (Hessian + eps I)^-1 @ gradient in float64, closed form for the symmetric 2x2 matrix.
    eps = np.finfo(np.float32).eps
    a = dxx.astype(np.float64) + eps
    b = dxy.astype(np.float64)
    d = dyy.astype(np.float64) + eps
    with np.errstate(divide="ignore", invalid="ignore"):
        det = a * d - b * b
        step_x = (d * dx - b * dy) / det
        step_y = (a * dy - b * dx) / det
    # MMPose's np.linalg.inv raises on an exactly singular Hessian; leave such points unmoved.
    singular = det == 0
    step_x[singular] = 0
    step_y[singular] = 0
    refined = locations.copy()
    refined[..., 0] -= step_x.astype(np.float64)  # subtracted into float32, like MMPose
    refined[..., 1] -= step_y.astype(np.float64)
    return refined


class GaussianHeatmapCodec:
    """What the Gaussian heatmap codecs share: the keypoint weights of `encode` without drawing the
    heatmaps, and `decode` as `batch_decode` of one. A codec sets `heatmap_size`, `sigma`,
    `scale_factor` and defines `encode` and `batch_decode`."""

    # the arguments `__repr__` shows, in the constructor's order
    repr_fields: tuple[str, ...] = ("input_size", "heatmap_size", "sigma", "blur_kernel_size")

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{name}={getattr(self, name)}' for name in self.repr_fields)})"

    def keypoint_weights(self, keypoints, keypoints_visible=None):
        """The keypoint_weights of `encode` (N, K) float32 without drawing the heatmaps."""
        keypoints, keypoints_visible = _check_keypoints(keypoints, keypoints_visible, type(self).__name__)
        return gaussian_keypoint_weights(keypoints / self.scale_factor, keypoints_visible,
                                         self.heatmap_size, self.sigma)[0]

    def decode(self, heatmaps):
        """heatmaps (K, H, W) -> keypoints (1, K, 2) in input pixels, scores (1, K) float32."""
        return self.batch_decode(_check_heatmaps(self, heatmaps, batched=False)[None])


class UDPHeatmap(GaussianHeatmapCodec):
    """Keypoints <-> UDP Gaussian heatmaps.

    Args:
        input_size: (w, h) of the model input crop.
        heatmap_size: (W, H) of the heatmaps.
        sigma: Gaussian sigma in heatmap cells.
        blur_kernel_size: kernel of the DARK-UDP blur at decode time (11 matches sigma 2).
    """

    # The flip test needs no 1-cell shift: UDP maps input x to heatmap x * (W - 1) / (w - 1), so a
    # mirrored crop's x -> w - 1 - x lands exactly on W - 1 - x_hm (MMPose: shift_heatmap=False).
    flip_shift = False

    def __init__(self, input_size=(192, 256), heatmap_size=(48, 64), sigma=2.0, blur_kernel_size=11):
        self.input_size = tuple(int(v) for v in input_size)
        self.heatmap_size = tuple(int(v) for v in heatmap_size)
        self.sigma = sigma
        self.blur_kernel_size = blur_kernel_size
        # float32 as in MMPose: the division below must round the same way.
        self.scale_factor = udp_stride(self.input_size, self.heatmap_size)

    def encode(self, keypoints, keypoints_visible=None):
        """keypoints (N, K, 2) in input-crop pixels, keypoints_visible (N, K) ->
        heatmaps (K, H, W) float32 (instances merged by max), keypoint_weights (N, K) float32."""
        keypoints, keypoints_visible = _check_keypoints(keypoints, keypoints_visible, type(self).__name__)
        return window_gaussian_heatmaps(self.heatmap_size, keypoints / self.scale_factor,
                                        keypoints_visible, self.sigma, subpixel=True)

    def batch_decode(self, heatmaps):
        """heatmaps (B, K, H, W) -> keypoints (B, K, 2) float64 in input pixels, scores (B, K) float32."""
        heatmaps = _check_heatmaps(self, heatmaps, batched=True)
        W, H = self.heatmap_size
        locations, scores = heatmap_maximum(heatmaps)
        locations = refine_dark_udp(locations, heatmaps, self.blur_kernel_size)
        # MMPose's output scale: x_hm / (W - 1) * w, computed in float64.
        keypoints = locations / np.array([W - 1, H - 1]) * np.array(self.input_size)
        return keypoints, scores
