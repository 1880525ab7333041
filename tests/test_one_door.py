"""One door to a predictor: every command that loads a model refuses the same mistakes the same way,
and select, audit and Ray's `PosePredictor` run exported models as they run the weights.

1. Each command that loads a model (predict, predict --engine ray, predict --segment, serve,
   select, audit, evaluate, export) with `--detector typo`, `--precision typo`, a model file that
   is not there, a model of another skeleton than the rest of the command line, and (export
   --precision int8) a `--gate-data` folder that is not there: one line on stderr, `vitpose CMD:
   error: ...` naming the flag or the file, exit status 2 (never "internal error", 70). serve must
   refuse at start-up, before it listens; it and the Ray engine (which starts a cluster) run as
   subprocesses.
2. `vitpose select`, `vitpose audit` and `PosePredictor` with an `.onnx` file and an OpenVINO IR of
   a tiny model give the records of its weights file within the export gate's tolerance: heatmaps
   that differ by up to `FP32_TOLERANCE` move a keypoint by at most `KEYPOINT_FLOOR_PX` crop
   pixels, or `KEYPOINT_SENSITIVITY_FACTOR` times what the PyTorch decode itself moves under
   heatmap noise of that size (the gate's rule, `vitpose.inference.export`).
"""

import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest
from conftest import REPO
from test_evaluate import tiny_model

import vitpose
import vitpose.inference.export as E
from vitpose.cli import main
from vitpose.data.metainfo import dataset_info
from vitpose.data.synthetic import make_coco
from vitpose.models.spec import spec_of_model

CROP = (128, 96)  # (h, w): small crops keep every command quick
K5_SKELETON = REPO / "configs" / "demo_k5_skeleton.yaml"


# ---------------------------------------------------------------------------------------------
# Tiny models, data, a video and configs, made once


def _weights(path, num_keypoints=17, skeleton=None, seed=5):
    import dataclasses

    from vitpose.builders import skeleton_data

    model = tiny_model(seed=seed, num_keypoints=num_keypoints, img_size=CROP).eval()
    spec = spec_of_model(model)
    if skeleton is not None:
        spec = dataclasses.replace(spec, skeleton=skeleton_data(skeleton))
    vitpose.save_weights(model, path, spec=spec)
    return model, path


