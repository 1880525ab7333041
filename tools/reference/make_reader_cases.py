"""Instances as MMPose 1.3.2's datasets read them -> tests/fixtures/reader_cases.json.

Run in the MMPose reference venv (never a dependency of vitpose):

    ~/.cache/mmpose-ref-venv/bin/python tools/reference/make_reader_cases.py [--mmpose-repo DIR]

Inputs: the annotation files of MMPose v1.3.2's tests/data that tests/data/mmpose/ holds
(tests/data/mmpose/README.md), plus a few hand-made records for the edge cases those files lack
(an MPII centre at x = -1, an empty MPII box, all-zero joints, COCO-WholeBody visibilities 2 and
0.5, an AP-10K record without keypoints). For each file the fixture holds what MMPose's dataset
class (AicDataset, AP10KDataset, CocoWholeBodyDataset, MpiiDataset) gives per instance after
`GetBBoxCenterScale(padding=1.25)`: ids, image ids and paths, category ids, boxes, centres,
scales, keypoints and visibilities. tests/test_skeletons.py builds vitpose's index of the same
files and compares.

MPII records carry no image size (vitpose reads it from the image headers): with --mmpose-repo
(a clone of github.com/open-mmlab/mmpose, tag v1.3.2 checked out or present) the sizes of the
five MPII test images are read from there with OpenCV and recorded, so that the test can write
stand-in images of those sizes instead of carrying 400 kB of JPEGs.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MMPOSE_REF = Path(os.environ.get("VITPOSE_MMPOSE_REF", REPO.parent / "shared" / "mmpose-ref"))
DATA = REPO / "tests" / "data" / "mmpose"
OUT = REPO / "tests" / "fixtures" / "reader_cases.json"

# Hand-made records (edge cases). Each is written to a temporary file and read by MMPose.
MPII_EDGE = [
    {"image": "000000001.jpg", "center": [-1.0, 120.25], "scale": 0.8731, "joints_vis": [1] * 16,
     "joints": [[10.5 + k, 20.25 + 2 * k] for k in range(16)]},               # x = -1: no centre shift
    {"image": "000000001.jpg", "center": [50.0, 60.0], "scale": 0.0, "joints_vis": [1] * 16,
     "joints": [[1.0, 2.0]] * 16},                                             # empty box: dropped
    {"image": "000000002.jpg", "center": [77.7, 33.3], "scale": 1.23456, "joints_vis": [0] * 16,
     "joints": [[0.0, 0.0]] * 16},                                             # no joints: dropped
    {"image": "000000002.jpg", "center": [123.456, 78.9], "scale": 2.5, "joints_vis": [1, 0] * 8,
     "joints": [[100.1 + k, 50.7 - k] for k in range(16)]},
]
MPII_EDGE_SIZES = {"000000001.jpg": [320, 240], "000000002.jpg": [200, 300]}


def wholebody_edge():
    """Two records: hand visibility 2 and 0.5 (v > 0 counts), one with num_keypoints 0 (dropped)."""
    def part(n, v, x0):
        return [c for k in range(n) for c in (x0 + k * 1.5, 40.25 + k, v)]
    base = {"image_id": 1, "category_id": 1, "iscrowd": 0, "segmentation": [], "area": 1000.0,
            "bbox": [10.0, 20.0, 150.0, 200.0]}
    anns = [dict(base, id=1, num_keypoints=3, keypoints=part(17, 2, 20.0), foot_kpts=part(6, 1, 30.0),
                 face_kpts=part(68, 0, 0.0), lefthand_kpts=part(21, 2, 60.0), righthand_kpts=part(21, 0.5, 70.0)),
            dict(base, id=2, num_keypoints=0, keypoints=part(17, 0, 0.0), foot_kpts=part(6, 2, 30.0),
                 face_kpts=part(68, 2, 5.0), lefthand_kpts=part(21, 2, 60.0), righthand_kpts=part(21, 2, 70.0))]
    return {"images": [{"id": 1, "file_name": "a.jpg", "width": 200, "height": 260}], "annotations": anns,
            "categories": [{"id": 1, "name": "person"}]}


def ap10k_edge():
    """Two animal families and a record without keypoints (skipped by MMPose)."""
    kp = [c for k in range(17) for c in (30.0 + 3 * k, 60.5 + k, 2)]
    anns = [{"id": 5, "image_id": 9, "category_id": 26, "bbox": [20, 50, 100, 80], "area": 8000, "iscrowd": 0,
             "num_keypoints": 17, "keypoints": kp},
            {"id": 6, "image_id": 9, "category_id": 3, "bbox": [5, 5, 300, 200], "area": 60000, "iscrowd": 0},
            {"id": 7, "image_id": 9, "category_id": 3, "bbox": [-5, 10, 60, 90], "area": 5400, "iscrowd": 0,
             "num_keypoints": 17, "keypoints": kp}]
    return {"images": [{"id": 9, "file_name": "b.jpg", "width": 320, "height": 240}], "annotations": anns,
            "categories": [{"id": 3, "name": "bison"}, {"id": 26, "name": "cheetah"}]}


def instances(dataset):
    from mmpose.datasets.transforms import GetBBoxCenterScale

    center_scale = GetBBoxCenterScale(padding=1.25)
    out = []
    for i in range(len(dataset)):
        info = center_scale(dataset.get_data_info(i))
        out.append({
            "id": int(info["id"]),
            "img_id": int(info["img_id"]),
            "img_path": Path(info["img_path"]).name,
            "category_id": int(np.asarray(info.get("category_id", 1)).reshape(-1)[0]),
            "bbox": np.asarray(info["bbox"], np.float32).reshape(4).tolist(),
            "center": np.asarray(info["bbox_center"], np.float32).reshape(2).tolist(),
            "scale": np.asarray(info["bbox_scale"], np.float32).reshape(2).tolist(),
            "keypoints": np.asarray(info["keypoints"]).reshape(-1, 2).tolist(),
            "keypoints_dtype": str(np.asarray(info["keypoints"]).dtype),
            "keypoints_visible": np.asarray(info["keypoints_visible"], np.float64).reshape(-1).tolist(),
        })
    return out


def mpii_image_sizes(mmpose_repo: Path | None) -> dict:
    import cv2

    if mmpose_repo is None:
        return {}
    sizes = {}
    for rec in json.loads((DATA / "mpii" / "test_mpii.json").read_text()):
        name = rec["image"]
        blob = subprocess.run(["git", "-C", str(mmpose_repo), "show", f"v1.3.2:tests/data/mpii/{name}"],
                              capture_output=True, check=True).stdout
        img = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR)
        sizes[name] = [int(img.shape[1]), int(img.shape[0])]
    return sizes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mmpose-repo", type=Path, help="a git clone of MMPose holding tag v1.3.2")
    args = parser.parse_args()
    sys.path.insert(0, str(MMPOSE_REF))
    import mmcompat  # noqa: F401  (must precede mmpose)
    import mmpose
    from mmpose.datasets import AicDataset, AP10KDataset, CocoWholeBodyDataset, MpiiDataset

    kwargs = dict(data_mode="topdown", pipeline=[], data_root="", data_prefix={"img": ""})
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        def written(name, doc):
            path = Path(tmp) / name
            path.write_text(json.dumps(doc))
            return path

        files = [
            ("aic", "aic/test_aic.json", AicDataset, None),
            ("ap10k", "ap10k/test_ap10k.json", AP10KDataset, None),
            ("coco_wholebody", "coco/test_coco_wholebody.json", CocoWholeBodyDataset, None),
            ("mpii", "mpii/test_mpii.json", MpiiDataset, None),
            ("mpii", "edge:mpii_edge.json", MpiiDataset, MPII_EDGE),
            ("coco_wholebody", "edge:wholebody_edge.json", CocoWholeBodyDataset, wholebody_edge()),
            ("ap10k", "edge:ap10k_edge.json", AP10KDataset, ap10k_edge()),
        ]
        for skeleton, name, cls, inline in files:
            path = written(name.split(":", 1)[1], inline) if inline is not None else DATA / name
            dataset = cls(ann_file=str(path), test_mode=False, **kwargs)
            case = {"skeleton": skeleton, "file": name, "instances": instances(dataset)}
            if inline is not None:
                case["content"] = inline
            if skeleton == "mpii":
                case["image_sizes"] = MPII_EDGE_SIZES if inline is not None else mpii_image_sizes(args.mmpose_repo)
            cases.append(case)
            print(f"{name}: {len(case['instances'])} instances")
    OUT.write_text(json.dumps({"mmpose": mmpose.__version__, "generator": "tools/reference/make_reader_cases.py",
                               "cases": cases}, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
