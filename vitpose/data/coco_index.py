"""The instance index of a COCO keypoint file: which person instances a top-down dataset has.

`build_coco_index(ann_file, bbox_file=None, ...)` reads the annotation file (and optionally a
detection results file), validates every record it uses, and returns a `CocoIndex`: a frozen
dataclass of numpy arrays, one row per instance (no per-instance dicts, so forked loader workers
share it without copy-on-write growth). `CocoKeypoints` samples from it, the crop cache bounds
its regions and fingerprints its contents with it, and tests read it directly.

Which annotations become instances (MMPose's `parse_data_info` / `_is_valid_instance`): not
crowd, `num_keypoints > 0`, `max(keypoints x, y) > 0`, and a box of positive width and height
after clipping to the image (x1 = clip(x, 0, W-1), x2 = clip(x + w, 0, W-1), same for y). GT
instances come in image order of the file, then annotation order.

Detections (MMPose's `_load_detection_results` then `filter_data`): boxes of other categories
are skipped, the person boxes are numbered 0, 1, ... in file order, and only then are boxes with
`score < bbox_score_thr` dropped, so a kept box keeps its number. Detection boxes are not
clipped.

Dropped records are counted per reason in `CocoIndex.dropped`. Malformed records raise
`DataError` naming the file, the record and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..coco_meta import NUM_KEYPOINTS, PERSON_CATEGORY_ID
from .errors import DataError
from .geometry import bbox_xywh2xyxy, bbox_xyxy2cs

__all__ = ["CocoIndex", "build_coco_index"]

# Box padding of MMPose's GetBBoxCenterScale (the scale is the box size x this).
BOX_PADDING = 1.25


@dataclass(frozen=True, eq=False, repr=False)
class CocoIndex:
    """Person instances of a COCO keypoint file, in numpy arrays (N instances, I images).

    Attributes:
        ann_file, bbox_file: the files it was built from (bbox_file None: GT boxes).
        num_keypoints: K.
        bbox_score_thr: the detection score threshold applied (0 for GT boxes).
        image_ids (I,) int64, image_sizes (I, 2) int64 (w, h), image_files (I,) str: the
            `images` records, in file order.
        ids (N,) int64: annotation ids, or the detection numbers (MMPose's, see the module).
        image_index (N,) int32: each instance's row in the image arrays.
        bbox_xyxy (N, 4) float32, bbox_score (N,) float32 (1 for GT boxes).
        center, scale (N, 2) float32: the box centre and the padded (1.25) box size.
        keypoints (N, K, 2) float32 and keypoints_visible (N, K) float32 (visibility clipped
            to 1): GT only, None for detections.
        dropped: records left out, counted per reason.
    """

    ann_file: Path
    bbox_file: Path | None
    num_keypoints: int
    bbox_score_thr: float
    image_ids: np.ndarray
    image_sizes: np.ndarray
    image_files: np.ndarray
    ids: np.ndarray
    image_index: np.ndarray
    bbox_xyxy: np.ndarray
    bbox_score: np.ndarray
    center: np.ndarray
    scale: np.ndarray
    keypoints: np.ndarray | None
    keypoints_visible: np.ndarray | None
    dropped: dict = field(default_factory=dict)

    def __post_init__(self):
        # Shared by every sample (and every forked worker): nothing may write into it.
        for value in vars(self).values():
            if isinstance(value, np.ndarray):
                value.flags.writeable = False

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return (f"CocoIndex(ann_file={str(self.ann_file)!r}, bbox_file="
                f"{None if self.bbox_file is None else str(self.bbox_file)!r}, instances={len(self)}, "
                f"images={len(self.image_ids)}, dropped={self.dropped})")

    @property
    def has_keypoints(self) -> bool:
        """True for GT instances, False for detected boxes."""
        return self.keypoints is not None

    def image_file(self, i: int) -> str:
        """The `file_name` of instance i's image."""
        return str(self.image_files[self.image_index[i]])

    def image_size(self, i: int) -> tuple[int, int]:
        """(w, h) of instance i's image, from its record."""
        w, h = self.image_sizes[self.image_index[i]]
        return int(w), int(h)

    def image_id(self, i: int) -> int:
        return int(self.image_ids[self.image_index[i]])

    def record(self, i: int) -> str:
        """How error messages name instance i, e.g. "annotation id 12 (image id 3)"."""
        kind = "annotation id" if self.bbox_file is None else "detection"
        return f"{kind} {int(self.ids[i])} (image id {self.image_id(i)})"

    def nbytes(self) -> int:
        """Bytes held by the index arrays."""
        return int(sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray)))


