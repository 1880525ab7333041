"""CocoEvaluator against MMPose's CocoMetric (fixtures metric.json and the repository's
tests/fixtures/metric_cases.json) and against plain pycocotools."""

import contextlib
import copy
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from vitpose.coco_meta import SIGMAS
from vitpose.evaluation import CocoEvaluator, oks_nms, soft_oks_nms
from vitpose.evaluation.coco_evaluator import (
    STAT_NAMES,
    GroundTruthError,
    PredictionError,
    check_predictions,
    load_predictions,
    save_predictions,
)
from vitpose.evaluation.nms import oks_one_to_many, pairwise_oks

# Written by tools/reference/make_metric_cases.py in the MMPose 1.3.2 reference environment.
METRIC_CASES = Path(__file__).parent / "fixtures" / "metric_cases.json"
CASES = json.loads(METRIC_CASES.read_text())


@pytest.fixture(scope="module")
def metric(fixtures_dir):
    return json.loads((fixtures_dir / "metric.json").read_text())


@pytest.fixture(scope="module")
def ann_file(coco_mini_dir):
    return coco_mini_dir / "test_coco.json"


@pytest.fixture(scope="module")
def evaluator(ann_file):
    return CocoEvaluator(ann_file)


def to_predictions(scenario, with_bbox=True):
    """metric.json's prediction records -> prediction dicts of docs/evaluation.md §3 (scores float32 like a model's)."""
    preds = []
    for p in scenario["predictions"]:
        pred = {"id": p["id"], "image_id": p["img_id"], "keypoints": np.asarray(p["keypoints"], np.float32),
                "keypoint_scores": np.asarray(p["keypoint_scores"], np.float32),
                "bbox_score": p["bbox_score"], "area": p["area_for_nms"]}
        if with_bbox:
            pred["bbox"] = p["bbox_xywh"]
        preds.append(pred)
    return preds


def pycocotools_stats(ann_file, results):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(ann_file))
        ev = COCOeval(gt, gt.loadRes(copy.deepcopy(results)), iouType="keypoints")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return dict(zip(STAT_NAMES, ev.stats))


SCENARIOS = ["exact", "noise_3px", "noise_12px", "relative_0.08"]


def scenario_named(metric, name):
    return next(s for s in metric["scenarios"] if s["name"] == name)


@pytest.mark.parametrize("name", SCENARIOS)
def test_stats_equal_mmpose(metric, evaluator, name):
    scenario = scenario_named(metric, name)
    stats = evaluator.evaluate(to_predictions(scenario))
    assert list(stats) == list(STAT_NAMES)
    for key, expected in scenario["mmpose"]["stats"].items():
        assert stats[key] == pytest.approx(expected, abs=1e-9), key


@pytest.mark.parametrize("name", SCENARIOS)
def test_after_nms_equals_mmpose(metric, evaluator, name):
    scenario = scenario_named(metric, name)
    ours = evaluator.results(to_predictions(scenario))
    theirs = scenario["mmpose"]["after_nms"]
    assert len(ours) == len(theirs) == scenario["n_after_nms"]

    def key(r):  # order-free identity of one result: image and its first keypoint
        return (r["image_id"], round(r["keypoints"][0], 3), round(r["keypoints"][1], 3))

    ours_by_key = {key(r): r for r in ours}
    assert len(ours_by_key) == len(ours)
    for r in theirs:
        mine = ours_by_key[key(r)]
        np.testing.assert_allclose(mine["keypoints"], r["keypoints"], rtol=0, atol=1e-4)
        assert mine["score"] == pytest.approx(r["score"], rel=1e-6)
        np.testing.assert_allclose(mine["bbox"], r["bbox"], atol=1e-4)


@pytest.mark.parametrize("name", SCENARIOS)
def test_raw_protocol_equals_plain_pycocotools(metric, ann_file, name):
    """score_mode='bbox', no NMS, no bbox field: exactly what pycocotools gives on the raw set."""
    scenario = scenario_named(metric, name)
    ev = CocoEvaluator(ann_file, score_mode="bbox", nms_mode="none")
    stats = ev.evaluate(to_predictions(scenario, with_bbox=False))
    for key, expected in scenario["pycocotools_raw"].items():
        assert stats[key] == pytest.approx(expected, abs=1e-9), key


