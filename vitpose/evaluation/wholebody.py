"""COCO-WholeBody keypoint AP per part, as MMPose's CocoWholeBodyMetric computes it (docs/evaluation.md §8.2).

The protocol before scoring is CocoEvaluator's (duplicate ids, rescoring and OKS-NMS over all 133
keypoints with the 133 sigmas). Then MMPose writes each instance as COCO-WholeBody results
(`keypoints` = the 17 body keypoints, `foot_kpts`, `face_kpts`, `lefthand_kpts`, `righthand_kpts`,
`score`; no box) and xtcocotools' COCOeval scores six times, with iouType keypoints_body, _foot,
_face, _lefthand, _righthand and _wholebody, each with that part's slice of the sigmas.

xtcocotools' per-part evaluation is COCO keypoint evaluation on a view of the data in which only
that part's keypoints exist: a GT is ignored when none of the part's keypoints is labelled; a
detection is left out when none of its part scores is above 0; OKS runs over the part's labelled
keypoints with the GT's `area`. Each detection's area, which decides the medium/large split, is
that of the extent of its 17 body keypoints in every run (xtcocotools' loadRes reads `keypoints`,
the body, since MMPose writes no box). So this module builds the six views and scores each with
pycocotools through `score_with_cocoeval`, handing each detection its body extent as a box, from
which pycocotools takes the same area.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vitpose.evaluation.coco_evaluator import STAT_NAMES, CocoEvaluator, read_ground_truth
from vitpose.evaluation.pycocotools_eval import coco_index_of, score_with_cocoeval

# (name, field of the GT and results, first keypoint, end) in the 133-keypoint order.
PARTS = (("body", "keypoints", 0, 17), ("foot", "foot_kpts", 17, 23), ("face", "face_kpts", 23, 91),
         ("lefthand", "lefthand_kpts", 91, 112), ("righthand", "righthand_kpts", 112, 133))
NUM_KEYPOINTS = 133
# MMPose 1.3.2 configs/_base_/datasets/coco_wholebody.py (the sigmas of xtcocotools'
# keypoints_wholebody): body, foot, face, left hand, right hand.
WHOLEBODY_SIGMAS = (
    0.026, 0.025, 0.025, 0.035, 0.035, 0.079, 0.079, 0.072, 0.072, 0.062, 0.062, 0.107, 0.107,
    0.087, 0.087, 0.089, 0.089,
    0.068, 0.066, 0.066, 0.092, 0.094, 0.094,
    0.042, 0.043, 0.044, 0.043, 0.04, 0.035, 0.031, 0.025, 0.02, 0.023, 0.029, 0.032, 0.037, 0.038,
    0.043, 0.041, 0.045, 0.013, 0.012, 0.011, 0.011, 0.012, 0.012, 0.011, 0.011, 0.013, 0.015, 0.009,
    0.007, 0.007, 0.007, 0.012, 0.009, 0.008, 0.016, 0.01, 0.017, 0.011, 0.009, 0.011, 0.009, 0.007,
    0.013, 0.008, 0.011, 0.012, 0.01, 0.034, 0.008, 0.008, 0.009, 0.008, 0.008, 0.007, 0.01, 0.008,
    0.009, 0.009, 0.009, 0.007, 0.007, 0.008, 0.011, 0.008, 0.008, 0.008, 0.01, 0.008,
    0.029, 0.022, 0.035, 0.037, 0.047, 0.026, 0.025, 0.024, 0.035, 0.018, 0.024, 0.022, 0.026, 0.017,
    0.021, 0.021, 0.032, 0.02, 0.019, 0.022, 0.031,
    0.029, 0.022, 0.035, 0.037, 0.047, 0.026, 0.025, 0.024, 0.035, 0.018, 0.024, 0.022, 0.026, 0.017,
    0.021, 0.021, 0.032, 0.02, 0.019, 0.022, 0.031,
)
VIEWS = tuple(name for name, *_ in PARTS) + ("wholebody",)


def stat_names() -> list[str]:
    """The 60 keys of `WholeBodyEvaluator.evaluate`: the whole-body stats, then each part's."""
    return list(STAT_NAMES) + [f"{part} {name}" for part, *_ in PARTS for name in STAT_NAMES]


def _view_keypoints(entry: dict, view: str) -> list:
    """The keypoints (x, y, v or score triplets) of one view of a GT annotation or a result."""
    if view == "wholebody":
        return [v for _, field, _, _ in PARTS for v in entry[field]]
    return list(entry[dict((name, field) for name, field, _, _ in PARTS)[view]])


def _ground_truth_view(dataset: dict, view: str) -> dict:
    """The annotation file as xtcocotools sees it for one iouType: only that view's keypoints,
    a GT ignored when none of them is labelled."""
    view_data = dict(dataset)
    annotations = []
    for ann in dataset["annotations"]:
        ann = dict(ann, keypoints=_view_keypoints(ann, view))
        ann["num_keypoints"] = int(np.count_nonzero(np.asarray(ann["keypoints"][2::3], np.float64) > 0))
        annotations.append(ann)
    view_data["annotations"] = annotations
    return view_data


