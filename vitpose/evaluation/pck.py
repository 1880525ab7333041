"""PCK, AUC and EPE on COCO-format annotations, as MMPose 1.3.2 computes them (docs/evaluation.md §8.6).

MMPose scores its hand datasets (OneHand10K, RHD2D, FreiHand, ...) with three metrics of
`mmpose/evaluation/metrics/keypoint_2d_metrics.py` over the functions of
`mmpose/evaluation/functional/keypoint_eval.py`:

- `PCKAccuracy(thr=0.2, norm_item="bbox")`: a keypoint is correct when its distance to the ground
  truth, divided by the instance's box size, is below thr. The box size is the longer side of
  the GT box, max(x2 - x1, y2 - y1), of the box as MMPose's COCO-style dataset reads it (clipped
  to the image: x1 = clip(x, 0, W - 1), x2 = clip(x + w, 0, W - 1), float32), the same for x
  and y. Per keypoint: the share of correct ones among the labelled ones (v > 0, MMPose's
  `min(1, v)` as a mask); the reported PCK is the mean over the keypoints labelled somewhere
  (`keypoint_pck_accuracy`'s avg_acc: a mean of per-keypoint shares, not of all points).
- `AUC(norm_factor=30, num_thrs=20)`: the same PCK with every distance divided by 30 pixels,
  at the thresholds 0, 0.05, ..., 0.95, averaged (`keypoint_auc`).
- `EPE`: the mean distance in pixels over the labelled keypoints of all instances (`keypoint_epe`).

MMPose's arithmetic is kept: the normalised distances are stored as float32 (-1 where a keypoint
is unlabelled, or everywhere in a row whose box size is 0) and compared with the threshold in
float32; the EPE sums them in float32 and divides in float64. Instances are those MMPose's
top-down dataset keeps (not crowd, `num_keypoints` > 0, a box with area after clipping, some
coordinate > 0): the instances `vitpose.data.CocoKeypoints` predicts on GT boxes, one prediction
per annotation id. PCK has no use for detected boxes (their predictions match no annotation).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vitpose.evaluation.coco_evaluator import GroundTruthError, PredictionError
from vitpose.evaluation.predictions import count_nonfinite, note_missing
from vitpose.files import write_atomic

log = logging.getLogger(__name__)

AUC_NORM_FACTOR = 30.0  # MMPose's AUC default: pixels
AUC_NUM_THRESHOLDS = 20  # MMPose's AUC default: thresholds 0, 1/20, ..., 19/20
NORMALIZERS = ("bbox",)


def normalised_distances(predicted: np.ndarray, gt: np.ndarray, mask: np.ndarray, norm: np.ndarray) -> np.ndarray:
    """(N, K) float32 distances / norm (N, 2); -1 where the keypoint is masked out or its row has a
    zero normaliser (MMPose's `_calc_distances`, which returns the transpose)."""
    usable = mask & ~(norm == 0).any(axis=1)[:, None]
    norm = norm.copy()
    norm[norm <= 0] = 1e6  # in the normaliser's own dtype, as MMPose assigns it
    distances = np.full(mask.shape, -1, np.float32)
    distances[usable] = np.linalg.norm(((predicted - gt) / norm[:, None, :])[usable], axis=-1)
    return distances


def pck_accuracy(distances: np.ndarray, thr: float) -> tuple[np.ndarray, float, int]:
    """(per-keypoint accuracy (K,) with -1 for a keypoint labelled nowhere, their mean over the
    others, how many others) of normalised distances (N, K): MMPose's `keypoint_pck_accuracy`."""
    valid = distances != -1
    count = valid.sum(axis=0)
    below = ((distances < np.float32(thr)) & valid).sum(axis=0)  # float32, as NumPy compares them
    accuracy = np.where(count > 0, below / np.maximum(count, 1), -1.0)
    scored = accuracy[accuracy >= 0]
    return accuracy, float(scored.mean()) if len(scored) else 0.0, len(scored)


def auc(predicted: np.ndarray, gt: np.ndarray, mask: np.ndarray, norm_factor: float = AUC_NORM_FACTOR,
        num_thresholds: int = AUC_NUM_THRESHOLDS) -> float:
    """MMPose's `keypoint_auc`: mean PCK over thresholds i / num_thresholds of distance / norm_factor."""
    norm = np.full((len(predicted), 2), float(norm_factor))
    distances = normalised_distances(predicted, gt, mask, norm)
    total = 0.0
    for i in range(num_thresholds):
        total += 1.0 / num_thresholds * pck_accuracy(distances, 1.0 * i / num_thresholds)[1]
    return total


def epe(predicted: np.ndarray, gt: np.ndarray, mask: np.ndarray) -> float:
    """MMPose's `keypoint_epe`: the mean pixel distance over the labelled keypoints (0 when none)."""
    distances = normalised_distances(predicted, gt, mask, np.ones((len(predicted), 2), np.float32))
    valid = distances[distances != -1]
    return float(valid.sum()) / max(1, len(valid))


class PCKEvaluator:
    """MMPose's PCKAccuracy (normalised by the GT box), AUC and EPE over a COCO-format annotation file.

    Args:
        ann_file: COCO keypoint annotations (`images` with width and height, `annotations` with
            `id`, `image_id`, `bbox`, `keypoints`).
        num_keypoints: K.
        threshold: PCK's threshold (MMPose's hand configs: 0.2).
        normalizer: "bbox" (the longer side of the GT box).
        auc_norm_factor, auc_num_thresholds: AUC's settings (MMPose's defaults 30 px, 20).

    `evaluate(predictions)`: one dict per annotation, `{"id": the annotation id, "keypoints": (K, 2)
    image pixels}` (`"image_id"` is checked when given). Returns `{"PCK@<thr>": ..., "AUC": ...,
    "EPE": ...}` (PCK and AUC as shares in [0, 1], EPE in pixels).
    """

    def __init__(self, ann_file, num_keypoints: int, threshold: float = 0.2, normalizer: str = "bbox",
                 auc_norm_factor: float = AUC_NORM_FACTOR, auc_num_thresholds: int = AUC_NUM_THRESHOLDS):
        if normalizer not in NORMALIZERS:
            raise ValueError(f"normalizer must be one of {list(NORMALIZERS)}, got {normalizer!r}")
        self.ann_file = Path(ann_file)
        self.num_keypoints = int(num_keypoints)
        self.threshold = float(threshold)
        self.normalizer = normalizer
        self.auc_norm_factor = float(auc_norm_factor)
        self.auc_num_thresholds = int(auc_num_thresholds)
        self.primary_stat = f"PCK@{self.threshold:g}"
        self.stat_names = (self.primary_stat, "AUC", "EPE")
        self.last_nonfinite = 0  # predictions with a non-finite coordinate in the last `evaluate`
        self.ids, self.image_ids, self.keypoints, self.mask, self.box_sizes = read_instances(
            self.ann_file, self.num_keypoints)
        self.row = {ann_id: i for i, ann_id in enumerate(self.ids.tolist())}

    def _stack(self, predictions: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
        """(rows of the ground truth, keypoints (M, K, 2) in their own float dtype) of the predictions."""
        rows, keypoints = [], []
        for i, pred in enumerate(predictions):
            if not isinstance(pred, dict):
                raise PredictionError(f"prediction #{i}: expected a dict, got {type(pred).__name__}")
            ann_id = pred.get("id")
            if isinstance(ann_id, (bool, np.bool_)) or not isinstance(ann_id, (int, np.integer)):
                raise PredictionError(f"prediction #{i}: field 'id' must be an annotation id, got {ann_id!r}")
            if int(ann_id) not in self.row:
                raise PredictionError(
                    f"prediction #{i}: id {ann_id} is not an evaluated annotation of {self.ann_file} (PCK scores "
                    "each annotated instance on its ground-truth box: evaluate with GT boxes, not detections)")
            row = self.row[int(ann_id)]
            if row in rows:
                raise PredictionError(f"prediction #{i}: annotation {ann_id} is predicted twice")
            image_id = pred.get("image_id")
            if image_id is not None and image_id != self.image_ids[row]:
                raise PredictionError(f"prediction #{i} (id {ann_id}): image_id {image_id!r} but annotation {ann_id} "
                                      f"of {self.ann_file} is on image {self.image_ids[row]}")
            try:
                xy = np.asarray(pred.get("keypoints"))
            except (ValueError, TypeError):
                xy = np.asarray(None)
            if xy.dtype.kind not in "fiu" or xy.shape != (self.num_keypoints, 2):
                raise PredictionError(f"prediction #{i} (id {ann_id}): field 'keypoints' must be "
                                      f"{self.num_keypoints} (x, y) numbers, got shape {xy.shape} of {xy.dtype}")
            rows.append(row)
            keypoints.append(xy)
        note_missing(len(self.ids) - len(rows), len(self.ids), f"instances of {self.ann_file}",
                     f"PCK, AUC and EPE are computed over the {len(rows)} predicted ones", log)
        return (np.asarray(rows, np.int64),
                np.stack(keypoints) if keypoints else np.zeros((0, self.num_keypoints, 2), np.float32))

    def evaluate(self, predictions: Sequence[dict]) -> dict[str, float]:
        """`{"PCK@<thr>", "AUC", "EPE"}` of `predictions` (see the class docstring)."""
        rows, predicted = self._stack(predictions)
        if len(rows) == 0:
            raise PredictionError(f"no predictions to evaluate against {self.ann_file}")
        # NaN is never below a threshold (those keypoints are wrong) and makes the EPE NaN, as in MMPose.
        self.last_nonfinite = count_nonfinite(predicted, "wrong for PCK and AUC, EPE is NaN", log)
        gt, mask = self.keypoints[rows], self.mask[rows]
        sizes = self.box_sizes[rows]
        norm = np.stack([sizes, sizes], axis=1)  # float32: MMPose's [bbox_size, bbox_size]
        pck = pck_accuracy(normalised_distances(predicted, gt, mask, norm), self.threshold)[1]
        return {self.primary_stat: pck,
                "AUC": auc(predicted, gt, mask, self.auc_norm_factor, self.auc_num_thresholds),
                "EPE": epe(predicted, gt, mask)}

    def results(self, predictions: Sequence[dict]) -> list[dict]:
        """The predictions as scored: `id`, `image_id` and `keypoints` (K x (x, y, score) flattened;
        score 1 where none is given)."""
        rows, predicted = self._stack(predictions)
        out = []
        for pred, row, xy in zip(predictions, rows.tolist(), predicted):
            scores = np.asarray(pred.get("keypoint_scores", np.ones(self.num_keypoints)), np.float64)
            if scores.shape != (self.num_keypoints,):
                raise PredictionError(f"prediction (id {pred.get('id')}): field 'keypoint_scores' has shape "
                                      f"{scores.shape}, expected ({self.num_keypoints},)")
            flat = np.concatenate([np.asarray(xy, np.float64), scores[:, None]], axis=1)
            out.append({"id": int(self.ids[row]), "image_id": self.image_ids[row], "keypoints": flat.ravel().tolist()})
        return out

    def write_results(self, predictions: Sequence[dict], path) -> Path:
        """Write `results(predictions)` as JSON."""
        return write_atomic(path, json.dumps(self.results(predictions)))


def _fail(path: Path, message: str):
    raise GroundTruthError(f"{path}: {message}")


def _numbers(value, count: int) -> bool:
    return (isinstance(value, list) and len(value) == count
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))


def read_instances(ann_file, num_keypoints: int):
    """(annotation ids, image ids, keypoints (N, K, 2) float32, labelled (N, K) bool, box sizes (N,)
    float32) of the instances MMPose's COCO-style top-down dataset keeps (module docstring).

    GroundTruthError names the file and the annotation when a field the metric reads is missing
    or malformed, or when no instance is left."""
    path = Path(ann_file)
    if not path.is_file():
        raise FileNotFoundError(f"annotation file not found: {path}")
    try:
        dataset = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        _fail(path, f"not valid JSON ({e})")
    if not isinstance(dataset, dict) or not isinstance(dataset.get("annotations"), list):
        _fail(path, "no 'annotations' list: PCK needs the ground truth")
    sizes = {}
    for j, image in enumerate(dataset.get("images") or []):
        if not isinstance(image, dict) or not all(isinstance(image.get(k), (int, float)) and not isinstance(image.get(k), bool)
                                                  for k in ("id", "width", "height")):
            _fail(path, f"images[{j}]: needs numeric 'id', 'width' and 'height' (the box is clipped to the image)")
        sizes[image["id"]] = (image["width"], image["height"])
    K = int(num_keypoints)
    ids, image_ids, keypoints, mask, box_sizes = [], [], [], [], []
    for j, ann in enumerate(dataset["annotations"]):
        where = f"annotations[{j}] (id {ann.get('id') if isinstance(ann, dict) else None!r})"
        if not isinstance(ann, dict):
            _fail(path, f"{where}: expected an object")
        if "bbox" not in ann or "keypoints" not in ann:
            continue  # MMPose's parse_data_info drops it
        if not isinstance(ann.get("id"), int) or isinstance(ann.get("id"), bool):
            _fail(path, f"{where}: 'id' must be an integer")
        if ann.get("image_id") not in sizes:
            _fail(path, f"{where}: image_id {ann.get('image_id')!r} is not in 'images'")
        if not _numbers(ann["bbox"], 4):
            _fail(path, f"{where}: 'bbox' must be 4 numbers [x, y, w, h]")
        if not _numbers(ann["keypoints"], 3 * K):
            _fail(path, f"{where}: 'keypoints' must be {3 * K} numbers ({K} keypoints x (x, y, v))")
        width, height = sizes[ann["image_id"]]
        x, y, w, h = ann["bbox"]
        x1, y1 = np.clip(x, 0, width - 1), np.clip(y, 0, height - 1)
        x2, y2 = np.clip(x + w, 0, width - 1), np.clip(y + h, 0, height - 1)
        box = np.array([x1, y1, x2, y2], np.float32)
        labels = np.array(ann["keypoints"], np.float32).reshape(K, 3)
        xy = labels[:, :2]
        count = ann["num_keypoints"] if "num_keypoints" in ann else np.count_nonzero(xy.max(axis=1))
        extent = box[2:] - box[:2]
        if ann.get("iscrowd", 0) or count == 0 or extent[0] <= 0 or extent[1] <= 0 or np.max(xy) <= 0:
            continue  # MMPose's _is_valid_instance
        ids.append(ann["id"])
        image_ids.append(ann["image_id"])
        keypoints.append(xy)
        mask.append(np.minimum(1, labels[:, 2]).astype(bool))
        box_sizes.append(np.max(extent))
    if len(set(ids)) != len(ids):
        _fail(path, "annotation ids appear more than once: predictions are matched to annotations by id")
    if not ids:
        _fail(path, "no annotation with keypoints and a box to score")
    return (np.asarray(ids, np.int64), image_ids, np.stack(keypoints), np.stack(mask),
            np.asarray(box_sizes, np.float32))


__all__ = ["PCKEvaluator", "auc", "epe", "normalised_distances", "pck_accuracy", "read_instances"]
