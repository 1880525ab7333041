"""The model's ModelSpec drives every runtime (issue 28 items 1 and 2): the codec (`model.codec: udp |
msra`), the pixel mean/std, the flip order; ONNX files carry only the spec; one flip average, one
decode, the rescoring rule outside evaluation; and the bad-input cases N8, N10, N23 and round-3 row
108 of the round-4 report.

References are computed here independently, step by step (normalise, mirror, average, decode,
map to the image), not through the functions under test.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_evaluate import tiny_model

import vitpose
from vitpose.builders import skeleton_data
from vitpose.coco_meta import PIXEL_MEAN, PIXEL_STD
from vitpose.codecs.flip import flip_average
from vitpose.codecs.msra import MSRAHeatmap
from vitpose.codecs.udp import UDPHeatmap
from vitpose.data import dataset_info
from vitpose.data.pixels import normalize_images
from vitpose.errors import UserError
from vitpose.inference.results import StageTimer
from vitpose.models.checkpoint import save_weights
from vitpose.models.spec import ModelSpec, SpecError, spec_of_model

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Tiny demo-derived training: 48x64 crops, a 2-block 32-d ViT, 6 synthetic images, one epoch.
TINY_TRAIN = [
    "model.input_size=[48, 64]", "model.heatmap_size=[12, 16]", "model.sigma=1.0",
    "model.extra={embed_dim: 32, depth: 2, num_heads: 2, deconv_channels: [16, 16]}",
    "data.synthetic_train_images=6", "data.synthetic_val_images=2", "loader.batch_size=2",
    "train.val_every=1000", "train.log_every=1", "train.checkpoint_minutes=0",
]
ODD_MEAN, ODD_STD = (10.0, 200.0, 90.0), (20.0, 80.0, 160.0)  # far from ImageNet's, per channel different


def reference_keypoints(model, crops, center, scale, codec, mean, std, flip_indices, shift):
    """Keypoints (N, K, 2) image pixels and scores by hand: (x - mean) / std, the model on the crops
    and their mirrors (one batch), the mirrored maps flipped back, channels swapped, shifted one
    column right when `shift` (first column kept), averaged, decoded, mapped with MMPose's formula."""
    x = (torch.as_tensor(np.ascontiguousarray(crops)).float()
         - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    with torch.no_grad():
        both = model(torch.cat([x, x.flip(-1)])).numpy()
    n = len(x)
    back = both[n:][:, list(flip_indices), :, ::-1]
    if shift:
        back = np.concatenate([back[..., :1], back[..., :-1]], axis=-1)
    heatmaps = (both[:n] + back) * np.float32(0.5)
    kpts, scores = codec.batch_decode(heatmaps)
    w, h = codec.input_size
    size = np.array([w, h], np.float64)
    image = kpts / size * scale[:, None] + center[:, None] - 0.5 * scale[:, None]
    return image, scores, heatmaps


def random_image(seed=0, shape=(120, 100, 3)):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


# ----------------------------------------------------------------------------------------------
# model.codec: msra, trained, then used from the file alone


@pytest.fixture(scope="module")
def msra_run(tmp_path_factory):
    """A demo-derived config trained for one epoch with model.codec: msra; its work dir."""
    import train

    root = tmp_path_factory.mktemp("msra")
    args = ["--demo", "--data-root", str(root / "data"), "--work-dir", str(root / "work"), "--workers", "0",
            "--epochs", "1", "--set", "model.codec=msra"]
    for setting in TINY_TRAIN:
        args += ["--set", setting]
    assert train.main(args) == 0
    return root / "work"


@pytest.fixture(scope="module")
def msra_checkpoint(msra_run):
    """The run's last.pth with its weights redrawn like the fixture recipe (std 0.05, biases 0.1):
    five iterations leave the heatmaps nearly flat, where no decode is a test of anything. Everything
    else (the recorded spec and config) is the training run's."""
    saved = torch.load(msra_run / "last.pth", weights_only=True)
    model = vitpose.load_model(msra_run / "last.pth", device="cpu").model
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():  # as test_evaluate.tiny_model draws them
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif p.ndim == 1:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.05 if "pos_embed" not in name else 0.5)
    assert saved["model"].keys() == model.state_dict().keys()
    saved["model"] = model.state_dict()
    path = msra_run / "msra_redrawn.pth"
    torch.save(saved, path)
    return path


