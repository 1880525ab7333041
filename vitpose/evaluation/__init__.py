"""Keypoint evaluation as MMPose computes it: COCO-style AP (CocoMetric, with any skeleton's sigmas),
COCO-WholeBody AP per part (CocoWholeBodyMetric) and MPII PCKh (MpiiPCKAccuracy)."""

import importlib

_LOCATIONS = {
    "CocoEvaluator": "vitpose.evaluation.coco_evaluator",
    "WholeBodyEvaluator": "vitpose.evaluation.wholebody",
    "PCKhEvaluator": "vitpose.evaluation.pckh",
    "read_mat_arrays": "vitpose.evaluation.matfile",
    "oks_nms": "vitpose.evaluation.nms",
    "soft_oks_nms": "vitpose.evaluation.nms",
}
__all__ = [*_LOCATIONS]


def __getattr__(name):
    # Imported on first use so that `import vitpose` stays light and each layer
    # loads only what it needs.
    if name in _LOCATIONS:
        return getattr(importlib.import_module(_LOCATIONS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