def _config(path, root, num_keypoints, skeleton_file=None):
    """A run config of the tiny model on `root` (a synthetic COCO set) with `num_keypoints`."""
    extra = {"depth": 1, "embed_dim": 96, "num_heads": 3, "deconv_channels": [32, 32]}
    data = {"root": str(root), "val_ann": "annotations/person_keypoints_val2017.json", "val_images": "val2017",
            "val_bbox_file": "person_detection_results/val_detections.json"}
    if skeleton_file is not None:
        data["dataset_info"] = str(skeleton_file)
    cfg = {"model": {"name": "vitpose-s", "num_keypoints": num_keypoints, "input_size": [CROP[1], CROP[0]],
                     "heatmap_size": [CROP[1] // 4, CROP[0] // 4], "extra": extra},
           "data": data, "train": {"work_dir": str(path.parent / "work")}}
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("one-door")
    make_coco(root / "coco", num_images=2, seed=3, split="val")
    _, w17 = _weights(root / "w17.safetensors")
    _, w5 = _weights(root / "w5.safetensors", num_keypoints=5, skeleton=dataset_info(K5_SKELETON), seed=6)
    image = cv2.imread(str(root / "coco" / "val2017" / "000000000001.jpg"))
    video = root / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, image.shape[1::-1])
    for i in range(4):
        writer.write(np.roll(image, 3 * i, axis=1))
    writer.release()
    return {"root": root, "coco": root / "coco", "w17": w17, "w5": w5, "video": video,
            "image": root / "coco" / "val2017" / "000000000001.jpg",
            "ann": root / "coco" / "annotations" / "person_keypoints_val2017.json",
            "cfg17": _config(root / "cfg17.json", root / "coco", 17),
            "cfg5": _config(root / "cfg5.json", root / "coco", 5, K5_SKELETON)}


# ---------------------------------------------------------------------------------------------
# 1. The same mistakes, the same one-line refusal, in every command that loads a model

COMMANDS = ("predict", "predict-ray", "predict-segment", "serve", "select", "audit", "evaluate", "export")
MISTAKES = ("detector-typo", "precision-typo", "missing-model", "other-skeleton", "missing-gate-data")
SUBPROCESS = {"serve", "predict-ray"}  # serve would listen; the Ray engine starts a cluster

# The combinations a command has no flag for (the parametrization says why instead of dropping them).
NO_SUCH_FLAG = {
    ("audit", "detector-typo"): "audit has no --detector: the labels' boxes are the people",
    ("evaluate", "detector-typo"): "evaluate has no --detector: the config's detection file or --gt-boxes",
    ("export", "detector-typo"): "export has no --detector: a graph of the pose model alone",
    **{(command, "missing-gate-data"): f"{command} has no --gate-data: only export --precision int8 gates on data"
       for command in COMMANDS if command != "export"},
}


def _argv(command: str, f, out, model=None) -> list[str]:
    """A command line of `command` that would run (`model` the weights file; a detector that needs
    no download)."""
    model = str(model or f["w17"])
    detector = ["--detector", "full-frame"]
    return {
        "predict": ["predict", f["image"], "--model", model, "--json", out / "poses.json", "--device", "cpu", *detector],
        "predict-ray": ["predict", f["coco"] / "val2017", "--model", model, "--engine", "ray", "--json", out / "shards",
                        "--device", "cpu", *detector],
        "predict-segment": ["predict", f["video"], "--model", model, "--segment", "2", "--json", out / "segments",
                            "--device", "cpu", *detector],
        "serve": ["serve", "--model", model, "--host", "127.0.0.1", "--port", "0", "--device", "cpu", *detector],
        "select": ["select", f["coco"] / "val2017", "--model", model, "--count", "1", "--out", out / "next.json",
                   "--device", "cpu", *detector],
        "audit": ["audit", "--model", model, "--annotations", f["ann"], "--images", f["coco"] / "val2017",
                  "--out", out / "audit.json", "--device", "cpu"],
        "evaluate": ["evaluate", "--checkpoint", model, "--config", f["cfg17"], "--gt-boxes",
                     "--out", out / "eval" / "predictions.json", "--device", "cpu", "--workers", "0"],
        "export": ["export", "--model", model, "--out", out / "pose.onnx"],
    }[command]


def _mistake(command: str, mistake: str, f, out) -> tuple[list[str], tuple[str, ...]]:
    """(the command line with the mistake, what its one line must name: any of these)."""
    if mistake == "detector-typo":
        return _argv(command, f, out) + ["--detector", "typo"], ("--detector",)
    if mistake == "precision-typo":
        return _argv(command, f, out) + ["--precision", "typo"], ("--precision",)
    if mistake == "missing-model":
        return _argv(command, f, out, model="/nonexistent.pth"), ("/nonexistent.pth",)
    if mistake == "missing-gate-data":
        missing = str(out / "no-such-folder")
        return _argv(command, f, out) + ["--precision", "int8", "--gate-data", missing], ("--gate-data",)
    # another skeleton: audit, a 5-keypoint model on a 17-keypoint COCO file; evaluate, a 5-keypoint
    # checkpoint with a COCO config; the others, 17-keypoint weights with the config of a 5-keypoint one
    if command == "audit":
        return _argv(command, f, out, model=f["w5"]), ("--annotations",)
    if command == "evaluate":
        return _argv(command, f, out, model=f["w5"]), ("--checkpoint", f["w5"].name, "--config", f["cfg17"].name)
    return _argv(command, f, out) + ["--config", str(f["cfg5"])], ("--config", f["cfg5"].name, f["w17"].name)


def _run(command: str, argv: list[str], capsys) -> tuple[int, str]:
    """(exit status, stderr) of `vitpose ARGV`: in this process, or a subprocess for serve and Ray."""
    argv = [str(a) for a in argv]
    if command not in SUBPROCESS:
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's own refusal of the command line
            code = e.code
        return code, capsys.readouterr().err
    # predict-ray needs no Ray here: the model's flags are refused in the driver, before Ray starts
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run([sys.executable, "-m", "vitpose", *argv], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=240)
    except subprocess.TimeoutExpired as e:  # serve listening, or a Ray job waiting on a dead actor
        pytest.fail(f"vitpose {command} did not refuse within 240 s; stdout so far: {e.stdout!r}")
    if command == "serve":
        assert "listening" not in done.stdout.lower() and "http://" not in done.stdout, done.stdout
    return done.returncode, done.stderr


def _cases():
    """Every command with every mistake it can make (NO_SUCH_FLAG says why the others cannot)."""
    for command in COMMANDS:
        for mistake in MISTAKES:
            if (command, mistake) not in NO_SUCH_FLAG:
                yield pytest.param(command, mistake, id=f"{command}-{mistake}")


@pytest.mark.parametrize("command, mistake", list(_cases()))
def test_a_mistake_is_one_line_naming_it_and_status_2(command, mistake, files, tmp_path, capsys):
    argv, named = _mistake(command, mistake, files, tmp_path)
    code, err = _run(command, argv, capsys)
    lines = err.strip().splitlines()
    prog = "vitpose predict" if command.startswith("predict") else f"vitpose {command}"
    assert code == 2, f"exit {code}, stderr:\n{err}"
    assert len(lines) == 1, f"{len(lines)} lines on stderr:\n{err}"
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    assert any(str(name) in lines[0] for name in named), f"{lines[0]!r} names none of {named}"


# ---------------------------------------------------------------------------------------------
# 2. Exported models in select, audit and Ray's PosePredictor: the records of the weights


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny 17-keypoint model's weights, its ONNX file and its OpenVINO IR (the default export:
    no flip test in the graph), and the PyTorch predictor of the weights in fp32 (what the gate
    compares with; `precision="auto"` may choose bf16 on this CPU)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    from vitpose.inference.predictor import Predictor

    root = tmp_path_factory.mktemp("exported")
    model, weights = _weights(root / "tiny.safetensors", seed=7)
    E.to_onnx(model, root / "tiny.onnx", log=None)
    E.to_openvino(model, root / "ir" / "tiny.xml", log=None)
    return {"weights": weights, "onnx": root / "tiny.onnx", "openvino": root / "ir" / "tiny.xml",
            "torch": Predictor(str(weights), device="cpu", detector=None, precision="fp32")}