def test_bbox_field_changes_area_split(metric, ann_file, evaluator):
    """Without `bbox` COCOeval measures areas from the keypoints: the same as pycocotools on that JSON."""
    scenario = scenario_named(metric, "noise_3px")
    preds = to_predictions(scenario, with_bbox=False)
    results = evaluator.results(preds)
    assert "bbox" not in results[0]
    expected = pycocotools_stats(ann_file, results)
    stats = evaluator.evaluate(preds)
    for key in STAT_NAMES:
        assert stats[key] == pytest.approx(expected[key], abs=1e-12), key


def test_duplicate_ids_keep_first_after_sorting(metric, evaluator):
    scenario = scenario_named(metric, "noise_12px")
    preds = to_predictions(scenario)
    base = evaluator.evaluate(preds)
    # A copy of a true positive with the same id but far-off keypoints and a top score: MMPose
    # keeps the first one of the id run (the original, since the sort is stable), so nothing changes.
    bad = dict(preds[0], keypoints=preds[0]["keypoints"] + 50.0, bbox_score=1.0)
    assert evaluator.evaluate(preds + [bad]) == base
    # Put first, the bad copy wins instead and AP drops.
    assert evaluator.evaluate([bad] + preds)["AP"] < base["AP"]


def test_rescoring_formula(evaluator):
    f32 = np.float32
    scores = np.array([0.1, 0.2, 0.3, 0.5] + [0.0] * 13, f32)
    # float32(0.2) = 0.2000000030 is above 0.2 in float64, as MMPose compares under NumPy 1.x:
    # the mean of the float32 values 0.2, 0.3 and 0.5, added in float64.
    expected = 0.8 * (((float(f32(0.2)) + float(f32(0.3))) + float(f32(0.5))) / 3)
    assert evaluator.rescore(scores, 0.8) == expected
    assert evaluator.rescore(np.full(17, 0.2, f32), 0.8) == 0.8 * float(f32(0.2))
    assert evaluator.rescore(np.full(17, np.nextafter(f32(0.2), f32(0)), f32), 0.8) == 0.0
    assert evaluator.rescore(np.full(17, 0.2, np.float64), 0.8) == 0.0  # exactly 0.2 is not above it
    assert evaluator.rescore(np.zeros((2, 3, 17), f32), np.ones((2, 3))).shape == (2, 3)
    # MMPose adds the scores one by one, left to right: 2^53 + 1 rounds back to 2^53 every time,
    # where a pairwise sum would first add the ones (2^53 + 16).
    wide = np.array([2.0 ** 53] + [1.0] * 16)
    assert evaluator.rescore(wide, 1.0) == 2.0 ** 53 / 17


def test_pairwise_oks_matches_the_formula():
    rng = np.random.default_rng(0)
    kpts = rng.uniform(0, 200, (5, 17, 2))
    areas = rng.uniform(1e3, 3e4, 5)
    oks = pairwise_oks(kpts, areas)
    var = (2 * np.asarray(SIGMAS)) ** 2
    for i in range(5):
        for j in range(5):
            d2 = ((kpts[i] - kpts[j]) ** 2).sum(-1)
            expected = np.mean(np.exp(-d2 / var / ((areas[i] + areas[j]) / 2) / 2))
            assert oks[i, j] == pytest.approx(expected, rel=1e-6)
    np.testing.assert_array_equal(oks, oks.T)
    np.testing.assert_allclose(np.diag(oks), 1.0)


def test_oks_nms_greedy():
    base = np.random.default_rng(1).uniform(0, 100, (17, 2))
    kpts = np.stack([base, base + 0.5, base + 40.0, base + 40.3])
    areas = np.full(4, 1e4)
    scores = np.array([0.5, 0.9, 0.3, 0.4])
    # 1 beats its near copy 0; 3 beats its near copy 2.
    assert oks_nms(kpts, scores, areas, 0.9).tolist() == [1, 3]
    # A threshold above every OKS keeps all, in score order.
    assert oks_nms(kpts, scores, areas, 1.0).tolist() == [1, 0, 3, 2]
    assert oks_nms(np.zeros((0, 17, 2)), [], [], 0.9).tolist() == []


