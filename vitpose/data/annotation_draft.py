"""What an annotation tool's export holds, before and after it is laid out as a COCO keypoint file.

The readers of `vitpose.data.labelstudio` and `vitpose.data.cvat` make a `Draft` (images, people,
keypoint names in the tool's order); `apply_skeleton` lays it out in a skeleton's order and
`to_coco(draft)` writes the COCO keypoint file: `categories[0]` names the keypoints and the limbs
(1-based, as COCO), so `vitpose.data.dataset_info(path)` reads the skeleton from it. Visibility:
occluded -> 1, outside or absent -> 0 (with x = y = 0), else 2.

Also here, what both tools share: `AnnotationFormatError` (one line naming the file, the task or
image and the field), the checks of what only an edited export can hold (a keypoint outside its
image, an image size no camera makes, one image twice, the other tool's file: docs/annotations.md
§1), and the reading of prediction records for the pre-annotation writers (docs/annotations.md §4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from .coco_index import MAX_IMAGE_SIDE  # the largest side a reader of the COCO file holds
from .errors import DataError
from .metainfo import DatasetInfo, dataset_info

DEFAULT_MARK_BELOW = 0.3  # keypoint scores below this are marked for the annotator's attention
# What `--mark-below` compares: "auto" the calibrated probability `p` where the records carry it (a
# model with a calibration) and the raw score where they do not; or either one asked by name.
MARK_BY = ("auto", "score", "p")
# Both tools keep points inside the image (Label Studio's canvas, CVAT projects them onto its edge);
# this much past the border is float rounding of a point placed on it (percent -> pixels).
EDGE_TOLERANCE_PX = 1e-6


class AnnotationFormatError(DataError, UserError):
    """An export that cannot be read as it is; the message names the task or image and the field."""


# ---------------------------------------------------------------------------- the draft


@dataclass
class DraftPerson:
    """One labelled person: keypoint name -> (x, y, v) in pixels, and the box when the tool has one."""

    keypoints: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    bbox: list[float] | None = None  # [x, y, w, h]
    # keypoint name -> the calibrated probability a pre-annotation carried (Label Studio's `meta.p`,
    # CVAT's `p_permille` attribute); empty when the export has none
    p: dict[str, float] = field(default_factory=dict)
    where: str = ""  # the task / image / region, for messages


@dataclass
class DraftImage:
    file_name: str
    width: int
    height: int
    people: list[DraftPerson] = field(default_factory=list)
    where: str = ""  # the task / <image> it came from, for messages


@dataclass
class Draft:
    """What an export holds, before it is laid out in a skeleton's keypoint order."""

    source: str
    tool: str
    images: list[DraftImage] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # keypoint names in the tool's order
    limbs: list[tuple[str, str]] = field(default_factory=list)
    category: str = "person"
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count (tasks, images, people)

    def skip(self, reason: str, count: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + count

    def add_name(self, name: str) -> None:
        if name not in self.names:
            self.names.append(name)


def finite_number(value, fail, what: str) -> float:
    """A finite number from a JSON or XML value, else `fail(message, field)`."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a JSON integer of 400 digits
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        fail(f"must be a finite number, got {value!r}", what)
    return number


def check_image_size(width: int, height: int, fail, what: str) -> None:
    """An image size a COCO reader can hold (`MAX_IMAGE_SIDE`; the pixel limit of `vitpose.files`,
    VITPOSE_MAX_PIXELS, bounds the area, as it does when decoding) and a decoder would accept: an edited
    `original_width: 1e20` would otherwise be written into the COCO file and crash `check-data` and
    training later."""
    from vitpose.files import MAX_PIXELS_ENV, max_pixels_limit

    limit = max_pixels_limit()
    if max(width, height) > MAX_IMAGE_SIDE or 0 < limit < width * height:
        bound = f"{MAX_IMAGE_SIDE} pixels a side" if max(width, height) > MAX_IMAGE_SIDE else \
            f"{limit / 1e6:g} megapixels, the pixel limit of {MAX_PIXELS_ENV}"
        fail(f"{_big(width)} x {_big(height)} is not a plausible image size (over {bound}); correct the size in "
             "the tool", what)


def _big(n: int) -> str:
    return str(n) if n < 10**12 else f"{float(n):.3g}" if n < 10**300 else f"a {len(str(n))}-digit number"


def outside_image(x: float, y: float, image: DraftImage) -> str:
    """Why a labelled point cannot be imported when it lies outside its image ("" when inside, the
    border included): neither tool's UI places one there, so the export was edited, and importing
    it as visible would train on a point that is not in the picture."""
    if (-EDGE_TOLERANCE_PX <= x <= image.width + EDGE_TOLERANCE_PX
            and -EDGE_TOLERANCE_PX <= y <= image.height + EDGE_TOLERANCE_PX):
        return ""
    return (f"at ({x:g}, {y:g}) px lies outside the {image.width} x {image.height} image; move it into the "
            "image or delete it in the tool")


def refuse_duplicate_images(draft: Draft, path: Path, what: str) -> None:
    """One image in two tasks / <image> elements would be imported twice: its people counted
    twice in training and evaluation."""
    first = {}
    for image in draft.images:
        if image.file_name in first:
            raise AnnotationFormatError(
                f"image {image.file_name!r} appears twice ({first[image.file_name]} and {image.where}); delete the "
                "duplicate in the tool (or export its tasks separately if they are different files)",
                file=path, record=image.where, field=what)
        first[image.file_name] = image.where


def _head(path: Path, size: int = 65536) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return b""


def wrong_format_hint(path: Path, fmt: str) -> str:
    """'this looks like ... use --format X' when the file is the other tool's export."""
    head = _head(path).lstrip(b"\xef\xbb\xbf \t\r\n")
    if fmt == "labelstudio" and head.startswith(b"<") and b"<annotations" in head:
        return "this looks like a CVAT XML export: use --format cvat"
    if fmt == "cvat" and head[:1] in (b"[", b"{"):
        return "this looks like a JSON file (a Label Studio export?): use --format labelstudio"
    return ""



# ---------------------------------------------------------------------------- the skeleton


def apply_skeleton(draft: Draft, skeleton) -> Draft:
    """With a skeleton (a built-in name, a skeleton YAML, a COCO file or a DatasetInfo): its names
    and limbs replace the tool's, and every name the export uses must be one of them."""
    if skeleton is None:
        if not draft.names:
            raise AnnotationFormatError("the export has no keypoints", file=draft.source)
        return draft
    info = skeleton if isinstance(skeleton, DatasetInfo) else dataset_info(skeleton)
    used = {name for image in draft.images for person in image.people for name in person.keypoints}
    unknown = sorted(used - set(info.keypoint_names))
    if unknown:
        raise AnnotationFormatError(f"keypoints {unknown} are not in the skeleton {info.name!r} "
                                    f"({', '.join(info.keypoint_names)}); rename them in the tool or use "
                                    f"another --skeleton", file=draft.source, field="--skeleton")
    names = info.keypoint_names
    draft.names = list(names)
    draft.limbs = [(names[a], names[b]) for a, b in info.skeleton]
    return draft


def to_coco(draft: Draft) -> dict:
    """The COCO keypoint file of a draft (docs/annotations.md §1): images numbered from 1 in the
    export's order, one annotation per person with a labelled keypoint; bbox from the tool's box
    or the labelled points' extent; area = box w x h; num_keypoints = labelled points."""
    index = {name: k for k, name in enumerate(draft.names)}
    images, annotations = [], []
    for image_id, image in enumerate(draft.images, start=1):
        images.append({"id": image_id, "file_name": image.file_name, "width": image.width, "height": image.height})
        for person in image.people:
            flat = [0.0, 0.0, 0] * len(draft.names)
            for name, (x, y, v) in person.keypoints.items():
                flat[3 * index[name]:3 * index[name] + 3] = [x, y, v] if v > 0 else [0.0, 0.0, 0]
            labelled = [(flat[3 * k], flat[3 * k + 1]) for k in range(len(draft.names)) if flat[3 * k + 2] > 0]
            if not labelled:
                draft.skip("people without a labelled keypoint")
                continue
            bbox = person.bbox or _extent(labelled)
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": 1,
                                "keypoints": flat, "num_keypoints": len(labelled), "bbox": bbox,
                                "area": bbox[2] * bbox[3], "iscrowd": 0})
            if person.p:  # the calibrated p of the pre-annotation, null where a point had none
                annotations[-1]["p"] = [person.p.get(name) for name in draft.names]
    category = {"id": 1, "name": draft.category, "supercategory": draft.category, "keypoints": list(draft.names),
                "skeleton": [[index[a] + 1, index[b] + 1] for a, b in draft.limbs]}
    return {"info": {"description": f"imported from {draft.tool} export {Path(draft.source).name}"},
            "images": images, "annotations": annotations, "categories": [category]}


