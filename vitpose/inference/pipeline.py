"""The one prediction pipeline: source -> boxes -> crops -> network -> heatmap decode -> `Poses`.

`TopDown` holds every step but the network: `Predictor` (PyTorch) and `OnnxPredictor`
(onnxruntime) subclass it and differ only in `run_network`. Images, folders, videos and webcams
all go through `TopDown.__call__`; tracking and smoothing post-process its `Poses`.

Also here, each once: the source classifier (`classify_source`: image / dir / video / webcam),
the reader of detection files (`read_boxes_file`, keyed by `image_id`, `file_name` or `frame`),
the image-id rule (`image_ids`), the COCO-record writer (`coco_records`, instance score =
`vitpose.evaluation`'s `instance_scores`, so `vitpose predict --json` and evaluate agree) and the
JSON Lines results file (`ResultsFile`: streamed, flushed, resumable). No torch (OnnxPredictor).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vitpose.data.geometry import bbox_xywh2xyxy, crop_to_image, person_boxes_to_center_scale
from vitpose.data.transforms import topdown_crops
from vitpose.errors import UserError
from vitpose.evaluation.coco_evaluator import instance_scores
from vitpose.files import write_atomic
from vitpose.inference.results import Detections, FlipViews, Poses, StageTimer

__all__ = ["BoxTable", "ResultsFile", "TopDown", "classify_source", "coco_records", "image_ids",
           "read_boxes_file", "read_records"]

KEYPOINT_SCORE_THR = 0.2  # MMPose's keypoint_score_thr for the instance score (CocoMetric's default)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".jp2", ".pgm", ".ppm")
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".flv", ".ts")


class TopDown:
    """The steps every predictor shares; a subclass sets `codec`, `batch_size`, `detector`,
    `num_keypoints` and `timer` (a `StageTimer`) and defines `run_network(crops) -> heatmaps`
    (uint8 RGB crops (N, 3, h, w) -> float32 numpy (N, K, H, W), flip test included)."""

    codec = None
    batch_size = 32
    detector = None
    num_keypoints = 17
    timer: StageTimer

    def run_network(self, crops) -> np.ndarray:
        raise NotImplementedError

    def boxes_to_center_scale(self, boxes, box_format: str = "xyxy", image_shape=None):
        """(M, 4|5) boxes -> centre (M, 2), scale (M, 2) float32 (`geometry.person_boxes_to_center_scale`)."""
        return person_boxes_to_center_scale(boxes, box_format, image_shape)

    def crops(self, image: np.ndarray, center: np.ndarray, scale: np.ndarray):
        """UDP crops of the boxes: uint8 (M, 3, h, w) in the image's channel order, aspect-fixed scales (M, 2)."""
        return topdown_crops(image, center, scale, self.codec.input_size)

    def predict(self, image, boxes=None, box_format: str = "xyxy", channels: str = "rgb"):
        """Keypoints (M, K, 2) float64 image pixels and scores (M, K) float32 of the given boxes.

        image: (H, W, 3) uint8 (RGB, or `channels="bgr"`) or a PIL image. boxes: (M, 4|5) xyxy
        (or `box_format="xywh"`) image pixels, [] for nobody, None for the whole image.
        Exactly `self(image, boxes=boxes)` without the boxes: the same steps, the same numbers.
        """
        image = as_image(image)
        if boxes is None:
            boxes, box_format = [[0, 0, image.shape[1], image.shape[0]]], "xyxy"
        poses = self(image, boxes=boxes, box_format=box_format, channels=channels)
        return poses.keypoints, poses.keypoint_scores

    def detect(self, images: Sequence[np.ndarray], channels: str = "rgb") -> list[Detections]:
        """The detector's person boxes of each image; a box that is not finite or has no area holds nobody."""
        if self.detector is None:
            raise ValueError("this predictor has no detector: pass boxes=..., or build it with "
                             "Predictor.from_pretrained(..., detector='default' | 'full-frame')")
        with self.timer.stage("detect"):
            found = self.detector(images, channels=channels)
        if len(found) != len(images):
            raise RuntimeError(f"the detector returned {len(found)} results for {len(images)} images")
        out = []
        for boxes, scores in found:
            boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
            scores = np.asarray(scores, np.float32).reshape(-1)
            valid = np.all(np.isfinite(boxes), axis=1) & np.all(boxes[:, 2:] > boxes[:, :2], axis=1)
            out.append(Detections(boxes[valid], scores[valid]))
        return out

    def __call__(self, images, boxes=None, box_format: str = "xyxy", channels: str = "rgb"):
        """All people of one image (-> `Poses`) or of a list of images (-> list of `Poses`).

        images: (H, W, 3) uint8, RGB (or `channels="bgr"`), a PIL image, or a list of them.
        boxes: None: the detector finds the people. Otherwise the caller's boxes: (M, 4|5) for one
            image ([] for nobody), a list of them for a list of images; a 5th column is the box score.
        box_format: "xyxy" | "xywh" (caller boxes).
        The crops of all the images go through the network together, `batch_size` at a time.
        """
        if channels not in ("rgb", "bgr"):
            raise ValueError(f"channels must be 'rgb' or 'bgr', got {channels!r}")
        single = not isinstance(images, (list, tuple))
        images = [as_image(image) for image in ([images] if single else images)]
        if boxes is None:
            found = self.detect(images, channels)
        else:
            boxes = [boxes] if single else list(boxes)
            if len(boxes) != len(images):
                raise ValueError(f"{len(images)} images but {len(boxes)} box arrays")
            found = [caller_boxes(b, box_format) for b in boxes]
        poses = self._pose(images, found, channels)
        return poses[0] if single else poses

    def _pose(self, images, found: list[Detections], channels: str) -> list[Poses]:
        """Crops of every box of every image -> network in batches -> keypoints, split per image."""
        with self.timer.stage("crop"):
            crops, centers, scales = self._crop_all(images, [d.boxes for d in found], channels)
        k = self.num_keypoints
        keypoints, scores = np.zeros((0, k, 2)), np.zeros((0, k), np.float32)
        if len(centers):  # one network pass over the crops of every image
            keypoints, scores = self._keypoints_of_crops(crops, centers, scales)
        out, start = [], 0
        for boxes, box_scores in found:
            stop = start + len(boxes)
            out.append(Poses(np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(box_scores, np.float32),
                             keypoints[start:stop], scores[start:stop]))
            start = stop
        return out

    def _crop_all(self, images, boxes_of_images, channels: str):
        """uint8 crops (N, 3, h, w) in RGB of every box, their centres (N, 2) and aspect-fixed scales (N, 2)."""
        crops, centers, scales = [], [], []
        for image, boxes in zip(images, boxes_of_images):
            if len(boxes):
                center, scale = self.boxes_to_center_scale(boxes)
                image_crops, fixed = self.crops(image, center, scale)
                crops.append(image_crops)
                centers.append(center)
                scales.append(fixed)
        if not crops:
            return None, np.zeros((0, 2), np.float32), np.zeros((0, 2), np.float32)
        crops = np.concatenate(crops)
        if channels == "bgr":  # the warp is per channel, so swapping after it is the same
            crops = crops[:, ::-1]
        return crops, np.concatenate(centers), np.concatenate(scales)

    def _keypoints_of_crops(self, crops, center: np.ndarray, fixed_scale: np.ndarray):
        """uint8 RGB crops (N, 3, h, w) -> keypoints (N, K, 2) image pixels, scores (N, K)."""
        return self._decode_views(crops, center, fixed_scale, lambda batch: (self.run_network(batch),))[0]

    def _decode_views(self, crops, center: np.ndarray, fixed_scale: np.ndarray, network):
        """`network(crops) -> (heatmaps, ...)` in batches, each heatmap view decoded to image
        pixels: [(keypoints (N, K, 2), scores (N, K)) per view]."""
        views = None
        for start in range(0, len(center), self.batch_size):
            stop = start + self.batch_size
            with self.timer.stage("pose"):
                outputs = network(crops[start:stop])
            with self.timer.stage("decode heatmaps"):
                views = views or [([], []) for _ in outputs]
                for (keypoints, scores), heatmaps in zip(views, outputs):
                    kpts, kpt_scores = self.codec.batch_decode(heatmaps)
                    keypoints.append(crop_to_image(kpts, center[start:stop], fixed_scale[start:stop],
                                                   self.codec.input_size))
                    scores.append(kpt_scores)
        return [(np.concatenate(keypoints), np.concatenate(scores)) for keypoints, scores in views]

    def run_network_views(self, crops):
        """uint8 RGB crops -> (flip-averaged, plain, mirrored-and-flipped-back) heatmaps; a
        predictor that can run the two views separately defines it (`Predictor`)."""
        raise NotImplementedError(f"{type(self).__name__} does not give the flip test's two views; "
                                  f"use the PyTorch Predictor")

    def flip_views(self, images, boxes=None, box_format: str = "xyxy", channels: str = "rgb"):
        """Like `__call__`, with the flip test's two views kept apart: for one image a
        `FlipViews` (a list of them for a list of images): `poses` (the flip-averaged prediction,
        what `__call__` returns), `plain` and `mirrored` keypoints (M, K, 2) and scores (M, K)
        decoded from the plain forward and from the mirrored forward flipped back. Their
        disagreement is a measure of the model's left/right doubt (`vitpose select`)."""
        single = not isinstance(images, (list, tuple))
        images = [as_image(image) for image in ([images] if single else images)]
        if boxes is None:
            found = self.detect(images, channels)
        else:
            boxes = [boxes] if single else list(boxes)
            if len(boxes) != len(images):
                raise ValueError(f"{len(images)} images but {len(boxes)} box arrays")
            found = [caller_boxes(b, box_format) for b in boxes]
        with self.timer.stage("crop"):
            crops, centers, scales = self._crop_all(images, [d.boxes for d in found], channels)
        k = self.num_keypoints
        empty = (np.zeros((0, k, 2)), np.zeros((0, k), np.float32))
        views = self._decode_views(crops, centers, scales, self.run_network_views) if len(centers) else [empty] * 3
        out, start = [], 0
        for boxes_here, box_scores in found:
            stop = start + len(boxes_here)
            part = [(kp[start:stop], sc[start:stop]) for kp, sc in views]
            poses = Poses(np.asarray(boxes_here, np.float32).reshape(-1, 4), np.asarray(box_scores, np.float32),
                          *part[0])
            out.append(FlipViews(poses, *part[1], *part[2]))
            start = stop
        return out[0] if single else out


