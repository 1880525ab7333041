"""Exported runtimes on the CPUs people have (issue 31): the provider guard (a GPU asked of a CPU-only
runtime is one line naming the package, never a silent CPU run), int8 ONNX files written only after
the AP gate passes, and OpenVINO IR gated the same way.

The guard tests fake onnxruntime's list of providers so they say the same on a GPU machine.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_evaluate import tiny_model

import vitpose.inference.export as E
from vitpose.inference.onnx import OnnxPredictor, ProviderError

REPO = Path(__file__).resolve().parents[1]
ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    """A 96-channel one-block ViTPose (recipe weights) exported to ONNX (the guard needs any file)."""
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    E.to_onnx(tiny_model(3).eval(), path, log=None)
    return path


CPU_ONLY = ["AzureExecutionProvider", "CPUExecutionProvider"]  # what the plain onnxruntime wheel offers


def test_cuda_on_a_cpu_only_onnxruntime_names_the_gpu_package(tiny_onnx, monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: list(CPU_ONLY))
    with pytest.raises(ProviderError, match=r"^CUDAExecutionProvider was asked for, but the installed onnxruntime"
                                            r".*pip install onnxruntime-gpu") as caught:
        OnnxPredictor(tiny_onnx, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert "\n" not in str(caught.value)
    assert OnnxPredictor(tiny_onnx, providers=["CPUExecutionProvider"]).session.get_providers() == [
        "CPUExecutionProvider"]


@pytest.mark.filterwarnings("ignore:Specified provider .CUDAExecutionProvider. is not in available provider names")  # the fallback this test makes
def test_a_session_that_fell_back_to_the_cpu_is_refused(tiny_onnx, monkeypatch):
    """onnxruntime builds the session on the CPU alone (a warning only) when the accelerator does not
    start: the build claims CUDA here, the real session cannot have it."""
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime really has CUDA")
    monkeypatch.setattr(ort, "get_available_providers", lambda: [*CPU_ONLY, "CUDAExecutionProvider"])
    with pytest.raises(ProviderError, match="could not start.*session would run on the CPU alone"):
        OnnxPredictor(tiny_onnx, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])


def test_predict_device_cuda_with_an_onnx_file_exits_2_in_one_line(tiny_onnx, monkeypatch, tmp_path, capsys,
                                                                    coco_mini_dir):
    from vitpose.cli import main

    monkeypatch.setattr(ort, "get_available_providers", lambda: list(CPU_ONLY))
    image = next(coco_mini_dir.glob("*.jpg"))
    code = main(["predict", str(image), "--model", str(tiny_onnx), "--device", "cuda", "--detector", "full-frame",
                 "--json", str(tmp_path / "out.json")])
    out, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "pip install onnxruntime-gpu" in lines[0], err
    assert not (tmp_path / "out.json").exists()


def test_a_file_onnxruntime_cannot_load_is_one_line_naming_it(tmp_path, capsys, coco_mini_dir):
    from vitpose.cli import main
    from vitpose.inference.onnx import OnnxLoadError

    damaged = tmp_path / "damaged.onnx"
    damaged.write_bytes(b"\x08\x07 not a protobuf of a model")
    with pytest.raises(OnnxLoadError, match=r"damaged\.onnx: onnxruntime .* cannot load it .*export it again"):
        OnnxPredictor(damaged)
    image = next(coco_mini_dir.glob("*.jpg"))
    code = main(["predict", str(image), "--model", str(damaged), "--detector", "full-frame",
                 "--json", str(tmp_path / "out.json")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "damaged.onnx" in lines[0] and "Traceback" not in lines[0], lines
    assert not (tmp_path / "out.json").exists()


# ---- int8: ONNX Runtime quantization, written only after the AP gate ----------------------------

def peaked_model_and_set(folder: Path, images: int = 48, steps: int = 120):
    """A 1-block ViTPose fitted (Adam) to the GT crops of a synthetic COCO set until its heatmaps are
    peaked (random weights give flat maps, where any rounding moves the argmax anywhere and an AP
    comparison means nothing), and the set's folder: the int8 gate's held-out set."""
    from vitpose.codecs import UDPHeatmap
    from vitpose.data import CocoKeypoints, get_udp_warp_matrix
    from vitpose.data.geometry import transform_points
    from vitpose.data.pixels import normalize_images
    from vitpose.data.synthetic import make_coco
    from vitpose.models import build_model

    size, heatmap = (48, 64), (12, 16)
    data = make_coco(folder, num_images=images, seed=0, split="val")
    dataset = CocoKeypoints(data.ann_file, data.img_dir, train=False, input_size=size, heatmap_size=heatmap)
    codec = UDPHeatmap(size, heatmap, sigma=1.0)
    crops, targets, weights = [], [], []
    for i in range(len(dataset)):
        info = dataset.instance_info(i)
        crop_keypoints = transform_points(info["keypoints"], get_udp_warp_matrix(info["center"], info["scale"], 0.0, size))
        target, weight = codec.encode(crop_keypoints[None], info["keypoints_visible"][None])
        crops.append(dataset[i]["image"])
        targets.append(torch.from_numpy(target))
        weights.append(torch.from_numpy(weight[0]))
    x, y, w = normalize_images(torch.stack(crops)), torch.stack(targets), torch.stack(weights)
    torch.manual_seed(0)
    model = build_model("vitpose-s", depth=1, embed_dim=32, num_heads=2, deconv_channels=(32, 32), img_size=(64, 48),
                        drop_path_rate=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            loss = (((model(x) - y) ** 2).mean((2, 3)) * w).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval(), codec, Path(folder)


@pytest.fixture(scope="module")
def peaked(tmp_path_factory):
    """(model, codec, held-out COCO folder, calibration COCO file of other images, checkpoint)."""
    from vitpose.data.synthetic import make_coco
    from vitpose.models.checkpoint import save_weights

    folder = tmp_path_factory.mktemp("int8")
    model, codec, root = peaked_model_and_set(folder / "coco")
    calibration = make_coco(folder / "calibration", num_images=8, seed=1, split="val")
    checkpoint = save_weights(model, folder / "peaked.safetensors")
    return model, codec, root, Path(calibration.ann_file), checkpoint


# The CI set: 48 synthetic images, ~100 people. Its AP difference's 95% interval is ~0.02 wide
# (measured: [-0.0153, +0.0064] for a good static file), so it cannot resolve issue 31's 0.005 bound:
# here the bound is 0.02, which a good file meets and a badly calibrated one misses by 10x (-0.24
# measured). The 0.005 gate proper is the slow test on the demo model below.
CI_BOUND, CI_BOOTSTRAP = 0.02, 50


def test_int8_export_is_gated_recorded_and_predicts(peaked, tmp_path, monkeypatch, capsys):
    import onnx

    from vitpose.cli import main
    from vitpose.inference import quantize as Q
    from vitpose.inference.predictor import Predictor

    model, codec, root, calibration, checkpoint = peaked
    monkeypatch.setattr(Q, "INT8_MAX_AP_DIFFERENCE", CI_BOUND)
    monkeypatch.setattr(Q, "GATE_BOOTSTRAP", CI_BOOTSTRAP)
    out = tmp_path / "pose.int8.onnx"
    code = main(["export", "--model", str(checkpoint), "--out", str(out), "--precision", "int8",
                 "--gate-data", str(root), "--calibration", str(calibration)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "against fp32 on 48 held-out images" in printed  # the calibration images are other ones: none left out
    proto = onnx.load(str(out))
    ops = {node.op_type for node in proto.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops  # static QDQ: the int8 arithmetic is in the file
    meta = {p.key: p.value for p in proto.metadata_props}
    facts = json.loads(meta[E.EXPORT_KEY])
    assert facts["precision"] == "int8" and facts["quantization"] == "static"
    gate = facts["gate"]
    assert gate["passed"] and gate["bound"] == CI_BOUND and gate["images"] == 48
    assert gate["difference"] == pytest.approx(gate["ap_int8"] - gate["ap_fp32"], abs=1e-6)
    assert gate["interval"][0] <= gate["difference"] + 1e-9 and abs(gate["difference"]) <= CI_BOUND
    assert gate["ap_fp32"] > 0.3  # peaked heatmaps: the comparison means something
    assert json.loads(meta["vitpose.model_spec"])["input_size"] == [48, 64]
    # the ONNX predictor and `vitpose predict --model` run it; its keypoints are the fp32 model's, near enough
    image = sorted((root / "val2017").glob("*.jpg"))[0]
    import cv2

    rgb = cv2.imread(str(image))[..., ::-1]
    boxes = np.array([[0, 0, rgb.shape[1], rgb.shape[0]]], np.float32)
    int8_keypoints, int8_scores = OnnxPredictor(out).predict(rgb, boxes)
    fp32_keypoints, _ = Predictor(model, device="cpu", codec=codec).predict(rgb, boxes)
    confident = int8_scores > 0.3
    assert confident.any()
    assert np.median(np.linalg.norm(int8_keypoints - fp32_keypoints, axis=-1)[confident]) < 2.0
    records = tmp_path / "poses.json"
    assert main(["predict", str(image), "--model", str(out), "--detector", "full-frame", "--json", str(records)]) == 0
    (record,) = json.loads(records.read_text())
    np.testing.assert_allclose(np.array(record["keypoints"]).reshape(-1, 3)[:, :2], int8_keypoints[0], atol=1e-3)


def _checkpoint_recording(model, path, data_root):
    """A training checkpoint of `model` (its spec recorded) whose recorded config's data root is `data_root`."""
    from vitpose.config import load_config
    from vitpose.models.spec import METADATA_KEY, spec_of_model

    config = load_config(None, [f"data.root={data_root}", "data.val_bbox_file=null"]).to_dict()
    torch.save({"model": model.state_dict(), "config": config, METADATA_KEY: spec_of_model(model).to_dict(),
                "epoch": 1, "iteration": 1}, path)
    return path


