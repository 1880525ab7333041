"""Predictions of a top-down model as the COCO evaluator takes them: checked, stacked, saved and loaded.

A prediction is a dict `{"id", "image_id", "keypoints" (K, 2) image px, "keypoint_scores" (K,),
"bbox_score", "area"}` and optionally `"bbox"` (x, y, w, h) px and `"category_id"` (default 1); a
calibrated model's predictions also carry `"keypoint_p"` (K,) and `"keypoint_visibility"` (K,)
(`vitpose.evaluation.rescoring`).
`check_predictions` refuses the first one that does not fit (`PredictionError`, naming its position,
id and field) and stacks them into columns (`PredictionArrays`); `save_predictions` /
`load_predictions` are the raw prediction files `evaluate.py --out` writes.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitpose.errors import UserError
from vitpose.files import write_atomic

DEFAULT_CATEGORY_ID = 1  # a prediction without `category_id` (COCO's "person")


class PredictionError(UserError, ValueError):
    """A prediction that does not fit the schema (names its position, id and the field)."""



def prediction_where(pred, index: int) -> str:
    return f"prediction #{index} (id {pred.get('id')!r}, image_id {pred.get('image_id')!r})"


def _as_array(pred: dict, index: int, key: str, shape: tuple) -> np.ndarray:
    if key not in pred:
        raise PredictionError(f"{prediction_where(pred, index)}: missing field {key!r}")
    try:
        value = np.asarray(pred[key])
    except (ValueError, TypeError) as e:  # ragged lists and the like
        raise PredictionError(f"{prediction_where(pred, index)}: field {key!r} is not an array of numbers ({e})") from None
    if value.dtype.kind not in "fiu":
        raise PredictionError(f"{prediction_where(pred, index)}: field {key!r} must hold numbers, got dtype {value.dtype}")
    if value.shape != shape:
        raise PredictionError(f"{prediction_where(pred, index)}: field {key!r} has shape {value.shape}, expected {shape}")
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
    category_ids: np.ndarray  # (N,) int64 (1 where a prediction has none)
    category_given: np.ndarray  # (N,) bool: the prediction carries its own category_id
    keypoints: np.ndarray  # (N, K, 2) float64, may hold NaN (an all-zero heatmap decodes to NaN)
    keypoint_scores: np.ndarray  # (N, K) float32 or float64, as given (the results keep the values)
    bbox_scores: np.ndarray  # (N,) float64
    # (N,) float32: MMPose's top-down area is the product of the float32 box size, and its NMS adds
    # two of them in float32 (docs/mmpose-edge-cases.md §5).
    areas: np.ndarray
    bboxes: np.ndarray | None  # (N, 4) float64 (x, y, w, h), or None when no prediction has one


def _check_keypoint_count(pred: dict, index: int, num_keypoints: int, origin: str) -> None:
    """A clear error when a prediction has another number of keypoints than the evaluator's sigmas."""
    value = pred.get("keypoints")
    shape = np.shape(value) if isinstance(value, (list, tuple, np.ndarray)) or hasattr(value, "shape") else None
    if shape is not None and len(shape) == 2 and shape[1] == 2 and shape[0] != num_keypoints:
        raise PredictionError(
            f"{prediction_where(pred, index)}: field 'keypoints' has shape {tuple(shape)}: {shape[0]} keypoints, but {origin} has "
            f"{num_keypoints} OKS sigmas; the model's num_keypoints and the evaluator's dataset "
            f"(data.dataset_info) must agree")


