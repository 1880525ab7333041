"""Top-down augmentation with MMPose 1.x semantics, each a function of an explicit Generator.

The train pipeline is MMPose's `RandomFlip -> RandomHalfBody -> RandomBBoxTransform ->
TopdownAffine(use_udp=True)` with the same defaults (docs/data.md §5). Each random step takes
a `np.random.Generator`; the dataset makes one per sample from (seed, epoch, index), so the
stream of augmentations does not depend on workers, prefetching or timing.

Only `topdown_affine` touches pixels; the random steps move the box (centre, scale, rotation)
and the keypoints. That lets the dataset settle the whole geometry before it decodes the image,
so the flip can be folded into the warp and the decoder can skip resolution the crop throws
away (`source_matrix`, `choose_reduction`).
"""

from dataclasses import dataclass
from statistics import NormalDist

import cv2
import numpy as np

from ..coco_meta import FLIP_INDICES, LOWER_BODY_IDS, UPPER_BODY_IDS
from .geometry import fix_aspect_ratio, get_udp_warp_matrix, transform_points

_NORMAL = NormalDist()  # the standard normal's CDF and inverse CDF, from the standard library


@dataclass(frozen=True)
class AugmentationLimits:
    """The settings of the random train augmentation: MMPose's defaults for `RandomFlip`,
    `RandomHalfBody` and `RandomBBoxTransform`, which ViTPose's config keeps.

    The functions below take their defaults from `AUGMENTATION_LIMITS`, and the crop cache
    bounds the image region a crop can read from the same instance (crop_cache.py), so the
    two cannot drift apart.
    """

    flip_prob: float = 0.5
    half_body_prob: float = 0.3
    half_body_min_keypoints: int = 9  # labelled keypoints an instance needs for a half-body box
    half_body_min_upper_keypoints: int = 2
    half_body_min_lower_keypoints: int = 3
    half_body_padding: float = 1.5  # the half-body box is the keypoints' extent x this
    half_body_upper_prob: float = 0.7  # preference for the upper body when both qualify
    shift_factor: float = 0.16  # centre shift, at most this x the (padded) box size per axis
    shift_prob: float = 0.3
    scale_range: tuple[float, float] = (0.5, 1.5)  # box size factor
    scale_prob: float = 1.0
    rotate_limit: float = 80.0  # degrees, either way
    rotate_prob: float = 0.6


AUGMENTATION_LIMITS = AugmentationLimits()


def truncated_normal(rng: np.random.Generator, size, low: float = -1.0, high: float = 1.0):
    """Standard normal truncated to [low, high] (scipy's truncnorm), float32 like MMPose.

    Inverse-CDF sampling: one uniform draw per value, no rejection loop.
    """
    u = rng.uniform(_NORMAL.cdf(low), _NORMAL.cdf(high), size)
    return np.array([_NORMAL.inv_cdf(float(v)) for v in np.ravel(u)], np.float64).reshape(np.shape(u)).astype(np.float32)


# ---------------------------------------------------------------------------------- flip

def flip_keypoints(keypoints, keypoints_visible, image_width, flip_indices=FLIP_INDICES):
    """Mirror keypoints (K, 2) in an image of the given width: x' = W - 1 - x, left<->right."""
    idx = np.asarray(flip_indices)
    kpts = keypoints[idx].copy()
    kpts[:, 0] = image_width - 1 - kpts[:, 0]
    return kpts, keypoints_visible[idx].copy()


def flip_center(center, image_width):
    out = center.copy()
    out[0] = image_width - 1 - center[0]
    return out


def flip_image(image):
    return cv2.flip(image, 1)


def random_flip(rng, center, keypoints, keypoints_visible, image_width, prob=AUGMENTATION_LIMITS.flip_prob,
                flip_indices=FLIP_INDICES):
    """MMPose `RandomFlip(direction='horizontal', prob=0.5)` on the box centre and keypoints.

    Returns (flipped, center, keypoints, keypoints_visible). The image is not touched: flip it
    with `flip_image`, or fold the flip into the warp with `source_matrix(..., flip_width=W)`.
    """
    if rng.random() >= prob:
        return False, center, keypoints, keypoints_visible
    kpts, vis = flip_keypoints(keypoints, keypoints_visible, image_width, flip_indices)
    return True, flip_center(center, image_width), kpts, vis