def _extent(points) -> list[float]:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]



# ---------------------------------------------------------------------------- prediction records


def images_of(records) -> list[tuple[str, int, int, list[dict]]]:
    """Prediction records grouped by image: (file_name, width, height, records), in first-seen order."""
    images = {}
    for i, rec in enumerate(records):
        where = f"prediction record [{i}]"
        if not isinstance(rec, dict):
            raise AnnotationFormatError(f"must be an object, got {type(rec).__name__}", record=where)
        for key in ("file_name", "width", "height", "keypoints", "bbox"):
            if key not in rec:
                raise AnnotationFormatError("missing field (records of `vitpose predict --json` have it)",
                                            record=where, field=key)
        name = rec["file_name"]
        entry = images.setdefault(name, (name, int(rec["width"]), int(rec["height"]), []))
        if (entry[1], entry[2]) != (int(rec["width"]), int(rec["height"])):
            raise AnnotationFormatError(f"image {name!r} has two sizes", record=where, field="width")
        entry[3].append(rec)
    return list(images.values())


def keypoints_of(rec: dict, K: int, where: str) -> list[tuple[float, float, float]]:
    flat = rec["keypoints"]
    if not isinstance(flat, list) or len(flat) != 3 * K:
        raise AnnotationFormatError(f"must hold {3 * K} numbers (x, y, score for {K} keypoints)", record=where,
                                    field="keypoints")
    return [(float(flat[3 * k]), float(flat[3 * k + 1]), float(flat[3 * k + 2])) for k in range(K)]