def _body_extent_box(keypoints: list) -> list:
    """(x, y, w, h) of the extent of the body keypoints: xtcocotools' loadRes takes a result's area
    as (max x - min x) x (max y - min y) over `keypoints` when there is no box; pycocotools takes it
    as w x h of a given box, the same product."""
    x, y = keypoints[0::3], keypoints[1::3]
    x0, x1, y0, y1 = np.min(x), np.max(x), np.min(y), np.max(y)
    return [x0, y0, x1 - x0, y1 - y0]


class WholeBodyEvaluator(CocoEvaluator):
    """MMPose's CocoWholeBodyMetric (ViTPose settings) on top of pycocotools' COCOeval.

    `evaluate(predictions)` (K = 133 keypoints per prediction, in COCO-WholeBody's order) returns
    the ten stats of the whole body under the usual names ("AP", ..., "AR (L)") and the same ten
    per part, prefixed "body ", "foot ", "face ", "lefthand ", "righthand " (e.g. "foot AP").
    MMPose's metric returns the whole-body ten and prints the part ones; they come from the same
    COCOeval runs. A prediction's `bbox`, if given, is not used: MMPose writes none for whole-body.

    Args:
        ann_file: COCO-WholeBody annotation file (`keypoints`, `foot_kpts`, `face_kpts`,
            `lefthand_kpts`, `righthand_kpts` per annotation).
        score_mode, keypoint_score_thr, nms_mode, nms_thr: as CocoEvaluator (over all 133 keypoints).
        sigmas: the 133 OKS sigmas (default: COCO-WholeBody's, `WHOLEBODY_SIGMAS`).
        use_area: as CocoEvaluator (MMPose's whole-body configs keep True).
    """

    def __init__(self, ann_file, score_mode: str = "bbox_keypoint", keypoint_score_thr: float = 0.2,
                 nms_mode: str = "oks_nms", nms_thr: float = 0.9, sigmas: Sequence[float] | None = None,
                 use_area: bool = True):
        sigmas = WHOLEBODY_SIGMAS if sigmas is None else sigmas
        if len(sigmas) != NUM_KEYPOINTS:
            raise ValueError(f"COCO-WholeBody evaluation needs {NUM_KEYPOINTS} sigmas (body 17, foot 6, face 68, "
                             f"hands 2 x 21), got {len(sigmas)}")
        super().__init__(ann_file, score_mode=score_mode, keypoint_score_thr=keypoint_score_thr,
                         nms_mode=nms_mode, nms_thr=nms_thr, sigmas=sigmas, use_area=use_area)

    def _index_ground_truth(self):
        fields = [(field, end - start) for _, field, start, end in PARTS]
        dataset = read_ground_truth(self.ann_file, NUM_KEYPOINTS, use_area=self.use_area, keypoint_fields=fields)
        self.views = {view: coco_index_of(_ground_truth_view(dataset, view)) for view in VIEWS}
        return self.views["wholebody"]

    def results(self, predictions: Sequence[dict]) -> list[dict]:
        """COCO-WholeBody results after the protocol, as MMPose writes them: per instance
        `image_id`, `category_id`, `keypoints` (the 17 body keypoints as x, y, score), `foot_kpts`,
        `face_kpts`, `lefthand_kpts`, `righthand_kpts` and `score`; no box."""
        out = []
        for entry in super().results(predictions):
            flat = entry["keypoints"]
            result = {"image_id": entry["image_id"], "category_id": entry["category_id"]}
            for _, field, start, end in PARTS:
                result[field] = flat[3 * start:3 * end]
            result["score"] = entry["score"]
            out.append(result)
        return out

    def evaluate_results(self, results: list[dict]) -> dict[str, float]:
        """The six COCOeval runs on COCO-WholeBody results (the format `results` writes)."""
        if not results:
            super().evaluate_results([])  # its warning; every stat is 0
            return {name: 0.0 for name in stat_names()}
        stats = {}
        for view in VIEWS:
            view_results = []
            for r in results:
                view_results.append({"image_id": r["image_id"], "category_id": r["category_id"],
                                     "keypoints": _view_keypoints(r, view), "score": r["score"],
                                     "bbox": _body_extent_box(r["keypoints"])})
            sigmas = self.sigmas if view == "wholebody" else self._part_sigmas(view)
            values = score_with_cocoeval(self.views[view], view_results, sigmas)
            prefix = "" if view == "wholebody" else f"{view} "
            stats.update({prefix + name: value for name, value in zip(STAT_NAMES, values)})
        return {name: stats[name] for name in stat_names()}

    def _part_sigmas(self, part: str) -> np.ndarray:
        start, end = next((s, e) for name, _, s, e in PARTS if name == part)
        return self.sigmas[start:end]


__all__ = ["PARTS", "WHOLEBODY_SIGMAS", "WholeBodyEvaluator", "stat_names"]