def test_a_model_trained_with_msra_predicts_with_msra_from_the_file_alone(msra_checkpoint):
    predictor = vitpose.Predictor(str(msra_checkpoint), device="cpu")
    codec = predictor.codec
    assert type(codec) is MSRAHeatmap and codec.input_size == (48, 64) and codec.heatmap_size == (12, 16)
    assert codec.sigma == 1.0 and not codec.unbiased
    image = random_image(1)
    boxes = np.array([[10, 8, 70, 110], [30, 20, 95, 100]], np.float32)
    keypoints, scores = predictor.predict(image, boxes)
    center, scale = predictor.boxes_to_center_scale(boxes)
    crops, fixed = predictor.crops(image, center, scale)
    coco = dataset_info("coco")
    independent = MSRAHeatmap((48, 64), (12, 16), 1.0)
    expected, expected_scores, _ = reference_keypoints(predictor.model, crops, center, fixed, independent,
                                                       PIXEL_MEAN, PIXEL_STD,
                                                       coco.flip_indices, shift=True)
    # Same operations in the same order (one batch of 2N, float32): equal but for the last bits.
    np.testing.assert_allclose(keypoints, expected, rtol=0, atol=1e-4)
    np.testing.assert_allclose(scores, expected_scores, rtol=0, atol=1e-5)
    # ... and not what the UDP codec, or a flip test without MSRA's shift, would give.
    udp = UDPHeatmap((48, 64), (12, 16), 1.0)
    as_udp, _, unshifted_maps = reference_keypoints(predictor.model, crops, center, fixed, udp, PIXEL_MEAN, PIXEL_STD,
                                                    coco.flip_indices, shift=False)
    assert np.abs(predictor.run_network(crops) - unshifted_maps).max() > 1e-2 * np.abs(unshifted_maps).max()
    assert np.abs(keypoints - as_udp).max() > 0.5


def test_msra_training_draws_msra_targets_and_records_the_codec(tmp_path):
    from vitpose.builders import build_codec, build_model_from_config, build_train_set
    from vitpose.config import load_config
    from vitpose.data.synthetic import make_coco

    make_coco(tmp_path, num_images=2, seed=0, split="train")
    cfg = load_config("demo", [f"data.root={tmp_path}", "model.codec=msra", *TINY_TRAIN])
    assert cfg.loader.targets_on_device  # the demo's setting: MSRA targets still come from the workers
    dataset = build_train_set(cfg)
    sample = dataset[0]
    expected, weights = MSRAHeatmap((48, 64), (12, 16), 1.0).encode(sample["keypoints"][None].numpy(),
                                                                  sample["keypoints_visible"][None].numpy())
    np.testing.assert_array_equal(sample["heatmaps"].numpy(), expected)
    np.testing.assert_array_equal(sample["keypoint_weights"].numpy(), weights[0])
    assert type(build_codec(cfg.model)) is MSRAHeatmap
    with torch.device("meta"):
        assert build_model_from_config(cfg.model).spec.codec == "MSRAHeatmap"


def test_model_codec_is_checked():
    from vitpose.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="model.codec"):
        load_config("demo", ["model.codec=dark"])


# ----------------------------------------------------------------------------------------------
# A spec with other pixel mean/std: its normalisation is used


@pytest.fixture(scope="module")
def odd_pixels_model():
    model = tiny_model(5).eval()
    model.spec = spec_of_model(model, pixel_mean=ODD_MEAN, pixel_std=ODD_STD,
                               skeleton=skeleton_data(dataset_info("coco")))
    return model


