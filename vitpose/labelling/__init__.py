"""The labelling loop's middle: which frames to label next (`select`) and which labels look wrong (`audit`).

Both take a predictor (`vitpose.Predictor`, the one top-down pipeline) and the skeleton it
carries (flip pairs, OKS sigmas); the commands are `vitpose select` and `vitpose audit`
(docs/labelling.md).
"""

from vitpose import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "vitpose.labelling.similarity": ["keypoint_similarity", "oks"],
    "vitpose.labelling.select": ["FrameScore", "choose_frames", "score_frame", "select_frames"],
    "vitpose.labelling.audit": ["audit_annotations", "ranked"],
    "vitpose.labelling.checks": ["audit_instance"],
    "vitpose.labelling.calibration": ["calibrate"],
    "vitpose.labelling.labels": ["read_labels"],
})
