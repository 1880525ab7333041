"""Detection ids and score filtering as MMPose 1.3.2's CocoDataset gives them -> tests/fixtures/detection_ids.json.

Run in the MMPose reference venv (never a dependency of vitpose):

    ~/.cache/mmpose-ref-venv/bin/python tools/reference/make_detection_ids.py

MMPose numbers the person boxes of a detection file 0, 1, ... in file order (boxes of other
categories get no number) and drops boxes with score < bbox_score_thr afterwards, so a kept box
keeps its number. The fixture holds a small annotation file, a detection file with other
categories, low scores and a score equal to a threshold, and for several thresholds the ids,
image ids, scores and xyxy boxes of MMPose's dataset. tests/test_dataset.py reads it.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# mmcompat.py (the import shim of the reference venv) lives beside this script (tools/reference/README.md).
MMPOSE_REF = Path(os.environ.get("VITPOSE_MMPOSE_REF", Path(__file__).resolve().parent))
OUT = REPO / "tests" / "fixtures" / "detection_ids.json"
THRESHOLDS = (0.0, 0.3, 0.5, 0.95)

IMAGES = [{"id": 7, "file_name": "000000000007.jpg", "width": 640, "height": 480},
          {"id": 3, "file_name": "000000000003.jpg", "width": 320, "height": 240}]
# (image_id, category_id, bbox xywh, score): file order matters.
DETECTIONS = [
    (7, 1, [10.5, 20.25, 100.0, 200.0], 0.99),
    (3, 2, [5.0, 5.0, 40.0, 40.0], 0.98),      # not a person: skipped, no number
    (3, 1, [1.0, 2.0, 30.0, 60.0], 0.12),
    (7, 1, [300.0, 100.0, 50.5, 120.75], 0.3),  # exactly the 0.3 threshold: kept there
    (7, 18, [0.0, 0.0, 10.0, 10.0], 0.2),      # not a person
    (3, 1, [100.0, 50.0, 80.0, 150.0], 0.51),
    (7, 1, [600.0, 400.0, 90.0, 120.0], 0.04),  # reaches past the image: not clipped
    (3, 1, [-4.0, -3.0, 20.0, 30.0], 0.96),
    (7, 1, [50.0, 60.0, 0.0, 25.0], 0.7),      # zero width, positive height
]


def main():
    sys.path.insert(0, str(MMPOSE_REF))
    import mmcompat  # noqa: F401  (must precede mmpose)
    import mmpose
    from mmpose.datasets import CocoDataset

    dets = [{"image_id": i, "category_id": c, "bbox": b, "score": s} for i, c, b, s in DETECTIONS]
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        ann_file, det_file = Path(tmp) / "ann.json", Path(tmp) / "det.json"
        ann_file.write_text(json.dumps({"images": IMAGES, "annotations": [],
                                        "categories": [{"id": 1, "name": "person"}]}))
        det_file.write_text(json.dumps(dets))
        for thr in THRESHOLDS:
            ds = CocoDataset(ann_file=str(ann_file), bbox_file=str(det_file), data_mode="topdown",
                             test_mode=True, filter_cfg={"bbox_score_thr": thr}, pipeline=[],
                             data_root="", data_prefix={"img": ""})
            infos = [ds.get_data_info(i) for i in range(len(ds))]
            cases.append({
                "bbox_score_thr": thr,
                "ids": [int(d["id"]) for d in infos],
                "image_ids": [int(d["img_id"]) for d in infos],
                "bbox_score": [float(d["bbox_score"][0]) for d in infos],
                "bbox_xyxy": [[float(v) for v in d["bbox"][0]] for d in infos],
            })
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "about": "MMPose CocoDataset(bbox_file=..., filter_cfg={'bbox_score_thr': thr}) on these files; "
                 "made by tools/reference/make_detection_ids.py",
        "mmpose_version": mmpose.__version__,
        "images": IMAGES, "detections": dets, "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT}: {len(cases)} thresholds")


if __name__ == "__main__":
    main()
