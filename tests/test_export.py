"""vitpose.inference.export (ONNX / torch.export with a numeric gate), `vitpose export`, OnnxPredictor and
`infer_model_spec`.

CI exports ViTPose-S-width models with one transformer block (the export time grows with the
number of blocks, not with what the gate checks); the full ViTPose-S classic and simple at fixed
and dynamic batch, fp16 and .pt2 are the `slow` tests (`pytest -m slow tests/test_export.py`).
Weights are drawn like the fixtures' recipe (std 0.05 weights, 0.1 biases), so heatmaps have
O(1) peaks and the 1e-4 gate is a real bound, not one met by near-zero outputs.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from test_evaluate import tiny_model
from weights_recipe import derive, load_spec, make_weights

import vitpose.inference.export as E
import vitpose.inference.export_writers as W
from vitpose.coco_meta import FLIP_INDICES
from vitpose.codecs.udp import UDPHeatmap
from vitpose.data.loaders import normalize_images
from vitpose.inference.onnx import OnnxPredictor
from vitpose.inference.predictor import Predictor
from vitpose.models.checkpoint import CheckpointError, save_weights
from vitpose.models.layouts import infer_model_spec
from vitpose.models.loading import load_weights
from vitpose.models.vitpose import build_model, flip_test
from vitpose.topdown import forward_heatmaps

REPO = Path(__file__).resolve().parents[1]
DET_IMAGE = 197388  # coco-mini image with many detection boxes


def reduced_s(decoder, seed=0):
    """ViTPose-S width (384 channels, 12 heads, 256-channel deconvs) with one block, recipe weights."""
    return tiny_model(seed, decoder=decoder, depth=1, embed_dim=384, num_heads=12,
                      deconv_channels=(256, 256)).eval()


def tiny(decoder, seed=0):
    """A 96-channel one-block ViTPose (recipe weights) for the tests of the machinery around the export."""
    return tiny_model(seed, decoder=decoder).eval()


@pytest.fixture(scope="module")
def crops():
    """The gate's default crops (the synthetic set), made once."""
    return E.gate_crops(None)


@pytest.fixture(scope="module")
def classic_dynamic(tmp_path_factory, crops):
    """(model, path, report): reduced ViTPose-S classic, dynamic batch, no flip in the graph."""
    model = reduced_s("classic", seed=1)
    path = tmp_path_factory.mktemp("onnx") / "classic.onnx"
    images, labels, source = crops
    report = E.to_onnx(model, path, crops=images, labels=labels, source=source)
    return model, path, report


@pytest.fixture(scope="module")
def simple_fixed_flip(tmp_path_factory, crops):
    """(model, path, report): reduced ViTPose-S simple, fixed batch 3, flip test in the graph."""
    model = reduced_s("simple", seed=2)
    path = tmp_path_factory.mktemp("onnx") / "simple_b3_flip.onnx"
    images, labels, source = crops
    report = E.to_onnx(model, path, batch=3, flip_test=True, crops=images, labels=labels, source=source)
    return model, path, report


def _onnx_heatmaps(path, x):
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x.numpy()})[0]


def _no_staging_left(folder):
    return not [p for p in Path(folder).iterdir() if p.name.startswith(".")]


# ----------------------------------------------------------------------------------------------
# The exports pass the gate, and the files are what the gate says


def test_dynamic_onnx_passes_the_gate_at_batch_1_and_5(classic_dynamic, crops):
    model, path, report = classic_dynamic
    assert path.is_file() and _no_staging_left(path.parent)
    assert report.passed and report.input_shape == ["batch", 3, 256, 192]
    assert [run.batch for run in report.runs] == [1, 5]
    assert all(run.heatmap_diff <= 1e-4 and run.tolerance == 1e-4 for run in report.runs)
    assert all(run.peak > 0.1 for run in report.runs)  # the bound is not met by near-zero heatmaps
    # Independently of the gate: a batch size neither the trace nor the gate used.
    images = crops[0][[0, 1, 2, 3, 4, 5, 6]]
    with torch.no_grad():
        reference = forward_heatmaps(model, images, flip_test=False).numpy()
    assert np.abs(_onnx_heatmaps(path, normalize_images(images)) - reference).max() <= 1e-4