def test_a_checkpoint_recording_other_mean_and_std_predicts_with_them(odd_pixels_model, tmp_path):
    path = save_weights(odd_pixels_model, tmp_path / "odd.safetensors")
    predictor = vitpose.Predictor(str(path), device="cpu")
    assert predictor.model.spec.pixel_mean == ODD_MEAN and predictor.model.spec.pixel_std == ODD_STD
    image = random_image(2, (300, 260, 3))
    boxes = np.array([[20, 15, 200, 280]], np.float32)
    keypoints, scores = predictor.predict(image, boxes)
    center, scale = predictor.boxes_to_center_scale(boxes)
    crops, fixed = predictor.crops(image, center, scale)
    expected, expected_scores, _ = reference_keypoints(predictor.model, crops, center, fixed, UDPHeatmap(),
                                                       ODD_MEAN, ODD_STD, dataset_info("coco").flip_indices,
                                                       shift=False)
    np.testing.assert_allclose(keypoints, expected, rtol=0, atol=1e-4)
    np.testing.assert_allclose(scores, expected_scores, rtol=0, atol=1e-5)


def test_validation_normalises_with_the_spec(odd_pixels_model):
    from vitpose.engine.evaluate import predict

    crops = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (2, 3, 256, 192), dtype=np.uint8))
    batch = {"image": crops, "id": torch.tensor([1, 2]), "image_id": torch.tensor([1, 1]),
             "center": torch.tensor([[100.0, 120.0], [90.0, 80.0]]), "scale": torch.tensor([[150.0, 200.0]] * 2)}
    preds = predict(odd_pixels_model, [batch], UDPHeatmap(), flip_test=True, device="cpu")
    expected, _, _ = reference_keypoints(odd_pixels_model, crops.numpy(), batch["center"].numpy().astype(np.float64),
                                         batch["scale"].numpy().astype(np.float64), UDPHeatmap(), ODD_MEAN, ODD_STD,
                                         dataset_info("coco").flip_indices, shift=False)
    np.testing.assert_allclose(np.stack([p["keypoints"] for p in preds]), expected, rtol=0, atol=1e-3)


# ----------------------------------------------------------------------------------------------
# ONNX: the spec alone


def onnx_metadata(path):
    import onnx

    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


def rewrite_metadata(src, dst, metadata):
    import onnx

    model = onnx.load(str(src))
    del model.metadata_props[:]
    for key, value in metadata.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(dst))
    return dst


@pytest.fixture(scope="module")
def ap10k_export(tmp_path_factory):
    """(model, .onnx path): a 17-keypoint AP-10K model (a flip order unlike COCO's) with odd pixels,
    exported without the flip test in the graph."""
    pytest.importorskip("onnxruntime")
    from vitpose.inference.export import to_onnx

    model = tiny_model(6).eval()
    model.spec = spec_of_model(model, pixel_mean=ODD_MEAN, pixel_std=ODD_STD,
                               skeleton=skeleton_data(dataset_info("ap10k")))
    path = tmp_path_factory.mktemp("onnx") / "ap10k.onnx"
    crops = torch.from_numpy(np.random.default_rng(4).integers(0, 256, (3, 3, 256, 192), dtype=np.uint8))
    to_onnx(model, path, crops=crops, log=None)
    return model, path


def test_exports_record_only_the_spec(ap10k_export):
    _, path = ap10k_export
    meta = onnx_metadata(path)
    assert set(meta) == {"vitpose.model_spec", "vitpose.export"}
    spec = ModelSpec.from_json(meta["vitpose.model_spec"])
    assert spec.pixel_mean == ODD_MEAN and spec.skeleton["name"] == "ap10k"
    assert json.loads(meta["vitpose.export"])["flip_test"] is False