def as_image(image) -> np.ndarray:
    """(H, W, 3) uint8 from a numpy array or a PIL image (converted to RGB); anything else: one line."""
    if not isinstance(image, np.ndarray) and hasattr(image, "convert") and hasattr(image, "size"):
        image = np.asarray(image.convert("RGB"))  # PIL: RGB, as `channels="rgb"` expects
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        got = f"{image.shape} {image.dtype}" if isinstance(image, np.ndarray) else type(image).__name__
        raise ValueError(f"image must be (H, W, 3) uint8 (or a PIL image), got {got}")
    return image


def caller_boxes(boxes, box_format: str = "xyxy") -> Detections:
    """(M, 4|5) caller boxes -> Detections(xyxy float32, scores): the 5th column or ones.

    xywh -> xyxy in float32, as CocoKeypoints converts detection files (same crops, same numbers).
    Malformed, non-finite or empty boxes raise (`person_boxes_to_center_scale` names them).
    """
    boxes = np.asarray(boxes, dtype=np.float32)
    if boxes.size == 0:
        return Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32))
    if boxes.ndim == 1:
        boxes = boxes[None]
    person_boxes_to_center_scale(boxes, box_format)  # the checks
    scores = boxes[:, 4].copy() if boxes.shape[1] == 5 else np.ones(len(boxes), np.float32)
    xyxy = bbox_xywh2xyxy(boxes[:, :4].copy()) if box_format == "xywh" else boxes[:, :4].copy()
    return Detections(xyxy, scores)