def gate_bounds(predictor, image_rgb, boxes_xywh) -> list[np.ndarray]:
    """(M, K) image pixels per view (averaged, plain, mirrored) that an exported file passed by the
    gate may move each keypoint of the PyTorch predictor's: heatmaps within FP32_TOLERANCE, so a
    keypoint within KEYPOINT_FLOOR_PX crop pixels or KEYPOINT_SENSITIVITY_FACTOR x the decode's own
    movement under noise of that size (`vitpose.inference.export`)."""
    boxes = np.asarray(boxes_xywh, np.float32).reshape(-1, 4)
    center, scale = predictor.boxes_to_center_scale(boxes, "xywh")
    crops, fixed = predictor.crops(image_rgb, center, scale)
    views = predictor.run_network_views(crops)
    px = fixed[:, 0:1] / predictor.codec.input_size[0]  # image pixels per crop pixel
    return [np.maximum(E.KEYPOINT_FLOOR_PX, E.KEYPOINT_SENSITIVITY_FACTOR
                       * E._decode_sensitivity(predictor.codec, view, E.FP32_TOLERANCE)) * px for view in views]


def _assert_within(keypoints, reference, bound, what, slack=0.0):
    error = np.hypot(*np.moveaxis(np.asarray(keypoints, float) - np.asarray(reference, float), -1, 0))
    assert np.all(error <= bound + slack), f"{what}: {error.max():.4g} px where {bound.min():.4g} px is allowed"