def test_int8_export_gates_on_the_validation_set_of_the_config_the_model_records(peaked, tmp_path, monkeypatch,
                                                                                   capsys):
    """`vitpose export --model M --precision int8 --out F` and no other flag: M records its training
    config, whose validation set is the held-out set of the AP gate."""
    import onnx

    from vitpose.cli import main
    from vitpose.inference import quantize as Q

    model, _, root, _, _ = peaked
    monkeypatch.setattr(Q, "INT8_MAX_AP_DIFFERENCE", CI_BOUND)
    monkeypatch.setattr(Q, "GATE_BOOTSTRAP", CI_BOOTSTRAP)
    checkpoint = _checkpoint_recording(model, tmp_path / "best.pth", root)
    out = tmp_path / "pose.int8.onnx"
    code = main(["export", "--model", str(checkpoint), "--precision", "int8", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    val_ann = root / "annotations" / "person_keypoints_val2017.json"
    assert "against fp32 on 48 held-out images" in printed and f"of {val_ann}:" in printed, printed
    facts = json.loads({p.key: p.value for p in onnx.load(str(out)).metadata_props}[E.EXPORT_KEY])
    assert facts["precision"] == "int8" and facts["gate"]["held_out"] == str(val_ann)
    assert facts["gate"]["images"] == 48 and facts["gate"]["passed"]


def test_int8_export_whose_recorded_validation_set_is_gone_is_one_line(peaked, tmp_path, capsys):
    from vitpose.cli import main

    model = peaked[0]
    checkpoint = _checkpoint_recording(model, tmp_path / "best.pth", tmp_path / "moved")
    out = tmp_path / "out" / "pose.int8.onnx"
    code = main(["export", "--model", str(checkpoint), "--precision", "int8", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert str(tmp_path / "moved") in err[0] and "records" in err[0] and "--gate-data" in err[0]
    assert not out.parent.exists()


def test_a_bad_calibration_set_fails_the_gate_and_writes_nothing(peaked, tmp_path):
    """Quantization made worse: calibrated on black crops (the activations' ranges of nothing a
    person looks like), the int8 file loses AP and the gate stops it."""
    from vitpose.coco_meta import FLIP_INDICES
    from vitpose.inference.export import to_int8_onnx
    from vitpose.inference.quantize import Int8GateError

    model, codec, root, _, _ = peaked
    out = tmp_path / "bad.int8.onnx"
    with pytest.raises(Int8GateError, match="int8 moves AP by more than the bound") as caught:
        to_int8_onnx(model, out, gate_data=root, codec=codec, flip_indices=FLIP_INDICES, bound=CI_BOUND,
                     bootstrap=CI_BOOTSTRAP, quantization="static",
                     calibration_crops_override=np.zeros((8, 3, 64, 48), np.uint8), log=None)
    assert caught.value.report.difference < -CI_BOUND
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _head_ranges_from(good, bad) -> int:
    """Overwrite, in the static QDQ file `good`, the activations' ranges (scale, zero point) of the
    head's outputs (the tensors its deconvolutions and final conv write) with those of `bad`; the
    backbone's calibrated ranges stay. Returns how many tensors were changed."""
    import onnx
    from onnx import numpy_helper

    good_model, bad_model = onnx.load(str(good)), onnx.load(str(bad))
    bad_values = {t.name: t for t in bad_model.graph.initializer}
    head_outputs = {out for node in good_model.graph.node
                    if any(".head." in name or name.startswith("head.") for name in node.input) and
                    node.op_type in ("Conv", "ConvTranspose")
                    for out in node.output}
    names = {name for node in good_model.graph.node if node.op_type == "QuantizeLinear" and node.input[0] in head_outputs
             for name in node.input[1:]}
    for tensor in good_model.graph.initializer:
        if tensor.name in names:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bad_values[tensor.name]), tensor.name))
    onnx.save(good_model, str(good))
    return len(names) // 2


def test_the_gate_fails_when_the_head_is_left_uncalibrated(peaked, tmp_path, monkeypatch):
    """Quantization made worse in the head alone (issue 31: "calibration skipped on the head"): the
    backbone calibrated on people, the head's activation ranges those of blank crops (what it sees
    with no calibration of its own). The gate stops the file; the same export without the fault passes."""
    from vitpose.coco_meta import FLIP_INDICES
    from vitpose.data.pixels import normalize_images
    from vitpose.inference import quantize as Q
    from vitpose.inference.export import to_int8_onnx
    from vitpose.inference.quantize import Int8GateError

    model, codec, root, calibration, _ = peaked
    spec = E._model_spec(model, codec)
    quantize = Q.quantize_onnx
    changed = []

    def head_uncalibrated(fp32_path, out_path, quantization="static", calibration=None):
        quantize(fp32_path, out_path, quantization, calibration)
        blank = normalize_images(np.zeros((8, 3, 64, 48), np.uint8), spec.pixel_mean, spec.pixel_std)
        bad = Path(str(out_path) + ".blank.onnx")
        quantize(fp32_path, bad, quantization, np.asarray(blank, np.float32))
        changed.append(_head_ranges_from(out_path, bad))
        bad.unlink()

    kwargs = dict(gate_data=root, codec=codec, flip_indices=FLIP_INDICES, bound=CI_BOUND, bootstrap=CI_BOOTSTRAP,
                  quantization="static", calibration=calibration, log=None)
    good = to_int8_onnx(model, tmp_path / "good.int8.onnx", **kwargs)
    assert good.passed
    monkeypatch.setattr(Q, "quantize_onnx", head_uncalibrated)
    out = tmp_path / "head.int8.onnx"
    with pytest.raises(Int8GateError, match="int8 moves AP by more than the bound") as caught:
        to_int8_onnx(model, out, **kwargs)
    assert changed == [3]  # the two deconvolutions' and the final conv's outputs
    assert caught.value.report.difference < -CI_BOUND < good.difference
    assert not out.exists()


def test_dynamic_int8_needs_no_calibration_and_gates_every_image(peaked, tmp_path):
    import onnx

    from vitpose.coco_meta import FLIP_INDICES
    from vitpose.inference.export import to_int8_onnx

    model, codec, root, calibration, _ = peaked
    out = tmp_path / "dynamic.int8.onnx"
    lines = []
    report = to_int8_onnx(model, out, gate_data=root, codec=codec, flip_indices=FLIP_INDICES,  # dynamic: the default
                          bound=CI_BOUND, bootstrap=CI_BOOTSTRAP, log=lines.append)
    assert report.passed and report.images == 48 and "no calibration" in lines[0]
    assert "DynamicQuantizeLinear" in {node.op_type for node in onnx.load(str(out)).graph.node}
    with pytest.raises(ValueError, match="dynamic quantization takes the activations' ranges at run time"):
        to_int8_onnx(model, tmp_path / "x.onnx", gate_data=root, codec=codec, quantization="dynamic",
                     calibration=calibration)


def test_the_gate_scores_only_the_images_the_quantizer_did_not_calibrate_on(tmp_path):
    """A gate on images the quantizer calibrated on flatters the int8 file: with a folder of 4
    images of which 2 calibrate, the gate's COCO set keeps the other 2 and only their people."""
    import cv2

    from vitpose.inference.quantize import calibration_crops, held_out_set

    images = tmp_path / "images"
    images.mkdir()
    for i in range(4):
        cv2.imwrite(str(images / f"{i}.png"), np.full((30, 20, 3), 40 * i, np.uint8))
    box = {"bbox": [2, 2, 10, 20], "area": 200, "iscrowd": 0, "category_id": 1, "num_keypoints": 1,
           "keypoints": [5, 5, 2] + [0, 0, 0] * 16}
    ann_file = tmp_path / "set.json"
    ann_file.write_text(json.dumps({
        "images": [{"id": 10 + i, "file_name": f"{i}.png", "width": 20, "height": 30} for i in range(4)],
        "annotations": [{**box, "id": 100 + i, "image_id": 10 + i} for i in range(4)],
        "categories": [{"id": 1, "name": "person"}]}))
    crops, used, _ = calibration_crops(images, (48, 64), count=2)
    assert len(crops) == 2 and used == {(images / "0.png").resolve(), (images / "1.png").resolve()}
    held_out, count = held_out_set(ann_file, images, used, tmp_path)
    kept = json.loads(held_out.read_text())
    assert count == 2
    assert [im["id"] for im in kept["images"]] == [12, 13]
    assert [a["image_id"] for a in kept["annotations"]] == [12, 13]


@pytest.mark.parametrize(("difference", "interval", "passed", "why"), [
    (-0.001, (-0.004, 0.002), True, "pass"),
    (-0.006, (-0.009, -0.003), False, "more than the bound"),
    (-0.001, (-0.012, 0.004), False, "cannot resolve"),  # inside the bound, on a set too small to tell
])
def test_the_int8_verdict(difference, interval, passed, why):
    from vitpose.inference.quantize import Int8Report

    report = Int8Report("static", 0.7, 0.7 + difference, interval, 100, 300, "set", "calib", 64)
    assert report.passed is passed
    assert why in "\n".join(report.lines())
    assert report.metadata()["passed"] is passed and report.metadata()["bound"] == 0.005


def test_int8_flags_are_checked_before_the_work(tmp_path, capsys):
    from vitpose.cli import main

    weights = tmp_path / "w.safetensors"
    from vitpose.models.checkpoint import save_weights

    save_weights(tiny_model(1), weights)
    code = main(["export", "--model", str(weights), "--out", str(tmp_path / "x.onnx"), "--precision", "int8"])
    err = capsys.readouterr().err
    assert code == 2 and "give --gate-data" in err and len(err.strip().splitlines()) == 1
    code = main(["export", "--model", str(weights), "--out", str(tmp_path / "x.onnx"), "--calibration", str(tmp_path)])
    assert code == 2 and "add --precision int8" in capsys.readouterr().err
    code = main(["export", "--model", str(weights), "--out", str(tmp_path / "x.onnx"), "--precision", "int8",
                 "--opset", "17", "--gate-data", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "--opset 17" in err and "leave --opset out" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == [weights]


# ---- OpenVINO: the IR written after the same numeric gate, run by `vitpose predict --model` -----

@pytest.fixture(scope="module")
def openvino_pair(peaked, tmp_path_factory):
    """(ONNX file, OpenVINO .xml) of the peaked model, both written by `vitpose export`."""
    pytest.importorskip("openvino")
    from vitpose.cli import main

    _, _, root, _, checkpoint = peaked
    folder = tmp_path_factory.mktemp("openvino")
    onnx_path, xml = folder / "pose.onnx", folder / "ir" / "pose.xml"
    assert main(["export", "--model", str(checkpoint), "--out", str(onnx_path), "--gate-data", str(root)]) == 0
    assert main(["export", "--model", str(checkpoint), "--out", str(xml), "--gate-data", str(root)]) == 0
    return onnx_path, xml


def test_openvino_export_is_gated_and_records_the_spec(openvino_pair, peaked, capsys):
    import openvino as ov

    from vitpose.inference.onnx import OPENVINO_RT_INFO
    from vitpose.models.spec import METADATA_KEY

    _, xml = openvino_pair
    assert sorted(p.name for p in xml.parent.iterdir()) == ["pose.bin", "pose.xml"]
    model = ov.Core().read_model(str(xml))
    spec = json.loads(model.get_rt_info(OPENVINO_RT_INFO[METADATA_KEY]).astype(str))
    facts = json.loads(model.get_rt_info(OPENVINO_RT_INFO[E.EXPORT_KEY]).astype(str))
    assert spec["input_size"] == [48, 64] and facts["precision"] == "float32"
    # the gate ran OpenVINO on the file: a changed model is found out by it
    codec = peaked[1]
    crops = E.gate_crops(peaked[2], (48, 64))
    assert E.check_export(xml, peaked[0], crops[0], format="openvino", codec=codec).passed
    import copy

    changed = copy.deepcopy(peaked[0])
    with torch.no_grad():
        changed.head.final_layer.bias.add_(0.01)
    report = E.check_export(xml, changed, crops[0], format="openvino", codec=codec)
    assert not report.passed and "OpenVINO" in report.runtime


@pytest.mark.parametrize("as_folder", [False, True], ids=["xml", "folder"])
def test_predict_on_the_openvino_ir_gives_the_onnx_files_records(openvino_pair, peaked, tmp_path, as_folder):
    from vitpose.cli import main
    from vitpose.inference.onnx import OpenVinoPredictor

    onnx_path, xml = openvino_pair
    root = peaked[2]
    images = sorted((root / "val2017").glob("*.jpg"))[:3]
    records = {}
    for name, model in (("onnx", onnx_path), ("openvino", xml.parent if as_folder else xml)):
        out = tmp_path / f"{name}.json"
        assert main(["predict", *map(str, images), "--model", str(model), "--detector", "full-frame",
                     "--json", str(out)]) == 0
        records[name] = json.loads(out.read_text())
    assert len(records["onnx"]) == len(records["openvino"]) == 3
    for a, b in zip(records["onnx"], records["openvino"]):
        assert a["image_id"] == b["image_id"]
        ka, kb = np.array(a["keypoints"]).reshape(-1, 3), np.array(b["keypoints"]).reshape(-1, 3)
        # the same numeric gate as the export's: heatmaps within 1e-4 move a keypoint by at most
        # KEYPOINT_FLOOR_PX (0.05 crop px; the crop here is the whole image, about 2x larger)
        np.testing.assert_allclose(ka[:, :2], kb[:, :2], atol=0.2)
        np.testing.assert_allclose(ka[:, 2], kb[:, 2], atol=1e-3)
    # the heatmaps themselves: within the export's fp32 bound
    x = np.random.default_rng(0).integers(0, 255, (2, 3, 64, 48), dtype=np.uint8)
    heat_ov = OpenVinoPredictor(xml).heatmaps(x)
    heat_onnx = OnnxPredictor(onnx_path).heatmaps(x)
    assert np.abs(heat_ov - heat_onnx).max() <= 2 * E.FP32_TOLERANCE


class _CpuOnlyCore:
    available_devices = ["CPU"]


def test_openvino_gpu_without_the_device_is_one_line(openvino_pair, peaked, monkeypatch, tmp_path, capsys):
    import openvino as ov

    from vitpose.cli import main
    from vitpose.inference.onnx import OpenVinoPredictor

    monkeypatch.setattr(ov, "Core", _CpuOnlyCore)
    with pytest.raises(ProviderError, match=r"OpenVINO device GPU was asked for, but this machine offers only CPU: "
                                            r"install Intel's GPU compute runtime"):
        OpenVinoPredictor(openvino_pair[1], device="GPU")
    image = sorted((peaked[2] / "val2017").glob("*.jpg"))[0]
    code = main(["predict", str(image), "--model", str(openvino_pair[1]), "--device", "gpu",
                 "--detector", "full-frame", "--json", str(tmp_path / "o.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "intel-opencl-icd" in err[0], err
    assert not (tmp_path / "o.json").exists()


@pytest.mark.slow  # trains the demo model and gates on 1000 images: ~15 min on 2 CPU cores
def test_int8_gate_with_issue_31s_bound_on_the_demo_model(tmp_path, capsys):
    """The 0.005 gate proper, on a set that resolves it (BENCHMARKS.md "int8": +0.0014 [-0.0007,
    +0.0038] on 968 held-out images); and the same model calibrated on black crops fails it."""
    import train
    from vitpose.builders import load_model
    from vitpose.data.synthetic import make_coco
    from vitpose.inference.export import to_int8_onnx
    from vitpose.inference.quantize import Int8GateError

    assert train.main(["--demo", "--work-dir", str(tmp_path), "--data-root", str(tmp_path / "data")]) == 0
    make_coco(tmp_path / "gate", 1000, seed=0, split="val")
    loaded = load_model(tmp_path / "best.pth", config=tmp_path / "config.yaml", device="cpu")
    kwargs = dict(gate_data=tmp_path / "gate", codec=loaded.codec, flip_indices=loaded.skeleton.flip_indices)
    report = to_int8_onnx(loaded.model, tmp_path / "demo.int8.onnx", **kwargs)
    assert report.passed and report.resolves and abs(report.difference) <= 0.005, report.lines()
    with pytest.raises(Int8GateError):
        to_int8_onnx(loaded.model, tmp_path / "bad.int8.onnx", **kwargs, quantization="static",
                     calibration_crops_override=np.zeros((16, 3, 128, 96), np.uint8))
    assert not (tmp_path / "bad.int8.onnx").exists()


def test_cli_int8_gate_failure_exits_1_and_leaves_no_file(peaked, tmp_path, monkeypatch, capsys):
    """`vitpose export --precision int8` whose file fails the gate: its figures, one error line, exit 1."""
    from vitpose.cli import main
    from vitpose.inference import quantize as Q

    _, _, root, _, checkpoint = peaked
    monkeypatch.setattr(Q, "INT8_MAX_AP_DIFFERENCE", 1e-9)  # no int8 file can pass this
    monkeypatch.setattr(Q, "GATE_BOOTSTRAP", 5)
    out = tmp_path / "x.int8.onnx"
    code = main(["export", "--model", str(checkpoint), "--out", str(out), "--precision", "int8",
                 "--gate-data", str(root)])
    printed, err = capsys.readouterr()
    assert code == 1 and not out.exists() and list(tmp_path.iterdir()) == []
    assert "FAIL" in printed and "against fp32 on 48 held-out images" in printed
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "did not pass the AP gate" in lines[0], err