def test_fixed_batch_onnx_has_the_flip_test_inside(simple_fixed_flip, crops):
    model, path, report = simple_fixed_flip
    assert report.passed and report.input_shape == [3, 3, 256, 192]
    assert [run.batch for run in report.runs] == [3]
    images = crops[0][3:6]
    with torch.no_grad():
        reference = flip_test(model, normalize_images(images)).numpy()
        plain = model(normalize_images(images)).numpy()
    exported = _onnx_heatmaps(path, normalize_images(images))
    assert np.abs(exported - reference).max() <= 1e-4
    assert np.abs(exported - plain).max() > 1e-2  # the flip test really is in the graph
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    # Only the spec describes the model; `vitpose.export` says how the graph was made.
    assert set(meta) == {"vitpose.model_spec", "vitpose.export"}
    facts = json.loads(meta["vitpose.export"])
    assert facts["flip_test"] is True and facts["batch"] == 3 and facts["precision"] == "float32"
    spec = json.loads(meta["vitpose.model_spec"])
    assert spec["skeleton"]["flip_indices"] == list(FLIP_INDICES)
    assert spec["input_size"] == [192, 256] and spec["heatmap_size"] == [48, 64] and spec["codec"] == "UDPHeatmap"


def test_exported_program_passes_the_gate_and_loads(tmp_path, crops):
    model = tiny("classic", seed=3)
    path = tmp_path / "classic.pt2"
    images, labels, source = crops
    report = E.to_exported_program(model, path, flip_test=True, crops=images, labels=labels, source=source)
    assert report.passed and [run.batch for run in report.runs] == [1, 5]
    program = torch.export.load(str(path)).module()
    batch = normalize_images(images[:4])
    with torch.no_grad():
        assert torch.equal(program(batch), flip_test(model, batch))  # same kernels: bit-exact


def test_fp16_onnx_is_gated_with_its_documented_bound(tmp_path, crops):
    model = tiny("classic", seed=7)
    report = E.to_onnx(model, tmp_path / "fp16.onnx", fp16=True, crops=crops[0], log=None)
    assert report.passed and report.precision == "float16"
    for run in report.runs:
        assert run.tolerance == pytest.approx(E.FP16_RELATIVE_TOLERANCE * run.peak)
        assert 1e-5 < run.heatmap_diff < run.tolerance  # really float16: not float32's ~1e-7
    import onnx

    initializers = onnx.load(str(tmp_path / "fp16.onnx")).graph.initializer
    weights = [i for i in initializers if i.name.endswith("final_layer.weight")]
    assert weights and weights[0].data_type == onnx.TensorProto.FLOAT16


def test_heavy_graphs_move_their_external_weights_with_them(tmp_path, crops, monkeypatch):
    """Past protobuf's 2 GiB (ViTPose-H in fp32) the weights go to `<name>.data`; the file and its
    data are gated in the staging folder and moved together, so the reference stays valid."""
    monkeypatch.setattr(W, "SINGLE_FILE_LIMIT", 0)  # a tiny model takes the heavy path
    out = tmp_path / "heavy.onnx"
    assert E.to_onnx(tiny("simple", seed=8), out, crops=crops[0], log=None).passed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heavy.onnx", "heavy.onnx.data"]
    assert out.stat().st_size < 100_000 < (tmp_path / "heavy.onnx.data").stat().st_size
    image = np.zeros((64, 48, 3), np.uint8)
    assert OnnxPredictor(out).predict(image)[0].shape == (1, 17, 2)


# ----------------------------------------------------------------------------------------------
# The gate's failure path


def _perturb_bias(model, keypoint, amount):
    with torch.no_grad():
        model.head.final_layer.bias[keypoint] += amount
    return model