def calibrated_of(rec: dict, K: int, where: str) -> tuple[list[float] | None, list[int] | None]:
    """A record's calibrated fields: `p` (K probabilities) and `visibility` (K of COCO's states 0
    absent, 1 occluded, 2 visible), each None when the record does not carry it (a model without a
    calibration): never invented."""
    p, visibility = rec.get("p"), rec.get("visibility")
    if p is not None:
        if not isinstance(p, list) or len(p) != K:
            raise AnnotationFormatError(f"must hold {K} probabilities, one per keypoint", record=where, field="p")
        p = [math.nan if v is None else float(v) for v in p]
    if visibility is not None:
        if not isinstance(visibility, list) or len(visibility) != K or any(v not in (0, 1, 2) for v in visibility):
            raise AnnotationFormatError(f"must hold {K} of 0 (absent), 1 (occluded), 2 (visible)", record=where,
                                        field="visibility")
        visibility = [int(v) for v in visibility]
    return p, visibility


def mark_values(scores: list[float], p: list[float] | None, mark_by: str, where: str) -> tuple[list[float], str]:
    """What `--mark-below` compares for one record's keypoints, and its name: `p` where `mark_by` is
    "p", or "auto" and the record carries it; else the raw scores (`MARK_BY`). Asking for "p" of
    a record without it is an error: the model has no calibration."""
    if mark_by not in MARK_BY:
        raise ValueError(f"mark_by must be one of {MARK_BY}, got {mark_by!r}")
    if mark_by == "p" and p is None:
        raise AnnotationFormatError("has no calibrated 'p': the model has no calibration (run `vitpose calibrate`) "
                                    "or mark by the raw score (--mark-below-by score)", record=where, field="p")
    if mark_by == "score" or p is None:
        return scores, "score"
    return p, "p"


def onto_image(x: float, y: float, width: int, height: int) -> tuple[float, float, str]:
    """A predicted keypoint moved onto the image (the crop around a person at the border reaches
    past it), with a note when it moved: the tools show no point outside the image, and the import
    refuses one (docs/annotations.md §4)."""
    cx, cy = min(max(x, 0.0), float(width)), min(max(y, 0.0), float(height))
    return cx, cy, "" if (cx, cy) == (x, y) else f"predicted outside the image at ({x:.1f}, {y:.1f}); placed on its edge"

