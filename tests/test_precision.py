"""Inference precision: `vitpose.device.resolve_precision` and the accuracy gate behind `precision="auto"`.

The gate (benchmarks/precision_gate.py, issue #20): on a trained model, the COCO AP at a reduced
precision is within 0.002 of fp32's. Every precision `auto` may pick (`AUTO_PRECISIONS`) must pass
it; one that fails is taken out of that table. The CI tier trains a tiny model for a few seconds
until its heatmaps are peaked (random weights give flat heatmaps, where any rounding moves the
argmax anywhere and the comparison means nothing); the slow tier runs the gate on the demo model.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vitpose import device as device_module
from vitpose.device import AUTO_PRECISIONS, PRECISIONS, cpu_has_native_bf16, precision_name, resolve_precision

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from precision_gate import MAX_AP_DIFFERENCE, compare_precisions, keypoint_distances  # noqa: E402

GATED = sorted({p for choices in AUTO_PRECISIONS.values() for p in choices})  # what auto may pick anywhere


def test_resolve_precision_on_this_cpu(monkeypatch):
    monkeypatch.setenv("VITPOSE_CPU_BF16", "faster")  # the speed rule is tests/test_precision_rule.py's
    assert resolve_precision("auto", "cpu") is (torch.bfloat16 if cpu_has_native_bf16() else None)
    assert resolve_precision("fp32", "cpu") is None
    assert resolve_precision("bf16", torch.device("cpu")) is torch.bfloat16  # asked for: taken, native or not
    assert resolve_precision("fp16", "cpu") is torch.float16
    assert [precision_name(resolve_precision(p, "cpu")) for p in PRECISIONS[1:]] == ["fp32", "bf16", "fp16"]
    with pytest.raises(ValueError, match=r"^precision 'half' is not one of auto, fp32, bf16, fp16$"):
        resolve_precision("half", "cpu")
    # Emulating an AVX2 machine (the settings of BENCHMARKS.md's AVX2 rows): oneDNN may not use
    # the bf16 instructions, so bf16 is emulated (training's --amp then runs fp32).
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not cpu_has_native_bf16()
    assert resolve_precision("auto", "cpu") is None
    assert resolve_precision("bf16", "cpu") is torch.bfloat16


def test_auto_picks_a_reduced_precision_only_where_it_is_gated_and_native(monkeypatch):
    """A precision in AUTO_PRECISIONS is picked where the device runs it natively, and one taken out
    of the table (as a failed gate would) is never picked, native or not."""
    monkeypatch.setenv("VITPOSE_CPU_BF16", "faster")  # the speed rule is tests/test_precision_rule.py's
    monkeypatch.setattr(device_module, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("auto", "cpu") is torch.bfloat16  # gated and native: picked
    monkeypatch.setattr(device_module, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", "cpu") is None  # gated, but it would be emulated here
    monkeypatch.setattr(device_module, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setitem(AUTO_PRECISIONS, "cpu", ())
    assert resolve_precision("auto", "cpu") is None  # native, but out of the table


def test_one_rule_of_native_bf16_for_training_and_inference(monkeypatch):
    monkeypatch.setenv("VITPOSE_CPU_BF16", "faster")  # where bf16 is measured faster (auto also follows speed)
    from vitpose.engine import precision as training_precision

    assert training_precision.cpu_has_native_bf16 is device_module.cpu_has_native_bf16
    amp = training_precision.resolve_precision(torch.device("cpu"), amp=True)
    assert amp.dtype is resolve_precision("auto", "cpu")  # --amp in training = auto in inference on a CPU


def test_auto_picks_only_gated_precisions():
    assert set(GATED) <= set(PRECISIONS) - {"auto", "fp32"}
    # bf16 on a CPU (fp16 runs slower than fp32 there), fp16 on CUDA: each passed the gate on sets
    # that decide it (BENCHMARKS.md, "Accuracy gate")
    assert AUTO_PRECISIONS == {"cpu": ("bf16",), "cuda": ("fp16",)}


def test_predictor_takes_precision(monkeypatch):
    monkeypatch.setenv("VITPOSE_CPU_BF16", "faster")
    from vitpose.inference.predictor import Predictor
    from vitpose.models import build_model

    model = build_model("vitpose-s", depth=1, embed_dim=32, num_heads=2, deconv_channels=(8, 8), img_size=(64, 48))
    assert Predictor(model, device="cpu", precision="bf16").amp_dtype is torch.bfloat16
    assert Predictor(model, device="cpu", precision="auto").amp_dtype is resolve_precision("auto", "cpu")
    assert Predictor(model, device="cpu").amp_dtype is None  # the Python API stays fp32 unless asked
    with pytest.raises(ValueError, match="not both"):
        Predictor(model, device="cpu", precision="bf16", amp_dtype=torch.bfloat16)


def test_keypoint_distances_compare_confident_keypoints_instance_by_instance():
    ref = [{"id": 1, "keypoints": np.array([[0.0, 0.0], [10.0, 10.0]]), "keypoint_scores": np.array([0.9, 0.1])},
           {"id": 2, "keypoints": np.array([[5.0, 5.0], [1.0, 1.0]]), "keypoint_scores": np.array([0.31, 0.3])}]
    other = [{"id": 1, "keypoints": np.array([[3.0, 4.0], [99.0, 99.0]])},
             {"id": 2, "keypoints": np.array([[5.0, 6.0], [50.0, 50.0]])}]
    np.testing.assert_allclose(keypoint_distances(ref, other), [5.0, 1.0])  # scores 0.1 and 0.3 not compared
    with pytest.raises(ValueError, match="same instances"):
        keypoint_distances(ref, other[::-1])


def _peaked_tiny_model(tmp_path):
    """A 1-block ViTPose overfitted (120 Adam steps, ~0.1 s each) to the GT crops of 12 synthetic
    images, and what the gate needs to evaluate it on those crops."""
    from vitpose.codecs import UDPHeatmap
    from vitpose.data import CocoKeypoints, get_udp_warp_matrix
    from vitpose.data.geometry import transform_points
    from vitpose.data.pixels import normalize_images
    from vitpose.data.synthetic import make_coco
    from vitpose.evaluation import CocoEvaluator
    from vitpose.models import build_model

    size, heatmap = (48, 64), (12, 16)
    data = make_coco(tmp_path / "coco", num_images=12, seed=0, split="val")
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
    for _ in range(120):
        loss = (((model(x) - y) ** 2).mean((2, 3)) * w).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, (lambda: torch.utils.data.DataLoader(dataset, batch_size=32)), codec, CocoEvaluator(data.ann_file)


def test_accuracy_gate_on_a_briefly_trained_tiny_model(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: one thread is faster, and steady on a busy machine
    try:
        model, batches, codec, evaluator = _peaked_tiny_model(tmp_path)
        results = compare_precisions(model, batches, codec, evaluator, GATED, bootstrap=20)
    finally:
        torch.set_num_threads(threads)
    # This set has few instances: one instance crossing one of COCOeval's 10 OKS thresholds moves AP
    # by about 1 / (10 N). Two such crossings are allowed where that exceeds the gate (N ~ 40 here:
    # 0.005; it happened under the AVX2 emulation, where training itself takes other kernels). The
    # 0.002 gate proper is the demo model's below (N ~ 300: two crossings are 0.0007).
    instances = len(evaluator.coco.getAnnIds(iscrowd=False))
    tolerance = max(MAX_AP_DIFFERENCE, 2 / (10 * instances))
    for r in results:
        print(r.line())
        assert r.ap_fp32 > 0.3, r.line()  # trained: the comparison is between peaked heatmaps
        assert r.confident_keypoints > 100, r.line()
        assert r.max_px > 0, r.line()  # the reduced precision really ran (its keypoints moved)
        assert abs(r.ap_difference) <= tolerance, r.line()
        assert r.median_px < 0.1, r.line()
        assert r.interval is not None and r.interval[0] <= r.interval[1], r.line()  # --bootstrap reaches the result


@pytest.mark.slow  # trains the demo model: minutes on a CPU
def test_accuracy_gate_on_the_demo_model(tmp_path):
    sys.path.insert(0, str(REPO))
    from precision_gate import build_from_config

    import train
    from vitpose.data.synthetic import make_coco

    assert train.main(["--demo", "--work-dir", str(tmp_path), "--data-root", str(tmp_path / "data")]) == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert max(r["AP"] for r in records if r.get("kind") == "eval") > 0.3
    # Gated on 1000 validation images of the same generator, not the demo's 100: on 100 images the
    # AP difference's 95% interval is ~0.006 wide (BENCHMARKS.md), too wide to tell a precision
    # inside the 0.002 gate from one outside it; on 1000 it is ~0.0025 and resolves the gate.
    make_coco(tmp_path / "gate", 1000, seed=0, split="val")
    model, batches, codec, evaluator, flip_indices, _ = build_from_config(
        tmp_path / "config.yaml", tmp_path / "best.pth", "cpu", data_root=tmp_path / "gate")
    for r in compare_precisions(model, batches, codec, evaluator, GATED, flip_indices=flip_indices, bootstrap=200):
        print(r.line())
        assert r.resolves_gate, r.line()
        assert abs(r.ap_difference) <= MAX_AP_DIFFERENCE, r.line()
        assert r.max_px > 0, r.line()
