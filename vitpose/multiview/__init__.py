"""Several cameras: calibrations read, people matched across views, keypoints triangulated
(confidence-weighted DLT with outlier views dropped), optionally refined, written as OpenSim's .trc
(`vitpose triangulate`; docs/3d.md). NumPy and OpenCV only: no torch.
"""

from vitpose import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "vitpose.multiview.calibration": ["Camera", "CalibrationError", "read_calibration", "calibration_text"],
    "vitpose.multiview.views": ["Detection", "ViewsError", "read_views"],
    "vitpose.multiview.triangulation": ["Triangulated", "triangulate", "dlt", "reprojection_errors"],
    "vitpose.multiview.run": ["TriangulateOptions", "triangulate_files"],
    "vitpose.multiview.trc": ["write_trc", "read_trc"],
})