# ------------------------------------------------------------------------------ half body

def half_body_box(keypoints, ids, padding=AUGMENTATION_LIMITS.half_body_padding):
    """Centre = mean of the chosen keypoints, scale = their extent x padding (no aspect fix)."""
    pts = keypoints[ids]
    center = pts.mean(axis=0)
    extent = pts.max(axis=0) - pts.min(axis=0)
    return center, np.asarray(extent * padding, dtype=center.dtype)


def random_half_body(rng, center, scale, keypoints, keypoints_visible, *,
                     min_total_keypoints=AUGMENTATION_LIMITS.half_body_min_keypoints,
                     min_upper_keypoints=AUGMENTATION_LIMITS.half_body_min_upper_keypoints,
                     min_lower_keypoints=AUGMENTATION_LIMITS.half_body_min_lower_keypoints,
                     padding=AUGMENTATION_LIMITS.half_body_padding, prob=AUGMENTATION_LIMITS.half_body_prob,
                     upper_prioritized_prob=AUGMENTATION_LIMITS.half_body_upper_prob,
                     upper_body_ids=UPPER_BODY_IDS, lower_body_ids=LOWER_BODY_IDS):
    """MMPose `RandomHalfBody` defaults: with prob 0.3 (when >= 9 keypoints are labelled) the
    box becomes the box of the upper body (preferred with prob 0.7) or the lower body.

    Returns (center, scale, part) with part None, "upper" or "lower". The draws follow MMPose:
    one gate draw when eligible, then one preference draw.
    """
    if keypoints_visible.sum() < min_total_keypoints:
        return center, scale, None
    if rng.random() > prob:
        return center, scale, None
    upper = [i for i in upper_body_ids if keypoints_visible[i] > 0]
    lower = [i for i in lower_body_ids if keypoints_visible[i] > 0]
    prefer_upper = rng.random() < upper_prioritized_prob
    upper_ok = len(upper) >= min_upper_keypoints
    lower_ok = len(lower) >= min_lower_keypoints
    if not upper_ok and not lower_ok:
        return center, scale, None
    use_upper = upper_ok and (prefer_upper or not lower_ok)
    new_center, new_scale = half_body_box(keypoints, upper if use_upper else lower, padding)
    if not (new_scale.max() > 0):
        # All chosen keypoints on one spot: MMPose would warp with an infinite scale. Keep the
        # full box instead (a rare annotation artefact; documented deviation).
        return center, scale, None
    return new_center, new_scale, "upper" if use_upper else "lower"


# ------------------------------------------------------------------ shift / scale / rotate

def random_bbox_transform(rng, center, scale, *, shift_factor=AUGMENTATION_LIMITS.shift_factor,
                          shift_prob=AUGMENTATION_LIMITS.shift_prob, scale_factor=AUGMENTATION_LIMITS.scale_range,
                          scale_prob=AUGMENTATION_LIMITS.scale_prob, rotate_factor=AUGMENTATION_LIMITS.rotate_limit,
                          rotate_prob=AUGMENTATION_LIMITS.rotate_prob):
    """MMPose `RandomBBoxTransform` defaults, draw for draw in the same order: four values of
    a standard normal truncated to [-1, 1] (shift x, shift y, scale, rotation), then the shift,
    scale and rotation gates.

    Shift is relative to the current (padded, not aspect-fixed) scale. Returns (center, scale,
    rotation in degrees), float32.
    """
    t = truncated_normal(rng, 4)
    gates = rng.random(3)
    offset = t[:2] * np.float32(shift_factor) if gates[0] < shift_prob else np.zeros(2, np.float32)
    lo, hi = scale_factor
    factor = t[2] * np.float32((hi - lo) * 0.5) + np.float32((hi + lo) * 0.5) \
        if gates[1] < scale_prob else np.float32(1.0)
    rotation = t[3] * np.float32(rotate_factor) if gates[2] < rotate_prob else np.float32(0.0)
    center = (center + offset * scale).astype(np.float32)
    scale = (scale * factor).astype(np.float32)
    return center, scale, np.float32(rotation)


# --------------------------------------------------------------------------- the warp