def build_coco_index(ann_file, bbox_file=None, num_keypoints: int = NUM_KEYPOINTS,
                     bbox_score_thr: float = 0.0) -> CocoIndex:
    """Read and validate a COCO keypoint file (and a detection file) into a `CocoIndex`.

    Args:
        ann_file: COCO keypoint annotation JSON (`person_keypoints_*.json`).
        bbox_file: COCO detection results JSON (a list of {image_id, category_id, bbox,
            score}); its person boxes replace the GT instances. None: GT instances.
        num_keypoints: K; every annotation's `keypoints` must hold 3 K numbers.
        bbox_score_thr: detections with a lower score are dropped (after numbering).

    Raises:
        DataError: a missing or malformed file or record, or no usable instance at all.
    """
    ann_file = Path(ann_file)
    bbox_file = None if bbox_file is None else Path(bbox_file)
    data = _load_json(ann_file, "annotation file")
    images = _read_images(data, ann_file)
    dropped: dict[str, int] = {}
    if bbox_file is None:
        instances = _read_annotations(data, ann_file, images, int(num_keypoints), dropped)
        bbox_score_thr = 0.0
    else:
        del data
        instances = _read_detections(_load_json(bbox_file, "detection file"), bbox_file, images,
                                     float(bbox_score_thr), dropped)
    if len(instances["ids"]) == 0:
        raise DataError(f"no usable person instances (dropped: {dropped or 'none'})",
                        file=bbox_file or ann_file, field="annotations" if bbox_file is None else "bbox")
    center, scale = bbox_xyxy2cs(instances["bbox_xyxy"], padding=BOX_PADDING)
    return CocoIndex(ann_file=ann_file, bbox_file=bbox_file, num_keypoints=int(num_keypoints),
                     bbox_score_thr=float(bbox_score_thr), image_ids=images.ids, image_sizes=images.sizes,
                     image_files=images.files, center=center.astype(np.float32),
                     scale=scale.astype(np.float32), dropped=dropped, **instances)


# ------------------------------------------------------------------------------ records

def _load_json(path: Path, what: str):
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except FileNotFoundError:
        raise DataError(f"{what} not found", file=path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{what} is not valid JSON: {e}", file=path) from None


def _require(record, key, path, record_name, types):
    """record[key], which must exist and be of `types` (bool never counts as a number)."""
    if not isinstance(record, dict) or key not in record:
        raise DataError("missing field", file=path, record=record_name, field=key)
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, types):
        raise DataError(f"has type {type(value).__name__}", file=path, record=record_name, field=key)
    return value


def _count(dropped: dict, reason: str, count) -> None:
    if count:
        dropped[reason] = dropped.get(reason, 0) + int(count)


@dataclass(frozen=True)
class _Images:
    ids: np.ndarray      # (I,) int64, file order
    sizes: np.ndarray    # (I, 2) int64 (w, h)
    files: np.ndarray    # (I,) str
    ids_sorted: np.ndarray
    rows_sorted: np.ndarray

    def rows(self, image_ids, file, records, field="image_id") -> np.ndarray:
        """Row of each image id in `images`; DataError on an id with no image record.

        records(k) names the k-th record for the message.
        """
        image_ids = np.asarray(image_ids, np.int64)
        if len(image_ids) and not len(self.ids_sorted):
            raise DataError(f"image id {int(image_ids[0])} is not in the annotation file's images (it has none)",
                            file=file, record=records(0), field=field)
        pos = np.minimum(np.searchsorted(self.ids_sorted, image_ids), len(self.ids_sorted) - 1)
        found = self.ids_sorted[pos] == image_ids
        if not np.all(found):
            k = int(np.flatnonzero(~found)[0])
            raise DataError(f"image id {int(image_ids[k])} is not in the annotation file's images",
                            file=file, record=records(k), field=field)
        return self.rows_sorted[pos].astype(np.int32)


