"""The labelled people of a COCO keypoint file, as the audit reads them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitpose.errors import UserError

__all__ = ["LabelledImage", "read_labels"]


@dataclass
class LabelledImage:
    """One image of the COCO file with its labelled people (keypoints (M, K, 3), boxes (M, 4) xywh)."""

    image_id: int
    file_name: str
    width: int
    height: int
    annotation_ids: list
    keypoints: np.ndarray
    boxes: np.ndarray


def read_labels(path: Path, num_keypoints: int) -> list[LabelledImage]:
    """The labelled people of a COCO keypoint file, per image (file order); crowd annotations and
    people without a labelled keypoint are left out. Errors name the file, the record and the field."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"--annotations {path}: not a readable JSON file ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list) \
            or not isinstance(doc.get("annotations"), list):
        raise UserError(f"--annotations {path}: not a COCO keypoint file (fields 'images' and 'annotations')")
    images, order = {}, []
    for i, image in enumerate(doc["images"]):
        where = f"--annotations {path}: images[{i}]"
        if not isinstance(image, dict):
            raise UserError(f"{where}: expected an object")
        for key, kind in (("id", int), ("file_name", str), ("width", int), ("height", int)):
            if not isinstance(image.get(key), kind) or isinstance(image.get(key), bool):
                raise UserError(f"{where}: field {key!r} must be {'a file name' if kind is str else 'an integer'}")
        images[image["id"]] = LabelledImage(image["id"], image["file_name"], image["width"], image["height"],
                                            [], [], [])
        order.append(image["id"])
    for i, ann in enumerate(doc["annotations"]):
        where = f"--annotations {path}: annotations[{i}]"
        if not isinstance(ann, dict):
            raise UserError(f"{where}: expected an object")
        if ann.get("iscrowd"):
            continue
        image = images.get(ann.get("image_id"))
        if image is None:
            raise UserError(f"{where}: field 'image_id' {ann.get('image_id')!r} names no image of the file")
        keypoints, bbox = ann.get("keypoints"), ann.get("bbox")
        if not _numbers(keypoints, 3 * num_keypoints):
            raise UserError(f"{where}: field 'keypoints' must hold {3 * num_keypoints} numbers (the model's "
                            f"{num_keypoints} keypoints as x, y, v)")
        if not _numbers(bbox, 4) or bbox[2] <= 0 or bbox[3] <= 0:
            raise UserError(f"{where}: field 'bbox' must be [x, y, w, h] with w, h > 0")
        keypoints = np.asarray(keypoints, np.float64).reshape(num_keypoints, 3)
        if not (keypoints[:, 2] > 0).any():
            continue
        image.annotation_ids.append(ann.get("id", i))
        image.keypoints.append(keypoints)
        image.boxes.append(np.asarray(bbox, np.float64))
    out = []
    for image_id in order:
        image = images[image_id]
        if image.annotation_ids:
            image.keypoints, image.boxes = np.stack(image.keypoints), np.stack(image.boxes)
            out.append(image)
    return out


def _numbers(value, count: int) -> bool:
    return (isinstance(value, list) and len(value) == count
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value))