# ---------------------------------------------------------------------------------------------
# Sources and boxes


def classify_source(source) -> str:
    """"webcam" (an int, or digits that name no file), "dir", "video" (by suffix) or "image"."""
    if isinstance(source, int) or (str(source).isdigit() and not Path(str(source)).exists()):
        return "webcam"
    path = Path(source).expanduser()
    if path.is_dir():
        return "dir"
    return "video" if path.suffix.lower() in VIDEO_SUFFIXES else "image"


_COCO_ID = re.compile(r"[0-9]+")  # ASCII digits only: "²" is a digit to str.isdigit, not to int()


def image_ids(names: Sequence[str]) -> tuple[list[int], bool]:
    """The image ids of file names and whether they are COCO ids.

    COCO ids (000000197388.jpg -> 197388) only when every stem is ASCII digits; two names with
    the same id (1.jpg, 001.jpg) are an error. Otherwise a running index (0, 1, ...), and
    `--boxes` are matched by `file_name`.
    """
    stems = [Path(name).stem for name in names]
    if not stems or not all(_COCO_ID.fullmatch(stem) for stem in stems):
        return list(range(len(names))), False
    ids, seen = [int(stem) for stem in stems], {}
    for name, image_id in zip(names, ids):
        if image_id in seen:
            raise UserError(f"{seen[image_id]} and {name} both have the COCO image id {image_id}: rename one "
                            f"(image ids are the file names' numbers when every name is a number)")
        seen[image_id] = name
    return ids, True