def test_an_onnx_file_with_only_its_spec_predicts_as_the_model(ap10k_export, tmp_path):
    from vitpose.inference.onnx import OnnxPredictor

    model, path = ap10k_export
    spec_only = rewrite_metadata(path, tmp_path / "spec_only.onnx",
                                 {"vitpose.model_spec": onnx_metadata(path)["vitpose.model_spec"]})
    onnx_predictor = OnnxPredictor(spec_only)
    assert onnx_predictor.flip_indices == list(dataset_info("ap10k").flip_indices)
    image = random_image(5, (320, 240, 3))
    boxes = np.array([[10, 10, 200, 300], [60, 40, 230, 260]], np.float32)
    center, scale = onnx_predictor.boxes_to_center_scale(boxes)
    crops, fixed = onnx_predictor.crops(image, center, scale)
    _, _, expected_maps = reference_keypoints(model, crops, center, fixed, UDPHeatmap(), ODD_MEAN, ODD_STD,
                                              dataset_info("ap10k").flip_indices, shift=False)
    # The gate's bound on the graph's arithmetic; COCO's order or ImageNet's pixels are off by far more.
    assert np.abs(onnx_predictor.heatmaps(crops) - expected_maps).max() <= 1e-4
    keypoints, _ = onnx_predictor.predict(image, boxes)
    torch_keypoints, _ = vitpose.Predictor(model, device="cpu").predict(image, boxes)
    moved = np.linalg.norm(keypoints - torch_keypoints, axis=-1)
    assert np.median(moved) < 0.05 and moved.max() < 5.0  # the UDP decode amplifies 1e-5 on flat maps


def test_older_onnx_files_with_loose_keys_still_load(ap10k_export, tmp_path):
    from vitpose.inference.onnx import OnnxPredictor

    _, path = ap10k_export
    ap10k = dataset_info("ap10k")
    loose = {"vitpose.pixel_mean": json.dumps(ODD_MEAN), "vitpose.pixel_std": json.dumps(ODD_STD),
             "vitpose.input_size": "[192, 256]", "vitpose.heatmap_size": "[48, 64]", "vitpose.codec": "UDPHeatmap",
             "vitpose.codec_sigma": "2.0", "vitpose.codec_blur_kernel_size": "11", "vitpose.num_keypoints": "17",
             "vitpose.flip_indices": json.dumps(list(ap10k.flip_indices)), "vitpose.flip_test": "0"}
    old = OnnxPredictor(rewrite_metadata(path, tmp_path / "old.onnx", loose))
    new = OnnxPredictor(path)
    assert old.flip_indices == new.flip_indices and old.mean == new.mean and old.std == new.std
    crops = np.random.default_rng(6).integers(0, 256, (2, 3, 256, 192), dtype=np.uint8)
    np.testing.assert_array_equal(old.heatmaps(crops), new.heatmaps(crops))


# -- N8: no metadata at all -----------------------------------------------------------------------------

def test_n8_an_onnx_file_without_metadata_does_not_guess_a_flip_order(ap10k_export, tmp_path):
    from vitpose.inference.onnx import OnnxPredictor

    _, path = ap10k_export
    bare = rewrite_metadata(path, tmp_path / "bare.onnx", {})
    with pytest.raises(UserError, match=r"bare\.onnx.*records no skeleton.*flip_indices=") as err:
        OnnxPredictor(bare)
    assert "\n" not in str(err.value)
    given = OnnxPredictor(bare, flip_indices=dataset_info("ap10k").flip_indices)
    assert given.flip_indices == list(dataset_info("ap10k").flip_indices)
    assert OnnxPredictor(bare, flip_test=False).flip_indices is None


# -- N10, N23: metadata checked as a weights spec is, errors naming the file and key ---------------------

def _spec_with(path, **changes):
    data = json.loads(onnx_metadata(path)["vitpose.model_spec"])
    for key, value in changes.items():
        if key == "flip_indices":
            data["skeleton"]["flip_indices"] = value
        else:
            data[key] = value
    return json.dumps(data)


