"""COCO keypoint AP with MMPose's CocoMetric protocol (the one behind ViTPose's published numbers).

Given per-instance predictions of a top-down model, `CocoEvaluator.evaluate`:
1. drops predictions that repeat an `id` within an image (keeps the first after sorting by id);
2. rescores each one: `bbox_score x mean(keypoint scores > 0.2)`, 0 when none pass;
3. runs greedy OKS-NMS at 0.9 per image, OKS with the crop area (`area`);
4. scores the survivors with pycocotools' COCOeval (iouType "keypoints", COCO sigmas).
docs/evaluation.md §4, §5, §6; tests/fixtures/README.md §4 item 13.

A prediction is a dict `{"id", "image_id", "keypoints" (K, 2) image px, "keypoint_scores" (K,),
"bbox_score", "area"}` and optionally `"bbox"` (x, y, w, h) px. When the input box is given it is
written into the results, as MMPose's top-down metric does, and COCOeval then measures each
detection's area from it (this decides the medium/large split); without it COCOeval uses the
extent of the keypoints.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitpose.coco_meta import SIGMAS
from vitpose.evaluation.nms import oks_nms, soft_oks_nms

log = logging.getLogger(__name__)

STAT_NAMES = ("AP", "AP .5", "AP .75", "AP (M)", "AP (L)", "AR", "AR .5", "AR .75", "AR (M)", "AR (L)")
SCORE_MODES = ("bbox_keypoint", "bbox")
NMS_MODES = ("oks_nms", "soft_oks_nms", "none")
PERSON_CATEGORY_ID = 1


class PredictionError(ValueError):
    """A prediction that does not fit the schema (names its position, id and the field)."""


@contextlib.contextmanager
def _quiet(what: str):
    """pycocotools prints progress to stdout; send it to the debug log instead."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        yield
    text = buffer.getvalue().strip()
    if text:
        log.debug("%s:\n%s", what, text)


def _where(pred, index: int) -> str:
    return f"prediction #{index} (id {pred.get('id')!r}, image_id {pred.get('image_id')!r})"


def _as_array(pred: dict, index: int, key: str, shape: tuple) -> np.ndarray:
    if key not in pred:
        raise PredictionError(f"{_where(pred, index)}: missing field {key!r}")
    try:
        value = np.asarray(pred[key])
    except (ValueError, TypeError) as e:  # ragged lists and the like
        raise PredictionError(f"{_where(pred, index)}: field {key!r} is not an array of numbers ({e})") from None
    if value.dtype.kind not in "fiu":
        raise PredictionError(f"{_where(pred, index)}: field {key!r} must hold numbers, got dtype {value.dtype}")
    if value.shape != shape:
        raise PredictionError(f"{_where(pred, index)}: field {key!r} has shape {value.shape}, expected {shape}")
    return value


def _as_int(pred: dict, index: int, key: str) -> int:
    value = pred.get(key)
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
        return int(value)
    raise PredictionError(f"prediction #{index}: field {key!r} must be an integer, got {value!r}")


@dataclass
class PredictionArrays:
    """Predictions as columns (N = number of predictions)."""

    ids: np.ndarray  # (N,) int64
    image_ids: np.ndarray  # (N,) int64
    keypoints: np.ndarray  # (N, K, 2) float64, may hold NaN (an all-zero heatmap decodes to NaN)
    keypoint_scores: np.ndarray  # (N, K): float32 stays float32, so 0.2 is compared as MMPose does
    bbox_scores: np.ndarray  # (N,) float64
    areas: np.ndarray  # (N,) float64
    bboxes: np.ndarray | None  # (N, 4) float64 (x, y, w, h), or None when no prediction has one