@pytest.mark.parametrize("runtime", ["onnx", "openvino"])
def test_exported_flip_views_are_the_weights_within_the_gate(exported, files, runtime):
    """`flip_views` of an exported file (the graph on the crops and their mirrors, flipped back
    here) against the weights: each of the three views within the gate, scores within its heatmap bound."""
    image = cv2.cvtColor(cv2.imread(str(files["image"])), cv2.COLOR_BGR2RGB)
    boxes = [[4, 6, 40, 70], [20, 10, 50, 60]]
    ours = vitpose.open_predictor(str(exported[runtime]), device="cpu", precision="fp32", detector=None).flip_views(
        image, boxes, box_format="xywh")
    theirs = exported["torch"].flip_views(image, boxes, box_format="xywh")
    averaged, plain, mirrored = gate_bounds(exported["torch"], image, boxes)
    _assert_within(ours.poses.keypoints, theirs.poses.keypoints, averaged, "averaged")
    _assert_within(ours.plain, theirs.plain, plain, "plain")
    _assert_within(ours.mirrored, theirs.mirrored, mirrored, "mirrored")
    for a, b in ((ours.poses.keypoint_scores, theirs.poses.keypoint_scores), (ours.plain_scores, theirs.plain_scores),
                 (ours.mirrored_scores, theirs.mirrored_scores)):
        np.testing.assert_allclose(a, b, rtol=0, atol=E.FP32_TOLERANCE)


