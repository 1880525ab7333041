"""Box and crop geometry of top-down pose estimation, with MMPose 1.x's numbers.

Conventions (MMPose's): boxes are pixels, `center` = (x, y), `scale` = (w, h) of the box (no
200-px unit), sizes are (w, h), rotations are degrees, counter-clockwise in the image.
The UDP warp maps the box centre to ((w - 1) / 2, (h - 1) / 2) of the crop, and a box of
`scale` pixels onto w - 1 by h - 1 crop pixels (docs/data.md §6.1).

Precision follows MMPose exactly where it decides pixels: the rotation keeps the dtype it comes
in (TopdownAffine passes a float32 value, and so does this project's pipeline; a Python float is
float64) and the UDP matrix is rounded to float32, so that `cv2.warpAffine` with these matrices
reproduces MMPose's crops bit for bit.
"""

import math

import cv2
import numpy as np

from ..codecs.decode import crop_to_image  # the inverse mapping lives with the decode; kept importable here

__all__ = [
    "bbox_xywh2xyxy",
    "bbox_xyxy2cs",
    "bbox_xyxy2xywh",
    "crop_to_image",
    "fix_aspect_ratio",
    "get_udp_warp_matrix",
    "get_warp_matrix",
    "transform_points",
]


def bbox_xywh2xyxy(bbox):
    """(..., 4) boxes (x, y, w, h) -> (x1, y1, x2, y2) with x2 = x + w (MMPose, no -1)."""
    bbox = np.array(bbox, copy=True)
    bbox[..., 2] = bbox[..., 0] + bbox[..., 2]
    bbox[..., 3] = bbox[..., 1] + bbox[..., 3]
    return bbox


def bbox_xyxy2xywh(bbox):
    """(..., 4) boxes (x1, y1, x2, y2) -> (x, y, w, h) with w = x2 - x1 (MMPose, no +1).

    Computed in the boxes' dtype, so float32 boxes give MMPose's float32 sizes.
    """
    bbox = np.array(bbox, copy=True)
    bbox[..., 2] = bbox[..., 2] - bbox[..., 0]
    bbox[..., 3] = bbox[..., 3] - bbox[..., 1]
    return bbox


def bbox_xyxy2cs(bbox, padding=1.25):
    """(..., 4) boxes (x1, y1, x2, y2) -> center (..., 2), scale (..., 2) = size * padding."""
    bbox = np.asarray(bbox)
    if bbox.shape[-1] != 4:
        raise ValueError(f"bbox_xyxy2cs: boxes must have shape (..., 4), got {bbox.shape}")
    scale = (bbox[..., 2:] - bbox[..., :2]) * padding
    center = (bbox[..., 2:] + bbox[..., :2]) * 0.5
    return center, scale


def fix_aspect_ratio(scale, aspect_ratio=0.75):
    """Enlarge (never shrink) box sizes (..., 2) to w / h = aspect_ratio (TopdownAffine's rule)."""
    scale = np.asarray(scale)
    w, h = scale[..., :1], scale[..., 1:]
    return np.where(w > h * aspect_ratio,
                    np.concatenate([w, w / aspect_ratio], axis=-1),
                    np.concatenate([h * aspect_ratio, h], axis=-1))


def _radians(rot):
    # MMPose calls np.deg2rad on whatever it is given: a float32 rotation (TopdownAffine's) gives
    # float32 radians, a Python float or float64 gives float64 radians, integers give float64.
    return np.deg2rad(np.asarray(rot))


def _elementwise(fn, values):
    # math.cos / math.sin (libm, double) as MMPose calls them; np.cos may differ in the last
    # bit, which can move a pixel of the uint8 crop.
    values = np.asarray(values, dtype=np.float64)
    return np.array([fn(v) for v in values.ravel()], dtype=np.float64).reshape(values.shape)


