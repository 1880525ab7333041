"""`vitpose calibrate`: p (P(keypoint within tolerance)) and three-state visibility, fitted on held-out
data, recorded in the model file and applied alike by every runtime.

CI tier: a 1-block model fitted in seconds (test_runtimes' `peaked_model_and_set`), calibrated on
another synthetic set; p and visibility equal in eager, ONNX, the server and Ray's actor; a file without calibration gives none; the 21-keypoint hand skeleton calibrates
with its PCK threshold; the command's refusals. Slow tier: the demo model (its occluders), the
acceptance figures (ECE, visibility against the majority class), int8, OpenVINO and a graph with
the flip test inside.
"""

import json
from pathlib import Path
from urllib.parse import quote

import cv2
import numpy as np
import pytest
from conftest import REPO

from vitpose.cli import main
from vitpose.codecs.confidence import (
    calibrated,
    check_calibration,
    fit_monotone_logistic,
    heatmap_sharpness,
    keypoint_features,
)
from vitpose.inference.calibrate import CalibrateOptions, calibrate, right_within_tolerance

HELD_OUT_IMAGES = 24


def _open(model, **kwargs):
    import vitpose

    return vitpose.open_predictor(str(model), device="cpu", precision="fp32", detector=None, **kwargs)


def _people(root: Path, count: int = 6, paths: bool = False):
    """(BGR images, their labelled people's xyxy boxes) of the first `count` images with people
    (the images' paths instead of their pixels with `paths`)."""
    coco = json.loads((root / "annotations" / "person_keypoints_val2017.json").read_text())
    boxes = {}
    for ann in coco["annotations"]:
        x, y, w, h = ann["bbox"]
        boxes.setdefault(ann["image_id"], []).append([x, y, x + w, y + h])
    images, out = [], []
    for image in coco["images"]:
        if image["id"] in boxes and len(images) < count:
            path = root / "val2017" / image["file_name"]
            images.append(path if paths else cv2.imread(str(path)))
            out.append(np.array(boxes[image["id"]], np.float32))
    return images, out