def check_predictions(predictions: Sequence[dict], num_keypoints: int) -> PredictionArrays:
    """Validate predictions and stack them into columns; raise PredictionError on the first bad one."""
    n = len(predictions)
    ids = np.empty(n, np.int64)
    image_ids = np.empty(n, np.int64)
    bbox_scores = np.empty(n, np.float64)
    areas = np.empty(n, np.float64)
    keypoints, scores, bboxes = [], [], []
    with_bbox = None
    for i, pred in enumerate(predictions):
        if not isinstance(pred, dict):
            raise PredictionError(f"prediction #{i}: expected a dict, got {type(pred).__name__}")
        ids[i] = _as_int(pred, i, "id")
        image_ids[i] = _as_int(pred, i, "image_id")
        keypoints.append(_as_array(pred, i, "keypoints", (num_keypoints, 2)))
        scores.append(_as_array(pred, i, "keypoint_scores", (num_keypoints,)))
        bbox_scores[i] = _as_array(pred, i, "bbox_score", ())
        areas[i] = _as_array(pred, i, "area", ())
        has_bbox = pred.get("bbox") is not None
        if with_bbox is None:
            with_bbox = has_bbox
        elif has_bbox != with_bbox:
            # COCOeval reads detection areas from boxes for all results or for none.
            raise PredictionError(
                f"{_where(pred, i)}: 'bbox' is {'given' if has_bbox else 'missing'} but it is "
                f"{'missing' if has_bbox else 'given'} on the first prediction; give it on all or none")
        if has_bbox:
            bboxes.append(_as_array(pred, i, "bbox", (4,)))
    columns = PredictionArrays(
        ids, image_ids,
        np.stack(keypoints).astype(np.float64) if n else np.zeros((0, num_keypoints, 2)),
        np.stack(scores) if n else np.zeros((0, num_keypoints)),
        bbox_scores, areas,
        np.stack(bboxes).astype(np.float64) if with_bbox else None)
    if columns.keypoint_scores.dtype.kind != "f":
        columns.keypoint_scores = columns.keypoint_scores.astype(np.float64)
    # Scores, areas and boxes must be finite (keypoint coordinates may be NaN, as in MMPose).
    for key, values in (("keypoint_scores", columns.keypoint_scores), ("bbox_score", bbox_scores),
                        ("area", areas), ("bbox", columns.bboxes)):
        if values is None or n == 0:
            continue
        bad = ~np.isfinite(values.reshape(n, -1)).all(axis=1)
        if bad.any():
            i = int(np.argmax(bad))
            raise PredictionError(f"{_where(predictions[i], i)}: field {key!r} is not finite: "
                                  f"{np.asarray(predictions[i][key]).tolist()}")
    return columns


