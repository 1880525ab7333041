"""Write tests/fixtures/pck_cases.json: MMPose 1.3.2's PCK, AUC and EPE on a 21-keypoint set.

Run it in the MMPose reference environment (README.md in this folder), never in vitpose's own:

    ~/.cache/mmpose-ref-venv/bin/python tools/reference/make_pck_cases.py [--out tests/fixtures/pck_cases.json]

The set: a small COCO-format annotation file of 21-keypoint instances, named as
configs/demo_hand21_skeleton.yaml (the K of MMPose's hand sets), drawn from a fixed seed, plus
instances aimed at one behaviour each (below), and seeded predictions around the ground truth
(float32, noise from sub-pixel to beyond the box). MMPose reads the file with its own hand dataset
class (`OneHand10KDataset`, top-down, test mode: its instance filter and its box clipping), and
scores the predictions twice, with the metric classes its OneHand10K configs use
(`PCKAccuracy(thr, norm_item="bbox")`, `AUC()`, `EPE()`, fed data samples as its top-down model
fills them) and with the functions under them (`keypoint_pck_accuracy` with the box sizes,
`keypoint_auc`, `keypoint_epe`); the script asserts that both agree and that every aimed case
really separates MMPose's behaviour from the tempting alternative, so a regenerated file keeps its
power to fail. The tests read the file with json and numpy only.

Aimed cases:
- a box that leaves the image: MMPose clips it (x2 = clip(x + w, 0, W - 1)) before taking the
  longer side, so the normaliser is not max(w, h) of the file's box;
- a tall box and a wide box: the longer side, not the width or the diagonal;
- v = 1 keypoints (labelled, not visible) count, v = 0 ones do not, even with coordinates;
- a keypoint labelled in no instance: no accuracy (-1), left out of the mean, not counted as 0;
- a prediction exactly at the threshold (distance / size == float32(thr)): not correct;
- a crowd annotation, one with num_keypoints 0, one whose box is empty after clipping, one
  without a bbox: MMPose drops them (no prediction is made for them);
- an annotation without a num_keypoints field (MMPose counts its labelled points).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SEED = 20261202
K = 21
NAMES = ["nose", "left_eye", "right_eye", "left_ear", "right_ear", "neck", "left_shoulder", "right_shoulder",
         "left_elbow", "right_elbow", "left_forearm", "right_forearm", "left_wrist", "right_wrist", "mid_hip",
         "left_hip", "right_hip", "left_knee", "right_knee", "left_ankle", "right_ankle"]
NEVER_LABELLED = 20  # right_ankle: labelled in no instance
THRESHOLDS = (0.2, 0.1)  # OneHand10K's 0.2, and another to show the threshold is read


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "pck_cases.json")
    return p.parse_args()


def ann(ann_id, image_id, box, keypoints, **extra):
    record = {"id": ann_id, "image_id": image_id, "category_id": 1, "bbox": [float(v) for v in box],
              "keypoints": [round(float(v), 2) for v in np.asarray(keypoints).ravel()], "iscrowd": 0}
    labels = np.asarray(keypoints).reshape(K, 3)
    record["num_keypoints"] = int(np.count_nonzero(labels[:, 2] > 0))
    record["area"] = float(box[2] * box[3])
    record.update(extra)
    return record


def random_keypoints(rng, box, width, height):
    """(K, 3) labels inside the box: v drawn 2 (70 %), 1 (15 %), 0 (15 %; at (0, 0) as COCO writes them)."""
    x, y, w, h = box
    xy = np.stack([rng.uniform(x, x + w, K), rng.uniform(y, y + h, K)], axis=1)
    xy = np.clip(xy, 0, [width - 1, height - 1])
    v = rng.choice([2, 1, 0], size=K, p=[0.7, 0.15, 0.15])
    v[NEVER_LABELLED] = 0
    xy[v == 0] = 0.0
    return np.concatenate([np.round(xy, 2), v[:, None]], axis=1)


def build_set(rng):
    """(COCO annotation dict, {annotation id: aim}) of the set the module docstring describes."""
    images, annotations, aims = [], [], {}
    sizes = [(96, 72), (120, 90), (80, 120), (160, 100), (64, 64), (100, 80)]
    next_id = 1
    for image_id, (width, height) in enumerate(sizes, start=1):
        images.append({"id": image_id, "file_name": f"{image_id:012d}.jpg", "width": width, "height": height})
        for _ in range(2):
            w, h = rng.uniform(0.3, 0.7) * width, rng.uniform(0.3, 0.7) * height
            box = [round(rng.uniform(0, width - w), 1), round(rng.uniform(0, height - h), 1), round(w, 1), round(h, 1)]
            annotations.append(ann(next_id, image_id, box, random_keypoints(rng, box, width, height)))
            aims[next_id] = "random"
            next_id += 1
    # Aimed instances (image 1 is 96 x 72, image 4 is 160 x 100).
    leaving = [60.0, 10.0, 70.0, 40.0]  # x + w = 130 > 95: clipped to 95, longer side 35 then 40 (h)
    kp = random_keypoints(rng, [60, 10, 35, 40], 96, 72)
    annotations.append(ann(next_id, 1, leaving, kp))
    aims[next_id] = "box leaves the image: clipped before the longer side"
    next_id += 1
    tall = [5.0, 2.0, 20.0, 66.0]
    annotations.append(ann(next_id, 1, tall, random_keypoints(rng, tall, 96, 72)))
    aims[next_id] = "tall box: the height is the size"
    next_id += 1
    wide = [10.0, 20.0, 130.0, 30.0]
    annotations.append(ann(next_id, 4, wide, random_keypoints(rng, wide, 160, 100)))
    aims[next_id] = "wide box: the width is the size"
    next_id += 1
    at_threshold = [20.0, 20.0, 50.0, 50.0]  # size 50: a distance of 10 is exactly 0.2, 5 exactly 0.1
    kp = random_keypoints(rng, at_threshold, 160, 100)
    kp[:, 2] = 2
    kp[NEVER_LABELLED] = 0
    kp[:, :2] = np.round(np.clip(kp[:, :2], 21, 59))  # whole pixels: gt + 10 is exact in float32
    kp[NEVER_LABELLED, :2] = 0
    annotations.append(ann(next_id, 4, at_threshold, kp))
    aims[next_id] = "predictions exactly at the thresholds"
    next_id += 1
    zero_with_xy = random_keypoints(rng, [30, 30, 40, 40], 120, 90)
    zero_with_xy[:5, 2] = 0  # v = 0 with coordinates: still not labelled
    zero_with_xy[:5, :2] = [[35, 35]] * 5
    zero_with_xy[5:10, 2] = 1
    record = ann(next_id, 2, [30, 30, 40, 40], zero_with_xy)
    del record["num_keypoints"]
    annotations.append(record)
    aims[next_id] = "v = 0 with coordinates and v = 1; no num_keypoints field"
    next_id += 1
    # Instances MMPose drops: a prediction for any of them matches nothing.
    crowd = ann(next_id, 3, [10, 10, 40, 60], random_keypoints(rng, [10, 10, 40, 60], 80, 120), iscrowd=1)
    annotations.append(crowd)
    aims[next_id] = "dropped: crowd"
    next_id += 1
    annotations.append(ann(next_id, 3, [5, 70, 20, 30], np.zeros((K, 3))))
    aims[next_id] = "dropped: num_keypoints 0"
    next_id += 1
    annotations.append(ann(next_id, 5, [70, 10, 10, 10], random_keypoints(rng, [40, 10, 20, 20], 64, 64)))
    aims[next_id] = "dropped: box empty after clipping (x beyond the image)"
    next_id += 1
    no_box = ann(next_id, 6, [0, 0, 1, 1], random_keypoints(rng, [10, 10, 50, 50], 100, 80))
    del no_box["bbox"]
    annotations.append(no_box)
    aims[next_id] = "dropped: no bbox"
    categories = [{"id": 1, "name": "demo_hand21", "supercategory": "demo_hand21", "keypoints": NAMES,
                   "skeleton": []}]
    return {"images": images, "annotations": annotations, "categories": categories}, aims


def predict(rng, instances, aims):
    """{annotation id: (K, 2) float32}: the ground truth plus noise of a per-instance scale (0.3 to
    25 px); the at-threshold instance is moved by exactly 0.2 and 0.1 of its size on some keypoints."""
    predictions = {}
    for info in instances:
        gt = info["keypoints"][0].astype(np.float64)
        scale = rng.choice([0.3, 1.5, 4.0, 8.0, 25.0])
        xy = gt + rng.normal(0, scale, gt.shape)
        if aims[info["id"]] == "predictions exactly at the thresholds":
            xy = gt.copy()
            xy[0:6, 0] += 10.0  # 10 / 50 == 0.2 (in float32 too): on the threshold, not below it
            xy[6:12, 1] -= 5.0  # 5 / 50 == 0.1; and 5 / 30 px for the AUC
            xy[12:15, 0] += 9.0  # below 0.2
            xy[15:18, 0] += 15.0  # 15 / 30 == 0.5: on an AUC threshold
        predictions[info["id"]] = xy.astype(np.float32)
    return predictions


def mmpose_dataset(ann_file: Path):
    from mmpose.datasets import OneHand10KDataset

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        dataset = OneHand10KDataset(ann_file=str(ann_file), data_root="", data_prefix=dict(img=""),
                                    data_mode="topdown", test_mode=True, pipeline=[])
    return [dataset.get_data_info(i) for i in range(len(dataset))]


def score_with_metrics(instances, predictions, thr):
    from mmpose.evaluation.metrics import AUC, EPE, PCKAccuracy

    stats = {}
    for metric in (PCKAccuracy(thr=thr, norm_item="bbox"), AUC(), EPE()):
        samples = [{"pred_instances": {"keypoints": predictions[info["id"]][None]},
                    "gt_instances": {"keypoints": info["keypoints"], "keypoints_visible": info["keypoints_visible"],
                                     "bboxes": info["bbox"]}} for info in instances]
        metric.process([], samples)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            stats.update(metric.compute_metrics(metric.results))
    return {name: float(value) for name, value in stats.items()}


def score_with_functions(instances, predictions, thr):
    from mmpose.evaluation.functional import keypoint_auc, keypoint_epe, keypoint_pck_accuracy

    pred = np.stack([predictions[info["id"]] for info in instances])
    gt = np.concatenate([info["keypoints"] for info in instances])
    mask = np.concatenate([info["keypoints_visible"] for info in instances]).astype(bool)
    sizes = np.array([np.max(info["bbox"][0][2:] - info["bbox"][0][:2]) for info in instances])
    norm = np.stack([sizes, sizes], axis=1)
    per_keypoint, pck, count = keypoint_pck_accuracy(pred, gt, mask, thr, norm)
    return {"PCK": float(pck), "AUC": float(keypoint_auc(pred, gt, mask, 30, 20)),
            "EPE": float(keypoint_epe(pred, gt, mask)), "per_keypoint": [float(a) for a in per_keypoint],
            "scored_keypoints": int(count), "box_sizes": [float(s) for s in sizes]}


def check_aims(instances, predictions, functions, thr):
    """Each aimed case changes the result against the tempting alternative."""
    from mmpose.evaluation.functional import keypoint_pck_accuracy

    pred = np.stack([predictions[info["id"]] for info in instances])
    gt = np.concatenate([info["keypoints"] for info in instances])
    mask = np.concatenate([info["keypoints_visible"] for info in instances]).astype(bool)
    raw = np.array([[info["raw_ann_info"]["bbox"][2], info["raw_ann_info"]["bbox"][3]] for info in instances])
    unclipped = raw.max(axis=1)
    assert not np.allclose(unclipped, functions["box_sizes"]), "the clipped box must change a size"
    alternatives = {
        "unclipped box": np.stack([unclipped, unclipped], 1),
        "box width": np.stack([raw[:, 0], raw[:, 0]], 1),
        "box diagonal": np.stack([np.hypot(raw[:, 0], raw[:, 1])] * 2, 1),
    }
    for name, norm in alternatives.items():
        assert keypoint_pck_accuracy(pred, gt, mask, thr, norm)[1] != functions["PCK"], name
    assert functions["per_keypoint"][NEVER_LABELLED] == -1
    acc = np.array(functions["per_keypoint"])
    assert acc[acc >= 0].mean() != np.where(acc >= 0, acc, 0).mean(), "-1 must not count as 0"
    assert keypoint_pck_accuracy(pred, gt, mask | (gt.max(-1) > 0), thr,
                                 np.stack([functions["box_sizes"]] * 2, 1))[1] != functions["PCK"], "v = 0 masked"
    # On the threshold is not below it: a threshold one float32 step higher changes the result.
    norm = np.stack([functions["box_sizes"]] * 2, 1)
    above = float(np.nextafter(np.float32(thr), np.float32(1)))
    assert keypoint_pck_accuracy(pred, gt, mask, above, norm)[1] > functions["PCK"], "at the threshold"


def main():
    args = parse_args()
    sys.path.insert(0, str(HERE))
    import mmcompat  # noqa: F401  (must precede mmpose)
    import mmpose

    sys.path.insert(0, str(HERE))
    from common import versions

    rng = np.random.default_rng(SEED)
    dataset, aims = build_set(rng)
    with tempfile.TemporaryDirectory() as tmp:
        ann_file = Path(tmp) / "hand21.json"
        ann_file.write_text(json.dumps(dataset))
        instances = mmpose_dataset(ann_file)
    kept = [info["id"] for info in instances]
    assert not any(aims[i].startswith("dropped") for i in kept)
    assert all(aims[i].startswith("dropped") for i in aims if i not in kept)
    predictions = predict(rng, instances, aims)
    runs = []
    for thr in THRESHOLDS:
        metrics = score_with_metrics(instances, predictions, thr)
        functions = score_with_functions(instances, predictions, thr)
        for name in ("PCK", "AUC", "EPE"):
            assert metrics[name] == functions[name], (name, metrics[name], functions[name])
        check_aims(instances, predictions, functions, thr)
        assert 0.2 < functions["PCK"] < 0.95 and 0.2 < functions["AUC"] < 0.95, functions
        runs.append({"thr": thr, "mmpose_metrics": metrics, "mmpose_functions": functions})
    fixture = {
        "generator": "tools/reference/make_pck_cases.py",
        "mmpose": mmpose.__version__,
        "versions": versions(),
        "seed": SEED,
        "notes": ("MMPose 1.3.2's PCKAccuracy(norm_item='bbox') / AUC() / EPE() metrics and keypoint_pck_accuracy "
                  "/ keypoint_auc / keypoint_epe on the annotations below as OneHand10KDataset reads them "
                  "(top-down, test mode) and the predictions (float32, one per kept annotation id)."),
        "annotations": dataset,
        "aims": {str(k): v for k, v in aims.items()},
        "kept_ids": kept,
        "predictions": [{"id": i, "image_id": int(next(info["img_id"] for info in instances if info["id"] == i)),
                         "keypoints": predictions[i].tolist()} for i in kept],
        "runs": runs,
    }
    args.out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {args.out}: {len(kept)} instances; " + "; ".join(
        f"thr {r['thr']}: PCK {r['mmpose_metrics']['PCK']:.4f} AUC {r['mmpose_metrics']['AUC']:.4f} "
        f"EPE {r['mmpose_metrics']['EPE']:.4f}" for r in runs))


if __name__ == "__main__":
    main()