def get_udp_warp_matrix(center, scale, rot, output_size):
    """UDP affine (image -> crop): (..., 2) center and scale, rot (...) in degrees, output (w, h).

    Returns (..., 2, 3) float32, equal to MMPose's `get_udp_warp_matrix`:
        x' = sx * ( cos(r) (x - cx) - sin(r) (y - cy) + S_w / 2 ),  sx = (w - 1) / S_w
        y' = sy * ( sin(r) (x - cx) + cos(r) (y - cy) + S_h / 2 ),  sy = (h - 1) / S_h
    The angle is converted in its own dtype (float32 rot: float32 radians, as in the training
    pipeline; Python float or float64: float64); the rest is float64 arithmetic, as MMPose's
    scalar expressions are under NumPy 1.x, rounded to float32 at the end.
    """
    center = np.asarray(center)
    scale = np.asarray(scale)
    if center.shape[-1] != 2 or scale.shape[-1] != 2:
        raise ValueError(f"get_udp_warp_matrix: center and scale must end in 2, got {center.shape}, {scale.shape}")
    rad = _radians(rot)
    batch = np.broadcast_shapes(center.shape[:-1], scale.shape[:-1], rad.shape)
    cos = _elementwise(math.cos, rad)
    sin = _elementwise(math.sin, rad)
    # float64 arithmetic throughout: numpy 1.x (which made the reference numbers) promoted
    # MMPose's scalar expressions `int / float32` and `float * float32` to float64.
    scale_x = (output_size[0] - 1) / scale[..., 0].astype(np.float64)
    scale_y = (output_size[1] - 1) / scale[..., 1].astype(np.float64)
    cx = center[..., 0].astype(np.float64)
    cy = center[..., 1].astype(np.float64)
    half_w = 0.5 * scale[..., 0].astype(np.float64)
    half_h = 0.5 * scale[..., 1].astype(np.float64)
    matrix = np.empty(batch + (2, 3), dtype=np.float64)
    matrix[..., 0, 0] = cos * scale_x
    matrix[..., 0, 1] = -sin * scale_x
    matrix[..., 0, 2] = scale_x * (-cx * cos + cy * sin + half_w)
    matrix[..., 1, 0] = sin * scale_y
    matrix[..., 1, 1] = cos * scale_y
    matrix[..., 1, 2] = scale_y * (-cx * sin - cy * cos + half_h)
    return matrix.astype(np.float32)


def _third_point(a, b):
    # The point that makes (a, b, c) a right angle at b: a - b rotated by +90 degrees.
    direction = a - b
    return b + np.array([-direction[1], direction[0]], dtype=direction.dtype)


def _plain_warp_matrix(center, scale, rad, output_size, fix_aspect_ratio):
    # MMPose 1.3.2: three point pairs (centre, centre + half width along the rotated x axis, and a
    # third point) rounded to float32, solved by cv2.getAffineTransform in float64.
    w_out, h_out = output_size
    sn, cs = np.sin(rad), np.cos(rad)  # in the angle's dtype, as MMPose's _rotate_point computes them
    rotation = np.array([[cs, -sn], [sn, cs]])
    src = np.zeros((3, 2), dtype=np.float32)
    src[0] = center
    src[1] = center + rotation @ np.array([float(scale[0]) * -0.5, 0.0])
    dst = np.zeros((3, 2), dtype=np.float32)
    dst[0] = [w_out * 0.5, h_out * 0.5]
    dst[1] = dst[0] + np.array([w_out * -0.5, 0.0])
    if fix_aspect_ratio:
        src[2] = _third_point(src[0], src[1])
        dst[2] = _third_point(dst[0], dst[1])
    else:  # the height is mapped on its own (the crop may be stretched)
        src[2] = center + rotation @ np.array([0.0, float(scale[1]) * -0.5])
        dst[2] = dst[0] + np.array([0.0, h_out * -0.5])
    return cv2.getAffineTransform(src, dst)


