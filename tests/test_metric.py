"""CocoEvaluator against MMPose's CocoMetric (fixtures/metric.json) and against plain pycocotools."""

import contextlib
import copy
import io
import json

import numpy as np
import pytest

from vitpose.coco_meta import SIGMAS
from vitpose.evaluation import CocoEvaluator, oks_nms, soft_oks_nms
from vitpose.evaluation.coco_evaluator import STAT_NAMES, PredictionError, load_predictions, save_predictions
from vitpose.evaluation.nms import pairwise_oks


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
    scores = np.array([0.1, 0.2, 0.3, 0.5] + [0.0] * 13, np.float32)
    # 0.2 is not above the threshold: mean of 0.3 and 0.5.
    assert evaluator.rescore(scores, 0.8) == pytest.approx(0.8 * 0.4, rel=1e-7)
    assert evaluator.rescore(np.full(17, 0.2, np.float32), 0.8) == 0.0


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
