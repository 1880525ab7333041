"""metric.json: MMPose's CocoMetric (ViTPose settings, xtcocotools) and plain pycocotools on
synthetic predictions built from the coco-mini ground truth (tests/fixtures/README.md §2, §4.13)."""

import contextlib
import io
import json
import tempfile
from pathlib import Path

import numpy as np
import ref_geometry
from common import IMAGE_IDS, versions, write_json
from mmpose.evaluation.metrics import CocoMetric
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

METRIC_CFG = {"type": "CocoMetric", "use_area": True, "iou_type": "keypoints", "score_mode": "bbox_keypoint",
              "keypoint_score_thr": 0.2, "nms_mode": "oks_nms", "nms_thr": 0.9}
SCENARIOS = [("exact", 0.0, None), ("noise_3px", 3.0, None), ("noise_12px", 12.0, None), ("relative_0.08", None, 0.08)]
FIRST_EXTRA_ID = 10_000_000
SEED = 5150
NOTES = (
    "Each prediction: id (unique per image; MMPose drops later entries with the same id), img_id, kind, "
    "gt_ann_id, keypoints (17x2, image pixels), keypoint_scores (17), bbox_score, bbox_xywh (given to CocoMetric "
    "as pred_instances.bboxes, written into its results json as bbox), area_for_nms = product of the 1.25-padded "
    "box widened to 3:4 (what CocoMetric gets from gt_instances.bbox_scales and uses as area in oks_nms). MMPose "
    "rescoring: score = bbox_score * mean(keypoint_scores > 0.2) (0 if none); then oks_nms at 0.9, then "
    "xtcocotools COCOeval with use_area=True. mmpose.after_nms is the json MMPose evaluated (keypoints flattened "
    "x, y, score). pycocotools_raw: pycocotools COCOeval on every prediction with score = bbox_score, no bbox "
    "field, no rescoring, no NMS; pycocotools_on_mmpose_json: pycocotools on mmpose.after_nms; oks_raw: per image "
    "pycocotools' OKS matrix (detections sorted by score desc x GT in file order), rounded to 6 decimals. Made by "
    "tools/reference/make_fixtures.py (ref_metric.py).")


def area_for_nms(bbox_xywh):
    """w * h of the box padded by 1.25 and widened to w/h = 0.75, in float32 (MMPose's bbox_scale)."""
    w, h = np.float32(bbox_xywh[2]) * np.float32(1.25), np.float32(bbox_xywh[3]) * np.float32(1.25)
    if w > h * np.float32(0.75):
        h = w / np.float32(0.75)
    else:
        w = h * np.float32(0.75)
    return float(np.float32(w * h))


def _prediction(rng, pid, image_id, kind, ann, keypoints, scores, bbox_score, box):
    return {"id": pid, "img_id": image_id, "kind": kind, "gt_ann_id": ann["id"] if ann else None,
            "keypoints": np.round(keypoints, 3).tolist(), "keypoint_scores": np.round(scores, 4).tolist(),
            "bbox_score": round(float(bbox_score), 4), "bbox_xywh": np.round(box, 3).tolist(),
            "area_for_nms": area_for_nms(np.round(box, 3))}


def draw_predictions(ann_file, sigma_px, sigma_rel, rng):
    """28 predictions: 12 true positives, and per image a near and a far duplicate of its first
    instance (0.9x and 0.7x its box score) and two false positives (random boxes and points)."""
    data = json.loads(Path(ann_file).read_text())
    shapes = {im["id"]: (im["height"], im["width"]) for im in data["images"]}
    extra_id = FIRST_EXTRA_ID
    predictions = []
    for image_id in IMAGE_IDS:
        anns = [a for a in data["annotations"] if a["image_id"] == image_id and a["num_keypoints"] > 0]
        for ann in anns:
            gt = np.array(ann["keypoints"], float).reshape(17, 3)
            x, y, w, h = ann["bbox"]
            sigma = sigma_px if sigma_px is not None else sigma_rel * np.sqrt(ann["area"])
            points = rng.uniform([x, y], [x + w, y + h], (17, 2))  # unlabelled joints: anywhere in the box
            labelled = gt[:, 2] > 0
            points[labelled] = gt[labelled, :2] + rng.normal(0, sigma, (labelled.sum(), 2)) * (sigma > 0)
            box = np.array(ann["bbox"]) + rng.normal(0, 3, 4)
            predictions.append(_prediction(rng, ann["id"], image_id, "tp", ann, points, rng.uniform(0, 1, 17),
                                           rng.uniform(0.3, 1.0), box))
        first = predictions[-len(anns)]
        for kind, noise, factor in (("near_duplicate", 1.0, 0.9), ("far_duplicate", 12.0, 0.7)):
            points = np.array(first["keypoints"]) + rng.normal(0, noise, (17, 2))
            predictions.append(_prediction(rng, extra_id, image_id, kind, anns[0], points, first["keypoint_scores"],
                                           first["bbox_score"] * factor, first["bbox_xywh"]))
            extra_id += 1
        height, width = shapes[image_id]
        for _ in range(2):
            bw, bh = rng.uniform(40, 250, 2)
            bx, by = rng.uniform(0, width - bw), rng.uniform(0, height - bh)
            points = rng.uniform([bx, by], [bx + bw, by + bh], (17, 2))
            predictions.append(_prediction(rng, extra_id, image_id, "false_positive", None, points,
                                           rng.uniform(0, 1, 17), rng.uniform(0.3, 1.0), [bx, by, bw, bh]))
            extra_id += 1
    return predictions


