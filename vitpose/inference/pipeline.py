"""The one prediction pipeline: source -> boxes -> crops -> network -> heatmap decode -> `Poses`.

`TopDown` holds every step but the network: `Predictor` (PyTorch) and `OnnxPredictor`
(onnxruntime) subclass it and differ only in `run_network`. Images, folders, videos and webcams
all go through `TopDown.__call__`; tracking and smoothing post-process its `Poses`.

Also here, each once: the source classifier (`classify_source`: image / dir / video / webcam),
the reader of detection files (`read_boxes_file`, keyed by `image_id`, `file_name` or `frame`),
the image-id rule (`image_ids`), the COCO-record writer (`coco_records`, instance score =
`vitpose.codecs.instance_scores`, the evaluator's rule, so `vitpose predict --json` and evaluate agree) and the
JSON Lines results file (`ResultsFile`: streamed, flushed, resumable). No torch (OnnxPredictor).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vitpose.codecs.confidence import VARIANTS, calibrated, heatmap_sharpness, keypoint_features, variant_of
from vitpose.codecs.decode import decode_to_image, instance_scores
from vitpose.data.geometry import bbox_xywh2xyxy, person_boxes_to_center_scale
from vitpose.data.transforms import topdown_crops
from vitpose.errors import UserError
from vitpose.inference.results import Detections, FlipViews, Poses, StageTimer
from vitpose.run.sources import IMAGE_SUFFIXES, VIDEO_SUFFIXES, classify_source  # noqa: F401 - their old home

__all__ = ["BoxError", "BoxTable", "TopDown", "calibrated_views", "classify_source", "coco_records", "decode_views",
           "image_ids", "read_boxes_file", "read_records"]

_COCO_ID = re.compile(r"[0-9]+")  # ASCII digits only: "²" is a digit to str.isdigit, not to int()
# A caller's box may reach past the image (a person at its edge), but one that misses the image
# or spans more than this many times its width or height is no person in it: boxes made for
# another image size or another image, or a unit mistake (1e30-pixel boxes gave keypoints ~5e29).
MAX_BOX_SPAN = 10
KEYPOINT_SCORE_THR = 0.2  # MMPose's keypoint_score_thr for the instance score (CocoMetric's default)


class BoxError(UserError, ValueError):
    """Caller boxes that cannot belong to their image (far outside it), in one line."""


class TopDown:
    """The steps every predictor shares; a subclass sets `codec`, `batch_size`, `detector`,
    `num_keypoints` and `timer` (a `StageTimer`) and defines `run_network(crops) -> heatmaps`
    (uint8 RGB crops (N, 3, h, w) -> float32 numpy (N, K, H, W), flip test included)."""

    codec = None
    batch_size = 32
    detector = None
    num_keypoints = 17
    flip_test = True
    calibration = None  # the model file's recorded fit (`ModelSpec.calibration`), or None
    timer: StageTimer

    def run_network(self, crops) -> np.ndarray:
        raise NotImplementedError

    def gives_views(self) -> bool:
        """Whether `run_network_views` can run (the flip test's two views apart); a subclass that can says so."""
        return False

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
            In a list, an image's entry may also be `Detections`, or None for the detector's boxes.
        box_format: "xyxy" | "xywh" (caller boxes).
        The crops of all the images go through the network together, `batch_size` at a time.
        """
        single, images, found = self._people(images, boxes, box_format, channels)
        poses = self._pose(images, found, channels)
        return poses[0] if single else poses

    def _people(self, images, boxes, box_format: str, channels: str):
        """`__call__`'s and `flip_views`'s arguments checked: (single, images, [Detections] per image)."""
        if channels not in ("rgb", "bgr"):
            raise ValueError(f"channels must be 'rgb' or 'bgr', got {channels!r}")
        single = not isinstance(images, (list, tuple))
        images = [as_image(image) for image in ([images] if single else images)]
        if boxes is None:
            return single, images, self.detect(images, channels)
        boxes = [boxes] if single else list(boxes)
        if len(boxes) != len(images):
            raise ValueError(f"{len(images)} images but {len(boxes)} box arrays")
        unboxed = [i for i, b in enumerate(boxes) if b is None]  # these images' people: the detector's
        detected = iter(self.detect([images[i] for i in unboxed], channels) if unboxed else ())
        found = []
        for i, (image, given) in enumerate(zip(images, boxes)):
            if given is None:
                found.append(next(detected))
                continue
            given = given if isinstance(given, Detections) else caller_boxes(given, box_format)
            outside = np.flatnonzero(boxes_outside_image(given.boxes, image.shape[1], image.shape[0]))
            if len(outside):
                j = int(outside[0])
                box = ", ".join(f"{v:.6g}" for v in given.boxes[j])
                raise BoxError(f"box {j}{'' if single else f' of image {i}'} [{box}] (xyxy) "
                               f"lies far outside the {image.shape[1]}x{image.shape[0]} image (it misses it or "
                               f"spans over {MAX_BOX_SPAN}x its size): boxes for another image or size?")
            found.append(given)
        return single, images, found

    def _pose(self, images, found: list[Detections], channels: str) -> list[Poses]:
        """Crops of every box of every image -> network in batches -> keypoints, split per image."""
        with self.timer.stage("crop"):
            crops, centers, scales = self._crop_all(images, [d.boxes for d in found], channels)
        k = self.num_keypoints
        keypoints, scores, p, visibility = np.zeros((0, k, 2)), np.zeros((0, k), np.float32), None, None
        if self.calibration is not None:
            p, visibility = np.zeros((0, k), np.float32), np.zeros((0, k), np.int8)
        if len(centers) and self.calibration is None:  # one network pass over the crops of every image
            keypoints, scores = self._keypoints_of_crops(crops, centers, scales)
        elif len(centers):
            keypoints, scores, p, visibility = self._calibrated_keypoints(crops, centers, scales, scene_of(images, found))
        out, start = [], 0
        for boxes, box_scores in found:
            stop = start + len(boxes)
            out.append(Poses(np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(box_scores, np.float32),
                             keypoints[start:stop], scores[start:stop],
                             keypoint_p=None if p is None else p[start:stop],
                             keypoint_visibility=None if visibility is None else visibility[start:stop]))
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
        return self._decode_views(crops, center, fixed_scale, lambda batch: (self.run_network(batch),))[0][:2]

    def _calibrated_keypoints(self, crops, center: np.ndarray, fixed_scale: np.ndarray, scene):
        """`_keypoints_of_crops` of a calibrated model, with the calibrated p (N, K) and visibility
        (N, K): the one place every runtime turns its features into them
        (`vitpose.codecs.confidence.calibrated`). The keypoints and scores are the same as without
        the calibration (the flip test's average of one batch); `scene`: `scene_of` the people."""
        views = self.gives_views()
        network = self.run_network_views if views else (lambda batch: (self.run_network(batch),))
        decoded = self._decode_views(crops, center, fixed_scale, network, sharpness=True)
        with self.timer.stage("calibrate"):
            return calibrated_views(self.calibration, decoded, fixed_scale, scene, variant_of(views, self.flip_test))

    def calibration_evidence(self, images, boxes, box_format: str = "xyxy", channels: str = "rgb") -> list[dict]:
        """What `vitpose calibrate` fits on: per image {variant: (keypoints (M, K, 2), scores (M, K),
        features (M, K, F))} of every variant (`vitpose.codecs.confidence.VARIANTS`), from one run of
        the flip test's two views on the given boxes (a list of (M, 4|5) arrays, one per image)."""
        _, images, found = self._people(list(images), list(boxes), box_format, channels)
        with self.timer.stage("crop"):
            crops, centers, scales = self._crop_all(images, [d.boxes for d in found], channels)
        if not len(centers):
            return [{} for _ in images]
        decoded = self._decode_views(crops, centers, scales, self.run_network_views, sharpness=True)
        scene = scene_of(images, found)
        every = {variant: variant_features(decoded, scales, scene, variant) for variant in VARIANTS}
        out, start = [], 0
        for boxes_here, _ in found:
            stop = start + len(boxes_here)
            out.append({variant: tuple(a[start:stop] for a in arrays) for variant, arrays in every.items()})
            start = stop
        return out

    def _decode_views(self, crops, center: np.ndarray, fixed_scale: np.ndarray, network, sharpness: bool = False):
        """`network(crops) -> (heatmaps, ...)` in batches, each heatmap view decoded to image
        pixels: [(keypoints (N, K, 2), scores (N, K), sharpness (N, K) or None) per view]."""
        views = None
        for start in range(0, len(center), self.batch_size):
            stop = start + self.batch_size
            with self.timer.stage("pose"):
                outputs = network(crops[start:stop])
            with self.timer.stage("decode heatmaps"):
                decoded = decode_views(self.codec, outputs, center[start:stop], fixed_scale[start:stop], sharpness)
            views = views or [([], [], []) for _ in outputs]
            for gathered, part in zip(views, decoded):
                for into, value in zip(gathered, part):
                    if value is not None:
                        into.append(value)
        return [(np.concatenate(keypoints), np.concatenate(scores), np.concatenate(sharp) if sharp else None)
                for keypoints, scores, sharp in views]

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
        single, images, found = self._people(images, boxes, box_format, channels)
        with self.timer.stage("crop"):
            crops, centers, scales = self._crop_all(images, [d.boxes for d in found], channels)
        k = self.num_keypoints
        calibrated_here = self.calibration is not None
        empty = (np.zeros((0, k, 2)), np.zeros((0, k), np.float32), np.zeros((0, k)) if calibrated_here else None)
        views = (self._decode_views(crops, centers, scales, self.run_network_views, sharpness=calibrated_here)
                 if len(centers) else [empty] * 3)
        p = visibility = None
        if calibrated_here:
            p, visibility = calibrated_views(self.calibration, views, scales, scene_of(images, found), "flip_views")[2:]
        out, start = [], 0
        for boxes_here, box_scores in found:
            stop = start + len(boxes_here)
            part = [(kp[start:stop], sc[start:stop]) for kp, sc, _ in views]
            poses = Poses(np.asarray(boxes_here, np.float32).reshape(-1, 4), np.asarray(box_scores, np.float32),
                          *part[0], keypoint_p=None if p is None else p[start:stop],
                          keypoint_visibility=None if visibility is None else visibility[start:stop])
            out.append(FlipViews(poses, *part[1], *part[2]))
            start = stop
        return out[0] if single else out


def scene_of(images, found: list[Detections]):
    """(image sizes (N, 2) w, h; boxes (N, 4) xyxy) of every person of the images (`scene_features`)."""
    sizes = [np.tile([image.shape[1], image.shape[0]], (len(d.boxes), 1)) for image, d in zip(images, found)]
    boxes = [np.asarray(d.boxes, np.float64).reshape(-1, 4) for d in found]
    return (np.concatenate(sizes).reshape(-1, 2) if sizes else np.zeros((0, 2)),
            np.concatenate(boxes) if boxes else np.zeros((0, 4)))


def decode_views(codec, outputs, center: np.ndarray, scale: np.ndarray, sharpness: bool = False):
    """Each heatmap view of one batch (N, K, H, W) decoded to image pixels: [(keypoints (N, K, 2),
    scores (N, K), sharpness (N, K) or None) per view] (`TopDown` and the evaluation loop)."""
    out = []
    for heatmaps in outputs:
        keypoints, scores = decode_to_image(codec, heatmaps, center, scale)
        out.append((keypoints, scores, heatmap_sharpness(heatmaps) if sharpness else None))
    return out


def calibrated_views(calibration, decoded, scale: np.ndarray, scene, variant: str):
    """(keypoints, scores, p (N, K), visibility (N, K)) of a calibrated model from `decode_views(...,
    sharpness=True)`'s views: the one seam every runtime and the evaluation loop pass, where the
    features of the variant they computed meet `vitpose.codecs.confidence.calibrated`.
    The keypoints and scores are the same as without the calibration."""
    keypoints, scores, features = variant_features(decoded, scale, scene, variant)
    p, visibility = calibrated(calibration, variant, features)
    return keypoints, scores, p, visibility


def variant_features(decoded, scale: np.ndarray, scene, variant: str):
    """(keypoints, scores, features (N, K, F)) of one variant from `_decode_views(..., sharpness=True)`'s
    views: [the decoded heatmaps] or [averaged, plain, mirrored flipped back]. `plain` is the
    plain view (the first of a run without the flip test); the others are the average's."""
    if variant == "plain" and len(decoded) == 3:
        decoded = decoded[1:2]
    keypoints, scores, sharpness = decoded[0]
    views = None
    if variant == "flip_views":
        (plain, plain_scores, _), (mirrored, mirrored_scores, _) = decoded[1], decoded[2]
        views = (plain, plain_scores, mirrored, mirrored_scores)
    return keypoints, scores, keypoint_features(scores, sharpness, scale, keypoints, scene, views)


def as_image(image) -> np.ndarray:
    """(H, W, 3) uint8 from a numpy array or a PIL image (converted to RGB); anything else: one line."""
    if not isinstance(image, np.ndarray) and hasattr(image, "convert") and hasattr(image, "size"):
        image = np.asarray(image.convert("RGB"))  # PIL: RGB, as `channels="rgb"` expects
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        got = f"{image.shape} {image.dtype}" if isinstance(image, np.ndarray) else type(image).__name__
        raise ValueError(f"image must be (H, W, 3) uint8 (or a PIL image), got {got}")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"image has no pixels: shape {image.shape}")
    return image


def boxes_outside_image(boxes, width: int, height: int) -> np.ndarray:
    """(M,) True for each xyxy box (M, 4) that misses the `width` x `height` image or spans
    more than MAX_BOX_SPAN times its width or height (see MAX_BOX_SPAN)."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    misses = (b[:, 2] <= 0) | (b[:, 3] <= 0) | (b[:, 0] >= width) | (b[:, 1] >= height)
    too_big = (b[:, 2] - b[:, 0] > MAX_BOX_SPAN * width) | (b[:, 3] - b[:, 1] > MAX_BOX_SPAN * height)
    return misses | too_big


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
    """Person boxes of a detection file: `by_key[kind][value]` -> rows [x, y, w, h, score, record
    index] for the kinds "image_id", "file_name" and "frame" that its records carry
    (`read_boxes_file`); `lookup` gives them as Detections."""

    def __init__(self, path: Path, by_key: dict[str, dict], flag: str = "--boxes"):
        self.path = path
        self.by_key = by_key
        self.flag = flag

    def lookup(self, kind: str, value, image_size: tuple[int, int] | None = None) -> Detections:
        """The boxes of the image or frame `value` (by `kind`); with its `image_size` (width,
        height), a box that lies far outside it (`boxes_outside_image`) raises UserError naming
        the file and the record."""
        rows = self.by_key[kind].get(value)
        if rows is None:
            return Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32))
        rows = np.asarray(rows, np.float64)
        xyxy = bbox_xywh2xyxy(rows[:, :4].astype(np.float32))
        if image_size is not None:
            outside = np.flatnonzero(boxes_outside_image(xyxy, *image_size))
            if len(outside):
                row = rows[outside[0]]
                raise UserError(f"{self.flag}: {self.path}: record [{int(row[5])}]: field 'bbox' "
                                f"{[float(v) for v in row[:4]]} lies far outside {kind} {value!r}'s "
                                f"{image_size[0]}x{image_size[1]} image (it misses it or spans over "
                                f"{MAX_BOX_SPAN}x its size): boxes for another image or image size?")
        return Detections(xyxy, rows[:, 4].astype(np.float32))

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



def video_boxes(path):
    """A video's `--boxes` file -> (BoxTable, the key of its records: "frame", else "image_id" as the
    0-based frame index), or (None, None) without one: the one rule of `vitpose.inference.video` and
    of `--segment`'s runs (`vitpose.inference.sharded`), so a segment reads the boxes the unsplit run does."""
    if not path:
        return None, None
    table = read_boxes_file(path)
    for key in ("frame", "image_id"):
        if table.keyed_by(key) or not table.by_key:
            return table, key
    raise UserError(f"--boxes: {path}: a video's boxes are keyed by 'frame' (the 0-based frame index); "
                    f"its records have only 'file_name'")

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
        row = _record_row(record, where) + [i]
        if record.get("category_id", 1) != 1:
            continue
        here = {kind for kind, _ in keys}
        kinds = here if kinds is None else kinds & here
        for kind, value in keys:
            by_key.setdefault(kind, {}).setdefault(value, []).append(row)
    return BoxTable(path, {kind: table for kind, table in by_key.items() if kinds is None or kind in kinds}, flag)


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
    instance score: `instance_scores`, comparisons in float64), `track_id` when tracked, and
    `p` (K calibrated probabilities) and `visibility` (K ints: 0 absent, 1 occluded, 2 visible)
    only when the poses carry them (a calibrated model file).
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
        if poses.keypoint_p is not None:
            p, bad_p = _finite_or_none(poses.keypoint_p[m])
            bad += bad_p
            record["p"] = p
        if poses.keypoint_visibility is not None:
            record["visibility"] = [int(v) for v in np.asarray(poses.keypoint_visibility[m]).ravel()]
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