def _export(model_file, path, **kwargs):
    """`vitpose export`'s ONNX writer on the model the file records (its calibration with it), gated on two crops."""
    import torch

    import vitpose
    from vitpose.inference.export import to_onnx

    loaded = vitpose.load_model(model_file, device="cpu")
    h, w = loaded.spec.input_size[1], loaded.spec.input_size[0]
    crops = torch.from_numpy(np.random.default_rng(0).integers(0, 255, (2, 3, h, w), dtype=np.uint8))
    to_onnx(loaded.model, path, crops=crops, log=None, **kwargs)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(uncalibrated file, calibrated file, its CalibrationRun, the held-out set's folder)."""
    import torch
    from test_runtimes import peaked_model_and_set

    from vitpose.data.synthetic import make_coco
    from vitpose.models.checkpoint import save_weights
    from vitpose.models.spec import spec_of_model

    folder = tmp_path_factory.mktemp("calibrate")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, codec, _ = peaked_model_and_set(folder / "train", images=16, steps=60)
        held = make_coco(folder / "held", num_images=HELD_OUT_IMAGES, seed=7, split="val")
        plain = save_weights(model, folder / "peaked.safetensors", spec_of_model(model, sigma=codec.sigma))
        run = calibrate(CalibrateOptions(model=str(plain), data=str(folder / "held"), device="cpu"), log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    return plain, run.out, run, Path(held.ann_file).parents[1]


def test_calibrate_writes_a_new_file_recording_the_fit_and_its_data(models):
    plain, out, run, held = models
    assert out == plain.with_name("peaked.calibrated.safetensors") and out.is_file() and run.plot.is_file()
    assert run.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from vitpose.models.checkpoint import read_weights

    spec = read_weights(out).spec
    assert read_weights(plain).spec.calibration is None  # the input is untouched
    fitted = spec.calibration["fitted_on"]
    assert fitted["file"].endswith("person_keypoints_val2017.json") and len(fitted["sha256"]) == 64
    assert fitted["images"] <= HELD_OUT_IMAGES and fitted["people"] >= 20
    assert spec.calibration["tolerance"]["metric"] == "oks" and spec.calibration["tolerance"]["level"] == 0.5
    assert set(spec.calibration["variants"]) == {"flip_views", "flip_average", "plain"}
    figures = spec.calibration["figures"]["flip_views"]
    assert figures["ece_p"] < figures["ece_score"]  # out of fold, even on 24 images
    assert 0 <= spec.calibration["figures"]["ap"] <= 1  # the model's AP on the labels' boxes, p or not
    assert any("ECE raw score" in line for line in run.lines)


def test_p_and_visibility_are_equal_in_eager_onnx_and_the_server(models, tmp_path, serve):
    plain, calibrated_file, _, held = models
    images, boxes = _people(held)
    eager = _open(calibrated_file)
    got = eager(images, boxes=boxes, channels="bgr")
    assert all(p.keypoint_p is not None and p.keypoint_p.dtype == np.float32 for p in got)
    assert all(p.keypoint_visibility.dtype == np.int8 and set(np.unique(p.keypoint_visibility)) <= {0, 1, 2}
               for p in got)
    # p is added beside the keypoints: they and the scores are the uncalibrated model's (AP unchanged)
    before = _open(plain)(images, boxes=boxes, channels="bgr")
    for a, b in zip(got, before):
        np.testing.assert_array_equal(a.keypoints, b.keypoints)
        np.testing.assert_array_equal(a.keypoint_scores, b.keypoint_scores)
        assert b.keypoint_p is None and b.keypoint_visibility is None
    onnx_path = tmp_path / "pose.onnx"
    _export(calibrated_file, onnx_path)
    for a, b in zip(got, _open(onnx_path)(images, boxes=boxes, channels="bgr")):
        np.testing.assert_allclose(a.keypoint_p, b.keypoint_p, atol=1e-4)
        np.testing.assert_array_equal(a.keypoint_visibility, b.keypoint_visibility)
    # the server, its batches one box at a time (a request's boxes in slices): the records of
    # `vitpose predict --json`, with p and visibility
    app, _ = serve(_open(calibrated_file, batch_size=1))
    from test_serve_seams import call

    i = int(np.argmax([len(b) for b in boxes]))
    body = cv2.imencode(".png", images[i])[1].tobytes()
    status, _, answer, _ = call(app, "POST", "/v1/predict?boxes=" + quote(json.dumps(boxes[i].tolist())), body)
    assert status == 200, answer
    records = answer if isinstance(answer, list) else answer.get("records", answer.get("predictions"))
    assert len(records) == len(boxes[i]) > 1
    for m, record in enumerate(records):
        np.testing.assert_allclose(record["p"], got[i].keypoint_p[m], atol=1e-6)
        assert record["visibility"] == got[i].keypoint_visibility[m].tolist()
        assert len(record["keypoints"]) == 3 * len(record["p"])  # the raw score stays in its place
    # Ray's actor (called here without a cluster): its rows carry them too
    import torch

    from vitpose.integrations.ray import PosePredictor

    threads = torch.get_num_threads()
    try:
        actor = PosePredictor(str(calibrated_file), detector=None, device="cpu", precision="fp32", threads=1)
    finally:
        torch.set_num_threads(threads)
    paths = _people(held, paths=True)[0]
    rows = actor({"path": np.array([str(paths[i])], dtype=object),
                  "boxes": np.array([json.dumps(boxes[i].tolist())], dtype=object)})
    assert len(rows["p"]) == len(boxes[i])
    for m in range(len(boxes[i])):
        np.testing.assert_allclose(np.asarray(rows["p"][m], np.float64), got[i].keypoint_p[m], atol=1e-6)
        assert list(rows["visibility"][m]) == got[i].keypoint_visibility[m].tolist()


def test_a_file_without_calibration_gives_no_p_and_no_visibility(models, tmp_path):
    plain, _, _, held = models
    image = sorted((held / "val2017").glob("*.jpg"))[0]
    out = tmp_path / "poses.json"
    assert main(["predict", str(image), "--model", str(plain), "--detector", "full-frame", "--json", str(out),
                 "--device", "cpu"]) == 0
    (record,) = json.loads(out.read_text())
    assert "p" not in record and "visibility" not in record and "score" in record


def test_predict_json_of_a_calibrated_file_carries_p_and_visibility(models, tmp_path):
    _, calibrated_file, _, held = models
    image = sorted((held / "val2017").glob("*.jpg"))[0]
    out = tmp_path / "poses.json"
    assert main(["predict", str(image), "--model", str(calibrated_file), "--detector", "full-frame",
                 "--json", str(out), "--device", "cpu"]) == 0
    (record,) = json.loads(out.read_text())
    k = len(record["keypoints"]) // 3
    assert len(record["p"]) == k and all(0 <= p <= 1 for p in record["p"])
    assert len(record["visibility"]) == k and set(record["visibility"]) <= {0, 1, 2}


def test_the_command_refuses_the_training_set_and_missing_data_in_one_line(models, tmp_path, capsys):
    import torch

    from vitpose.config import load_config
    from vitpose.models.spec import METADATA_KEY

    plain, _, _, held = models
    code = main(["calibrate", "--model", str(plain), "--data", str(tmp_path / "nothing")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--data" in err[0], err
    # a checkpoint whose recorded training set is the held-out set
    from vitpose.models.checkpoint import read_weights

    weights = read_weights(plain)
    config = load_config(None, [f"data.root={held}", "data.train_ann=annotations/person_keypoints_val2017.json"])
    checkpoint = tmp_path / "trained.pth"
    torch.save({"state_dict": weights.state_dict, METADATA_KEY: weights.spec.to_dict(), "config": config.to_dict()},
               checkpoint)
    code = main(["calibrate", "--model", str(checkpoint), "--data", str(held)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "training set" in err[0], err
    assert not (tmp_path / "trained.calibrated.pth").exists()
    code = main(["calibrate", "--model", str(plain), "--data", str(held), "--out", str(plain)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--out" in err[0], err


def test_the_hand_skeleton_calibrates_with_its_pck_threshold(tmp_path):
    """A 21-keypoint model of configs/demo_hand21.yaml (metric: pck, threshold 0.2 of the box's
    longer side) on a 21-keypoint synthetic set: "right" is PCK's, and the fit has 21 rows."""
    import torch

    from vitpose.builders import build_dataset_info, build_model_from_config
    from vitpose.config import load_config
    from vitpose.data.synthetic import make_coco
    from vitpose.models.checkpoint import read_weights, save_weights

    cfg = load_config(REPO / "configs" / "demo_hand21.yaml")
    info = build_dataset_info(cfg, REPO)
    torch.manual_seed(0)
    model = build_model_from_config(cfg.model, info)
    path = save_weights(model, tmp_path / "hand21.safetensors")
    make_coco(tmp_path / "held", num_images=12, seed=3, split="val", dataset_info=info)
    run = calibrate(CalibrateOptions(model=str(path), data=str(tmp_path / "held"), device="cpu"), log=lambda _: None)
    tolerance = run.calibration["tolerance"]
    assert tolerance == {"metric": "pck", "threshold": 0.2, "normalizer": "bbox"}
    # no COCO AP to gate a rescoring on: recorded as not kept, with no gate figures invented
    assert run.calibration["rescore_kept"] is False and "rescore" not in run.calibration
    spec = read_weights(run.out).spec
    assert np.asarray(spec.calibration["variants"]["flip_views"]["correct"]).shape[0] == 21
    # PCK's rule: within 0.2 of the box's longer side (100 px here), whatever the OKS would say
    label = np.zeros((1, 21, 3))
    label[0, :, 2] = 2
    predicted = np.zeros((1, 21, 2))
    predicted[0, :, 0] = np.linspace(0, 40, 21)
    right = right_within_tolerance(predicted, label, np.array([[0, 0, 50, 100]]), np.array([5000.0]), tolerance)
    np.testing.assert_array_equal(right[0], predicted[0, :, 0] <= 20)


# ---- the seams: evaluation, the gate's verdict, refusals up front, the server, the Dask recipe ---

def _evaluate_config(folder: Path, held: Path) -> Path:
    """A training config of the fixture's 1-block model (`peaked_model_and_set`), its validation set the held-out one."""
    cfg = {"model": {"name": "vitpose-s", "input_size": [48, 64], "heatmap_size": [12, 16], "sigma": 1.0,
                     "extra": {"depth": 1, "embed_dim": 32, "num_heads": 2, "deconv_channels": [32, 32]}},
           "data": {"root": str(held)}, "train": {"work_dir": str(folder / "work")}}
    path = folder / "peaked.json"  # JSON is YAML
    path.write_text(json.dumps(cfg))
    return path


def test_evaluate_rescore_calibrated_reports_both_aps_and_the_gates_verdict(models, tmp_path, capsys):
    """The evaluation loop applies the calibration through the runtimes' seam: its p and visibility
    are the eager Predictor's on the same boxes, and `--rescore calibrated` prints both APs, the
    interval and the verdict; a file without a calibration gives predictions without them."""
    from vitpose.evaluation.predictions import load_predictions

    plain, calibrated_file, _, held = models
    config = _evaluate_config(tmp_path, held)
    base = ["evaluate", "--config", str(config), "--gt-boxes", "--device", "cpu", "--workers", "0"]
    assert main(base + ["--checkpoint", str(calibrated_file), "--rescore", "calibrated",
                        "--out", str(tmp_path / "calibrated.json")]) == 0
    printed = capsys.readouterr().out
    (line,) = [x for x in printed.splitlines() if x.startswith("rescore calibrated on ")]
    assert " vs raw " in line and "95% interval" in line and ("kept" in line.split("gate:")[1]), line
    predictions = load_predictions(tmp_path / "calibrated.json")
    assert all(p["keypoint_p"].shape == (17,) and p["keypoint_visibility"].dtype == np.int8 for p in predictions)
    coco = json.loads((held / "annotations" / "person_keypoints_val2017.json").read_text())
    files = {image["id"]: image["file_name"] for image in coco["images"]}
    anns = {a["id"]: a for a in coco["annotations"]}
    eager = _open(calibrated_file)
    for image_id in sorted({p["image_id"] for p in predictions})[:4]:
        mine = [p for p in predictions if p["image_id"] == image_id]
        boxes = np.array([anns[p["id"]]["bbox"] for p in mine], np.float32)
        got = eager(cv2.imread(str(held / "val2017" / files[image_id])), boxes=boxes, box_format="xywh", channels="bgr")
        np.testing.assert_allclose(np.stack([p["keypoint_p"] for p in mine]), got.keypoint_p, atol=1e-4)
        np.testing.assert_array_equal(np.stack([p["keypoint_visibility"] for p in mine]), got.keypoint_visibility)
    assert main(base + ["--checkpoint", str(plain), "--out", str(tmp_path / "plain.json")]) == 0
    capsys.readouterr()
    assert not any("keypoint_p" in p for p in load_predictions(tmp_path / "plain.json"))
    assert main(base + ["--checkpoint", str(plain), "--rescore", "calibrated", "--out", str(tmp_path / "x.json")]) == 2
    assert "records no calibration" in capsys.readouterr().err


def test_calibrate_records_the_gates_verdict_that_predict_reads(models):
    """`vitpose calibrate` runs the rescoring gate on its held-out set (out-of-fold p) and records
    its figures and its verdict under the one key `vitpose predict --rescore calibrated` reads."""
    from types import SimpleNamespace

    from vitpose.cli.predict import check_rescore_kept
    from vitpose.evaluation.rescoring import RESCORE_KEPT, RescoreError, rescore_kept
    from vitpose.models.checkpoint import read_weights

    _, calibrated_file, run, _ = models
    spec = read_weights(calibrated_file).spec
    gate = spec.calibration["rescore"]
    assert gate["ap_raw"] == spec.calibration["figures"]["ap"] and 0 <= gate["ap_rescored"] <= 1
    low, high = gate["interval"]
    assert low <= high and gate["images"] <= HELD_OUT_IMAGES and gate["bootstrap"] > 0
    assert spec.calibration[RESCORE_KEPT] is gate[RESCORE_KEPT] is (low >= -gate["bound"])
    assert rescore_kept(spec) is gate[RESCORE_KEPT]
    assert any(line.startswith("rescore calibrated on ") for line in run.lines)
    predictor = SimpleNamespace(spec=spec, model=None)
    if gate[RESCORE_KEPT]:
        check_rescore_kept(predictor)
    else:
        with pytest.raises(RescoreError, match=RESCORE_KEPT):
            check_rescore_kept(predictor)


def test_mark_below_by_p_without_a_calibration_is_refused_before_any_work(models, tmp_path, capsys, monkeypatch):
    """predict, select and serve refuse `--mark-below-by p` for a model without a calibration as
    soon as the model is open: one line naming the flag, exit 2, nothing predicted or written."""
    from vitpose.inference import dispatch
    from vitpose.labelling import select as select_module
    from vitpose.serve import server

    def never(*args, **kwargs):
        raise AssertionError("the work started")

    monkeypatch.setattr(dispatch, "run_local", never)
    monkeypatch.setattr(select_module, "select_frames", never)
    monkeypatch.setattr(server, "run", never)
    plain, calibrated_file, _, held = models
    image = sorted((held / "val2017").glob("*.jpg"))[0]
    commands = [
        ["predict", str(image), "--model", str(plain), "--detector", "full-frame", "--device", "cpu",
         "--format", "cvat", "--json", str(tmp_path / "tasks.xml"), "--mark-below-by", "p"],
        ["select", str(image.parent), "--model", str(plain), "--detector", "full-frame", "--device", "cpu",
         "--count", "1", "--out", str(tmp_path / "tasks.json"), "--mark-below-by", "p"],
        ["serve", "--model", str(plain), "--detector", "full-frame", "--device", "cpu", "--port", "0",
         "--mark-below-by", "p"],
    ]
    for argv in commands:
        code = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "--mark-below-by p" in err[0] and "calibrat" in err[0], (argv[0], err)
    assert not any(tmp_path.iterdir())
    monkeypatch.undo()
    assert main(commands[0][:3] + [str(calibrated_file)] + commands[0][4:]) == 0  # a calibrated model's p
    assert (tmp_path / "tasks.xml").is_file()


def test_the_model_route_says_whether_the_model_is_calibrated(models, serve):
    from test_serve_seams import call

    from vitpose.evaluation.rescoring import RESCORE_KEPT

    plain, calibrated_file, run, _ = models
    app, _ = serve(_open(calibrated_file))
    status, _, answer, _ = call(app, "GET", "/v1/model")
    assert status == 200 and answer["calibration"]["calibrated"] is True, answer
    assert answer["calibration"]["tolerance"]["metric"] == "oks"
    assert answer["calibration"]["fitted_on"]["people"] == run.calibration["fitted_on"]["people"]
    assert answer["calibration"][RESCORE_KEPT] is run.calibration[RESCORE_KEPT]
    app, _ = serve(_open(plain))
    status, _, answer, _ = call(app, "GET", "/v1/model")
    assert status == 200 and answer["calibration"] == {"calibrated": False}


def test_the_readmes_dask_recipe_gives_a_calibrated_models_p(models, tmp_path, monkeypatch):
    """README's Dask recipe as written, on a calibrated model file: its records carry the eager p."""
    dask = pytest.importorskip("dask")
    from test_docs_run import python_blocks

    _, calibrated_file, _, held = models
    (code,) = [c for _, c, _ in python_blocks((REPO / "README.md").read_text(encoding="utf-8")) if "dask.bag" in c]
    assert '"work_dirs/demo/best.pth"' in code
    (tmp_path / "images").symlink_to(held / "val2017", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    with dask.config.set(scheduler="threads"):  # the recipe's own code; threads instead of processes
        exec(compile(code.replace('"work_dirs/demo/best.pth"', repr(str(calibrated_file))), "README.md", "exec"),
             namespace)  # noqa: S102 - the documentation's own code
    records = namespace["records"]
    assert records and all(len(r["p"]) == len(r["visibility"]) == len(r["keypoints"]) // 3 for r in records)
    first = min(records, key=lambda r: r["file_name"])
    import vitpose

    eager = vitpose.Predictor.from_pretrained(str(calibrated_file), detector="full-frame", device="cpu")
    poses = eager(cv2.imread(str(tmp_path / "images" / first["file_name"]))[:, :, ::-1])
    np.testing.assert_allclose(first["p"], poses.keypoint_p[0], atol=1e-6)


# ---- the numbers themselves ---------------------------------------------------------------------

def test_the_fit_is_monotone_in_the_peak():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3))
    y = (rng.random(400) < 1 / (1 + np.exp(2 * x[:, 0]))).astype(float)  # a falling rate: refused
    weights = fit_monotone_logistic(x, y)
    assert weights[0] == 0.0
    rising = fit_monotone_logistic(x, 1 - y)
    assert rising[0] > 0


def test_sharpness_and_features():
    heatmaps = np.zeros((1, 2, 16, 12))
    heatmaps[0, 0, 8, 6] = 1.0  # one peak
    heatmaps[0, 1] = 0.1  # flat
    heatmaps[0, 1, 8, 6] = 0.2
    sharp = heatmap_sharpness(heatmaps)
    assert sharp[0, 0] == pytest.approx(1.0) and sharp[0, 1] < 0.2
    keypoints = np.array([[[5.0, 5.0], [-3.0, 5.0]]])
    scene = (np.array([[100.0, 100.0]]), np.array([[0.0, 0.0, 50.0, 50.0]]))
    features = keypoint_features(np.array([[0.9, 0.1]]), sharp, np.array([[60.0, 80.0]]), keypoints, scene)
    assert features.shape == (1, 2, 4) and features[0, 1, 3] < 0 < features[0, 0, 3]  # outside the image


def test_a_malformed_calibration_is_refused_by_the_spec():
    from vitpose.models.spec import ModelSpec, SpecError

    with pytest.raises(SpecError, match="calibration"):
        ModelSpec(calibration={"version": 1, "variants": {"plain": {"correct": [[0.0]], "visibility": []}}})
    fit = {"correct": np.zeros((17, 5)).tolist(), "visibility": np.zeros((3, 4 + 17 + 1)).tolist()}
    views = {"correct": np.zeros((17, 7)).tolist(), "visibility": np.zeros((3, 6 + 17 + 1)).tolist()}
    with pytest.raises(ValueError, match="each of"):  # a runtime applies the variant it computes: all three
        check_calibration({"version": 1, "variants": {"plain": fit}}, 17)
    good = check_calibration({"version": 1, "variants": {"plain": fit, "flip_average": fit, "flip_views": views}}, 17)
    spec = ModelSpec(calibration=good)
    assert ModelSpec.from_json(spec.to_json()).calibration == good
    assert "calibration" not in ModelSpec().to_dict()  # files without one read as before
    p, visibility = calibrated(good, "plain", np.zeros((2, 17, 4)))
    assert p.shape == (2, 17) and np.allclose(p, 0.5) and visibility.dtype == np.int8


# ---- slow: the demo model, int8 and OpenVINO ------------------------------------------------------

@pytest.mark.slow  # trains the demo model (~70 s on 2 cores), calibrates on 300 held-out images
def test_acceptance_on_the_demo_model_with_occluders(tmp_path):
    import train
    from vitpose.data.synthetic import make_coco

    assert train.main(["--demo", "--work-dir", str(tmp_path), "--data-root", str(tmp_path / "data")]) == 0
    make_coco(tmp_path / "held", 300, seed=11, split="val")
    lines = []
    run = calibrate(CalibrateOptions(model=str(tmp_path / "best.pth"), data=str(tmp_path / "held"), device="cpu"),
                    log=lines.append)
    figures = run.calibration["figures"]["flip_views"]
    assert figures["ece_p"] <= 0.5 * figures["ece_score"], lines
    # visibility: at least the majority class (the demo's occluders barely show in a heatmap: the
    # margin docs/calibration.md states, with its interval, is small)
    assert figures["visibility_accuracy"] >= figures["majority_accuracy"] - 1e-9, lines
    assert figures["margin_interval"][1] > 0, lines


@pytest.mark.slow  # the int8 export's AP gate, OpenVINO's conversion, a graph with the flip test: ~1 min
def test_p_within_int8s_gate_and_equal_in_openvino_and_a_graph_with_the_flip_test(models, tmp_path, monkeypatch):
    pytest.importorskip("openvino")
    from vitpose.inference import quantize as Q

    _, calibrated_file, _, held = models
    images, boxes = _people(held)
    eager = _open(calibrated_file)(images, boxes=boxes, channels="bgr")
    xml, int8, inside = tmp_path / "ir" / "pose.xml", tmp_path / "pose.int8.onnx", tmp_path / "inside.onnx"
    assert main(["export", "--model", str(calibrated_file), "--out", str(xml), "--gate-data", str(held)]) == 0
    for a, b in zip(eager, _open(xml)(images, boxes=boxes, channels="bgr")):
        np.testing.assert_allclose(a.keypoint_p, b.keypoint_p, atol=1e-4)
        np.testing.assert_array_equal(a.keypoint_visibility, b.keypoint_visibility)
    # the flip test inside the graph gives the average only: the `flip_average` fit, as eager's of that variant
    assert main(["export", "--model", str(calibrated_file), "--out", str(inside), "--flip-test",
                 "--gate-data", str(held)]) == 0
    predictor = _open(inside)
    assert not predictor.gives_views()

    averaged = predictor(images, boxes=boxes, channels="bgr")
    evidence = _open(calibrated_file).calibration_evidence(images, boxes, channels="bgr")
    for a, e in zip(averaged, evidence):
        p, visibility = calibrated(predictor.calibration, "flip_average", e["flip_average"][2])
        np.testing.assert_allclose(a.keypoint_p, p, atol=1e-4)
        np.testing.assert_array_equal(a.keypoint_visibility, visibility)
    monkeypatch.setattr(Q, "INT8_MAX_AP_DIFFERENCE", 0.05)  # 40 images cannot resolve 0.005 (test_runtimes)
    assert main(["export", "--model", str(calibrated_file), "--out", str(int8), "--precision", "int8",
                 "--gate-data", str(held)]) == 0
    got = _open(int8)(images, boxes=boxes, channels="bgr")
    p_eager = np.concatenate([p.keypoint_p.ravel() for p in eager])
    p_int8 = np.concatenate([p.keypoint_p.ravel() for p in got])
    agree = np.mean(np.concatenate([a.keypoint_visibility.ravel() == b.keypoint_visibility.ravel()
                                    for a, b in zip(eager, got)]))
    assert np.mean(np.abs(p_eager - p_int8)) < 0.05 and agree >= 0.9


def test_the_training_set_is_refused_from_another_folder_than_trainings(tmp_path, monkeypatch):
    """A config records `data.root` relative to where training ran; run from elsewhere, the check
    must still find the training set (above the recorded work dir) instead of passing by not finding it."""
    from vitpose.inference.calibrate import CalibrationDataError, _held_out

    project = tmp_path / "project"
    ann = project / "data" / "coco" / "annotations" / "person_keypoints_train2017.json"
    ann.parent.mkdir(parents=True)
    (project / "data" / "coco" / "train2017").mkdir()
    ann.write_text(json.dumps({"images": [], "annotations": [], "categories": []}))
    config = {"data": {"root": "data/coco", "train_ann": "annotations/person_keypoints_train2017.json"},
              "train": {"work_dir": str(project / "work_dirs" / "demo")}}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(CalibrationDataError, match="training set"):
        _held_out(str(ann), config)
    copy = elsewhere / "copy.json"  # the same content under another name
    copy.write_text(ann.read_text())
    with pytest.raises(CalibrationDataError, match="training set"):
        _held_out(str(copy), config)
    other = elsewhere / "held.json"
    other.write_text(json.dumps({"images": [], "annotations": [], "categories": [{"id": 1}]}))
    assert _held_out(str(other), config)[0] == other


@pytest.mark.parametrize("field, value", [("bbox", [float("nan")] * 4), ("keypoints", [None] * 51),
                                          ("bbox", [10.0, 10.0, 0.0, 0.0])])
def test_a_label_with_nan_or_null_is_one_line_before_any_forward_pass(tmp_path, field, value):
    """A NaN box or a null keypoint in --data ended in a traceback (exit 70) after the model had run
    on the set; the labels are now read as training reads them, first. An empty box (which the
    predictor refuses: exit 70 too) is dropped, as training's reader drops it."""
    from vitpose.errors import UserError
    from vitpose.inference.calibrate import _check_labels

    people = [{"id": i + 1, "image_id": 1, "category_id": 1, "iscrowd": 0, "num_keypoints": 17, "area": 400.0,
               "bbox": [10.0, 10.0, 20.0, 20.0], "keypoints": [15.0, 15.0, 2] * 17} for i in range(25)]
    people[3][field] = value
    coco = {"images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 64}], "annotations": people,
            "categories": [{"id": 1, "name": "person", "keypoints": [f"k{i}" for i in range(17)]}]}
    ann = tmp_path / "held.json"
    ann.write_text(json.dumps(coco))
    if value[2] == 0.0:
        assert _check_labels(ann, coco, 17) == set(range(1, 26)) - {4}
        return
    with pytest.raises(UserError, match=f"annotation id 4.*'{field}'"):
        _check_labels(ann, coco, 17)


def test_calibrate_refuses_an_exported_file_name_for_out(tmp_path, capsys):
    """--out x.onnx got a torch checkpoint that every loader would then read as ONNX."""
    code = main(["calibrate", "--model", str(tmp_path / "m.pth"), "--data", str(tmp_path), "--out",
                 str(tmp_path / "m.onnx")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--out" in err[0] and "weights file" in err[0], err


def test_calibrate_refuses_a_plot_that_is_not_a_png(tmp_path, capsys):
    """--plot p.txt got a PNG under a text file's name."""
    code = main(["calibrate", "--model", str(tmp_path / "m.pth"), "--data", str(tmp_path), "--plot",
                 str(tmp_path / "p.txt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--plot" in err[0] and ".png" in err[0], err
    assert not (tmp_path / "p.txt").exists()