def _quiet(function, *args):
    with contextlib.redirect_stdout(io.StringIO()):
        return function(*args)


def mmpose_evaluate(ann_file, dataset_meta, predictions, work_dir):
    """(stats, results json) of CocoMetric on `predictions`, fed as the top-down estimator does."""
    metric = CocoMetric(ann_file=str(ann_file), outfile_prefix=str(work_dir / "results"),
                        **{k: v for k, v in METRIC_CFG.items() if k != "type"})
    metric.dataset_meta = dataset_meta
    samples = []
    for p in predictions:
        x, y, w, h = p["bbox_xywh"]  # corners in float64, then float32 like a pipeline's boxes
        samples.append({
            "id": p["id"], "img_id": p["img_id"], "category_id": 1,
            "pred_instances": {"keypoints": np.array([p["keypoints"]], np.float32),
                               "keypoint_scores": np.array([p["keypoint_scores"]], np.float32),
                               "bboxes": np.array([[x, y, x + w, y + h]], np.float32),
                               "bbox_scores": np.array([p["bbox_score"]], np.float32)},
            "gt_instances": {"bbox_scales": np.array([[p["area_for_nms"], 1.0]], np.float32)},
        })
    metric.process([], samples)
    stats = _quiet(metric.compute_metrics, metric.results)
    after_nms = json.loads((work_dir / "results.keypoints.json").read_text())
    return {name: float(value) for name, value in stats.items()}, after_nms


def pycocotools_evaluate(ann_file, results):
    """(stats, {image id: OKS matrix}) of plain pycocotools COCOeval on a results list."""
    gt = _quiet(COCO, str(ann_file))
    evaluator = COCOeval(gt, _quiet(gt.loadRes, [dict(r) for r in results]), iouType="keypoints")
    _quiet(evaluator.evaluate)
    _quiet(evaluator.accumulate)
    _quiet(evaluator.summarize)
    names = ["AP", "AP .5", "AP .75", "AP (M)", "AP (L)", "AR", "AR .5", "AR .75", "AR (M)", "AR (L)"]
    oks = {str(image_id): np.round(np.asarray(evaluator.ious[(image_id, 1)]), 6).tolist() for image_id in IMAGE_IDS}
    return dict(zip(names, (float(v) for v in evaluator.stats))), oks


def raw_results(predictions):
    """The predictions as a plain COCO results list: score = bbox_score, no bbox field."""
    return [{"image_id": p["img_id"], "category_id": 1,
             "keypoints": np.concatenate([np.array(p["keypoints"]), np.array(p["keypoint_scores"])[:, None]],
                                         axis=1).ravel().tolist(),
             "score": p["bbox_score"]} for p in predictions]


def write(out_dir, cases_dir, coco_mini):
    ann_file = coco_mini / "test_coco.json"
    dataset_meta = ref_geometry._val_dataset(coco_mini, []).metainfo
    cases = None
    if cases_dir is not None:
        cases = {s["name"]: s for s in json.loads((Path(cases_dir) / "metric.json").read_text())["scenarios"]}
    rng = np.random.default_rng(SEED)
    scenarios = []
    for name, sigma_px, sigma_rel in SCENARIOS:
        predictions = (cases[name]["predictions"] if cases else draw_predictions(ann_file, sigma_px, sigma_rel, rng))
        with tempfile.TemporaryDirectory() as work_dir:
            stats, after_nms = mmpose_evaluate(ann_file, dataset_meta, predictions, Path(work_dir))
        raw_stats, oks = pycocotools_evaluate(ann_file, raw_results(predictions))
        on_mmpose_json, _ = pycocotools_evaluate(ann_file, after_nms)
        scenarios.append({"name": name, "noise_sigma_px": sigma_px, "noise_sigma_rel_sqrt_area": sigma_rel,
                          "n_predictions": len(predictions), "n_after_nms": len(after_nms),
                          "predictions": predictions, "mmpose": {"stats": stats, "after_nms": after_nms},
                          "pycocotools_raw": raw_stats, "pycocotools_on_mmpose_json": on_mmpose_json,
                          "oks_raw": oks})
    record = {"versions": versions(), "ann_file": "tests/data/coco-mini/test_coco.json",
              "mmpose_metric_cfg": METRIC_CFG, "sigmas": [float(s) for s in dataset_meta["sigmas"]], "seed": SEED,
              "notes": NOTES, "scenarios": scenarios}
    write_json(out_dir / "metric.json", record)
    return ["metric.json"]