class BoxTable:
    """Person boxes of a detection file: `by_key[kind][value] -> Detections` for the kinds
    "image_id", "file_name" and "frame" that its records carry (`read_boxes_file`)."""

    def __init__(self, path: Path, by_key: dict[str, dict]):
        self.path = path
        self.by_key = by_key

    def lookup(self, kind: str, value) -> Detections:
        rows = self.by_key[kind].get(value)
        if rows is None:
            return Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32))
        rows = np.asarray(rows, np.float32)
        return Detections(bbox_xywh2xyxy(rows[:, :4].copy()), rows[:, 4].copy())

    def keyed_by(self, kind: str) -> bool:
        return kind in self.by_key


def _record_key(record: dict, where: str) -> list[tuple[str, object]]:
    keys = []
    for kind in ("frame", "image_id"):
        value = record.get(kind)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"{where}: field {kind!r} must be an integer >= 0, got {value!r}")
            keys.append((kind, value))
    name = record.get("file_name")
    if name is not None:
        if not isinstance(name, str) or not name:
            raise UserError(f"{where}: field 'file_name' must be a file name, got {name!r}")
        keys.append(("file_name", Path(name).name))
    if not keys:
        raise UserError(f"{where}: missing field 'image_id' (or 'file_name' for images, 'frame' for videos)")
    return keys


def _record_row(record: dict, where: str) -> list[float]:
    bbox, score = record.get("bbox"), record.get("score", 1.0)
    if bbox is None:
        raise UserError(f"{where}: missing field 'bbox'")
    if (not isinstance(bbox, list) or len(bbox) < 4
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bbox[:4])):
        raise UserError(f"{where}: field 'bbox' must be [x, y, w, h] finite numbers, got {bbox!r}")
    if bbox[2] <= 0 or bbox[3] <= 0:
        raise UserError(f"{where}: field 'bbox' has zero or negative width/height: {bbox!r}")
    if not isinstance(score, (int, float)) or isinstance(score, bool) or not math.isfinite(score):
        raise UserError(f"{where}: field 'score' must be a finite number, got {score!r}")
    return [float(v) for v in bbox[:4]] + [float(score)]