@pytest.mark.parametrize("change, message", [
    (dict(flip_indices=[0] * 17), "not a set of swaps"),
    (dict(flip_indices=[99] * 17), "not a set of swaps"),
    (dict(pixel_std=[0, 0, 0]), "pixel_std must be three positive"),
    (dict(pixel_mean="abc"), "pixel_mean must be three finite"),
    (dict(codec="DARKHeatmap"), "codec must be one of"),
])
def test_n10_n23_a_bad_recorded_spec_is_refused_naming_the_file(ap10k_export, tmp_path, change, message):
    from vitpose.inference.onnx import OnnxPredictor

    _, path = ap10k_export
    bad = rewrite_metadata(path, tmp_path / "bad.onnx", {"vitpose.model_spec": _spec_with(path, **change)})
    with pytest.raises(SpecError, match=message) as err:
        OnnxPredictor(bad)
    assert str(bad) in str(err.value) and "vitpose.model_spec" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("key, value, message", [
    ("vitpose.flip_indices", "[0, 2", "vitpose.flip_indices is not valid JSON"),
    ("vitpose.flip_indices", json.dumps([0] * 17), "not a set of swaps"),
    ("vitpose.pixel_std", "[0, 0, 0]", "pixel_std must be three positive"),
    ("vitpose.pixel_mean", '"abc"', "pixel_mean must be three finite"),
    ("vitpose.flip_test", "yes", "vitpose.flip_test must be 0 or 1"),
])
def test_n10_n23_bad_loose_keys_of_older_files_are_refused_naming_the_file(ap10k_export, tmp_path, key, value,
                                                                           message):
    from vitpose.inference.onnx import OnnxPredictor

    _, path = ap10k_export
    bad = rewrite_metadata(path, tmp_path / "bad_old.onnx", {"vitpose.num_keypoints": "17", key: value})
    with pytest.raises(SpecError, match=message) as err:
        OnnxPredictor(bad)
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


def test_n10_a_graph_said_to_hold_the_flip_test_that_does_not_is_refused(ap10k_export, tmp_path):
    from vitpose.inference.onnx import OnnxPredictor

    _, path = ap10k_export
    meta = onnx_metadata(path)
    facts = {**json.loads(meta["vitpose.export"]), "flip_test": True}
    lying = rewrite_metadata(path, tmp_path / "lying.onnx", {**meta, "vitpose.export": json.dumps(facts)})
    with pytest.raises(SpecError, match="not mirror-symmetric"):
        OnnxPredictor(lying)


def test_a_graph_with_the_flip_test_inside_passes_the_symmetry_probe(tmp_path):
    pytest.importorskip("onnxruntime")
    from vitpose.inference.export import to_onnx
    from vitpose.inference.onnx import OnnxPredictor

    model = tiny_model(7).eval()
    crops = torch.from_numpy(np.random.default_rng(8).integers(0, 256, (2, 3, 256, 192), dtype=np.uint8))
    to_onnx(model, tmp_path / "flip.onnx", flip_test=True, crops=crops, log=None)
    assert OnnxPredictor(tmp_path / "flip.onnx").graph_flips


def test_n23_read_export_spec_names_the_file(tmp_path):
    from vitpose.inference.export import PT2_SPEC_FILE, read_export_spec

    class Tiny(torch.nn.Module):
        def forward(self, x):
            return x * 2

    program = torch.export.export(Tiny(), (torch.zeros(1, 3),))
    for text, message in (("{not json", "not valid JSON"), ("[1, 2]", "expected a mapping")):
        path = tmp_path / "bad.pt2"
        torch.export.save(program, str(path), extra_files={PT2_SPEC_FILE: text})
        with pytest.raises(SpecError, match=message) as err:
            read_export_spec(path)
        assert str(path) in str(err.value) and "\n" not in str(err.value)


# -- round 3, row 108: NaN / Inf weights and a non-finite PyTorch reference ------------------------------

def test_108_nan_weights_are_refused_before_the_export(tmp_path):
    from vitpose.inference.export import to_onnx

    model = tiny_model(9).eval()
    with torch.no_grad():
        model.head.final_layer.bias[3] = float("nan")
    with pytest.raises(UserError, match=r"NaN/Inf values \(first in head\.final_layer\.bias") as err:
        to_onnx(model, tmp_path / "nan.onnx", log=None)
    assert "differs" not in str(err.value) and not (tmp_path / "nan.onnx").exists()


def test_108_the_gate_says_pytorchs_own_output_is_not_finite():
    from vitpose.inference.export import GateReport, _compare

    reference = np.random.default_rng(0).standard_normal((1, 17, 64, 48)).astype(np.float32)
    exported = reference.copy()
    reference[0, 2, 5, 5] = np.inf
    run = _compare(reference, exported, UDPHeatmap(), 1e-4, ["crop 0"])
    report = GateReport(path="x.onnx", format="onnx", runtime="ort", precision="float32", source="s",
                        input_shape=[1, 3, 256, 192], runs=[run])
    text = "\n".join(report.lines())
    assert not report.passed and report.reference_nonfinite and run.reference_nonfinite == 1
    assert "PyTorch's own heatmaps are not finite" in text and "gate FAILED: PyTorch's own output" in text