def test_soft_oks_nms_reorders_by_decayed_score():
    base = np.random.default_rng(2).uniform(0, 100, (17, 2))
    kpts = np.stack([base, base + 0.5, base + 60.0])
    areas = np.full(3, 1e4)
    scores = np.array([0.9, 0.8, 0.5])
    # 1 overlaps 0 almost fully: its score decays to ~0.8 * exp(-1/0.9) = 0.26 < 0.5.
    assert soft_oks_nms(kpts, scores, areas, 0.9).tolist() == [0, 2, 1]
    assert soft_oks_nms(kpts, scores, areas, 0.9, max_dets=2).tolist() == [0, 2]


def test_soft_nms_mode_runs_through_cocoeval(metric, ann_file):
    scenario = scenario_named(metric, "noise_3px")
    preds = to_predictions(scenario)
    ev = CocoEvaluator(ann_file, nms_mode="soft_oks_nms")
    results = ev.results(preds)
    # Soft NMS drops nothing here (fewer than 20 per image), it only reorders.
    assert len(results) == len(preds)
    stats = ev.evaluate(preds)
    expected = pycocotools_stats(ann_file, results)
    assert stats == pytest.approx(expected, abs=1e-12)


def test_no_predictions_gives_zero_with_warning(evaluator):
    with pytest.warns(UserWarning, match="no predictions"):
        stats = evaluator.evaluate([])
    assert stats == {name: 0.0 for name in STAT_NAMES}


@pytest.mark.parametrize("mutate, match", [
    (lambda p: p.pop("area"), "missing field 'area'"),
    (lambda p: p.update(keypoints=np.zeros((16, 2))), r"'keypoints' has shape \(16, 2\)"),
    (lambda p: p.update(keypoint_scores=[0.5] * 17 + [1.0]), "'keypoint_scores' has shape"),
    (lambda p: p.update(bbox_score=float("nan")), "'bbox_score' is not finite"),
    (lambda p: p.update(image_id="785"), "'image_id' must be an integer"),
    (lambda p: p.update(image_id=123456789), "not in .*test_coco.json: \\[123456789\\]"),
    (lambda p: p.update(bbox=[1, 2, 3]), r"'bbox' has shape \(3,\)"),
])
def test_malformed_predictions_raise(metric, evaluator, mutate, match):
    preds = to_predictions(scenario_named(metric, "exact"))
    mutate(preds[3])
    with pytest.raises(PredictionError, match=match):
        evaluator.evaluate(preds)


def test_mixed_bbox_presence_raises(metric, evaluator):
    preds = to_predictions(scenario_named(metric, "exact"))
    del preds[5]["bbox"]
    with pytest.raises(PredictionError, match="'bbox' is missing"):
        evaluator.evaluate(preds)


def test_bad_modes_and_missing_file(ann_file, tmp_path):
    with pytest.raises(ValueError, match="nms_mode"):
        CocoEvaluator(ann_file, nms_mode="nms")
    with pytest.raises(ValueError, match="score_mode"):
        CocoEvaluator(ann_file, score_mode="keypoint_bbox")
    with pytest.raises(FileNotFoundError, match="nope.json"):
        CocoEvaluator(tmp_path / "nope.json")


def test_write_results_and_prediction_files_round_trip(metric, evaluator, ann_file, tmp_path):
    scenario = scenario_named(metric, "relative_0.08")
    preds = to_predictions(scenario)
    path = evaluator.write_results(preds, tmp_path / "out" / "results.json")
    written = json.loads(path.read_text())
    assert written == json.loads(json.dumps(evaluator.results(preds)))
    stats = pycocotools_stats(ann_file, written)
    assert stats == pytest.approx(scenario["mmpose"]["stats"], abs=1e-9)

    raw = save_predictions(preds, tmp_path / "preds.json")
    assert evaluator.evaluate(load_predictions(raw)) == evaluator.evaluate(preds)


