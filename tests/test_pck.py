"""PCK / AUC / EPE for a skeleton whose metric is `pck`: equal to MMPose 1.3.2's, picked by the skeleton.

tests/fixtures/pck_cases.json is what MMPose's PCKAccuracy(norm_item="bbox") / AUC / EPE metrics and
keypoint_pck_accuracy / keypoint_auc / keypoint_epe give on a 21-keypoint annotation file read by
MMPose's OneHand10KDataset, with seeded predictions (tools/reference/make_pck_cases.py; its
docstring lists the cases aimed at one behaviour each: box clipping, the longer side, v = 0/1, a
keypoint labelled nowhere, a distance exactly at the threshold, the instances MMPose drops).
"""

import json
import re

import cv2
import numpy as np
import pytest
from conftest import FIXTURES, REPO

from vitpose.evaluation.coco_evaluator import PredictionError
from vitpose.evaluation.pck import PCKEvaluator, normalised_distances, pck_accuracy

FIXTURE = json.loads((FIXTURES / "pck_cases.json").read_text())
K = 21
HAND21 = REPO / "configs" / "demo_hand21.yaml"
HAND21_SKELETON = REPO / "configs" / "demo_hand21_skeleton.yaml"
# EPE is a float32 sum of ~250 distances (MMPose's arithmetic); its order of summation may differ
# between NumPy builds and CPUs by a few float32 roundings: relative 2e-6 is ~30 float32 ulps.
EPE_REL = 2e-6


@pytest.fixture
def ann_file(tmp_path):
    path = tmp_path / "hand21.json"
    path.write_text(json.dumps(FIXTURE["annotations"]))
    return path


def fixture_predictions():
    return [dict(p, keypoints=np.asarray(p["keypoints"], np.float32)) for p in FIXTURE["predictions"]]


@pytest.mark.parametrize("run", FIXTURE["runs"], ids=lambda r: f"thr{r['thr']}")
def test_pck_auc_epe_equal_mmpose(ann_file, run):
    evaluator = PCKEvaluator(ann_file, K, threshold=run["thr"])
    stats = evaluator.evaluate(fixture_predictions())
    mmpose = run["mmpose_metrics"]
    assert list(stats) == [f"PCK@{run['thr']:g}", "AUC", "EPE"] and evaluator.primary_stat == f"PCK@{run['thr']:g}"
    # Counts over counts from the same float32 distances: the same arithmetic, the same bits.
    assert stats[f"PCK@{run['thr']:g}"] == mmpose["PCK"]
    assert stats["AUC"] == mmpose["AUC"]
    assert stats["EPE"] == pytest.approx(mmpose["EPE"], rel=EPE_REL)
    assert mmpose == {k: run["mmpose_functions"][k] for k in ("PCK", "AUC", "EPE")}  # metric classes == functions


def test_instances_box_sizes_and_per_keypoint_accuracy_are_mmposes(ann_file):
    """The instances MMPose's dataset keeps (crowd, no keypoints, empty clipped box, no bbox dropped)
    and their normaliser: the longer side of the box clipped to the image."""
    evaluator = PCKEvaluator(ann_file, K)
    assert sorted(evaluator.ids.tolist()) == sorted(FIXTURE["kept_ids"])
    run = FIXTURE["runs"][0]
    order = [evaluator.row[i] for i in FIXTURE["kept_ids"]]  # MMPose's order: by image, then annotation
    np.testing.assert_array_equal(evaluator.box_sizes[order], np.float32(run["mmpose_functions"]["box_sizes"]))
    predicted = np.stack([p["keypoints"] for p in fixture_predictions()])
    norm = np.stack([evaluator.box_sizes[order]] * 2, axis=1)
    accuracy, mean, count = pck_accuracy(
        normalised_distances(predicted, evaluator.keypoints[order], evaluator.mask[order], norm), run["thr"])
    assert accuracy.tolist() == run["mmpose_functions"]["per_keypoint"]  # -1: the keypoint labelled nowhere
    assert count == run["mmpose_functions"]["scored_keypoints"] == K - 1
    assert mean == run["mmpose_functions"]["PCK"]


def test_a_row_with_a_zero_size_box_is_not_scored():
    """MMPose's `keypoint_pck_accuracy` leaves a row whose normaliser is 0 out (-1), rather than
    dividing by a stand-in that makes any error look tiny: one zero-size-box row 70 px off and one
    row half its box off give distances [-1, 0.5] and PCK@0.2 0, not 0.5."""
    predicted = np.array([[[70.0, 0.0]], [[10.5, 20.0]]])
    gt = np.array([[[0.0, 0.0]], [[10.0, 20.0]]])
    mask = np.ones((2, 1), bool)
    norm = np.array([[0.0, 0.0], [1.0, 1.0]])
    distances = normalised_distances(predicted, gt, mask, norm)
    np.testing.assert_array_equal(distances, np.float32([[-1], [0.5]]))
    accuracy, mean, count = pck_accuracy(distances, 0.2)
    assert accuracy.tolist() == [0.0] and mean == 0.0 and count == 1