def test_a_graph_with_the_flip_test_inside_is_refused_by_select_in_one_line(exported, files, tmp_path, capsys):
    from vitpose.inference.export import to_onnx
    from vitpose.inference.onnx import ExportedModelError, OnnxPredictor

    model = vitpose.load_model(str(exported["weights"]), device="cpu").model
    baked = tmp_path / "baked.onnx"
    to_onnx(model, baked, flip_test=True, log=None)
    with pytest.raises(ExportedModelError, match="export it again without --flip-test"):
        OnnxPredictor(baked).run_network_views(np.zeros((1, 3, *CROP), np.uint8))
    out = tmp_path / "next.json"
    code = main(["select", str(files["coco"] / "val2017"), "--model", str(baked), "--count", "1", "--out", str(out),
                 "--detector", "full-frame", "--device", "cpu"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "--flip-test" in lines[0] and "--model" in lines[0], lines
    assert not out.exists() and not (tmp_path / "next.json.progress.jsonl").exists()


def _select_records(model, files, out):
    boxes = files["coco"] / "person_detection_results" / "val_detections.json"
    argv = ["select", files["coco"] / "val2017", "--model", model, "--count", "2", "--format", "coco",
            "--boxes", boxes, "--out", out, "--device", "cpu", "--precision", "fp32"]
    assert main([str(a) for a in argv]) == 0
    return sorted(json.loads(out.read_text()), key=lambda r: (r["file_name"], r["bbox"]))


@pytest.mark.parametrize("runtime", ["onnx", "openvino"])
def test_select_with_an_exported_model_gives_the_records_of_the_weights(exported, files, runtime, tmp_path):
    reference = _select_records(exported["weights"], files, tmp_path / "weights.json")
    records = _select_records(exported[runtime], files, tmp_path / f"{runtime}.json")
    assert reference and [(r["file_name"], r["bbox"]) for r in records] == [(r["file_name"], r["bbox"])
                                                                            for r in reference]
    for ours, theirs in zip(records, reference):
        image = cv2.cvtColor(cv2.imread(str(files["coco"] / "val2017" / theirs["file_name"])), cv2.COLOR_BGR2RGB)
        bound = gate_bounds(exported["torch"], image, [theirs["bbox"]])[0]
        kp, ref = np.reshape(ours["keypoints"], (1, -1, 3)), np.reshape(theirs["keypoints"], (1, -1, 3))
        _assert_within(kp[..., :2], ref[..., :2], bound, f"select {runtime} {theirs['file_name']}")
        np.testing.assert_allclose(kp[..., 2], ref[..., 2], rtol=0, atol=E.FP32_TOLERANCE)


def _audit_lines(model, files, out):
    argv = ["audit", "--model", model, "--annotations", files["ann"], "--images", files["coco"] / "val2017",
            "--out", out, "--device", "cpu", "--precision", "fp32"]
    assert main([str(a) for a in argv]) == 0
    progress = out.with_name(out.name + ".progress.jsonl")
    return {line["image"]: line for line in map(json.loads, progress.read_text().splitlines())}


@pytest.mark.parametrize("runtime", ["onnx", "openvino"])
def test_audit_with_an_exported_model_gives_the_predictions_of_the_weights(exported, files, runtime, tmp_path):
    """audit's per-image lines (predictions rounded to 0.01 px, scores to 1e-4) of the exported file
    against the weights', within the gate; and the same people ranked."""
    from vitpose.labelling.audit import read_labels

    reference = _audit_lines(exported["weights"], files, tmp_path / "weights.json")
    lines = _audit_lines(exported[runtime], files, tmp_path / f"{runtime}.json")
    assert reference and lines.keys() == reference.keys()
    for labelled in read_labels(files["ann"], 17):
        ours, theirs = lines[labelled.file_name], reference[labelled.file_name]
        assert ours["annotation_ids"] == theirs["annotation_ids"]
        image = cv2.cvtColor(cv2.imread(str(files["coco"] / "val2017" / labelled.file_name)), cv2.COLOR_BGR2RGB)
        bound = gate_bounds(exported["torch"], image, labelled.boxes)[0]
        _assert_within(ours["predicted"], theirs["predicted"], bound, f"audit {runtime}", slack=0.01)
        for key in ("scores", "plain_scores", "mirrored_scores"):
            np.testing.assert_allclose(ours[key], theirs[key], rtol=0, atol=E.FP32_TOLERANCE + 1e-4)
    ranked = [json.loads((tmp_path / f"{name}.json").read_text())["ranking"] for name in ("weights", runtime)]
    assert sorted(r["annotation_id"] for r in ranked[0]) == sorted(r["annotation_id"] for r in ranked[1])


@pytest.mark.parametrize("runtime", ["onnx", "openvino"])
def test_ray_pose_predictor_opens_an_exported_model_through_the_door(exported, files, runtime):
    """`PosePredictor` (the class Ray's actors hold, called directly: no cluster) with an exported
    file gives the rows of the weights within the gate."""
    from vitpose.integrations.ray import PosePredictor

    names = sorted(p.name for p in (files["coco"] / "val2017").iterdir())
    boxes = [[[4.0, 6.0, 44.0, 76.0, 0.9]], [[10.0, 8.0, 60.0, 70.0, 0.8], [0.0, 0.0, 30.0, 40.0, 0.7]]]
    batch = {"path": np.array([str(files["coco"] / "val2017" / n) for n in names], dtype=object),
             "boxes": np.array([json.dumps(b) for b in boxes], dtype=object)}
    rows = {}
    for which in ("weights", runtime):
        actor = PosePredictor(str(exported[which]), detector=None, device="cpu", precision="fp32", rows="image")
        out = actor(batch)
        assert list(out["error"]) == ["", ""], out["error"]
        rows[which] = [json.loads(r) for r in out["records"]]
    assert type(actor.predictor).__name__ == {"onnx": "OnnxPredictor", "openvino": "OpenVinoPredictor"}[runtime]
    for name, b, ours, theirs in zip(names, boxes, rows[runtime], rows["weights"]):
        assert len(ours) == len(theirs) == len(b)
        image = cv2.cvtColor(cv2.imread(str(files["coco"] / "val2017" / name)), cv2.COLOR_BGR2RGB)
        xyxy = np.asarray(b)[:, :4]
        bound = gate_bounds(exported["torch"], image, np.concatenate([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]], 1))[0]
        kp = np.array([r["keypoints"] for r in ours]).reshape(len(b), -1, 3)
        ref = np.array([r["keypoints"] for r in theirs]).reshape(len(b), -1, 3)
        _assert_within(kp[..., :2], ref[..., :2], bound, f"PosePredictor {runtime} {name}")
        np.testing.assert_allclose(kp[..., 2], ref[..., 2], rtol=0, atol=E.FP32_TOLERANCE)


def test_ray_missing_is_the_one_install_the_extra_error(monkeypatch):
    import builtins

    from vitpose.errors import MissingExtraError
    from vitpose.integrations import ray as integration

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(MissingExtraError, match=r'^--engine ray needs ray, which is not installed: '
                                                r'pip install "vitpose\[ray\]"$') as caught:
        integration._import_ray()
    assert isinstance(caught.value, integration.RayMissingError)


def test_select_and_audit_keep_the_usage_error_name():
    from vitpose.cli import audit, select
    from vitpose.errors import UsageError

    assert select.UsageError is audit.UsageError is UsageError