def test_gate_finds_a_perturbed_model_and_says_where(classic_dynamic, crops):
    model, path, _ = classic_dynamic
    changed = _perturb_bias(reduced_s("classic", seed=1), keypoint=9, amount=3e-4)
    report = E.check_export(path, changed, crops[0], format="onnx", labels=crops[1])
    assert not report.passed
    for run in report.runs:
        assert run.heatmap_diff == pytest.approx(3e-4, abs=2e-5)
        assert run.heatmap_where[1] == 9  # the keypoint channel that was changed
    text = "\n".join(report.lines())
    assert "FAILED" in text and "keypoint 9 (left_wrist)" in text
    assert path.is_file()  # check_export only measures; deleting is the writer's job


def _corrupting_writer(monkeypatch, keypoint, amount):
    """Make the ONNX writer change one weight of the file it wrote (the 'graph perturbed after export')."""
    import onnx
    from onnx import numpy_helper

    original = W._write_onnx

    def write_then_corrupt(graph, path, *args, **kwargs):
        original(graph, path, *args, **kwargs)
        proto = onnx.load(str(path))
        for init in proto.graph.initializer:
            if init.name.endswith("final_layer.bias"):
                values = numpy_helper.to_array(init).copy()
                values[keypoint] += amount
                init.CopyFrom(numpy_helper.from_array(values, init.name))
                break
        else:
            raise AssertionError("final_layer.bias not found among the initializers")
        onnx.save(proto, str(path))

    monkeypatch.setattr(W, "_write_onnx", write_then_corrupt)


def test_cli_gate_failure_exits_1_and_leaves_no_file(tmp_path, monkeypatch, capsys, coco_mini_dir):
    from vitpose.cli import main

    checkpoint = save_weights(tiny("simple", seed=4), tmp_path / "simple.safetensors")
    config = tmp_path / "tiny.yaml"  # 96 channels is no ViTPose size: the config says what to build
    config.write_text("model:\n  name: vitpose-s\n  decoder: simple\n"
                      "  extra: {depth: 1, embed_dim: 96, num_heads: 3}\n")
    out = tmp_path / "out" / "simple.onnx"
    _corrupting_writer(monkeypatch, keypoint=5, amount=1e-3)
    code = main(["export", "--model", str(checkpoint), "--config", str(config), "--out", str(out),
                 "--batch", "2", "--gate-data", str(coco_mini_dir)])
    captured = capsys.readouterr()
    assert code == 1
    assert not out.exists() and _no_staging_left(out.parent)
    assert "gate FAILED" in captured.out and "keypoint 5 (left_shoulder)" in captured.out
    measured = float(re.search(r"heatmaps max \|diff\| (\S+) \(tolerance 0.0001", captured.out).group(1))
    assert measured == pytest.approx(1e-3, rel=0.1)  # the size of the change, measured back
    assert "nothing was written" in captured.err


def test_library_gate_failure_keeps_an_earlier_file(tmp_path, monkeypatch, crops):
    out = tmp_path / "model.onnx"
    out.write_bytes(b"an earlier export")
    _corrupting_writer(monkeypatch, keypoint=0, amount=1e-2)
    with pytest.raises(E.GateError) as info:
        E.to_onnx(tiny("classic", seed=5), out, batch=1, crops=crops[0], log=None)
    assert not info.value.report.passed and info.value.report.runs[0].heatmap_where[1] == 0
    assert "gate FAILED" in str(info.value)
    assert out.read_bytes() == b"an earlier export" and _no_staging_left(tmp_path)


# ----------------------------------------------------------------------------------------------
# `vitpose export` end to end, and OnnxPredictor against Predictor