def test_predictions_that_match_no_instance_are_refused(ann_file):
    evaluator = PCKEvaluator(ann_file, K)
    dropped = [int(i) for i, aim in FIXTURE["aims"].items() if aim.startswith("dropped: crowd")]
    bad = fixture_predictions() + [{"id": dropped[0], "keypoints": np.zeros((K, 2))}]
    with pytest.raises(PredictionError, match=rf"id {dropped[0]} is not an evaluated annotation.*GT boxes"):
        evaluator.evaluate(bad)
    twice = fixture_predictions() + fixture_predictions()[:1]
    with pytest.raises(PredictionError, match="predicted twice"):
        evaluator.evaluate(twice)
    wrong_k = [dict(p, keypoints=np.zeros((17, 2))) for p in fixture_predictions()]
    with pytest.raises(PredictionError, match=r"21 \(x, y\) numbers, got shape \(17, 2\)"):
        evaluator.evaluate(wrong_k)
    nan = fixture_predictions()
    nan[0]["keypoints"] = np.full((K, 2), np.nan, np.float32)
    with pytest.warns(UserWarning, match="1 of 17 predictions have non-finite keypoints"):
        stats = evaluator.evaluate(nan)
    assert evaluator.last_nonfinite == 1 and np.isnan(stats["EPE"]) and stats["PCK@0.2"] < FIXTURE["runs"][0][
        "mmpose_metrics"]["PCK"]


# ---- the skeleton names the metric, `vitpose evaluate` prints it ------------------------------------

def _write_images(root, annotations):
    (root / "val2017").mkdir(parents=True)
    for image in annotations["images"]:
        cv2.imwrite(str(root / "val2017" / image["file_name"]), np.zeros((image["height"], image["width"], 3), np.uint8))


def _checkpoint(tmp_path, config=HAND21):
    """A random-weight demo-sized model of the config (K = 21), saved with its spec."""
    import torch

    from vitpose.builders import build_dataset_info, build_model_from_config
    from vitpose.config import load_config
    from vitpose.models.checkpoint import save_weights

    cfg = load_config(config)
    torch.manual_seed(0)
    model = build_model_from_config(cfg.model, build_dataset_info(cfg, REPO))
    path = tmp_path / "hand21.safetensors"
    save_weights(model, path)
    return path


def _printed_stats(out: str) -> dict:
    """The two-row table `vitpose evaluate` ends with: names over values."""
    lines = [line for line in out.strip().splitlines() if line.strip()]
    names = [n.strip() for n in lines[-3].split("|")]
    values = [float(v) for v in lines[-1].split("|")]
    return dict(zip(names, values))


def test_build_evaluator_follows_the_skeletons_metric(tmp_path, ann_file):
    from vitpose.builders import build_dataset_info, build_evaluator
    from vitpose.config import ConfigError, load_config
    from vitpose.evaluation import CocoEvaluator

    cfg = load_config(HAND21, [f"data.root={tmp_path}", f"data.val_ann={ann_file.name}",
                               f"data.dataset_info={HAND21_SKELETON}"])
    info = build_dataset_info(cfg)
    evaluator = build_evaluator(cfg, info)
    assert type(evaluator) is PCKEvaluator and evaluator.threshold == 0.2 and evaluator.primary_stat == "PCK@0.2"
    coco_mini = REPO / "tests" / "data" / "coco-mini"
    cfg_coco = load_config(None, [f"data.root={coco_mini}", "data.val_ann=test_coco.json"])
    assert type(build_evaluator(cfg_coco, build_dataset_info(cfg_coco))) is CocoEvaluator  # coco-oks
    cfg = load_config(HAND21, [f"data.root={tmp_path}", f"data.val_ann={ann_file.name}",
                               f"data.dataset_info={HAND21_SKELETON}", "data.val_bbox_file=dets.json"])
    with pytest.raises(ConfigError, match=r"data.val_bbox_file is set.*scored with PCK.*val_bbox_file: null"):
        build_evaluator(cfg, info)