def _read_images(data, path: Path) -> _Images:
    if not isinstance(data, dict):
        raise DataError("top level must be an object", file=path, field="images")
    images = data.get("images")
    if not isinstance(images, list):
        raise DataError("missing or not a list", file=path, field="images")
    n = len(images)
    ids = np.empty(n, np.int64)
    sizes = np.empty((n, 2), np.int64)
    names = []
    for j, img in enumerate(images):
        ids[j] = _require(img, "id", path, f"images[{j}]", int)
        rec = f"image id {ids[j]}"
        names.append(_require(img, "file_name", path, rec, str))
        for c, key in enumerate(("width", "height")):
            v = _require(img, key, path, rec, (int, float))
            if not v > 0:
                raise DataError(f"must be positive, got {v}", file=path, record=rec, field=key)
            sizes[j, c] = int(v)
    unique, counts = np.unique(ids, return_counts=True)
    if np.any(counts > 1):
        raise DataError("image id appears twice", file=path, record=f"image id {unique[np.argmax(counts > 1)]}",
                        field="id")
    order = np.argsort(ids, kind="stable")
    return _Images(ids, sizes, np.array(names, dtype=np.str_), ids[order], order)


def _numeric_rows(rows, shape, name, path, record_of):
    """float64 array of the listed rows; DataError naming the first record that is not numeric."""
    try:
        return np.array(rows, np.float64).reshape(shape)
    except (TypeError, ValueError):
        for k, row in enumerate(rows):
            try:
                np.array(row, np.float64)
            except (TypeError, ValueError):
                raise DataError(f"{name} is not numeric: {row!r}", file=path, record=record_of(k),
                                field=name) from None
        raise


def _read_annotations(data, path: Path, images: _Images, K: int, dropped: dict) -> dict:
    anns = data.get("annotations")
    if not isinstance(anns, list):
        raise DataError("missing or not a list", file=path, field="annotations")
    n = len(anns)
    ann_ids = np.empty(n, np.int64)
    image_ids = np.empty(n, np.int64)
    crowd = np.zeros(n, bool)
    has_kpts = np.ones(n, bool)
    num_kpts = np.full(n, -1, np.int64)
    # Plain lists, converted once at the end: per-record numpy calls would dominate on
    # COCO train (260k records).
    box_rows, kpt_rows, rows_with_kpts = [], [], []
    for j, ann in enumerate(anns):
        ann_ids[j] = _require(ann, "id", path, f"annotations[{j}]", int)
        rec = f"annotation id {ann_ids[j]}"
        image_ids[j] = _require(ann, "image_id", path, rec, int)
        crowd[j] = bool(ann.get("iscrowd", 0))
        if "keypoints" not in ann or "bbox" not in ann:
            has_kpts[j] = False  # MMPose skips these records (not keypoint annotations)
            continue
        box, kp = ann["bbox"], ann["keypoints"]
        if not isinstance(box, (list, tuple)) or len(box) != 4:
            raise DataError("bbox must be [x, y, w, h]", file=path, record=rec, field="bbox")
        if not isinstance(kp, (list, tuple)) or len(kp) != 3 * K:
            got = len(kp) if isinstance(kp, (list, tuple)) else type(kp).__name__
            raise DataError(f"keypoints must hold {3 * K} numbers (x, y, v for {K} keypoints), got {got}",
                            file=path, record=rec, field="keypoints")
        if "num_keypoints" in ann:
            num_kpts[j] = _require(ann, "num_keypoints", path, rec, (int, float))
        box_rows.append(box)
        kpt_rows.append(kp)
        rows_with_kpts.append(j)
    rows_with_kpts = np.asarray(rows_with_kpts, np.int64)

    def record_of(k):
        return f"annotation id {ann_ids[rows_with_kpts[k]]}"

    boxes = np.zeros((n, 4), np.float64)
    kpts = np.zeros((n, K, 3), np.float32)  # MMPose keeps keypoints in float32
    boxes[rows_with_kpts] = _numeric_rows(box_rows, (-1, 4), "bbox", path, record_of)
    kpts[rows_with_kpts] = _numeric_rows(kpt_rows, (-1, K, 3), "keypoints", path, record_of)
    bad_box = ~np.all(np.isfinite(boxes), axis=1) | (boxes[:, 2] < 0) | (boxes[:, 3] < 0)
    if np.any(bad_box):
        j = int(np.flatnonzero(bad_box)[0])
        raise DataError(f"bbox has a negative or non-finite size: {boxes[j].tolist()}",
                        file=path, record=f"annotation id {ann_ids[j]}", field="bbox")
    bad_kpts = ~np.all(np.isfinite(kpts), axis=(1, 2))
    if np.any(bad_kpts):
        j = int(np.flatnonzero(bad_kpts)[0])
        raise DataError("keypoints hold a null, non-finite or too large number", file=path,
                        record=f"annotation id {ann_ids[j]}", field="keypoints")
    unique, counts = np.unique(ann_ids, return_counts=True)
    if np.any(counts > 1):
        raise DataError("annotation id appears twice", file=path,
                        record=f"annotation id {unique[np.argmax(counts > 1)]}", field="id")
    img_rows = images.rows(image_ids, path, lambda k: f"annotation id {ann_ids[k]}")

    xy, vis = kpts[..., :2], np.minimum(1, kpts[..., 2])
    counted = np.count_nonzero(xy.max(axis=2), axis=1)
    num_kpts = np.where(num_kpts >= 0, num_kpts, counted)
    # MMPose: x1 = clip(x, 0, W - 1), x2 = clip(x + w, 0, W - 1) in float64, then float32.
    last_pixel = np.tile(images.sizes[img_rows] - 1, 2).astype(np.float64)
    xyxy = np.clip(bbox_xywh2xyxy(boxes), 0, last_pixel).astype(np.float32)
    box_ok = (xyxy[:, 2] - xyxy[:, 0] > 0) & (xyxy[:, 3] - xyxy[:, 1] > 0)
    keep = np.ones(n, bool)
    for reason, bad in (("no keypoints field", ~has_kpts), ("crowd", crowd),
                        ("num_keypoints == 0", num_kpts == 0),
                        ("box empty after clipping", ~box_ok),
                        ("max(keypoints) <= 0", xy.max(axis=(1, 2), initial=0) <= 0)):
        _count(dropped, reason, np.count_nonzero(keep & bad))
        keep &= ~bad
    # MMPose's order: images as listed, then their annotations as listed.
    rows = np.flatnonzero(keep)
    rows = rows[np.argsort(img_rows[rows], kind="stable")]
    return {"ids": ann_ids[rows], "image_index": img_rows[rows], "bbox_xyxy": xyxy[rows],
            "bbox_score": np.ones(len(rows), np.float32),
            "keypoints": np.ascontiguousarray(xy[rows]), "keypoints_visible": np.ascontiguousarray(vis[rows])}


