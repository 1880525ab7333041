"""Draw poses of any skeleton on an image with OpenCV (COCO-17 by default)."""

from __future__ import annotations

import cv2
import numpy as np

from vitpose.coco_meta import SKELETON

# Colours in RGB: left limbs green, right limbs orange, head and torso blue (as most COCO tools).
LEFT, RIGHT, CENTRE = (0, 200, 0), (255, 128, 0), (51, 153, 255)
_LEFT_IDS = {1, 3, 5, 7, 9, 11, 13, 15}
_RIGHT_IDS = {2, 4, 6, 8, 10, 12, 14, 16}


def _side_colour(a: int, b: int):
    if a in _LEFT_IDS and b in _LEFT_IDS:
        return LEFT
    if a in _RIGHT_IDS and b in _RIGHT_IDS:
        return RIGHT
    return CENTRE


def _point_colour(k: int):
    return LEFT if k in _LEFT_IDS else RIGHT if k in _RIGHT_IDS else CENTRE


def draw_pose(image: np.ndarray, keypoints, scores=None, thr: float = 0.3, skeleton=SKELETON,
              radius: int | None = None, thickness: int | None = None, channels: str = "rgb",
              keypoint_colors=None, link_colors=None) -> np.ndarray:
    """Draw keypoints and the skeleton of one or more people (or animals); returns a new image.

    image: (H, W, 3) uint8 (RGB by default; `channels="bgr"` for OpenCV images, so the
        colours come out the same). keypoints: (K, 2) or (M, K, 2) image pixels (x, y).
    scores: (K,) or (M, K); keypoints with score <= thr (or non-finite coordinates) are not
        drawn, nor the limbs that touch them. None draws every keypoint.
    skeleton: limb index pairs, 0-based (default: COCO-17, `vitpose.coco_meta.SKELETON`; for
        another dataset its `DatasetInfo.skeleton`). A limb outside the K keypoints raises.
    keypoint_colors, link_colors: RGB triples, one per keypoint and one per limb (a
        `DatasetInfo`'s `keypoint_colors` / `link_colors`). None: for K = 17 COCO's left/right
        colours, otherwise one colour for all.
    """
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be (H, W, 3) uint8, got {image.shape} {image.dtype}")
    keypoints = np.asarray(keypoints, dtype=np.float64)
    if keypoints.ndim == 2:
        keypoints = keypoints[None]
    if keypoints.ndim != 3 or keypoints.shape[-1] != 2:
        raise ValueError(f"keypoints must be (K, 2) or (M, K, 2), got {keypoints.shape}")
    if scores is None:
        scores = np.ones(keypoints.shape[:2])
    scores = np.asarray(scores, dtype=np.float64).reshape(keypoints.shape[:2])
    if channels not in ("rgb", "bgr"):
        raise ValueError(f"channels must be 'rgb' or 'bgr', got {channels!r}")
    K = keypoints.shape[1]
    skeleton = [(int(a), int(b)) for a, b in skeleton]
    outside = [limb for limb in skeleton if not (0 <= limb[0] < K and 0 <= limb[1] < K)]
    if outside:
        raise ValueError(f"skeleton limb {outside[0]} is out of range for {K} keypoints: pass the dataset's "
                         "skeleton (DatasetInfo.skeleton)")
    point_colours = _colours(keypoint_colors, K, "keypoint_colors", [_point_colour(k) if K == 17 else CENTRE
                                                                      for k in range(K)])
    limb_colours = _colours(link_colors, len(skeleton), "link_colors",
                            [_side_colour(a, b) if K == 17 else CENTRE for a, b in skeleton])

    def colour(rgb):
        return tuple(int(c) for c in (rgb[::-1] if channels == "bgr" else rgb))

    canvas = np.ascontiguousarray(image.copy())
    size = max(image.shape[:2])
    radius = radius or max(2, size // 160)
    thickness = thickness or max(1, size // 320)
    for person, person_scores in zip(keypoints, scores):
        visible = (person_scores > thr) & np.all(np.isfinite(person), axis=-1)
        points = [tuple(round(float(v)) for v in p) if ok else None for p, ok in zip(person, visible)]
        for (a, b), rgb in zip(skeleton, limb_colours):
            if points[a] and points[b]:
                cv2.line(canvas, points[a], points[b], colour(rgb), thickness, cv2.LINE_AA)
        for p, rgb in zip(points, point_colours):
            if p is not None:
                cv2.circle(canvas, p, radius, colour(rgb), -1, cv2.LINE_AA)
    return canvas


def _colours(given, count: int, name: str, default: list) -> list:
    """`given` as `count` RGB tuples (checked), or the default."""
    if given is None:
        return default
    colours = [tuple(int(c) for c in rgb) for rgb in given]
    if len(colours) != count or any(len(c) != 3 for c in colours):
        raise ValueError(f"{name} must hold {count} RGB triples, got {len(colours)}")
    return colours


def _track_colour(track_id: int) -> tuple[int, int, int]:
    """An RGB colour per track id: well-separated hues for consecutive ids."""
    hue = (track_id * 47) % 180
    rgb = cv2.cvtColor(np.array([[[hue, 200, 255]]], np.uint8), cv2.COLOR_HSV2RGB)[0, 0]
    return tuple(int(v) for v in rgb)


def draw_people(image: np.ndarray, poses, skeleton=None, thr: float = 0.3, channels: str = "bgr") -> np.ndarray:
    """The people of one image or frame (a `Poses`) drawn on a copy: skeletons, boxes, track ids.

    skeleton: the model's `DatasetInfo` (its limbs and colours; None: COCO-17). Boxes are white,
    or the track's colour with its id written above when `poses.track_ids` is set.
    """
    if len(poses.boxes) and skeleton is not None:
        canvas = draw_pose(image, poses.keypoints, poses.keypoint_scores, thr=thr, skeleton=skeleton.skeleton,
                           channels=channels, keypoint_colors=skeleton.keypoint_colors,
                           link_colors=skeleton.link_colors)
    elif len(poses.boxes):
        canvas = draw_pose(image, poses.keypoints, poses.keypoint_scores, thr=thr, channels=channels)
    else:
        canvas = np.ascontiguousarray(np.asarray(image).copy())
    thickness = max(1, max(canvas.shape[:2]) // 400)
    for m, box in enumerate(np.asarray(poses.boxes, np.float64)):
        if not np.all(np.isfinite(box)):
            continue
        tracked = poses.track_ids is not None
        rgb = _track_colour(int(poses.track_ids[m])) if tracked else (255, 255, 255)
        colour = tuple(rgb[::-1]) if channels == "bgr" else rgb
        p1 = (int(round(box[0])), int(round(box[1])))
        p2 = (int(round(box[2])), int(round(box[3])))
        cv2.rectangle(canvas, p1, p2, colour, thickness, cv2.LINE_AA)
        if tracked:
            cv2.putText(canvas, str(int(poses.track_ids[m])), (p1[0] + 2, p1[1] + 14 * thickness),
                        cv2.FONT_HERSHEY_SIMPLEX, 0.5 * thickness, colour, thickness, cv2.LINE_AA)
    return canvas