def test_108_cli_export_of_nan_weights_is_one_line(tmp_path, capsys):
    from vitpose.cli import main

    model = tiny_model(10).eval()
    with torch.no_grad():
        model.backbone.pos_embed[0, 0, 0] = float("inf")
    path = save_weights(model, tmp_path / "inf.safetensors")
    status = main(["export", "--model", str(path), "--out", str(tmp_path / "inf.pt2")])
    err = capsys.readouterr().err
    assert status == 2 and "NaN/Inf values (first in backbone.pos_embed" in err and "Traceback" not in err
    assert not (tmp_path / "inf.pt2").exists()


# ----------------------------------------------------------------------------------------------
# One flip average: numpy, eager torch, torch.export and ONNX give the same bits


class ExactMaps(torch.nn.Module):
    """(N, 3, h, w) -> (N, 17, h, w) by multiplying input channels by small integers: exact in float32 on
    every runtime, so any difference downstream is the flip test's own arithmetic."""

    def forward(self, x):
        return torch.cat([x[:, k % 3:k % 3 + 1] * float(k + 1) for k in range(17)], dim=1)


@pytest.mark.parametrize("shift", [False, True])
def test_the_flip_average_has_one_definition_across_runtimes(tmp_path, shift):
    from vitpose.inference.export import ExportGraph

    flip = list(dataset_info("ap10k").flip_indices)
    x = torch.from_numpy(np.random.default_rng(11).standard_normal((3, 3, 16, 12)).astype(np.float32))
    model = ExactMaps()
    eager = vitpose.flip_test(model, x, flip, shift)
    # By hand: the definition (mirror, swap, shift one column right keeping the first, average).
    n = len(x)
    both = model(torch.cat([x, x.flip(-1)])).numpy()
    back = both[n:][:, flip, :, ::-1]
    if shift:
        back = np.concatenate([back[..., :1], back[..., :-1]], axis=-1)
    np.testing.assert_array_equal(eager.numpy(), (both[:n] + back) * np.float32(0.5))
    # numpy and torch flip_average: the same bits.
    np.testing.assert_array_equal(flip_average(both[:n], both[n:], flip, shift),
                                  flip_average(torch.from_numpy(both[:n]), torch.from_numpy(both[n:]), flip,
                                               shift).numpy())
    # torch.export of the graph `vitpose export --flip-test` writes.
    graph = ExportGraph(model, flip_test=True, flip_indices=flip, flip_shift=shift).eval()
    program = torch.export.export(graph, (x,), dynamic_shapes={"images": {0: torch.export.Dim("batch", min=1)}},
                                  strict=False).module()
    assert torch.equal(program(x), eager)
    # ONNX: the graph with the flip inside (onnxruntime), and the plain graph + OnnxPredictor's numpy average.
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    for flips in (True, False):
        path = tmp_path / f"flip{int(flips)}.onnx"
        plain = ExportGraph(model, flip_test=flips, flip_indices=flip, flip_shift=shift).eval()
        onnx_program = torch.onnx.export(plain, (x,), None, dynamo=True, input_names=["input"],
                                         output_names=["heatmaps"],
                                         dynamic_shapes={"images": {0: torch.export.Dim("batch", min=1)}})
        onnx_program.save(str(path))
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        if flips:
            out = session.run(None, {"input": x.numpy()})[0]
        else:
            from vitpose.inference.onnx import OnnxPredictor

            predictor = OnnxPredictor.__new__(OnnxPredictor)  # only the network step, on this session
            predictor.session, predictor.input_name, predictor.graph_batch = session, "input", None
            predictor.mean, predictor.std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
            predictor.flip_test, predictor.graph_flips, predictor.flip_indices = True, False, flip
            predictor.codec = MSRAHeatmap() if shift else UDPHeatmap()
            out = predictor._run(np.concatenate([x.numpy(), x.numpy()[..., ::-1]]))
            out = flip_average(out[:n], out[n:], flip, predictor.codec.flip_shift)
        np.testing.assert_array_equal(out, eager.numpy())