@pytest.fixture(scope="module")
def cli_export(tmp_path_factory, coco_mini_dir):
    """(checkpoint, onnx path, stdout) of `vitpose export` on a reduced ViTPose-S simple checkpoint."""
    from vitpose.cli import main

    folder = tmp_path_factory.mktemp("cli")
    checkpoint = save_weights(reduced_s("simple", seed=6), folder / "simple.safetensors")
    out = folder / "simple.onnx"
    code = main(["export", "--model", str(checkpoint), "--out", str(out), "--gate-data", str(coco_mini_dir)])
    assert code == 0
    return checkpoint, out


def test_cli_export_infers_the_model_and_writes_a_gated_file(cli_export, capsys):
    checkpoint, out = cli_export
    assert out.is_file() and _no_staging_left(out.parent)
    spec = infer_model_spec(checkpoint)
    assert (spec.size, spec.decoder, spec.depth) == ("vitpose-s", "simple", 1)


def test_pyproject_declares_the_console_script_and_the_extra():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert meta["scripts"]["vitpose"] == "vitpose.cli:main"
    assert {d.split(">")[0] for d in meta["optional-dependencies"]["export"]} == {"onnx", "onnxscript", "onnxruntime"}


@pytest.fixture(scope="module")
def det_image(coco_mini_dir):
    """coco-mini image 197388 (BGR) and its detection boxes (xywh), with a score column."""
    dets = json.loads((coco_mini_dir / "test_coco_det_AP_H_56.json").read_text())
    boxes = np.array([d["bbox"] + [d["score"]] for d in dets if d["image_id"] == DET_IMAGE], np.float32)
    image = cv2.imread(str(coco_mini_dir / f"{DET_IMAGE:012d}.jpg"), cv2.IMREAD_COLOR)
    return image, boxes[:5]


def _decode_sensitivity(heatmaps, amplitude):
    codec = UDPHeatmap()
    return E._decode_sensitivity(codec, heatmaps, amplitude)


@pytest.mark.parametrize("which", ["dynamic_numpy_flip", "fixed_batch_graph_flip"])
def test_onnx_predictor_matches_predictor(which, cli_export, simple_fixed_flip, det_image):
    if which == "dynamic_numpy_flip":
        checkpoint, path = cli_export
        model = reduced_s("simple", seed=6)
        load_weights(model, checkpoint)
    else:
        model, path, _ = simple_fixed_flip
    image, boxes = det_image
    torch_pred = Predictor(model, device="cpu", batch_size=4)
    onnx_pred = OnnxPredictor(path, batch_size=4)  # 5 boxes: chunks of 4 and 1 (a fixed graph pads to 3)
    keypoints, scores = onnx_pred.predict(image, boxes, box_format="xywh", channels="bgr")
    ref_keypoints, ref_scores = torch_pred.predict(image, boxes, box_format="xywh", channels="bgr")
    assert keypoints.shape == ref_keypoints.shape == (5, 17, 2) and keypoints.dtype == np.float64
    assert scores.dtype == np.float32
    np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=1e-5)
    # Keypoints: the graph's float32 arithmetic differs from PyTorch's by ~1e-6 and the UDP
    # decode amplifies that on flat maps (random weights); each keypoint stays within 3x what
    # the PyTorch decode itself moves under heatmap noise of 1e-5.
    center, scale = onnx_pred.boxes_to_center_scale(boxes, "xywh")
    crops_bgr, fixed = onnx_pred.crops(image, center, scale)
    with torch.no_grad():
        heatmaps = forward_heatmaps(model, torch.from_numpy(crops_bgr[:, ::-1].copy())).numpy()
    px = fixed[:, None, 0:1] / 192.0  # image pixels per crop pixel
    allowed = np.maximum(1e-3, 3 * _decode_sensitivity(heatmaps, 1e-5)[..., None] * px)
    error = np.abs(keypoints - ref_keypoints)
    assert np.all(error <= allowed), (error.max(), allowed.min())
    assert (error.max(-1) < 1e-3).mean() > 0.8, error.max()