def _read_detections(dets, path: Path, images: _Images, bbox_score_thr: float, dropped: dict) -> dict:
    if not isinstance(dets, list):
        raise DataError("a detection file must be a JSON list of {image_id, category_id, bbox, score}",
                        file=path, field="<top level>")
    n = len(dets)
    image_ids = np.empty(n, np.int64)
    categories = np.empty(n, np.int64)
    boxes = np.empty((n, 4), np.float32)
    scores = np.empty(n, np.float32)
    for j, det in enumerate(dets):
        rec = f"detection [{j}]"
        image_ids[j] = _require(det, "image_id", path, rec, int)
        categories[j] = _require(det, "category_id", path, rec, int)
        box = _require(det, "bbox", path, rec, (list, tuple))
        if len(box) < 4:
            raise DataError("bbox must be [x, y, w, h]", file=path, record=rec, field="bbox")
        try:
            boxes[j] = box[:4]
        except (TypeError, ValueError):
            raise DataError(f"bbox is not numeric: {box!r}", file=path, record=rec, field="bbox") from None
        if (not np.all(np.isfinite(boxes[j])) or boxes[j, 2] < 0 or boxes[j, 3] < 0
                or (boxes[j, 2] == 0 and boxes[j, 3] == 0)):
            raise DataError(f"bbox has a negative, empty or non-finite size: {box}",
                            file=path, record=rec, field="bbox")
        scores[j] = _require(det, "score", path, rec, (int, float))
    person = categories == PERSON_CATEGORY_ID
    _count(dropped, "not a person", np.count_nonzero(~person))
    # MMPose numbers the person boxes first and filters by score afterwards.
    numbers = np.cumsum(person) - 1
    low = person & (scores < bbox_score_thr)
    _count(dropped, f"score < {bbox_score_thr}", np.count_nonzero(low))
    # Every person box must name a known image, kept or not (MMPose looks them all up).
    people = np.flatnonzero(person)
    img_rows = images.rows(image_ids[people], path, lambda k: f"detection [{people[k]}]")
    kept = ~low[people]
    rows = people[kept]
    return {"ids": numbers[rows].astype(np.int64), "image_index": img_rows[kept],
            # MMPose's bbox_xywh2xyxy in float32; detection boxes are not clipped.
            "bbox_xyxy": bbox_xywh2xyxy(boxes[rows]), "bbox_score": scores[rows],
            "keypoints": None, "keypoints_visible": None}
