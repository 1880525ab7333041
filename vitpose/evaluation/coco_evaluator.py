"""COCO keypoint AP with MMPose's CocoMetric protocol (the one behind ViTPose's published numbers).

Given per-instance predictions of a top-down model, `CocoEvaluator.evaluate`:
1. drops predictions that repeat an `id` within an image (keeps the first after sorting by id);
2. rescores each one: `bbox_score x mean(keypoint scores > 0.2)`, 0 when none pass;
3. runs greedy OKS-NMS at 0.9 per image, OKS with the crop area (`area`);
4. scores the survivors with pycocotools' COCOeval (iouType "keypoints", COCO sigmas).
SPEC.md §7 and "Decisions" 4; fixtures README §4 item 13.

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
from collections import OrderedDict
from collections.abc import Iterable, Sequence
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


def _as_array(pred: dict, index: int, key: str, shape: tuple) -> np.ndarray:
    where = f"prediction #{index} (id {pred.get('id')!r}, image_id {pred.get('image_id')!r})"
    if key not in pred:
        raise PredictionError(f"{where}: missing field {key!r}")
    try:
        value = np.asarray(pred[key])
    except (ValueError, TypeError) as e:  # ragged lists and the like
        raise PredictionError(f"{where}: field {key!r} is not an array of numbers ({e})") from None
    if value.dtype.kind not in "fiu":
        raise PredictionError(f"{where}: field {key!r} must hold numbers, got dtype {value.dtype}")
    if value.shape != shape:
        raise PredictionError(f"{where}: field {key!r} has shape {value.shape}, expected {shape}")
    if key != "keypoints" and not np.all(np.isfinite(value)):
        # Keypoint coordinates may be NaN (an all-zero heatmap decodes to NaN with score 0, as in
        # MMPose); scores, areas and boxes may not.
        raise PredictionError(f"{where}: field {key!r} is not finite: {value.tolist()}")
    return value


def _as_int(pred: dict, index: int, key: str) -> int:
    value = pred.get(key)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
            return int(value)
        raise PredictionError(f"prediction #{index}: field {key!r} must be an integer, got {value!r}")
    return int(value)


def check_predictions(predictions: Sequence[dict], num_keypoints: int) -> list[dict]:
    """Validate and normalise predictions to numpy fields; raise PredictionError on the first bad one."""
    checked = []
    with_bbox = None
    for i, pred in enumerate(predictions):
        if not isinstance(pred, dict):
            raise PredictionError(f"prediction #{i}: expected a dict, got {type(pred).__name__}")
        item = {"id": _as_int(pred, i, "id"), "image_id": _as_int(pred, i, "image_id")}
        item["keypoints"] = _as_array(pred, i, "keypoints", (num_keypoints, 2))
        scores = _as_array(pred, i, "keypoint_scores", (num_keypoints,))
        # Keep float32 scores float32: the 0.2 threshold is then compared in float32, as in MMPose.
        item["keypoint_scores"] = scores if scores.dtype.kind == "f" else scores.astype(np.float64)
        item["bbox_score"] = float(_as_array(pred, i, "bbox_score", ()))
        item["area"] = float(_as_array(pred, i, "area", ()))
        has_bbox = pred.get("bbox") is not None
        if with_bbox is None:
            with_bbox = has_bbox
        elif has_bbox != with_bbox:
            # COCOeval reads detection areas from boxes for all results or for none.
            raise PredictionError(
                f"prediction #{i} (id {item['id']}): 'bbox' is {'given' if has_bbox else 'missing'} "
                f"but it is {'missing' if has_bbox else 'given'} on the first prediction; give it on all or none")
        if has_bbox:
            item["bbox"] = _as_array(pred, i, "bbox", (4,)).astype(np.float64)
        checked.append(item)
    return checked


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

    def rescore(self, keypoint_scores: np.ndarray, bbox_score: float) -> float:
        if self.score_mode == "bbox":
            return bbox_score
        confident = keypoint_scores[keypoint_scores > self.keypoint_score_thr]
        return bbox_score * float(confident.mean()) if len(confident) else 0.0

    def _suppress(self, instances: list[dict]) -> list[dict]:
        if self.nms_mode == "none":
            return instances
        keypoints = np.stack([p["keypoints"] for p in instances]).astype(np.float64)
        scores = np.array([p["score"] for p in instances])
        areas = np.array([p["area"] for p in instances])
        # MMPose keeps the dataset sigmas as float32 for NMS; nms.py applies that rounding.
        nms = oks_nms if self.nms_mode == "oks_nms" else soft_oks_nms
        keep = nms(keypoints, scores, areas, self.nms_thr, sigmas=self.sigmas)
        return [instances[k] for k in keep]

    def results(self, predictions: Sequence[dict]) -> list[dict]:
        """The COCO results list (after de-duplication, rescoring and NMS) that COCOeval scores.

        Each entry: `image_id`, `category_id`, `keypoints` (x, y, score) * K flattened, `score`,
        and `bbox` when the predictions carry it. Images keep their first-appearance order and
        instances their NMS order, which decides COCOeval's order between equal scores.
        """
        checked = check_predictions(predictions, self.num_keypoints)
        unknown = sorted({p["image_id"] for p in checked} - self.image_ids)
        if unknown:
            raise PredictionError(
                f"{len(unknown)} prediction image_id(s) are not in {self.ann_file}: {unknown[:10]}")
        by_image: dict[int, list[dict]] = OrderedDict()
        for pred in checked:
            by_image.setdefault(pred["image_id"], []).append(pred)

        results = []
        for image_id, instances in by_image.items():
            instances = _unique_by_id(instances)
            for p in instances:
                p["score"] = self.rescore(p["keypoint_scores"], p["bbox_score"])
            for p in self._suppress(instances):
                flat = np.concatenate([p["keypoints"], p["keypoint_scores"][:, None]], axis=1)
                entry = {"image_id": image_id, "category_id": PERSON_CATEGORY_ID,
                         "keypoints": flat.reshape(-1).tolist(), "score": float(p["score"])}
                if "bbox" in p:
                    entry["bbox"] = p["bbox"].tolist()
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


def _unique_by_id(instances: list[dict]) -> list[dict]:
    """Sort by id (stable) and keep the first of each run of equal ids, as MMPose does."""
    instances = sorted(instances, key=lambda p: p["id"])
    return [p for i, p in enumerate(instances) if i == 0 or p["id"] != instances[i - 1]["id"]]


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
