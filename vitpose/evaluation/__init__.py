"""COCO keypoint evaluation with MMPose's CocoMetric protocol (rescoring, OKS-NMS, COCOeval)."""

import importlib

_LOCATIONS = {
    "CocoEvaluator": "vitpose.evaluation.coco_evaluator",
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