def read_boxes_file(path, flag: str = "--boxes") -> BoxTable:
    """A COCO detection results JSON (a list, or JSON Lines) -> `BoxTable` of its person boxes.

    Records: `{"image_id" | "file_name" | "frame", "bbox": [x, y, w, h], "score" (default 1),
    "category_id" (default 1)}`; other categories are left out, every person box is kept whatever
    its score (as CocoKeypoints and MMPose read detection files). Errors name the flag, the file,
    the record and the field.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{flag}: file not found: {path}")
    try:
        records = read_records(path)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"{flag}: {path}: not readable JSON ({e})") from None
    by_key: dict[str, dict] = {}
    kinds = None
    for i, record in enumerate(records):
        where = f"{flag}: {path}: record [{i}]"
        if not isinstance(record, dict):
            raise UserError(f"{where}: expected an object, got {type(record).__name__}")
        keys = _record_key(record, where)
        row = _record_row(record, where)
        if record.get("category_id", 1) != 1:
            continue
        here = {kind for kind, _ in keys}
        kinds = here if kinds is None else kinds & here
        for kind, value in keys:
            by_key.setdefault(kind, {}).setdefault(value, []).append(row)
    return BoxTable(path, {kind: table for kind, table in by_key.items() if kinds is None or kind in kinds})


# ---------------------------------------------------------------------------------------------
# Results


def _finite_or_none(values) -> tuple[list, int]:
    out = [float(v) if math.isfinite(v) else None for v in np.asarray(values, np.float64).ravel()]
    return out, sum(v is None for v in out)


def coco_records(poses: Poses, image_id: int | None = None, file_name: str | None = None,
                 keypoint_score_thr: float = KEYPOINT_SCORE_THR) -> tuple[list[dict], int]:
    """COCO keypoint results of one image's or frame's `Poses` -> (records, non-finite values).

    One record per person: `image_id` and `file_name` (images) or `frame` (videos), `category_id`
    1, `bbox` [x, y, w, h], `keypoints` [x1, y1, s1, ...], `bbox_score`, `score` (the evaluator's
    instance score: `instance_scores`, comparisons in float64) and `track_id` when tracked.
    Non-finite keypoints or scores are written as null (JSON has no NaN); the count is returned.
    """
    scores = instance_scores(poses.keypoint_scores, poses.box_scores, keypoint_score_thr)
    records, bad = [], 0
    for m in range(len(poses)):
        x1, y1, x2, y2 = (float(v) for v in poses.boxes[m])
        flat = np.concatenate([poses.keypoints[m], np.asarray(poses.keypoint_scores[m], np.float64)[:, None]], 1)
        keypoints, bad_keypoints = _finite_or_none(flat)
        numbers, bad_numbers = _finite_or_none([x1, y1, x2 - x1, y2 - y1, poses.box_scores[m], scores[m]])
        bad += bad_keypoints + bad_numbers
        record = {"image_id": image_id, "file_name": file_name} if poses.frame is None else {"frame": poses.frame}
        record.update({"category_id": 1, "bbox": numbers[:4], "keypoints": keypoints, "bbox_score": numbers[4],
                       "score": numbers[5]})
        if poses.track_ids is not None:
            record["track_id"] = int(poses.track_ids[m])
        records.append(record)
    return records, bad


def read_records(path) -> list:
    """The records of a results or detection file: a JSON list, or JSON Lines (one object a line)."""
    text = Path(path).read_text(encoding="utf-8")
    stripped = text.lstrip()
    if not stripped:
        return []
    if stripped.startswith("["):
        records = json.loads(text)
        if not isinstance(records, list):
            raise ValueError(f"expected a list of records, got {type(records).__name__}")
        return records
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise ValueError(f"neither a JSON list nor JSON Lines ({e})") from None


class ResultsFile:
    """`--json`: records streamed as JSON Lines (each item's records in one flushed write), or one
    JSON array written at the end (`array=True`, bounded inputs only; `render` turns the records
    into another whole-file format).

    An existing file is replaced only when the run completes (`close(completed=True)`): until then
    the records go to `<name>.partial` beside it. A new file is written in place, so an
    interrupted run leaves a parseable file that `resume=True` continues: the records of the last
    item in it (which may be incomplete) are dropped and that item is done again, the others
    (`done`: their `file_name` or `frame`) are skipped.
    """

    def __init__(self, path, key: str, array: bool = False, resume: bool = False, render=None):
        self.path, self.key, self.array = Path(path), key, array
        self.render = render  # array files: records -> text (default: a JSON list)
        self.done: set = set()
        self.records: list[dict] = []
        self.nonfinite = 0
        self.count = 0
        if resume and self.path.exists():
            self._truncate_to_complete_items()
            self.target = self.path
        else:
            self.target = self.path.with_name(self.path.name + ".partial") if self.path.exists() else self.path
        self.target.parent.mkdir(parents=True, exist_ok=True)  # checked writable before the run
        self.file = None if array else open(self.target, "a" if self.target == self.path and resume else "w",
                                            encoding="utf-8")

    def _truncate_to_complete_items(self) -> None:
        data = self.path.read_bytes()
        if data.lstrip().startswith(b"["):
            raise UserError(f"--json {self.path} is one JSON list; --resume continues JSON Lines (the default "
                            f"without --json-array)")
        offsets, keys, position = [], [], 0
        for line in data.splitlines(keepends=True):
            try:
                record = json.loads(line)
                keys.append(record[self.key])
            except (ValueError, KeyError, TypeError):
                if line.endswith(b"\n"):
                    raise UserError(f"--json {self.path}: not a JSON Lines file of {self.key!r} records "
                                    f"(line {len(offsets) + 1}); --resume continues only what this command "
                                    f"wrote") from None
                break  # a torn last line: the item is done again
            offsets.append(position)
            position += len(line)
        end = position
        if keys:  # the last item's records may be incomplete (stopped mid-item): it is done again
            last = keys[-1]
            while keys and keys[-1] == last:
                keys.pop()
                end = offsets.pop()
        with open(self.path, "r+b") as f:
            f.truncate(end)
        self.done = set(keys)

    def write(self, records: list[dict], nonfinite: int = 0) -> None:
        self.count += len(records)
        self.nonfinite += nonfinite
        if self.array:
            self.records += records
        elif records:
            self.file.write("".join(json.dumps(r, allow_nan=False) + "\n" for r in records))
            self.file.flush()

    def close(self, completed: bool) -> Path:
        """Finish the file; returns where the results are (the `.partial` file if not replaced)."""
        if self.array:
            text = self.render(self.records) if self.render else json.dumps(self.records, allow_nan=False)
            write_atomic(self.target, text)
        else:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
        if completed and self.target != self.path:
            os.replace(self.target, self.path)
            return self.path
        return self.target