def warp_crop(image, matrix, input_size=(192, 256)):
    """`cv2.warpAffine` bilinear, constant-0 border: bit-identical to MMPose's TopdownAffine."""
    return cv2.warpAffine(image, np.asarray(matrix), (int(input_size[0]), int(input_size[1])),
                          flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0)


def crop_geometry(center, scale, rotation=0.0, input_size=(192, 256)):
    """Aspect fix (enlarge to w/h of the input) then MMPose's UDP warp matrix.

    Returns (aspect-fixed scale float32 (2,), matrix (2, 3) float32).
    """
    w, h = input_size
    scale = np.asarray(fix_aspect_ratio(np.asarray(scale, np.float32), w / h), np.float32)
    matrix = get_udp_warp_matrix(np.asarray(center, np.float32), scale, rotation, (w, h))
    return scale.reshape(2), np.asarray(matrix, np.float32)


def topdown_affine(image, center, scale, rotation=0.0, input_size=(192, 256), keypoints=None):
    """MMPose `TopdownAffine(input_size, use_udp=True)`.

    Returns (crop uint8 (h, w, C), keypoints in crop pixels or None, aspect-fixed scale, matrix).
    """
    scale, matrix = crop_geometry(center, scale, rotation, input_size)
    crop = warp_crop(image, matrix, input_size)
    kpts = None if keypoints is None else transform_points(keypoints, matrix)
    return crop, kpts, scale, matrix


def source_matrix(matrix, flip_width=None, reduce=1):
    """The warp matrix to apply to the *unflipped*, possibly reduced, decoded image.

    `matrix` maps (flipped, full-resolution) image pixels to crop pixels. A horizontal flip is
    x_f = W - 1 - x; a 1/f reduced JPEG pixel x_r sits at full-resolution x = f*x_r + (f-1)/2.
    Composing these avoids flipping (and decoding) pixels the crop never uses.
    """
    m = np.vstack([np.asarray(matrix, np.float64), [0.0, 0.0, 1.0]])
    if flip_width is not None:
        m = m @ np.array([[-1.0, 0.0, flip_width - 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    if reduce > 1:
        off = (reduce - 1.0) / 2.0
        m = m @ np.array([[reduce, 0.0, off], [0.0, reduce, off], [0.0, 0.0, 1.0]])
    return m[:2]


def choose_reduction(scale_fixed, input_size=(192, 256), max_reduce=8, margin=1.0):
    """Largest JPEG reduction f in {1, 2, 4, 8} with f <= (image px per crop px) / margin.

    When the crop shrinks the box by d image pixels per crop pixel, a 1/f decode with f <= d
    still has at least one source pixel per output pixel, so little detail is lost.
    """
    w, h = input_size
    d = min(float(scale_fixed[0]) / (w - 1), float(scale_fixed[1]) / (h - 1)) / margin
    f = 1
    while f * 2 <= min(d, max_reduce):
        f *= 2
    return f


# ------------------------------------------------------------------ photometric (optional)

def build_photometric(transforms=None):
    """Optional albumentations photometric stage (ViTPose uses none; off by default).

    `transforms`: a list of albumentations transforms that do not move pixels (colour,
    blur, noise). Imported lazily so albumentations is needed only when this is used.
    Returns a function image -> image, or None.
    """
    if not transforms:
        return None
    import albumentations as A  # noqa: PLC0415 - optional dependency

    compose = A.Compose(list(transforms))

    def apply(image):
        return compose(image=image)["image"]

    return apply



def topdown_crops(image, center, scale, input_size=(192, 256)):
    """UDP crops of several boxes of one image: uint8 (M, 3, h, w) in the image's channel order
    and the aspect-fixed scales (M, 2) float32 (what `Predictor` and `OnnxPredictor` feed)."""
    out, scales = [], []
    for c, s in zip(center, scale):
        crop, _, fixed, _ = topdown_affine(image, c, s, 0.0, input_size)
        out.append(crop.transpose(2, 0, 1))
        scales.append(fixed)
    w, h = input_size
    if not out:
        return np.zeros((0, 3, h, w), np.uint8), np.zeros((0, 2), np.float32)
    return np.stack(out), np.stack(scales).astype(np.float32)
