"""COCO keypoint AP with MMPose's CocoMetric protocol (the one behind ViTPose's published numbers).

Given per-instance predictions of a top-down model, `CocoEvaluator.evaluate`:
1. drops predictions that repeat an `id` within an image (keeps the first after sorting by id);
2. rescores each one: `bbox_score x mean(keypoint scores > 0.2)`, 0 when none pass;
3. runs greedy OKS-NMS at 0.9 per image, OKS with the crop area (`area`);
4. scores the survivors with pycocotools' COCOeval (iouType "keypoints", the dataset's sigmas).
docs/evaluation.md §4, §5, §6, §8; tests/fixtures/README.md §4 item 13.

A prediction is a dict `{"id", "image_id", "keypoints" (K, 2) image px, "keypoint_scores" (K,),
"bbox_score", "area"}` and optionally `"bbox"` (x, y, w, h) px and `"category_id"` (default 1;
AP-10K has one category per animal family). K is the number of sigmas. When the input box is given it is
written into the results, as MMPose's top-down metric does, and COCOeval then measures each
detection's area from it (this decides the medium/large split); without it COCOeval uses the
extent of the keypoints.

MMPose scores with xtcocotools' COCOeval and ran under NumPy 1.x; the published numbers come from
that. This module reproduces it on top of pycocotools (docs/mmpose-edge-cases.md §2 to §5):
a detection whose keypoint scores are all <= 0 is kept in the results but not evaluated; the
sigmas are float32; the ground truth is read as xtcocotools reads it (a missing `iscrowd` is 0, a
GT is ignored when none of its keypoints is labelled, whatever `num_keypoints` says); keypoint
scores meet the 0.2 threshold in float64; NMS adds two float32 areas in float32.

The prediction schema lives in `vitpose.evaluation.predictions` and pycocotools' COCOeval with its
bootstrap in `vitpose.evaluation.pycocotools_eval`; their names are importable from here too.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vitpose.coco_meta import SIGMAS
from vitpose.codecs.decode import instance_scores  # the rescoring rule, shared with inference (kept importable here)
from vitpose.errors import UserError
from vitpose.evaluation.nms import oks_nms, soft_oks_nms
from vitpose.evaluation.predictions import (  # noqa: F401 - the schema's names, importable from here too
    DEFAULT_CATEGORY_ID,
    PredictionArrays,
    PredictionError,
    check_predictions,
    load_predictions,
    nonfinite_rows,
    prediction_where,
    save_predictions,
)
from vitpose.evaluation.pycocotools_eval import (  # noqa: F401 - importable from here too
    coco_index_of,
    evaluated_by_cocoeval,
    paired_bootstrap,
    quiet_pycocotools,
    resampled_ap,
    run_cocoeval,
    score_with_cocoeval,
)
from vitpose.files import write_atomic

log = logging.getLogger(__name__)

STAT_NAMES = ("AP", "AP .5", "AP .75", "AP (M)", "AP (L)", "AR", "AR .5", "AR .75", "AR (M)", "AR (L)")
SCORE_MODES = ("bbox_keypoint", "bbox")
NMS_MODES = ("oks_nms", "soft_oks_nms", "none")
# The fields of a ground-truth annotation that COCOeval reads for keypoints (`area` only with use_area).
ANNOTATION_FIELDS = ("id", "image_id", "category_id", "keypoints", "area", "bbox")
# xtcocotools' COCOeval with use_area=False: a GT's area is this share of its box (w x h).
BOX_AREA_SHARE = 0.53


class GroundTruthError(UserError, ValueError):
    """An annotation file COCO keypoint evaluation cannot use (names the file, the record, the field)."""


def _fail(path: Path, message: str):
    raise GroundTruthError(f"{path}: {message}")


def _check_annotation(path: Path, index: int, ann, keypoint_fields: Sequence[tuple[str, int]],
                      image_ids: set, category_ids: set, use_area: bool) -> None:
    where = f"annotation #{index}"
    if not isinstance(ann, dict):
        _fail(path, f"{where}: expected an object, got {type(ann).__name__}")
    where = f"annotation #{index} (id {ann.get('id')!r})"
    for field in ANNOTATION_FIELDS:
        if field == "area" and not use_area:
            continue
        if field not in ann:
            hint = (" (a file without areas, like AI Challenger's, is evaluated with use_area=False, "
                    "as MMPose's AIC config does)" if field == "area" else "")
            _fail(path, f"{where}: missing field {field!r}, which COCO keypoint evaluation reads{hint}")
    if not isinstance(ann["id"], int) or isinstance(ann["id"], bool):
        _fail(path, f"{where}: field 'id' must be an integer")
    for field, count in keypoint_fields:
        keypoints = ann.get(field)
        if not isinstance(keypoints, list) or len(keypoints) != 3 * count:
            size = len(keypoints) if isinstance(keypoints, list) else type(keypoints).__name__
            _fail(path, f"{where}: field {field!r} must be a list of {3 * count} numbers "
                        f"(x, y, v for {count} keypoints), got {size}")
    if ann["image_id"] not in image_ids:
        _fail(path, f"{where}: field 'image_id' {ann['image_id']!r} is not in the file's images")
    if ann["category_id"] not in category_ids:
        _fail(path, f"{where}: no category with id {ann['category_id']!r} in 'categories' "
                    f"(ids: {sorted(category_ids)[:20]})")
    box = ann["bbox"]
    if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)):
        _fail(path, f"{where}: field 'bbox' must be 4 numbers (x, y, w, h), got {box!r}")


def read_ground_truth(ann_file, num_keypoints: int, use_area: bool = True,
                      keypoint_fields: Sequence[tuple[str, int]] | None = None) -> dict:
    """Load a COCO keypoint annotation file, refuse what evaluation cannot use, and read it as
    xtcocotools (MMPose's COCOeval) does.

    Args:
        ann_file: the annotation file.
        num_keypoints: K, the length of each annotation's `keypoints` (when `keypoint_fields` is None).
        use_area: False: each GT's area is 0.53 x its box (w x h) for OKS and the area ranges, and
            `area` may be absent (xtcocotools' use_area=False; MMPose's AIC config).
        keypoint_fields: (field, number of keypoints) pairs to check instead, e.g. COCO-WholeBody's
            `keypoints`, `foot_kpts`, `face_kpts`, `lefthand_kpts`, `righthand_kpts`.

    Refused with a GroundTruthError naming the file: no `annotations` (MMPose asserts) or an empty
    list (MMPose would report -1 for every stat), no `images`, no `categories`, an annotation
    without a field COCOeval reads, with a wrong number of keypoints, an unknown image or category,
    and negative or repeated annotation ids (xtcocotools counts a match to a negative id as a false
    positive; COCO's index keeps one annotation per id).
    Read as xtcocotools does, so that pycocotools then scores alike (docs/mmpose-edge-cases.md §4):
    a missing `iscrowd` is 0; `num_keypoints` becomes the number of labelled keypoints (v > 0),
    which is what decides whether a GT is ignored; an annotation id 0 gets an unused id, because
    pycocotools' matching reads id 0 as "no match"; with use_area=False the area is replaced by
    0.53 x the box, which is all that xtcocotools' switch changes (docs/evaluation.md §8.1).
    """
    keypoint_fields = tuple(keypoint_fields or (("keypoints", num_keypoints),))
    path = Path(ann_file)
    try:
        dataset = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        _fail(path, f"not valid JSON ({e})")
    if not isinstance(dataset, dict):
        _fail(path, f"expected a COCO annotation object, got a JSON {type(dataset).__name__}")
    if "annotations" not in dataset:
        _fail(path, "no 'annotations': COCO keypoint evaluation needs the ground truth "
                    "(MMPose's CocoMetric refuses such a file as well)")
    annotations = dataset["annotations"]
    if not isinstance(annotations, list) or not annotations:
        _fail(path, "'annotations' is empty: there is no ground truth to evaluate against "
                    "(MMPose would report -1 for every stat)")
    if not isinstance(dataset.get("images"), list) or not dataset["images"]:
        _fail(path, "no 'images' list")
    categories = dataset.get("categories")
    if not isinstance(categories, list) or not categories:
        _fail(path, "no 'categories' list")
    category_ids = {c.get("id") for c in categories if isinstance(c, dict)}
    image_ids = {img.get("id") for img in dataset["images"] if isinstance(img, dict)}
    for index, ann in enumerate(annotations):
        _check_annotation(path, index, ann, keypoint_fields, image_ids, category_ids, use_area)
    ids = [ann["id"] for ann in annotations]
    if min(ids) < 0:
        _fail(path, f"annotation id {min(ids)} is negative: xtcocotools, which MMPose evaluates with, "
                    "counts a match to it as a false positive; renumber the annotations")
    repeated = sorted(i for i, count in Counter(ids).items() if count > 1)[:10]
    if repeated:
        _fail(path, f"annotation ids {repeated} appear more than once; COCO's index would keep only one of each")
    unused_id = max(ids) + 1
    for ann in annotations:
        ann.setdefault("iscrowd", 0)
        labels = np.concatenate([np.asarray(ann[field][2::3], np.float64) for field, _ in keypoint_fields])
        ann["num_keypoints"] = int(np.count_nonzero(labels > 0))
        if ann["id"] == 0:
            ann["id"] = unused_id
        if not use_area:
            # xtcocotools computes box[3] * box[2] * 0.53 in its OKS and box[2] * box[3] * 0.53
            # for the area ranges; a product of two numbers does not depend on their order.
            ann["area"] = ann["bbox"][2] * ann["bbox"][3] * BOX_AREA_SHARE
    return dataset



class CocoEvaluator:
    """MMPose's CocoMetric (ViTPose settings) on top of pycocotools' COCOeval.

    `primary_stat` names the stat that ranks checkpoints ("AP").

    Args:
        ann_file: COCO keypoint annotation file (checked and read by `read_ground_truth`).
        score_mode: "bbox_keypoint" (rescoring, ViTPose) or "bbox" (the box score alone).
        keypoint_score_thr: keypoint scores above it enter the rescoring mean.
        nms_mode: "oks_nms" (ViTPose), "soft_oks_nms" or "none".
        nms_thr: OKS threshold of the NMS.
        sigmas: per-keypoint OKS sigmas (default: COCO's); their number is K. Used as float32, as
            MMPose does (its dataset meta holds them so).
        use_area: False: each GT's area (for OKS and the medium/large split) is 0.53 x its box, as
            xtcocotools' `COCOeval(..., use_area=False)` that MMPose's AIC config asks for.
    """

    primary_stat = "AP"

    def __init__(self, ann_file, score_mode: str = "bbox_keypoint", keypoint_score_thr: float = 0.2,
                 nms_mode: str = "oks_nms", nms_thr: float = 0.9, sigmas: Sequence[float] | None = None,
                 use_area: bool = True):
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
        # MMPose's dataset meta holds the sigmas as float32, and hands them so to NMS and COCOeval.
        self.sigmas = np.asarray(SIGMAS if sigmas is None else sigmas, dtype=np.float32)
        if self.sigmas.ndim != 1 or len(self.sigmas) == 0 or not (self.sigmas > 0).all():
            raise ValueError(f"sigmas must be a non-empty list of positive numbers, got {self.sigmas.tolist()}")
        self.num_keypoints = len(self.sigmas)
        self.use_area = bool(use_area)

        with quiet_pycocotools(f"indexing {self.ann_file}"):
            self.coco = self._index_ground_truth()
        self.image_ids = set(self.coco.getImgIds())
        self.category_ids = set(self.coco.getCatIds())
        # Categories that have ground truth: with several (AP-10K's animal families), a prediction
        # must say which it is, or it would silently be scored as category 1.
        self.annotated_categories = sorted({ann["category_id"] for ann in self.coco.dataset["annotations"]})
        # Predictions with non-finite keypoints or scores in the last `results` call (scored as misses).
        self.last_nonfinite = 0

    def _index_ground_truth(self):
        """The pycocotools COCO index of the checked annotation file."""
        return coco_index_of(read_ground_truth(self.ann_file, self.num_keypoints, use_area=self.use_area))

    # -- protocol ---------------------------------------------------------------------------------

    def rescore(self, keypoint_scores: np.ndarray, bbox_scores) -> np.ndarray:
        """bbox_score x mean of the keypoint scores above the threshold (`instance_scores`);
        the box score alone with `score_mode="bbox"`."""
        if self.score_mode == "bbox":
            return np.asarray(bbox_scores, dtype=np.float64)
        return instance_scores(keypoint_scores, bbox_scores, self.keypoint_score_thr)

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
        """The COCO results list (after de-duplication, rescoring and NMS), as MMPose writes it.

        COCOeval then leaves out the entries none of whose keypoint scores is above 0 (see
        `evaluated_by_cocoeval`); they stay in this list, as they stay in MMPose's results file.

        Each entry: `image_id`, `category_id`, `keypoints` (x, y, score) * K flattened, `score`,
        and `bbox` when the predictions carry it. Images keep their first-appearance order and
        instances their NMS order, which decides COCOeval's order between equal scores.
        """
        columns = check_predictions(predictions, self.num_keypoints, origin=f"the evaluator of {self.ann_file}")
        self.last_nonfinite = int(nonfinite_rows(columns).sum())
        if self.last_nonfinite:
            message = (f"{self.last_nonfinite} of {len(columns.ids)} predictions have non-finite keypoints or "
                       f"scores (a diverged or broken model?): they are scored as misses (OKS 0)")
            warnings.warn(message, stacklevel=2)
            log.warning(message)
        if len(columns.ids) == 0:
            return []
        unknown = sorted(set(columns.image_ids.tolist()) - self.image_ids)
        if unknown:
            raise PredictionError(
                f"{len(unknown)} prediction image_id(s) are not in {self.ann_file}: {unknown[:10]}")
        if len(self.annotated_categories) > 1 and not columns.category_given.all():
            i = int(np.argmin(columns.category_given))
            raise PredictionError(
                f"{prediction_where(predictions[i], i)}: no 'category_id', but the annotations of {self.ann_file} have "
                f"{len(self.annotated_categories)} categories ({self.annotated_categories[:10]}); each "
                f"prediction must carry the category of its instance")
        unknown = sorted(set(columns.category_ids.tolist()) - self.category_ids)
        if unknown:
            raise PredictionError(
                f"prediction category_id(s) {unknown[:10]} are not among the categories of {self.ann_file} "
                f"({sorted(self.category_ids)[:20]}); a prediction without 'category_id' counts as "
                f"{DEFAULT_CATEGORY_ID}")
        scores = self.rescore(columns.keypoint_scores, columns.bbox_scores)
        flat = np.concatenate([columns.keypoints, columns.keypoint_scores[..., None].astype(np.float64)], axis=-1)
        flat = flat.reshape(len(flat), -1)
        results = []
        for members in self.keep(columns):
            for i in members.tolist():
                entry = {"image_id": int(columns.image_ids[i]), "category_id": int(columns.category_ids[i]),
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
        return dict(zip(STAT_NAMES, score_with_cocoeval(self.coco, results, self.sigmas)))

    def cocoeval(self, predictions: Sequence[dict]):
        """The COCOeval behind `evaluate`'s stats, for per-image statistics (`resampled_ap`)."""
        return run_cocoeval(self.coco, self.results(predictions), self.sigmas)

    def write_results(self, predictions: Sequence[dict], path) -> Path:
        """Write the COCO keypoint results JSON (after the protocol) that `evaluate` scores."""
        return write_atomic(path, json.dumps(self.results(predictions)))