def test_pycocotools_prints_nothing(metric, evaluator, capsys):
    evaluator.evaluate(to_predictions(scenario_named(metric, "exact")))
    assert capsys.readouterr().out == ""


def test_dense_and_row_by_row_nms_agree(monkeypatch):
    """Crowded images switch from the whole OKS matrix to one row per kept instance: same result."""
    from vitpose.evaluation import nms

    rng = np.random.default_rng(3)
    base = rng.uniform(0, 300, (6, 17, 2))
    kpts = np.concatenate([base + rng.normal(0, 2, base.shape) for _ in range(8)])  # 48 near-copies
    areas = rng.uniform(5e3, 2e4, len(kpts))
    scores = rng.uniform(0, 1, len(kpts))
    dense_oks = pairwise_oks(kpts, areas)
    dense = oks_nms(kpts, scores, areas, 0.9), soft_oks_nms(kpts, scores, areas, 0.9)
    monkeypatch.setattr(nms, "DENSE_MAX", 0)
    rows = oks_nms(kpts, scores, areas, 0.9), soft_oks_nms(kpts, scores, areas, 0.9)
    assert [d.tolist() for d in dense] == [r.tolist() for r in rows]
    assert 6 <= len(dense[0]) < len(kpts)
    variances = (2 * np.asarray(SIGMAS, np.float32)) ** 2
    row = nms.oks_one_to_many(kpts, areas, 5, np.arange(len(kpts)), variances)
    np.testing.assert_array_equal(row, dense_oks[5])  # bit for bit


# ----------------------------------------------------------------------------- MMPose edge cases
# tests/fixtures/metric_cases.json: MMPose 1.3.2's CocoMetric (xtcocotools, NumPy 1.x) on seeded
# predictions aimed at one behaviour each (docs/mmpose-edge-cases.md): keypoint scores <= 0,
# scores on float32(0.2), NMS on the float32 OKS boundary and score ties, ids, float32 sigmas,
# and annotation files that pycocotools and xtcocotools read differently.

RUNS = [(s["name"], i) for s in CASES["scenarios"] for i in range(len(s["runs"]))]


def case_predictions(scenario):
    """The fixture's prediction records as the prediction loop gives them (float64 keypoints,
    float32 scores; box score and area hold float32 values)."""
    return [{"id": p["id"], "image_id": p["img_id"], "keypoints": np.asarray(p["keypoints"], np.float64),
             "keypoint_scores": np.asarray(p["keypoint_scores"], np.float32), "bbox_score": p["bbox_score"],
             "area": p["area"], "bbox": p["bbox_xywh"]} for p in scenario["predictions"]]


def annotation_file(ann_file, patch_name, tmp_path):
    """coco-mini's annotations, changed as the run says (the same change MMPose saw)."""
    if patch_name is None:
        return ann_file
    data = json.loads(ann_file.read_text())
    patch = CASES["annotation_patches"][patch_name]
    for i, field, value in patch.get("set", []):
        data["annotations"][i][field] = value
    for i, field in patch.get("delete", []):
        del data["annotations"][i][field]
    path = tmp_path / f"{patch_name}.json"
    path.write_text(json.dumps(data))
    return path


def test_cases_use_this_annotation_file(ann_file):
    assert hashlib.md5(ann_file.read_bytes()).hexdigest() == CASES["info"]["annotation_md5"]


@pytest.mark.parametrize("name, run_index", RUNS, ids=[f"{n}-{i}" for n, i in RUNS])
def test_edge_cases_equal_mmpose(ann_file, tmp_path, name, run_index):
    scenario = scenario_named(CASES, name)
    run = scenario["runs"][run_index]
    evaluator = CocoEvaluator(annotation_file(ann_file, run["annotation_patch"], tmp_path), **run["metric"])
    predictions = case_predictions(scenario)
    # The results file: the same predictions, in the same order, with the same scores, bit for bit.
    kept = np.concatenate(evaluator.keep(check_predictions(predictions, 17))).tolist()
    assert kept == run["mmpose"]["kept"]
    assert [r["score"] for r in evaluator.results(predictions)] == run["mmpose"]["scores"]
    stats = evaluator.evaluate(predictions)
    for key, expected in run["mmpose"]["stats"].items():
        assert stats[key] == pytest.approx(expected, abs=1e-9), key


