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

Annotation formats (`annotation_format`, from the skeleton's `DatasetInfo`):
- "coco": COCO keypoint files (COCO, AIC, AP-10K, APT-36K, a user's own). Every annotation's
  `category_id` is kept (AP-10K has one category per animal family); visibility min(1, v).
- "coco_wholebody": the 133 keypoints are `keypoints` (body 17) + `foot_kpts` (6) + `face_kpts`
  (68) + `lefthand_kpts` (21) + `righthand_kpts` (21), in that order, as MMPose's
  CocoWholeBodyDataset concatenates them; visibility is v > 0, and `num_keypoints` (the body's
  count) decides as in MMPose.
- "mpii": MMPose's MPII JSON (a list of {image, center, scale, joints, joints_vis}); see
  `_read_mpii`. Its records carry no image size, so the sizes are read from the image headers
  under `img_dir`.

Dropped records are counted per reason in `CocoIndex.dropped`. Malformed records raise
`DataError` naming the file, the record and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..coco_meta import NUM_KEYPOINTS, PERSON_CATEGORY_ID
from .errors import DataError
from .geometry import bbox_xywh2xyxy, bbox_xyxy2cs
from .image_io import read_image_size

MAX_IMAGE_SIDE = 2**31 - 1  # an image `width` / `height` beyond this is an error in the file, not a photo

if TYPE_CHECKING:
    from .metainfo import DatasetInfo

__all__ = ["CocoIndex", "build_coco_index"]

# Box padding of MMPose's GetBBoxCenterScale (the scale is the box size x this).
BOX_PADDING = 1.25
# COCO-WholeBody's keypoint fields, concatenated in this order (MMPose's CocoWholeBodyDataset).
WHOLEBODY_PARTS = (("keypoints", 17), ("foot_kpts", 6), ("face_kpts", 68), ("lefthand_kpts", 21),
                   ("righthand_kpts", 21))
# MPII's boxes are in units of 200 pixels; MMPose moves the centre down by 15 such units per
# scale (to keep the feet) and converts MATLAB's 1-based pixel coordinates to 0-based.
MPII_PIXEL_STD = 200.0
MPII_CENTER_SHIFT = 15.0


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
        category_ids (N,) int64: each instance's `category_id` (1 for detections and MPII).
        annotation_format: how the records were read ("coco", "coco_wholebody", "mpii").
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
    category_ids: np.ndarray | None = None
    annotation_format: str = "coco"

    def __post_init__(self):
        if self.category_ids is None:
            object.__setattr__(self, "category_ids", np.full(len(self.ids), PERSON_CATEGORY_ID, np.int64))
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
        kind = ("detection" if self.bbox_file is not None else
                "MPII record" if self.annotation_format == "mpii" else "annotation id")
        return f"{kind} {int(self.ids[i])} (image id {self.image_id(i)})"

    def nbytes(self) -> int:
        """Bytes held by the index arrays."""
        return int(sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray)))