def test_evaluate_command_prints_mmposes_pck_auc_epe(tmp_path, monkeypatch, capsys):
    """Acceptance: `vitpose evaluate` on the 21-keypoint set of a `metric: pck` skeleton prints PCK@0.2,
    AUC and EPE equal to MMPose's metrics on the same predictions (the network is replaced by the
    fixture's predictions; everything else is the command)."""
    import vitpose.cli.evaluate as evaluate_cli
    from vitpose.cli import main

    root = tmp_path / "data"
    (root / "annotations").mkdir(parents=True)
    (root / "annotations" / "person_keypoints_val2017.json").write_text(json.dumps(FIXTURE["annotations"]))
    _write_images(root, FIXTURE["annotations"])
    checkpoint = _checkpoint(tmp_path)
    predictions = [dict(p, keypoint_scores=np.ones(K, np.float32), bbox_score=1.0, area=1.0)
                   for p in fixture_predictions()]

    def fixture_network(model, loader, codec, **kwargs):
        return predictions

    monkeypatch.setattr(evaluate_cli, "predict", fixture_network)
    monkeypatch.chdir(REPO)  # data.dataset_info: configs/demo_hand21_skeleton.yaml
    code = main(["evaluate", "--config", str(HAND21), "--checkpoint", str(checkpoint), "--data-root", str(root),
                 "--out", str(tmp_path / "eval" / "predictions.json"), "--device", "cpu", "--workers", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    printed = _printed_stats(out)
    mmpose = FIXTURE["runs"][0]["mmpose_metrics"]
    assert list(printed) == ["PCK@0.2", "AUC", "EPE"]
    assert printed == {"PCK@0.2": round(mmpose["PCK"], 4), "AUC": round(mmpose["AUC"], 4),
                       "EPE": round(mmpose["EPE"], 4)}
    assert "COCOeval" not in out and "PCK@0.2 (distance / the longer side of the GT box)" in out
    results = json.loads((tmp_path / "eval" / "predictions.coco_results.json").read_text())
    assert sorted(r["id"] for r in results) == sorted(FIXTURE["kept_ids"])
    # Detected boxes match no annotation: refused in one line before any work.
    code = main(["evaluate", "--config", str(HAND21), "--checkpoint", str(checkpoint), "--data-root", str(root),
                 "--bbox-file", str(tmp_path / "dets.json"), "--out", str(tmp_path / "eval2" / "p.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines()[-1] == (
        "vitpose evaluate: error: --bbox-file: the skeleton 'demo_hand21' is scored with PCK, which compares each "
        "annotated instance with its prediction on the ground-truth box; leave out --bbox-file")


@pytest.mark.filterwarnings("ignore:.*have no prediction")
def test_evaluate_command_on_a_synthetic_21_keypoint_set(tmp_path, capsys):
    """The whole path with a real (random-weight) network on the synthetic 21-keypoint set: the
    printed numbers are the PCK evaluator's on the predictions the command wrote, on GT boxes."""
    from vitpose.cli import main
    from vitpose.data import dataset_info
    from vitpose.data.synthetic import make_coco
    from vitpose.evaluation.coco_evaluator import load_predictions

    root = tmp_path / "synthetic"
    make_coco(root, 3, seed=5, split="val", dataset_info=dataset_info(HAND21_SKELETON))
    checkpoint = _checkpoint(tmp_path)
    out_file = tmp_path / "eval" / "predictions.json"
    code = main(["evaluate", "--config", str(HAND21), "--checkpoint", str(checkpoint), "--data-root", str(root),
                 "--set", f"data.dataset_info={HAND21_SKELETON}", "--out", str(out_file), "--device", "cpu",
                 "--workers", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    printed = _printed_stats(out)
    stats = PCKEvaluator(root / "annotations" / "person_keypoints_val2017.json", K).evaluate(load_predictions(out_file))
    assert list(printed) == list(stats) == ["PCK@0.2", "AUC", "EPE"]
    assert printed == pytest.approx({k: round(v, 4) for k, v in stats.items()}, abs=1.5e-4)  # float64 reload
    assert re.search(r"boxes\s*: ground truth", out)


# ---- the default detector of a skeleton ----------------------------------------------------------

def test_default_detector_of_a_hand_skeleton_is_full_frame(tmp_path):
    """Acceptance: a skeleton that names no detector classes (keypoints of no built-in) is cropped
    full-frame by the default detector, not by a person detector; one that names classes keeps them."""
    from vitpose.data import dataset_info
    from vitpose.inference import detect
    from vitpose.inference.predictor import Predictor
    from vitpose.inference.results import FullFrame

    hand = dataset_info(HAND21_SKELETON)
    assert hand.detector_classes == () and detect.detector_labels(hand) == ()
    assert isinstance(detect.make_detector("default", labels=detect.detector_labels(hand)), FullFrame)
    with pytest.raises(ValueError, match=r"names no classes to detect.*--det-classes"):
        detect.make_detector("fasterrcnn-mobilenet-v3-large-fpn", labels=())
    assert detect.detector_labels(hand, ["person"]) == (detect.PERSON_LABEL,)  # --det-classes wins

    predictor = Predictor.from_pretrained(_checkpoint(tmp_path), config=HAND21, device="cpu")  # loads no detector
    assert isinstance(predictor.detector, FullFrame) and predictor.skeleton.metric == "pck"
    image = np.zeros((60, 40, 3), np.uint8)
    poses = predictor(image)
    np.testing.assert_array_equal(poses.boxes, [[0, 0, 40, 60]])

    dogs = tmp_path / "dogs.yaml"
    dogs.write_text("keypoints: [nose, left_ear, right_ear]\ndetector_classes: [dog, cat]\n")
    assert detect.detector_labels(dataset_info(dogs)) == (18, 17)


def test_a_saved_model_records_its_metric_and_detector_classes(tmp_path):
    """The skeleton travels in the weights file: predicting from the file alone crops full-frame."""
    from vitpose.builders import load_model

    loaded = load_model(_checkpoint(tmp_path))
    assert loaded.skeleton.metric == "pck" and loaded.skeleton.pck_threshold == 0.2
    assert loaded.skeleton.detector_classes == ()