def test_edge_cases_are_not_plain_pycocotools():
    """The scenarios separate xtcocotools from pycocotools: otherwise the tests above prove less."""
    for scenario in CASES["scenarios"]:
        if scenario["name"] in ("nonpositive_scores", "all_nonpositive_scores", "sigmas_float32",
                                "annotation_variants"):
            for run in scenario["runs"]:
                assert run["plain_pycocotools_on_mmpose_results"] != run["mmpose"]["stats"], scenario["name"]
    facts = scenario_named(CASES, "threshold_float32_0.2")["facts"]
    assert facts["stats_if_compared_in_float32"] != scenario_named(CASES, "threshold_float32_0.2")["runs"][0][
        "mmpose"]["stats"]


@pytest.mark.parametrize("case", range(len(CASES["oks_iou"])))
def test_oks_equals_mmpose_bit_for_bit(case):
    """MMPose's oks_iou (float64 keypoints, float32 areas) against ours, exactly. The last cases
    sit on the float32 rounding boundary of OKS-NMS's 0.9: float64 area sums land elsewhere."""
    data = CASES["oks_iou"][case]
    keypoints = np.asarray(data["keypoints"], np.float64)
    areas = np.asarray(data["areas"], np.float32)
    expected = np.asarray(data["ious_first_vs_rest"], np.float32)
    rest = np.arange(1, len(keypoints))
    np.testing.assert_array_equal(pairwise_oks(keypoints, areas)[0, 1:], expected)
    variances = (2 * np.asarray(SIGMAS, np.float32)) ** 2
    np.testing.assert_array_equal(oks_one_to_many(keypoints, areas, 0, rest, variances), expected)
    if case >= len(CASES["oks_iou"]) - len(scenario_named(CASES, "nms_crowds")["facts"]["boundary_pairs"]):
        float64_sum = pairwise_oks(keypoints, areas.astype(np.float64))[0, 1:]
        assert (float64_sum <= 0.9) != (expected <= 0.9)  # the case can tell the two apart


def test_nonpositive_detections_are_written_but_not_evaluated(ann_file, evaluator):
    """pycocotools only: a detection with no keypoint score above 0 is in the results, and the
    stats are pycocotools' on the results without it (xtcocotools' COCOeval skips it)."""
    gt = json.loads(ann_file.read_text())
    predictions = []
    for ann in gt["annotations"]:
        if ann["num_keypoints"] == 0:
            continue
        xyv = np.asarray(ann["keypoints"], np.float64).reshape(17, 3)
        predictions.append({"id": ann["id"], "image_id": ann["image_id"], "keypoints": xyv[:, :2] + 1.0,
                            "keypoint_scores": np.full(17, 0.9, np.float32), "bbox_score": 1.0,
                            "area": float(ann["area"]), "bbox": ann["bbox"]})
    predictions[4]["keypoint_scores"] = np.zeros(17, np.float32)  # its GT is found by nothing else
    predictions[7]["keypoint_scores"] = -np.ones(17, np.float32)
    results = evaluator.results(predictions)
    assert len(results) == len(predictions)
    scored = [r for r in results if max(r["keypoints"][2::3]) > 0]
    assert len(scored) == len(results) - 2
    stats = evaluator.evaluate(predictions)
    assert stats == pytest.approx(pycocotools_stats(ann_file, scored), abs=1e-12)
    assert stats["AR"] < pycocotools_stats(ann_file, results)["AR"]


def test_no_evaluated_detection_scores_zero(ann_file, evaluator):
    scenario = scenario_named(CASES, "all_nonpositive_scores")
    assert evaluator.evaluate(case_predictions(scenario)) == {name: 0.0 for name in STAT_NAMES}


@pytest.fixture
def annotations(ann_file):
    return json.loads(ann_file.read_text())


def refused(tmp_path, data, match):
    path = tmp_path / "bad_annotations.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    with pytest.raises(GroundTruthError, match=match) as info:
        CocoEvaluator(path)
    assert "bad_annotations.json" in str(info.value)