def build_coco_index(ann_file, bbox_file=None, num_keypoints: int | None = None,
                     bbox_score_thr: float = 0.0, *, dataset_info: DatasetInfo | None = None,
                     img_dir=None) -> CocoIndex:
    """Read and validate a keypoint annotation file (and a detection file) into a `CocoIndex`.

    Args:
        ann_file: the annotation JSON (COCO format, COCO-WholeBody or MMPose's MPII JSON).
        bbox_file: COCO detection results JSON (a list of {image_id, category_id, bbox,
            score}); its person boxes replace the GT instances. None: GT instances.
        num_keypoints: K; every record must hold K keypoints. Default: the skeleton's K (17
            without one); given with a skeleton, it must equal the skeleton's K.
        bbox_score_thr: detections with a lower score are dropped (after numbering).
        dataset_info: the skeleton (`vitpose.data.dataset_info`): K and the annotation format.
            None: COCO-17.
        img_dir: the images' folder; needed by the MPII format only (its records have no image
            size, so the sizes are read from the image headers).

    Raises:
        DataError: a missing or malformed file or record, a skeleton that does not fit the file,
            or no usable instance at all.
    """
    ann_file = Path(ann_file)
    bbox_file = None if bbox_file is None else Path(bbox_file)
    fmt = "coco" if dataset_info is None else dataset_info.annotation_format
    skeleton = "COCO-17" if dataset_info is None else repr(dataset_info.name)
    if num_keypoints is None:
        num_keypoints = NUM_KEYPOINTS if dataset_info is None else dataset_info.num_keypoints
    elif dataset_info is not None and int(num_keypoints) != dataset_info.num_keypoints:
        raise ValueError(f"num_keypoints={num_keypoints} but the skeleton {skeleton} has "
                         f"{dataset_info.num_keypoints} keypoints")
    K = int(num_keypoints)
    if fmt == "coco_wholebody" and K != sum(n for _, n in WHOLEBODY_PARTS):
        raise ValueError(f"the coco_wholebody format has {sum(n for _, n in WHOLEBODY_PARTS)} keypoints, not {K}")
    data = _load_json(ann_file, "annotation file")
    dropped: dict[str, int] = {}
    if fmt == "mpii":
        if bbox_file is not None:
            raise DataError("the MPII format is evaluated on its GT boxes; there is no detection file for it",
                            file=bbox_file, field="bbox_file")
        images, instances, center, scale = _read_mpii(data, ann_file, img_dir, K, dropped)
    else:
        images = _read_images(data, ann_file)
        if bbox_file is None:
            if fmt == "coco":
                _check_categories(data, ann_file, K, skeleton)
            instances = _read_annotations(data, ann_file, images, K, dropped, fmt, skeleton)
        else:
            del data
            instances = _read_detections(_load_json(bbox_file, "detection file"), bbox_file, images,
                                         float(bbox_score_thr), dropped)
        center, scale = bbox_xyxy2cs(instances["bbox_xyxy"], padding=BOX_PADDING)
    if bbox_file is None:
        bbox_score_thr = 0.0
    if len(instances["ids"]) == 0:
        what = "person instances" if dataset_info is None or dataset_info.name == "coco" else "instances"
        raise DataError(f"no usable {what} (dropped: {dropped or 'none'})",
                        file=bbox_file or ann_file, field="annotations" if bbox_file is None else "bbox")
    return CocoIndex(ann_file=ann_file, bbox_file=bbox_file, num_keypoints=K,
                     bbox_score_thr=float(bbox_score_thr), image_ids=images.ids, image_sizes=images.sizes,
                     image_files=images.files, center=center.astype(np.float32),
                     scale=scale.astype(np.float32), dropped=dropped, annotation_format=fmt, **instances)


# ------------------------------------------------------------------------------ records

def _load_json(path: Path, what: str):
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except FileNotFoundError:
        raise DataError(f"{what} not found", file=path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{what} is not valid JSON: {e}", file=path) from None


def _require(record, key, path, record_name, types, int64=True):
    """record[key], which must exist and be of `types` (bool never counts as a number); an int must
    fit int64 unless `int64` is False (the caller checks a tighter range)."""
    if not isinstance(record, dict) or key not in record:
        raise DataError("missing field", file=path, record=record_name, field=key)
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, types):
        raise DataError(f"has type {type(value).__name__}", file=path, record=record_name, field=key)
    if int64 and isinstance(value, int) and not -2**63 <= value < 2**63:  # ids and counts are kept as int64
        raise DataError(f"a {len(str(abs(value)))}-digit number is out of range (int64)", file=path,
                        record=record_name, field=key)
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
            v = _require(img, key, path, rec, (int, float), int64=False)
            if not v > 0:
                raise DataError(f"must be positive, got {v}", file=path, record=rec, field=key)
            if not v <= MAX_IMAGE_SIDE:  # 1e20 (or Infinity) would overflow the int64 array below
                shown = f"{v:.3g}" if isinstance(v, float) else f"a {len(str(v))}-digit number"
                raise DataError(f"{shown} is not a plausible image size (at most {MAX_IMAGE_SIDE} pixels a side)",
                                file=path, record=rec, field=key)
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


def _check_categories(data, path: Path, K: int, skeleton: str) -> None:
    """A category that names its keypoints must name K of them: a skeleton of the wrong size
    is caught here, once, instead of as a wrong-length record."""
    categories = data.get("categories")
    if not isinstance(categories, list):
        return
    for j, cat in enumerate(categories):
        names = cat.get("keypoints") if isinstance(cat, dict) else None
        if isinstance(names, list) and names and len(names) != K:
            raise DataError(f"the file's category {cat.get('id')} has {len(names)} keypoints but the skeleton "
                            f"{skeleton} has {K}; set data.dataset_info to a skeleton of this file (its path "
                            f"reads categories[0]) and model.num_keypoints to {len(names)}",
                            file=path, field=f"categories[{j}].keypoints")