def get_warp_matrix(center, scale, rot, output_size, fix_aspect_ratio=True):
    """Non-UDP affine (image -> crop), MMPose's `get_warp_matrix`: (..., 2, 3) float64.

    Maps the box centre to (w / 2, h / 2) and the box width `scale[0]` onto w crop pixels; with
    fix_aspect_ratio (the default) the height scales like the width. The rotation matrix is in
    the angle's dtype (float32 rot: float32 sin and cos; Python float or float64: float64).
    """
    center = np.asarray(center)
    scale = np.asarray(scale)
    rad = _radians(rot)
    batch = np.broadcast_shapes(center.shape[:-1], scale.shape[:-1], rad.shape)
    center = np.broadcast_to(center, batch + (2,))
    scale = np.broadcast_to(scale, batch + (2,))
    rad = np.broadcast_to(rad, batch)
    matrix = np.empty(batch + (2, 3), dtype=np.float64)
    for index in np.ndindex(*batch):
        matrix[index] = _plain_warp_matrix(center[index], scale[index], rad[index], output_size, fix_aspect_ratio)
    return matrix


def transform_points(points, matrix):
    """Apply a (2, 3) affine matrix to points (..., 2), or (B, 2, 3) matrices to points (B, ..., 2).

    Uses `cv2.transform`, as MMPose's TopdownAffine does, so float32 points get exactly MMPose's
    float32 results; float64 points are transformed in float64 (other dtypes become float64).
    """
    points = np.asarray(points)
    matrix = np.asarray(matrix)
    if points.shape[-1] != 2 or matrix.shape[-2:] != (2, 3):
        raise ValueError(
            f"transform_points: need points (..., 2) and matrix (..., 2, 3), got {points.shape}, {matrix.shape}")
    if points.dtype not in (np.float32, np.float64):
        points = points.astype(np.float64)
    if matrix.ndim == 2:
        if points.size == 0:
            return points.copy()
        flat = np.ascontiguousarray(points.reshape(-1, 1, 2))
        return cv2.transform(flat, matrix).reshape(points.shape)
    if points.shape[:matrix.ndim - 2] != matrix.shape[:-2]:
        raise ValueError(
            f"transform_points: {matrix.shape[:-2]} matrices need points with the same leading "
            f"dimensions, got {points.shape}")
    out = np.empty_like(points)
    for index in np.ndindex(*matrix.shape[:-2]):
        out[index] = transform_points(points[index], matrix[index])
    return out


def person_boxes_to_center_scale(boxes, box_format: str = "xyxy", image_shape=None):
    """A caller's person boxes (M, 4|5) -> centre (M, 2), scale (M, 2) float32 (padding 1.25,
    before the aspect fix): the checks and conversion `Predictor` and `OnnxPredictor` share.

    boxes: xyxy (or `box_format="xywh"`) image pixels; a 5th column (a score) is ignored; None
    means the whole image (`image_shape` (H, W, ...) needed). Raises ValueError naming the boxes
    that are malformed, non-finite or empty.
    """
    if boxes is None:
        if image_shape is None:
            raise ValueError("boxes=None needs the image shape")
        h, w = image_shape[:2]
        boxes, box_format = [[0, 0, w, h]], "xyxy"
    boxes = np.asarray(boxes, dtype=np.float32)
    if boxes.ndim == 1 and boxes.shape[0] in (4, 5):
        boxes = boxes[None]
    if boxes.ndim != 2 or boxes.shape[1] not in (4, 5):
        raise ValueError(f"boxes must have shape (M, 4) or (M, 5), got {boxes.shape}")
    boxes = boxes[:, :4].copy()
    if not np.all(np.isfinite(boxes)):
        raise ValueError("boxes contain non-finite values")
    if box_format == "xywh":
        boxes = bbox_xywh2xyxy(boxes)
    elif box_format != "xyxy":
        raise ValueError(f"box_format must be 'xyxy' or 'xywh', got {box_format!r}")
    empty = np.any(boxes[:, 2:] <= boxes[:, :2], axis=1)
    if np.any(empty):
        raise ValueError(f"boxes {np.nonzero(empty)[0].tolist()} have zero or negative width/height "
                         f"(box_format={box_format!r})")
    return bbox_xyxy2cs(boxes, padding=1.25)