def test_onnx_predictor_steps_are_predictors_given_the_same_heatmaps(cli_export, det_image, monkeypatch):
    """With the graph replaced by the PyTorch model, OnnxPredictor's pre- and post-processing give
    Predictor's keypoints exactly: normalisation, flip average, decode and mapping are the same."""
    checkpoint, path = cli_export
    model = reduced_s("simple", seed=6)
    load_weights(model, checkpoint)
    image, boxes = det_image
    onnx_pred = OnnxPredictor(path)

    def torch_graph(x):
        with torch.no_grad():
            return model(torch.from_numpy(np.ascontiguousarray(x))).numpy()

    monkeypatch.setattr(onnx_pred, "_run", torch_graph)
    keypoints, scores = onnx_pred.predict(image, boxes, box_format="xywh", channels="bgr")
    ref_keypoints, ref_scores = Predictor(model, device="cpu").predict(image, boxes, box_format="xywh", channels="bgr")
    np.testing.assert_array_equal(scores, ref_scores)
    np.testing.assert_array_equal(keypoints, ref_keypoints)


@pytest.mark.parametrize("boxes, box_format", [
    (np.zeros((2, 3)), "xyxy"), ([[0, 0, 10, 10]], "cxcywh"), ([[5, 5, 5, 20]], "xyxy"),
    ([[0, 0, np.nan, 10]], "xyxy"), ([[0, 0, -1, 10]], "xywh"),
])
def test_onnx_predictor_refuses_boxes_as_predictor_does(cli_export, boxes, box_format):
    onnx_pred = OnnxPredictor(cli_export[1])
    torch_pred = Predictor(torch.nn.Identity(), device="cpu")
    with pytest.raises(ValueError) as ours:
        onnx_pred.boxes_to_center_scale(boxes, box_format)
    with pytest.raises(ValueError) as theirs:
        torch_pred.boxes_to_center_scale(boxes, box_format)
    assert str(ours.value) == str(theirs.value)


def test_onnx_predictor_edges(cli_export, simple_fixed_flip, det_image):
    image, _ = det_image
    onnx_pred = OnnxPredictor(cli_export[1])
    keypoints, scores = onnx_pred.predict(image, np.zeros((0, 4)))
    assert keypoints.shape == (0, 17, 2) and scores.shape == (0, 17)
    whole, _ = onnx_pred.predict(image)  # boxes=None: the whole image
    assert whole.shape == (1, 17, 2)
    with pytest.raises(ValueError, match="baked into its graph"):
        OnnxPredictor(simple_fixed_flip[1], flip_test=False)
    with pytest.raises(ValueError, match="uint8"):
        onnx_pred.predict(image.astype(np.float32))