def _record_keypoints(ann, path: Path, rec: str, K: int, fmt: str, hint: str = ""):
    """The flat (x, y, v) * K list of one annotation (the wholebody parts concatenated); `hint`
    ends the message of a wrong-length list."""
    parts = WHOLEBODY_PARTS if fmt == "coco_wholebody" else (("keypoints", K),)
    flat = []
    for key, count in parts:
        if key not in ann:
            raise DataError("missing field", file=path, record=rec, field=key)
        kp = ann[key]
        if not isinstance(kp, (list, tuple)) or len(kp) != 3 * count:
            got = len(kp) if isinstance(kp, (list, tuple)) else type(kp).__name__
            seen = f" ({got // 3} keypoints)" if isinstance(got, int) and got % 3 == 0 else ""
            raise DataError(f"{key} must hold {3 * count} numbers (x, y, v for {count} keypoints), got "
                            f"{got}{seen}{hint}", file=path, record=rec, field=key)
        flat = list(kp) if len(parts) == 1 else flat + list(kp)
    return flat


def _read_annotations(data, path: Path, images: _Images, K: int, dropped: dict, fmt: str = "coco",
                      skeleton: str = "COCO-17") -> dict:
    anns = data.get("annotations")
    if not isinstance(anns, list):
        raise DataError("missing or not a list", file=path, field="annotations")
    n = len(anns)
    ann_ids = np.empty(n, np.int64)
    image_ids = np.empty(n, np.int64)
    category_ids = np.full(n, PERSON_CATEGORY_ID, np.int64)
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
        if "category_id" in ann:
            category_ids[j] = _require(ann, "category_id", path, rec, int)
        crowd[j] = bool(ann.get("iscrowd", 0))
        if "keypoints" not in ann or "bbox" not in ann:
            has_kpts[j] = False  # MMPose skips these records (not keypoint annotations)
            continue
        box = ann["bbox"]
        if not isinstance(box, (list, tuple)) or len(box) != 4:
            raise DataError("bbox must be [x, y, w, h]", file=path, record=rec, field="bbox")
        # When the first record already disagrees, the skeleton is the likely culprit.
        hint = "" if kpt_rows else f"; the skeleton {skeleton} has {K} keypoints: does data.dataset_info fit this file?"
        kp = _record_keypoints(ann, path, rec, K, fmt, hint)
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
    _check_annotation_arrays(boxes, kpts, ann_ids, path)
    img_rows = images.rows(image_ids, path, lambda k: f"annotation id {ann_ids[k]}")

    # MMPose: min(1, v) for COCO files; v > 0 for COCO-WholeBody.
    xy = kpts[..., :2]
    vis = (kpts[..., 2] > 0).astype(np.float32) if fmt == "coco_wholebody" else np.minimum(1, kpts[..., 2])
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
            "keypoints": np.ascontiguousarray(xy[rows]), "keypoints_visible": np.ascontiguousarray(vis[rows]),
            "category_ids": category_ids[rows]}


def _check_annotation_arrays(boxes: np.ndarray, kpts: np.ndarray, ann_ids: np.ndarray, path: Path) -> None:
    """DataError naming the first record with a bad box or keypoints, or a repeated annotation id."""
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


