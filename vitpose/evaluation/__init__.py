"""Keypoint evaluation as MMPose computes it: COCO-style AP (CocoMetric, with any skeleton's sigmas),
COCO-WholeBody AP per part (CocoWholeBodyMetric), MPII PCKh (MpiiPCKAccuracy) and PCK / AUC / EPE
(PCKAccuracy by box size, AUC, EPE: MMPose's hand metrics)."""

from vitpose import lazy_exports

# Imported on first use, so that `import vitpose` stays light and each layer loads only what it needs.
__all__, __getattr__ = lazy_exports(__name__, {
    "vitpose.evaluation.coco_evaluator": ["CocoEvaluator"],
    "vitpose.evaluation.wholebody": ["WholeBodyEvaluator"],
    "vitpose.evaluation.pckh": ["PCKhEvaluator"],
    "vitpose.evaluation.pck": ["PCKEvaluator"],
    "vitpose.evaluation.matfile": ["read_mat_arrays"],
    "vitpose.evaluation.nms": ["oks_nms", "soft_oks_nms"],
})