def test_annotation_file_without_annotations_is_refused(tmp_path, annotations):
    # MMPose asserts on a file without the key; with an empty list every stat would be -1.
    assert CASES["empty_annotations"]["missing_key"]["error"].startswith("AssertionError")
    assert set(CASES["empty_annotations"]["empty_list"]["stats"].values()) == {-1.0}
    refused(tmp_path, {k: v for k, v in annotations.items() if k != "annotations"}, "no 'annotations'")
    refused(tmp_path, dict(annotations, annotations=[]), "'annotations' is empty")


@pytest.mark.parametrize("change, match", [
    (lambda d: d["annotations"][3].pop("area"), r"annotation #3 \(id 1202706\): missing field 'area'"),
    (lambda d: d["annotations"][0].update(keypoints=[0, 0, 0]), "must be a list of 51 numbers"),
    (lambda d: d["annotations"][1].update(image_id=5), "'image_id' 5 is not in the file's images"),
    (lambda d: d["annotations"][2].update(id=-4), "annotation id -4 is negative"),
    (lambda d: d["annotations"][2].update(id=d["annotations"][1]["id"]), r"ids \[198196\] appear more than once"),
    (lambda d: d.update(categories=[{"id": 2, "name": "dog"}]), "no category with id 1"),
    (lambda d: d.pop("images"), "no 'images'"),
])
def test_unusable_annotations_are_refused(tmp_path, annotations, change, match):
    change(annotations)
    refused(tmp_path, annotations, match)


def test_annotation_file_that_is_not_json(tmp_path):
    refused(tmp_path, "{not json", "not valid JSON")


# ---- non-finite predictions (issue #10): a broken model must not score well --------------------

def broken_model_predictions(metric):
    """What a diverged model gives: every keypoint NaN (constant heatmaps), keypoint scores 0..1."""
    preds = to_predictions(scenario_named(metric, "exact"))
    for p in preds:
        p["keypoints"] = np.full_like(p["keypoints"], np.nan)
    return preds


def test_nonfinite_predictions_score_zero_and_are_counted(metric, evaluator, ann_file):
    preds = broken_model_predictions(metric)
    # Plain pycocotools counts a NaN OKS as a match: the broken model would look good.
    with pytest.warns(UserWarning, match="non-finite"):  # results() warns too; the count is checked below
        naive = [dict(r) for r in CocoEvaluator(ann_file, nms_mode="none").results(preds)]
    assert pycocotools_stats(ann_file, naive)["AP"] > 0.3
    with pytest.warns(UserWarning, match=f"{len(preds)} of {len(preds)} predictions have non-finite"):
        stats = evaluator.evaluate(preds)
    assert evaluator.last_nonfinite == len(preds)
    assert stats["AP"] == 0.0 and stats["AR"] == 0.0


def test_nonfinite_scores_are_accepted_and_scored_as_misses(metric, evaluator):
    preds = to_predictions(scenario_named(metric, "exact"))
    good = evaluator.evaluate(preds)["AP"]
    for p in preds[:3]:
        p["keypoint_scores"] = np.full_like(p["keypoint_scores"], np.nan)
    with pytest.warns(UserWarning, match="3 of .* non-finite"):
        stats = evaluator.evaluate(preds)
    assert 0 < stats["AP"] < good


def test_a_nonfinite_instance_suppresses_nobody_in_nms():
    from vitpose.evaluation.nms import oks_nms, soft_oks_nms

    rng = np.random.default_rng(0)
    person = rng.uniform(0, 100, (17, 2))
    keypoints = np.stack([np.full((17, 2), np.nan), person, person + 0.1])
    scores, areas = np.array([0.9, 0.8, 0.7]), np.array([5000.0, 5000.0, 5000.0], np.float32)
    # The NaN instance (best score) is kept but removes neither finite one; the finite pair is a duplicate.
    assert oks_nms(keypoints, scores, areas, 0.9).tolist() == [0, 1]
    assert sorted(soft_oks_nms(keypoints, scores, areas, 0.9).tolist()) == [0, 1, 2]