def _mpii_number_list(ann, key, count, path, rec) -> np.ndarray:
    """A numeric list field of an MPII record as float64 (count values), or DataError."""
    value = _require(ann, key, path, rec, (list, tuple))
    try:
        arr = np.array(value, np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise DataError(f"{key} is not numeric: {value!r}", file=path, record=rec, field=key) from None
    if arr.size != count:
        raise DataError(f"{key} must hold {count} numbers, got {arr.size}", file=path, record=rec, field=key)
    if not np.all(np.isfinite(arr)):
        raise DataError(f"{key} holds a non-finite number", file=path, record=rec, field=key)
    return arr


def _read_mpii(data, path: Path, img_dir, K: int, dropped: dict):
    """MMPose's MpiiDataset: one instance per record, in file order.

    Each record: `image` (file name, whose number before the dot is the image id), `center`
    (x, y, MATLAB 1-based) and `scale` (box size / 200 px) of the person, `joints` (K x 2) and
    `joints_vis` (K). As MMPose: scale s -> a (200 s, 200 s) box; unless x is -1 the centre moves
    down by 15 s px (MPII's boxes cut the feet otherwise); then 1 is subtracted (0-based pixels),
    in float32, and the box is padded by 1.25 like every top-down box. Instance ids are the
    record numbers. Records with an empty box or all-zero joints are dropped, as MMPose does.

    Returns (images, instances, center (N, 2), scale (N, 2)).
    """
    if not isinstance(data, list):
        raise DataError("the MPII format is a JSON list of {image, center, scale, joints, joints_vis}",
                        file=path, field="<top level>")
    if img_dir is None:
        raise ValueError("the MPII format needs img_dir: its records have no image size, which is read from "
                         "the image files")
    n = len(data)
    center = np.zeros((n, 2), np.float32)
    size = np.zeros((n, 2), np.float32)  # the unpadded box (w, h) in pixels
    kpts = np.zeros((n, K, 2), np.float32)
    vis = np.zeros((n, K), np.float32)
    names, image_ids = [], np.zeros(n, np.int64)
    for j, ann in enumerate(data):
        rec = f"MPII record {j}"
        name = _require(ann, "image", path, rec, str)
        try:
            image_ids[j] = int(name.split(".")[0])
        except ValueError:
            raise DataError(f"image name {name!r} must be a number and a suffix (MMPose takes the number as the "
                            "image id)", file=path, record=rec, field="image") from None
        names.append(name)
        c = _mpii_number_list(ann, "center", 2, path, rec).astype(np.float32)
        s = np.float32(_require(ann, "scale", path, rec, (int, float)))
        size[j] = np.array([s, s], np.float32) * np.float32(MPII_PIXEL_STD)
        if c[0] != -1:
            # float64 arithmetic stored as float32: what MMPose's numpy 1.x expression does.
            c[1] = np.float32(float(c[1]) + MPII_CENTER_SHIFT / MPII_PIXEL_STD * float(size[j, 1]))
        center[j] = c - np.float32(1)
        kpts[j] = _mpii_number_list(ann, "joints", 2 * K, path, rec).reshape(K, 2)
        vis[j] = _mpii_number_list(ann, "joints_vis", K, path, rec)
    images = _mpii_images(names, image_ids, path, Path(img_dir))
    img_rows = images.rows(image_ids, path, lambda k: f"MPII record {k}", field="image")
    keep = np.ones(n, bool)
    for reason, bad in (("box empty", ~np.all(size > 0, axis=1)),
                        ("max(keypoints) <= 0", kpts.max(axis=(1, 2), initial=0) <= 0)):
        _count(dropped, reason, np.count_nonzero(keep & bad))
        keep &= ~bad
    rows = np.flatnonzero(keep)
    half = size[rows] * np.float32(0.5)
    bbox = np.concatenate([center[rows] - half, center[rows] + half], axis=1).astype(np.float32)
    instances = {"ids": rows.astype(np.int64), "image_index": img_rows[rows], "bbox_xyxy": bbox,
                 "bbox_score": np.ones(len(rows), np.float32), "keypoints": np.ascontiguousarray(kpts[rows]),
                 "keypoints_visible": np.ascontiguousarray(vis[rows]),
                 "category_ids": np.full(len(rows), PERSON_CATEGORY_ID, np.int64)}
    return images, instances, center[rows], size[rows] * np.float32(BOX_PADDING)


def _mpii_images(names: list, image_ids: np.ndarray, path: Path, img_dir: Path) -> _Images:
    """The distinct images of an MPII file, in order of first use, sized from their headers."""
    first = {}
    for name, image_id in zip(names, image_ids):
        if first.setdefault(int(image_id), name) != name:
            raise DataError(f"image id {int(image_id)} names two files: {first[int(image_id)]!r} and {name!r}",
                            file=path, field="image")
    ids = np.array(list(first), np.int64)
    files = list(first.values())
    sizes = np.array([read_image_size(img_dir / f, record=f"image {f}") for f in files], np.int64).reshape(-1, 2)
    order = np.argsort(ids, kind="stable")
    return _Images(ids, sizes, np.array(files, dtype=np.str_), ids[order], order)
