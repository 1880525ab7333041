"""MPII PCKh, as MMPose's MpiiPCKAccuracy computes it (docs/evaluation.md §8.3).

A joint is correct when its distance to the ground truth, divided by the person's head size, is
below 0.5 (PCKh) or 0.1 (PCKh@0.1). The head size is 0.6 x the diagonal of the head box of MPII's
`mpii_gt_val.mat` (`headboxes_src`, one box per annotation of the validation file, in file order).
Per joint, the share of correct ones among the labelled ones (`joints_vis`); the reported numbers
are percentages: Head (joint 9), the means of the left and right Shoulder, Elbow, Wrist, Hip, Knee
and Ankle, and the means over all joints but pelvis and thorax (6, 7), weighted by each joint's
number of labelled instances.

MMPose's arithmetic is kept: the prediction gets +1 (MPII's coordinates are 1-based, MATLAB's),
the ground truth is float32, the normalised distances are stored as float32 and compared with the
threshold in float32; a joint labelled nowhere has accuracy -1 (so -100 %); the PCKh@0.1
percentages pass through a float32 array before they are weighted. A person whose head size is 0
counts for no joint's PCKh but still weighs in the joint counts; for PCKh@0.1 the same person
counts with a head size of 1e6, every labelled joint correct: MMPose's distance function replaces
the zero head sizes by 1e6 in the array it is given, in place, during the PCKh call, and the
later calls no longer see a zero (`_calc_distances` in mmpose/evaluation/functional/keypoint_eval.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vitpose.evaluation.coco_evaluator import GroundTruthError, PredictionError
from vitpose.evaluation.matfile import read_mat_arrays
from vitpose.evaluation.predictions import count_nonfinite, note_missing
from vitpose.files import write_atomic

log = logging.getLogger(__name__)

NUM_JOINTS = 16
HEAD_SIZE_FACTOR = 0.6  # MMPose's SC_BIAS: head size = 0.6 x the head box diagonal
# MPII joint order: 0 r ankle, 1 r knee, 2 r hip, 3 l hip, 4 l knee, 5 l ankle, 6 pelvis, 7 thorax,
# 8 upper neck, 9 head top, 10 r wrist, 11 r elbow, 12 r shoulder, 13 l shoulder, 14 l elbow, 15 l wrist.
GROUPS = (("Head", (9,)), ("Shoulder", (13, 12)), ("Elbow", (14, 11)), ("Wrist", (15, 10)),
          ("Hip", (3, 2)), ("Knee", (4, 1)), ("Ankle", (5, 0)))
LEFT_OUT_OF_MEAN = (6, 7)  # pelvis and thorax
STAT_NAMES = tuple(name for name, _ in GROUPS) + ("PCKh", "PCKh@0.1")


def read_mpii_annotations(ann_file) -> list[dict]:
    """MMPose's MPII JSON (a list of {image, joints (16 x 2, 1-based), joints_vis (16), center,
    scale}); refused with a GroundTruthError naming the file and the record."""
    path = Path(ann_file)
    if not path.is_file():
        raise FileNotFoundError(f"MPII annotation file not found: {path}")
    try:
        records = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise GroundTruthError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(records, list) or not records:
        raise GroundTruthError(f"{path}: expected a non-empty JSON list of MPII annotations (MMPose's format)")
    for i, record in enumerate(records):
        where = f"{path}: record #{i}"
        if not isinstance(record, dict):
            raise GroundTruthError(f"{where}: expected an object, got {type(record).__name__}")
        for field in ("image", "joints", "joints_vis"):
            if field not in record:
                raise GroundTruthError(f"{where}: missing field {field!r}")
        if np.shape(record["joints"]) != (NUM_JOINTS, 2) or np.shape(record["joints_vis"]) != (NUM_JOINTS,):
            raise GroundTruthError(f"{where}: 'joints' must be {NUM_JOINTS} x 2 and 'joints_vis' {NUM_JOINTS} "
                                   f"values, got shapes {np.shape(record['joints'])} and "
                                   f"{np.shape(record['joints_vis'])}")
    return records


def read_headboxes(headbox_file, num_annotations: int, ann_file) -> np.ndarray:
    """(N, 2, 2) head boxes, per annotation its two corners (x, y), from MPII's `mpii_gt_val.mat`
    (`headboxes_src`, shape (2, 2, N)) or an .npz holding the same array under that name."""
    path = Path(headbox_file)
    if not path.is_file():
        raise FileNotFoundError(f"head box file not found: {path}")
    if path.suffix == ".mat":
        arrays = read_mat_arrays(path)
    elif path.suffix == ".npz":
        with np.load(path) as npz:
            arrays = {name: npz[name] for name in npz.files}
    else:
        raise GroundTruthError(f"{path}: head boxes are read from MPII's .mat file (mpii_gt_val.mat) or an "
                               f".npz with a 'headboxes_src' array, not {path.suffix or 'a file without suffix'}")
    if "headboxes_src" not in arrays:
        raise GroundTruthError(f"{path}: no 'headboxes_src' array (it holds {sorted(arrays) or 'none'}); "
                               f"MPII's mpii_gt_val.mat has one")
    boxes = np.asarray(arrays["headboxes_src"], np.float64)
    if boxes.ndim != 3 or boxes.shape[:2] != (2, 2):
        raise GroundTruthError(f"{path}: 'headboxes_src' has shape {boxes.shape}, expected (2, 2, N)")
    if boxes.shape[2] != num_annotations:
        raise GroundTruthError(
            f"{path}: {boxes.shape[2]} head boxes for the {num_annotations} annotations of {ann_file}; "
            f"the head boxes must be those of this annotation file, in its order (MPII's mpii_gt_val.mat "
            f"goes with MMPose's mpii_val.json)")
    return np.transpose(boxes, (2, 0, 1))


class PCKhEvaluator:
    """MMPose's MpiiPCKAccuracy (thr 0.5, head-normalised) on predictions of MPII's validation set.

    Args:
        ann_file: MPII annotations in MMPose's JSON format (e.g. `mpii_val.json`).
        headbox_file: MPII's `mpii_gt_val.mat` (read without SciPy by vitpose.evaluation.matfile) or
            an .npz with its `headboxes_src` array (2, 2, N).
        thr: the PCKh threshold (MMPose's default 0.5).

    `evaluate(predictions)`: one dict per annotation, `{"id": its index in the annotation file (the
    instance id MMPose gives it), "keypoints": (16, 2) image pixels (0-based, as the model predicts)}`,
    optionally `"image_id"` (checked against the record's image). Returns percentages under
    "Head", "Shoulder", "Elbow", "Wrist", "Hip", "Knee", "Ankle", "PCKh" and "PCKh@0.1".
    A prediction with a non-finite coordinate has those joints wrong (counted in `last_nonfinite`).
    """

    primary_stat = "PCKh"

    def __init__(self, ann_file, headbox_file, thr: float = 0.5):
        self.ann_file = Path(ann_file)
        self.headbox_file = Path(headbox_file)
        self.thr = float(thr)
        records = read_mpii_annotations(self.ann_file)
        self.image_ids = [_image_id(r["image"]) for r in records]
        # MMPose reads the joints as float32 and the visibility as given.
        self.joints = np.array([r["joints"] for r in records], dtype=np.float32)
        self.visible = np.array([r["joints_vis"] for r in records]).astype(bool)
        boxes = read_headboxes(self.headbox_file, len(records), self.ann_file)
        self.head_sizes = np.linalg.norm(boxes[:, 1] - boxes[:, 0], axis=1) * HEAD_SIZE_FACTOR
        self.last_nonfinite = 0  # predictions with a non-finite coordinate in the last `evaluate`

    def _stack(self, predictions: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
        """(indices into the annotation file, keypoints (M, 16, 2)) of the predictions; the keypoints
        keep their float dtype (MMPose adds the 1 and subtracts the float32 ground truth in it)."""
        indices, keypoints = [], []
        seen = set()
        for i, pred in enumerate(predictions):
            if not isinstance(pred, dict):
                raise PredictionError(f"prediction #{i}: expected a dict, got {type(pred).__name__}")
            index = pred.get("id")
            if not isinstance(index, (int, np.integer)) or isinstance(index, bool) or not 0 <= index < len(self.joints):
                raise PredictionError(f"prediction #{i}: field 'id' must be the index of its annotation in "
                                      f"{self.ann_file} (0 .. {len(self.joints) - 1}), got {index!r}")
            if index in seen:
                raise PredictionError(f"prediction #{i}: annotation {index} is predicted twice")
            seen.add(index)
            image_id = pred.get("image_id")
            if image_id is not None and image_id != self.image_ids[index]:
                raise PredictionError(f"prediction #{i} (id {index}): image_id {image_id!r} but annotation {index} "
                                      f"of {self.ann_file} is image {self.image_ids[index]}")
            xy = np.asarray(pred.get("keypoints"))
            if xy.dtype.kind not in "fiu":
                raise PredictionError(f"prediction #{i} (id {index}): field 'keypoints' must hold numbers")
            if xy.shape != (NUM_JOINTS, 2):
                raise PredictionError(f"prediction #{i} (id {index}): field 'keypoints' has shape {xy.shape}, "
                                      f"expected ({NUM_JOINTS}, 2): MPII has {NUM_JOINTS} joints")
            indices.append(int(index))
            keypoints.append(xy)
        note_missing(len(self.joints) - len(seen), len(self.joints), f"annotations of {self.ann_file}",
                     f"PCKh is computed over the {len(seen)} predicted ones", log)
        return np.asarray(indices, np.int64), np.stack(keypoints) if keypoints else np.zeros((0, NUM_JOINTS, 2))

    def evaluate(self, predictions: Sequence[dict]) -> dict[str, float]:
        """Percentages "Head", ..., "Ankle", "PCKh" and "PCKh@0.1" of `predictions`."""
        indices, keypoints = self._stack(predictions)
        if len(indices) == 0:
            raise PredictionError(f"no predictions to evaluate against {self.ann_file}")
        # NaN distances compare as "not below the threshold": those joints count as wrong.
        self.last_nonfinite = count_nonfinite(keypoints, "their joints count as wrong", log)
        predicted = keypoints + 1.0  # MPII's ground truth is 1-based (MATLAB)
        gt, visible, head = self.joints[indices], self.visible[indices], self.head_sizes[indices]
        distances = normalised_distances(predicted, gt, visible, head)
        pckh = 100.0 * joint_accuracy(distances, self.thr)
        # MMPose scores 51 thresholds 0, 0.01, ..., 0.5 into a float32 table and reports row 10;
        # by then its zero head sizes have become 1e6 (module docstring).
        threshold_01 = np.arange(0, 0.5 + 0.01, 0.01)[10]
        distances_01 = normalised_distances(predicted, gt, visible, np.where(head <= 0, 1e6, head))
        pckh_01 = (100.0 * joint_accuracy(distances_01, threshold_01)).astype(np.float32)
        weights = joint_weights(visible)
        stats = {name: float(pckh[joints[0]]) if len(joints) == 1 else float(0.5 * (pckh[joints[0]] + pckh[joints[1]]))
                 for name, joints in GROUPS}
        stats["PCKh"] = _weighted_sum(pckh, weights)
        stats["PCKh@0.1"] = _weighted_sum(pckh_01, weights)
        return stats


    def results(self, predictions: Sequence[dict]) -> list[dict]:
        """The predictions as scored, one per annotation: `id`, `image_id` and `keypoints`
        (16 x (x, y, score) flattened, 0-based pixels; score 1 where none is given)."""
        indices, keypoints = self._stack(predictions)
        out = []
        for pred, index, xy in zip(predictions, indices.tolist(), keypoints):
            scores = np.asarray(pred.get("keypoint_scores", np.ones(NUM_JOINTS)), np.float64)
            if scores.shape != (NUM_JOINTS,):
                raise PredictionError(f"prediction (id {index}): field 'keypoint_scores' has shape {scores.shape}, "
                                      f"expected ({NUM_JOINTS},)")
            flat = np.concatenate([np.asarray(xy, np.float64), scores[:, None]], axis=1)
            out.append({"id": index, "image_id": self.image_ids[index], "keypoints": flat.ravel().tolist()})
        return out

    def write_results(self, predictions: Sequence[dict], path) -> Path:
        """Write `results(predictions)` as JSON."""
        return write_atomic(path, json.dumps(self.results(predictions)))


def _image_id(image: str) -> int | str:
    stem = Path(str(image)).stem
    return int(stem) if stem.isdigit() else stem


def normalised_distances(predicted: np.ndarray, gt: np.ndarray, visible: np.ndarray,
                         head_sizes: np.ndarray) -> np.ndarray:
    """(M, 16) float32 distances / head size; -1 where the joint is unlabelled or the head size 0."""
    usable = visible & (head_sizes != 0)[:, None]
    norm = np.where(head_sizes <= 0, 1e6, head_sizes)[:, None, None]
    distances = np.full(visible.shape, -1, np.float32)
    distances[usable] = np.linalg.norm(((predicted - gt) / norm)[usable], axis=-1)
    return distances


def joint_accuracy(distances: np.ndarray, thr) -> np.ndarray:
    """(16,) share of each joint's valid distances below thr (compared in float32, as NumPy 1.x
    did for MMPose); -1 for a joint with no valid distance."""
    valid = distances != -1
    count = valid.sum(axis=0)
    below = ((distances < np.float32(thr)) & valid).sum(axis=0)
    return np.where(count > 0, below / np.maximum(count, 1), -1.0)


def joint_weights(visible: np.ndarray) -> np.ndarray:
    """(16,) each joint's share of the labelled joints, pelvis and thorax left out (weight 0)."""
    counts = visible.sum(axis=0)
    counts[list(LEFT_OUT_OF_MEAN)] = 0
    return counts / np.float64(counts.sum())


def _weighted_sum(values: np.ndarray, weights: np.ndarray) -> float:
    # MMPose sums a masked array: the masked joints become 0 and NumPy sums all 16 (pairwise order).
    products = values * weights
    products[list(LEFT_OUT_OF_MEAN)] = 0.0
    return float(np.sum(products))


__all__ = ["PCKhEvaluator", "STAT_NAMES", "read_headboxes", "read_mpii_annotations"]