def test_onnx_predictor_averages_with_flip_average(monkeypatch):
    """OnnxPredictor.heatmaps on a stand-in network equals the eager flip test of the same network."""
    from vitpose.inference.onnx import OnnxPredictor

    model = ExactMaps()
    predictor = OnnxPredictor.__new__(OnnxPredictor)
    predictor.mean, predictor.std = ODD_MEAN, ODD_STD
    predictor.flip_test, predictor.graph_flips = True, False
    predictor.flip_indices = list(dataset_info("coco").flip_indices)
    predictor.codec = MSRAHeatmap()
    monkeypatch.setattr(predictor, "_run", lambda x: model(torch.from_numpy(np.ascontiguousarray(x))).numpy(),
                        raising=False)
    crops = np.random.default_rng(12).integers(0, 256, (2, 3, 16, 12), dtype=np.uint8)
    x = normalize_images(torch.from_numpy(crops), ODD_MEAN, ODD_STD)
    expected = vitpose.flip_test(model, x, predictor.flip_indices, shift=True).numpy()
    np.testing.assert_array_equal(predictor.heatmaps(crops), expected)


# ----------------------------------------------------------------------------------------------
# One decode, the rescoring rule outside evaluation


def test_inference_does_not_import_evaluation():
    code = ("import sys; import vitpose.inference.pipeline, vitpose.inference.onnx; "
            "print(sorted(m for m in sys.modules if m.startswith('vitpose.evaluation')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_rescoring_rule_is_one_function_importable_from_evaluation():
    from vitpose.codecs.decode import instance_scores
    from vitpose.evaluation.coco_evaluator import instance_scores as old_name

    assert old_name is instance_scores
    scores = np.array([[0.1, 0.2, 0.9]], np.float32)
    # float32(0.2) > 0.2 in float64, as MMPose compares: the mean of (0.2000000030, 0.9) times the box score.
    f = np.float32
    np.testing.assert_allclose(instance_scores(scores, [0.5]), [0.5 * (float(f(0.2)) + float(f(0.9))) / 2],
                               rtol=1e-15)


def test_validation_and_prediction_decode_the_same_way(monkeypatch):
    """Given the same heatmaps, the validation loop and the TopDown pipeline map them to the same pixels."""
    from vitpose.codecs.decode import decode_to_image
    from vitpose.engine import evaluate as ev
    from vitpose.inference.pipeline import TopDown

    heatmaps = np.random.default_rng(13).random((2, 17, 64, 48)).astype(np.float32)
    center = np.array([[100.0, 120.0], [50.0, 60.0]], np.float32)
    scale = np.array([[150.0, 200.0], [75.0, 100.0]], np.float32)
    codec = MSRAHeatmap()
    meta = {"id": np.array([1, 2]), "image_id": np.array([1, 1]), "center": center, "scale": scale,
            "bbox_score": np.ones(2), "area": np.ones(2)}
    validation = np.stack([p["keypoints"] for p in ev._decode(torch.from_numpy(heatmaps), None, meta, codec)])

    class Stub(TopDown):
        def run_network(self, crops):
            return heatmaps

    stub = Stub()
    stub.codec, stub.batch_size, stub.timer = codec, 8, StageTimer()
    prediction, _ = stub._keypoints_of_crops(np.zeros((2, 3, 256, 192), np.uint8), center, scale)
    expected, _ = decode_to_image(codec, heatmaps, center, scale)
    np.testing.assert_array_equal(validation, expected)
    np.testing.assert_array_equal(prediction, expected)
    size = np.array([192.0, 256.0])
    by_hand = codec.batch_decode(heatmaps)[0] / size * scale[:, None] + center[:, None] - 0.5 * scale[:, None]
    np.testing.assert_allclose(expected, by_hand, rtol=0, atol=1e-4)