class CocoEvaluator:
    """MMPose's CocoMetric (ViTPose settings) on top of pycocotools' COCOeval."""

    def __init__(self, ann_file, score_mode: str = "bbox_keypoint", keypoint_score_thr: float = 0.2,
                 nms_mode: str = "oks_nms", nms_thr: float = 0.9, sigmas: Sequence[float] | None = None):
        if score_mode not in SCORE_MODES:
            raise ValueError(f"score_mode {score_mode!r}: expected one of {SCORE_MODES}")
        if nms_mode not in NMS_MODES:
            raise ValueError(f"nms_mode {nms_mode!r}: expected one of {NMS_MODES}")
        self.ann_file = Path(ann_file)
        if not self.ann_file.is_file():
            raise FileNotFoundError(f"COCO annotation file not found: {self.ann_file}")
        self.score_mode = score_mode
        self.keypoint_score_thr = float(keypoint_score_thr)
        self.nms_mode = nms_mode
        self.nms_thr = float(nms_thr)
        self.sigmas = np.asarray(SIGMAS if sigmas is None else sigmas, dtype=np.float64)
        self.num_keypoints = len(self.sigmas)

        from pycocotools.coco import COCO

        with _quiet(f"loading {self.ann_file}"):
            self.coco = COCO(str(self.ann_file))
        self.image_ids = set(self.coco.getImgIds())

    # -- protocol ---------------------------------------------------------------------------------

    def rescore(self, keypoint_scores: np.ndarray, bbox_scores) -> np.ndarray:
        """bbox_score x mean of the keypoint scores above the threshold (0 when none are).

        keypoint_scores (..., K), bbox_scores (...) -> (...) float64.
        """
        bbox_scores = np.asarray(bbox_scores, dtype=np.float64)
        if self.score_mode == "bbox":
            return bbox_scores
        confident = keypoint_scores > self.keypoint_score_thr  # in the scores' own dtype
        count = confident.sum(axis=-1)
        total = np.where(confident, keypoint_scores, 0).sum(axis=-1, dtype=np.float64)
        mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
        return bbox_scores * mean

    def keep(self, columns: PredictionArrays) -> list[np.ndarray]:
        """Per image (first-appearance order): the indices that survive de-duplication and NMS."""
        scores = self.rescore(columns.keypoint_scores, columns.bbox_scores)
        groups: dict[int, list[int]] = {}
        for i, image_id in enumerate(columns.image_ids.tolist()):
            groups.setdefault(image_id, []).append(i)
        nms = {"oks_nms": oks_nms, "soft_oks_nms": soft_oks_nms}.get(self.nms_mode)
        kept = []
        for members in groups.values():
            members = np.asarray(members)
            # Duplicate ids: sort by id (stable) and keep the first of each run, as MMPose does.
            members = members[np.argsort(columns.ids[members], kind="stable")]
            ids = columns.ids[members]
            members = members[np.r_[True, ids[1:] != ids[:-1]]]
            if nms is not None:
                # MMPose keeps the dataset sigmas as float32 for NMS; nms.py applies that rounding.
                members = members[nms(columns.keypoints[members], scores[members], columns.areas[members],
                                      self.nms_thr, sigmas=self.sigmas)]
            kept.append(members)
        return kept

    def results(self, predictions: Sequence[dict]) -> list[dict]:
        """The COCO results list (after de-duplication, rescoring and NMS) that COCOeval scores.

        Each entry: `image_id`, `category_id`, `keypoints` (x, y, score) * K flattened, `score`,
        and `bbox` when the predictions carry it. Images keep their first-appearance order and
        instances their NMS order, which decides COCOeval's order between equal scores.
        """
        columns = check_predictions(predictions, self.num_keypoints)
        if len(columns.ids) == 0:
            return []
        unknown = sorted(set(columns.image_ids.tolist()) - self.image_ids)
        if unknown:
            raise PredictionError(
                f"{len(unknown)} prediction image_id(s) are not in {self.ann_file}: {unknown[:10]}")
        scores = self.rescore(columns.keypoint_scores, columns.bbox_scores)
        flat = np.concatenate([columns.keypoints, columns.keypoint_scores[..., None].astype(np.float64)], axis=-1)
        flat = flat.reshape(len(flat), -1)
        results = []
        for members in self.keep(columns):
            for i in members.tolist():
                entry = {"image_id": int(columns.image_ids[i]), "category_id": PERSON_CATEGORY_ID,
                         "keypoints": flat[i].tolist(), "score": float(scores[i])}
                if columns.bboxes is not None:
                    entry["bbox"] = columns.bboxes[i].tolist()
                results.append(entry)
        return results

    # -- scoring ----------------------------------------------------------------------------------

    def evaluate(self, predictions: Sequence[dict]) -> dict[str, float]:
        """The ten COCO keypoint stats ("AP", "AP .5", ..., "AR (L)") of `predictions`."""
        results = self.results(predictions)
        return self.evaluate_results(results)

    def evaluate_results(self, results: list[dict]) -> dict[str, float]:
        """COCOeval (keypoints) on a COCO results list, with no further processing."""
        if not results:
            message = ("no predictions to evaluate: every COCO keypoint stat is reported as 0 "
                       f"(annotations: {self.ann_file})")
            warnings.warn(message, stacklevel=2)
            log.warning(message)
            return {name: 0.0 for name in STAT_NAMES}

        from pycocotools.cocoeval import COCOeval

        with _quiet("COCOeval"):
            # loadRes fills in area/bbox/id in place; keep the caller's list untouched.
            detections = self.coco.loadRes(copy.deepcopy(results))
            coco_eval = COCOeval(self.coco, detections, iouType="keypoints")
            coco_eval.params.kpt_oks_sigmas = self.sigmas.copy()
            coco_eval.params.useSegm = None
            coco_eval.evaluate()
            coco_eval.accumulate()
            coco_eval.summarize()
        return {name: float(value) for name, value in zip(STAT_NAMES, coco_eval.stats)}

    def write_results(self, predictions: Sequence[dict], path) -> Path:
        """Write the COCO keypoint results JSON (after the protocol) that `evaluate` scores."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.results(predictions)))
        return path


# -- raw prediction files (what evaluate.py --out writes) --------------------------------------------

def save_predictions(predictions: Iterable[dict], path) -> Path:
    """Write predictions (the dicts `evaluate` takes) as JSON, arrays as lists."""
    def plain(value):
        if isinstance(value, np.ndarray):
            return value.tolist()
        if isinstance(value, np.generic):
            return value.item()
        if hasattr(value, "tolist"):  # torch tensors
            return value.tolist()
        return value

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([{k: plain(v) for k, v in p.items()} for p in predictions]))
    return path


def load_predictions(path) -> list[dict]:
    """Read a file written by `save_predictions`; keypoints come back as float64, scores as float32 (the dtypes `predict` makes)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise PredictionError(f"{path}: expected a JSON list of predictions")
    for pred in data:
        for key in ("keypoints", "keypoint_scores"):
            if isinstance(pred, dict) and key in pred:
                pred[key] = np.asarray(pred[key], dtype=np.float32 if key == "keypoint_scores" else np.float64)
    return data