def test_onnx_predictor_runs_without_torch(cli_export, det_image, coco_mini_dir, tmp_path):
    """A fresh interpreter where `import torch` fails: OnnxPredictor imports and predicts, and no
    module of torch (or of the other training-side packages) was loaded; its keypoints are the
    ones this process gets."""
    _, path = cli_export
    image, boxes = det_image
    out = tmp_path / "keypoints.npy"
    code = f"""
import sys
sys.modules["torch"] = None  # `import torch` now raises ImportError
import cv2, numpy as np
from vitpose.inference.onnx import OnnxPredictor
image = cv2.imread({str(coco_mini_dir / f"{DET_IMAGE:012d}.jpg")!r}, cv2.IMREAD_COLOR)
boxes = np.array({boxes.tolist()!r}, np.float32)
keypoints, scores = OnnxPredictor({str(path)!r}).predict(image, boxes, box_format="xywh", channels="bgr")
np.save({str(out)!r}, keypoints)
# None of the torch side's packages either (torch, torchvision, timm, safetensors, pycocotools, yaml).
heavy = {"torch", "torchvision", "timm", "safetensors", "pycocotools", "yaml", "matplotlib"}
loaded = sorted(m for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] in heavy)
assert not loaded, loaded
print("torch-free ok")
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "torch-free ok" in result.stdout
    here, _ = OnnxPredictor(path).predict(image, boxes, box_format="xywh", channels="bgr")
    np.testing.assert_array_equal(np.load(out), here)


# ----------------------------------------------------------------------------------------------
# infer_model_spec


@pytest.fixture(scope="module")
def recipe_weights(fixtures_dir):
    """{decoder: MMPose 1.x weights of the fixtures' recipe (seed 7)}, drawn once."""
    return {dec: make_weights(load_spec(fixtures_dir, dec, "mmpose1x"), 7) for dec in ("classic", "simple")}


@pytest.mark.parametrize("layout", ["mmpose1x", "official0x", "hf"])
@pytest.mark.parametrize("decoder", ["classic", "simple"])
def test_infer_model_spec_reads_every_layout(fixtures_dir, recipe_weights, decoder, layout):
    weights = recipe_weights[decoder]
    if layout != "mmpose1x":
        weights = derive(weights, load_spec(fixtures_dir, decoder, layout))
    spec = infer_model_spec(weights)
    assert (spec.size, spec.decoder, spec.num_keypoints, spec.depth, spec.embed_dim) == ("vitpose-s", decoder, 17, 12, 384)
    assert spec.input_size == (192, 256) and spec.heatmap_size == (48, 64)
    with torch.device("meta"):
        model = spec.build()
    load_weights(model.to_empty(device="cpu"), weights)  # strict: the spec fits every tensor


def _meta_state(name, decoder="classic", **kwargs):
    """A state dict of meta tensors (shapes only: no memory, no init)."""
    with torch.device("meta"):
        return build_model(name, decoder, **kwargs).state_dict()


@pytest.mark.parametrize("name, decoder, kwargs, input_size, heatmap_size", [
    ("vitpose-b", "classic", dict(depth=3, img_size=(256, 256), num_keypoints=133, deconv_channels=(128,)),
     (256, 256), (32, 32)),
    ("vitpose-l", "simple", dict(num_keypoints=14), (192, 256), (48, 64)),
    ("vitpose-h", "classic", dict(mlp_ratio=2.0, depth=2), (192, 256), (48, 64)),
])
def test_infer_model_spec_reads_sizes_depths_grids_and_heads(name, decoder, kwargs, input_size, heatmap_size):
    spec = infer_model_spec(_meta_state(name, decoder, **kwargs))
    assert (spec.size, spec.decoder, spec.num_keypoints) == (name, decoder, kwargs.get("num_keypoints", 17))
    built = spec.build_kwargs()
    for key, value in kwargs.items():  # every dimension that differs from the size's table is read
        if key != "num_keypoints":
            assert built[key] == value, key
    assert (spec.input_size, spec.heatmap_size) == (input_size, heatmap_size)


def test_infer_model_spec_refuses_what_it_cannot_tell():
    state = _meta_state("vitpose-s", depth=1)
    backbone_only = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
    with pytest.raises(CheckpointError, match="backbone-only"):
        infer_model_spec(backbone_only)
    with pytest.raises(CheckpointError, match="embed dim 512 is none of ViTPose's"):
        infer_model_spec(_meta_state("vitpose-s", depth=1, embed_dim=512, num_heads=8))
    no_head = {k: v for k, v in state.items() if not k.startswith("head.final_layer")}
    with pytest.raises(CheckpointError, match="no head.final_layer.weight"):
        infer_model_spec(no_head)


# ----------------------------------------------------------------------------------------------
# Bad input


def test_cli_refuses_a_checkpoint_of_another_size_than_the_config(tmp_path, capsys):
    from vitpose.cli import main

    config = tmp_path / "s.yaml"
    config.write_text("model:\n  name: vitpose-s\n  extra: {depth: 1}\n")
    with torch.device("meta"):
        b = build_model("vitpose-b", depth=1)
    checkpoint = save_weights(b.to_empty(device="cpu"), tmp_path / "b.safetensors")
    out = tmp_path / "x.onnx"
    assert main(["export", "--model", str(checkpoint), "--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "ViT-B weights for a ViT-S model" in err and err.startswith("vitpose export: error:")
    assert not out.exists()


def test_unknown_formats_are_refused(tmp_path, capsys):
    from vitpose.cli import main

    with pytest.raises(SystemExit) as info:
        main(["export", "--model", "m.pth", "--format", "tflite", "--out", "m.tflite"])
    assert info.value.code == 2 and "invalid choice: 'tflite'" in capsys.readouterr().err
    assert main(["export", "--model", "m.pth", "--out", str(tmp_path / "m.tflite")]) == 2
    assert "cannot tell the format from suffix '.tflite'" in capsys.readouterr().err
    assert main(["export", "--model", "m.pth", "--format", "onnx", "--out", str(tmp_path / "m.pt2")]) == 2
    assert "--format onnx but --out" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"unknown export format 'tflite'; choose one of \('onnx', 'pt2', 'openvino'\)"):
        E.export(torch.nn.Identity(), tmp_path / "m.tflite", "tflite")
    for bad in ("0", "abc"):
        with pytest.raises(SystemExit):
            main(["export", "--model", "m.pth", "--out", "m.onnx", "--batch", bad])
        assert "expected 'dynamic' or a positive integer" in capsys.readouterr().err


def test_missing_optional_dependency_names_the_extra(tmp_path, monkeypatch, capsys):
    from vitpose.cli import main

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` fails
    with pytest.raises(E.MissingDependencyError,
                       match=r'ONNX export needs onnxruntime, which is not installed: pip install "vitpose\[export\]"'):
        E.to_onnx(tiny("simple"), tmp_path / "x.onnx")
    assert main(["export", "--model", "m.pth", "--out", str(tmp_path / "x.onnx")]) == 2
    assert 'pip install "vitpose[export]"' in capsys.readouterr().err
    with pytest.raises(ImportError, match="OnnxPredictor needs onnxruntime"):
        OnnxPredictor(tmp_path / "x.onnx")


def test_cli_entry_point_reports_bad_paths(tmp_path):
    """The real interpreter entry (`python -m vitpose.cli`): a missing checkpoint and a gate-data
    folder without a COCO file are one-line errors with exit status 2."""
    missing = subprocess.run([sys.executable, "-m", "vitpose", "export", "--model", str(tmp_path / "no.pth"),
                              "--out", str(tmp_path / "x.onnx")], cwd=REPO, capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2 and "weights file not found" in missing.stderr
    assert missing.stderr.count("\n") == 1


def test_gate_data_must_be_a_coco_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="gate data folder not found"):
        E.gate_crops(tmp_path / "none")
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="found 2 JSON objects"):
        E.gate_crops(tmp_path)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("problem", ["missing folder", "missing file", "no COCO file in it"])
def test_a_gate_data_set_that_is_not_there_is_one_line_naming_the_flag(tmp_path, capsys, precision, problem):
    """`--gate-data` goes through one resolver for the numeric gate and the int8 AP gate: a folder
    or file that is not there (or holds no COCO file) is one line naming the flag and the path,
    exit 2, before the model is read or anything is written."""
    from vitpose.cli import main

    weights = save_weights(tiny("simple"), tmp_path / "w.safetensors")
    gate = {"missing folder": tmp_path / "no" / "coco", "missing file": tmp_path / "val.json",
            "no COCO file in it": tmp_path / "empty"}[problem]
    if problem == "no COCO file in it":
        gate.mkdir()
    out = tmp_path / "out" / "x.onnx"
    code = main(["export", "--model", str(weights), "--out", str(out), "--precision", precision,
                 "--gate-data", str(gate)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and "--gate-data" in err[0] and str(gate) in err[0], err
    assert not out.parent.exists()


def test_a_calibration_set_that_is_not_there_is_one_line_naming_the_flag(tmp_path, capsys, coco_mini_dir):
    from vitpose.cli import main
    from vitpose.inference import quantize as Q

    weights = save_weights(tiny("simple"), tmp_path / "w.safetensors")
    missing = tmp_path / "photos"
    code = main(["export", "--model", str(weights), "--out", str(tmp_path / "x.onnx"), "--precision", "int8",
                 "--gate-data", str(coco_mini_dir), "--calibration", str(missing)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--calibration" in err[0] and str(missing) in err[0], err
    # the library's calls name the same flag with the same class (CalibrationError is GateDataError)
    assert Q.CalibrationError is E.GateDataError
    with pytest.raises(E.GateDataError, match="--calibration: calibration folder not found"):
        Q.calibration_crops(missing, (48, 64))
    with pytest.raises(E.GateDataError, match="--gate-data: gate data folder not found"):
        E.to_int8_onnx(tiny("simple"), tmp_path / "y.onnx", gate_data=tmp_path / "none", log=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]


def test_the_export_command_module_does_not_import_torch():
    """`vitpose.cli` imports every command module: `vitpose.cli.export` imports torch only when an
    export runs (its parser and flag checks are torch-free)."""
    code = ("import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('vitpose_cli_export', 'vitpose/cli/export.py')\n"
            "module = importlib.util.module_from_spec(spec)\n"
            "sys.modules[spec.name] = module\n"
            "spec.loader.exec_module(module)\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "assert 'numpy' not in sys.modules, 'numpy imported'\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_gate_crops_are_the_validation_pipelines(coco_mini_dir):
    from vitpose.data.coco import CocoKeypoints

    images, labels, source = E.gate_crops(coco_mini_dir, count=5)
    dataset = CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir, train=False)
    assert images.dtype == torch.uint8 and images.shape == (5, 3, 256, 192)
    for i in range(5):
        assert torch.equal(images[i], dataset[i]["image"])
        assert labels[i] == f"image {dataset[i]['image_id']} instance {dataset[i]['id']}"


# ----------------------------------------------------------------------------------------------
# Full ViTPose-S (slow): classic and simple, fixed and dynamic batch; fp16; .pt2


@pytest.fixture(scope="module")
def full_s(recipe_weights):
    models = {}
    for decoder in ("classic", "simple"):
        model = build_model("vitpose-s", decoder)
        load_weights(model, recipe_weights[decoder])
        models[decoder] = model.eval()
    return models


@pytest.mark.slow
@pytest.mark.parametrize("batch", ["dynamic", 4])
@pytest.mark.parametrize("decoder", ["classic", "simple"])
def test_full_vitpose_s_onnx_passes_the_gate(full_s, decoder, batch, tmp_path, coco_mini_dir):
    images, labels, source = E.gate_crops(coco_mini_dir)
    report = E.to_onnx(full_s[decoder], tmp_path / f"{decoder}.onnx", batch=batch, crops=images, labels=labels,
                       source=source)
    assert report.passed and (tmp_path / f"{decoder}.onnx").is_file()
    assert all(run.heatmap_diff <= 1e-4 and run.peak > 1.0 for run in report.runs)
    assert [run.batch for run in report.runs] == ([1, 5] if batch == "dynamic" else [4])


@pytest.mark.slow
def test_full_vitpose_s_fp16_and_pt2(full_s, tmp_path, coco_mini_dir):
    images, labels, source = E.gate_crops(coco_mini_dir)
    fp16 = E.to_onnx(full_s["classic"], tmp_path / "fp16.onnx", fp16=True, flip_test=True, crops=images,
                     labels=labels, source=source)
    assert fp16.passed and fp16.precision == "float16"
    assert all(run.tolerance == pytest.approx(1e-2 * run.peak) for run in fp16.runs)
    assert (tmp_path / "fp16.onnx").stat().st_size < 0.6 * 4 * sum(p.numel() for p in full_s["classic"].parameters())
    pt2 = E.to_exported_program(full_s["simple"], tmp_path / "simple.pt2", crops=images, labels=labels, source=source)
    assert pt2.passed and all(run.heatmap_diff <= 1e-4 for run in pt2.runs)