def check_predictions(predictions: Sequence[dict], num_keypoints: int,
                      origin: str = "the evaluator") -> PredictionArrays:
    """Validate predictions and stack them into columns; raise PredictionError on the first bad one.

    Args:
        predictions: prediction dicts (module docstring).
        num_keypoints: K, the number of OKS sigmas.
        origin: how error messages name the evaluator (e.g. its annotation file).
    """
    n = len(predictions)
    ids = np.empty(n, np.int64)
    image_ids = np.empty(n, np.int64)
    category_ids = np.full(n, DEFAULT_CATEGORY_ID, np.int64)
    category_given = np.zeros(n, bool)
    bbox_scores = np.empty(n, np.float64)
    areas = np.empty(n, np.float32)
    keypoints, scores, bboxes = [], [], []
    with_bbox = None
    for i, pred in enumerate(predictions):
        if not isinstance(pred, dict):
            raise PredictionError(f"prediction #{i}: expected a dict, got {type(pred).__name__}")
        ids[i] = _as_int(pred, i, "id")
        image_ids[i] = _as_int(pred, i, "image_id")
        if pred.get("category_id") is not None:
            category_ids[i] = _as_int(pred, i, "category_id")
            category_given[i] = True
        _check_keypoint_count(pred, i, num_keypoints, origin)
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
                f"{prediction_where(pred, i)}: 'bbox' is {'given' if has_bbox else 'missing'} but it is "
                f"{'missing' if has_bbox else 'given'} on the first prediction; give it on all or none")
        if has_bbox:
            bboxes.append(_as_array(pred, i, "bbox", (4,)))
    columns = PredictionArrays(
        ids, image_ids, category_ids, category_given,
        np.stack(keypoints).astype(np.float64) if n else np.zeros((0, num_keypoints, 2)),
        np.stack(scores) if n else np.zeros((0, num_keypoints)),
        bbox_scores, areas,
        np.stack(bboxes).astype(np.float64) if with_bbox else None)
    if columns.keypoint_scores.dtype.kind != "f":
        columns.keypoint_scores = columns.keypoint_scores.astype(np.float64)
    # Box scores, areas and boxes must be finite. Keypoints and their scores may not be: a diverged
    # or broken model decodes NaN, and such a prediction is scored as a miss (see `nonfinite_rows`).
    for key, values in (("bbox_score", bbox_scores),
                        ("area", areas), ("bbox", columns.bboxes)):
        if values is None or n == 0:
            continue
        bad = ~np.isfinite(values.reshape(n, -1)).all(axis=1)
        if bad.any():
            i = int(np.argmax(bad))
            raise PredictionError(f"{prediction_where(predictions[i], i)}: field {key!r} is not finite: "
                                  f"{np.asarray(predictions[i][key]).tolist()}")
    return columns


def nonfinite_rows(columns: PredictionArrays) -> np.ndarray:
    """(N,) bool: predictions with a non-finite keypoint coordinate or keypoint score."""
    n = len(columns.ids)
    if n == 0:
        return np.zeros(0, bool)
    return ~(np.isfinite(columns.keypoints.reshape(n, -1)).all(axis=1)
             & np.isfinite(np.asarray(columns.keypoint_scores, np.float64).reshape(n, -1)).all(axis=1))


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

    return write_atomic(path, json.dumps([{k: plain(v) for k, v in p.items()} for p in predictions]))


def load_predictions(path) -> list[dict]:
    """Read a file written by `save_predictions`; keypoints come back as float64, scores as float32 (the dtypes `predict` makes)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise PredictionError(f"{path}: expected a JSON list of predictions")
    # a calibrated model's optional keypoint_p and keypoint_visibility come back as its runtimes give them
    dtypes = {"keypoints": np.float64, "keypoint_scores": np.float32, "keypoint_p": np.float32,
              "keypoint_visibility": np.int8}
    for pred in data:
        for key, dtype in dtypes.items():
            if isinstance(pred, dict) and key in pred:
                pred[key] = np.asarray(pred[key], dtype=dtype)
    return data


def count_nonfinite(keypoints: np.ndarray, consequence: str, logger: logging.Logger) -> int:
    """How many of the predictions (N, K, 2) have a non-finite keypoint; when any, one warning (and
    one line in `logger`) says so and what follows for the metric (`consequence`)."""
    count = int((~np.isfinite(keypoints.reshape(len(keypoints), -1))).any(axis=1).sum())
    if count:
        message = (f"{count} of {len(keypoints)} predictions have non-finite keypoints (a diverged or broken "
                   f"model?): {consequence}")
        warnings.warn(message, stacklevel=3)
        logger.warning(message)
    return count


def note_missing(missing: int, total: int, things: str, computed: str, logger: logging.Logger) -> None:
    """One warning (and one line in `logger`) when `missing` of the `total` `things` have no
    prediction; `computed` says what the metric is then computed over."""
    if missing:
        message = f"{missing} of the {total} {things} have no prediction; {computed} (as MMPose would)"
        warnings.warn(message, stacklevel=4)
        logger.warning(message)
