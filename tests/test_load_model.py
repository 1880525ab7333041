"""Self-describing weights and the one way from a name to a model (`vitpose.load_model`).

- A file this project writes (save_weights, a training checkpoint, an export) records its ModelSpec;
  `vitpose.load_model(path)` alone rebuilds the model with its K, input size, codec and skeleton
  (flip indices, limbs), and `Predictor(path)` flips with that skeleton's order.
- Files made elsewhere: the skeleton by K (COCO-WholeBody for 133) or a one-line request for a config.
- HF repo ids `org/repo` and `org/repo@REVISION` load offline from a local cache laid out like the Hub's.
- Downloads never hang: a server that accepts and never answers ends in one line with the URL and
  the manual fix; a cached download that cannot be read says to delete it.
- One explanation of refused pickles for load_weights, load_model/predict and training resume.
"""

import argparse
import hashlib
import json
import os
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO

import vitpose
from vitpose import hub
from vitpose.builders import skeleton_data
from vitpose.data import dataset_info
from vitpose.models.checkpoint import CheckpointError, read_weights
from vitpose.models.loading import load_weights
from vitpose.models.spec import METADATA_KEY, ModelSpec, SpecError, spec_of_model

TINY = dict(depth=1, embed_dim=48, num_heads=2, img_size=(64, 48))


def tiny(num_keypoints, seed=0, decoder="simple"):
    torch.manual_seed(seed)
    return vitpose.build_model("vitpose-s", decoder, num_keypoints, **TINY).eval()


@pytest.fixture(scope="module")
def k5_skeleton():
    return dataset_info(REPO / "configs" / "demo_k5_skeleton.yaml")


# -- the spec as data --------------------------------------------------------------------------------

def test_spec_round_trips_through_json_and_rebuilds_the_model(k5_skeleton):
    model = tiny(5, decoder="classic")
    spec = spec_of_model(model, skeleton=skeleton_data(k5_skeleton), sigma=3.0)
    again = ModelSpec.from_json(spec.to_json())
    assert again == spec and again.skeleton["flip_indices"] == [0, 2, 1, 4, 3]
    assert (spec.input_size, spec.heatmap_size, spec.depth, spec.embed_dim) == ((48, 64), (12, 16), 1, 48)
    rebuilt = again.build()
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    with pytest.raises(SpecError, match="unknown fields"):
        ModelSpec.from_dict({**spec.to_dict(), "colour": 1})
    with pytest.raises(SpecError, match="has 5 keypoints, the model 17"):
        spec.replace(num_keypoints=17)


# -- save_weights -> load_model ----------------------------------------------------------------------

def test_a_5_keypoint_model_loads_with_its_skeleton_from_the_file_alone(tmp_path, k5_skeleton):
    model = tiny(5, seed=1)
    path = vitpose.save_weights(model, tmp_path / "k5.safetensors",
                                spec=spec_of_model(model, skeleton=skeleton_data(k5_skeleton)))
    loaded = vitpose.load_model(path)
    assert loaded.spec.num_keypoints == 5 and loaded.codec.input_size == (48, 64)
    assert loaded.skeleton.flip_indices == k5_skeleton.flip_indices == (0, 2, 1, 4, 3)
    assert loaded.skeleton.skeleton == k5_skeleton.skeleton and loaded.skeleton.keypoint_names == k5_skeleton.keypoint_names
    for a, b in zip(loaded.model.state_dict().values(), model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    # Predictor(path): the flip test mirrors with the skeleton's pairs (not COCO's 17).
    predictor = vitpose.Predictor(path, device="cpu")
    assert predictor.skeleton == loaded.skeleton and predictor.flip_indices == [0, 2, 1, 4, 3]
    image = np.random.default_rng(0).integers(0, 255, (80, 60, 3), dtype=np.uint8)
    keypoints, scores = predictor.predict(image, [[0, 0, 60, 80]])
    assert keypoints.shape == (1, 5, 2)
    crops, _ = predictor.crops(image, *predictor.boxes_to_center_scale([[0, 0, 60, 80]]))
    x = vitpose.data.pixels.normalize_images(torch.from_numpy(np.ascontiguousarray(crops)))
    with torch.no_grad():
        mirrored = model(x.flip(-1)).flip(-1)
        by_hand = (model(x) + mirrored[:, [0, 2, 1, 4, 3]]) * 0.5
        wrong = (model(x) + mirrored[:, [0, 1, 2, 3, 4]]) * 0.5
    _, hand_scores = loaded.codec.batch_decode(by_hand.numpy())
    _, wrong_scores = loaded.codec.batch_decode(wrong.numpy())
    np.testing.assert_allclose(scores, hand_scores, rtol=1e-5)
    assert not np.allclose(scores, wrong_scores, rtol=1e-5)  # the pairs matter for this model


def test_a_wholebody_sized_model(tmp_path):
    wholebody = dataset_info("coco_wholebody")
    torch.manual_seed(2)  # ViT-S dims (a file without a spec is read by its shapes: S has 12 heads), one block
    model = vitpose.build_model("vitpose-s", "simple", 133, depth=1, img_size=(64, 48)).eval()
    recorded = vitpose.save_weights(model, tmp_path / "wb.safetensors",
                                    spec=spec_of_model(model, skeleton=skeleton_data(wholebody)))
    from safetensors.torch import save_file

    bare = tmp_path / "bare.safetensors"  # the same tensors with no spec, as a file made elsewhere
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(bare))
    for path in (recorded, bare):
        loaded = vitpose.load_model(path)
        assert loaded.spec.num_keypoints == 133 and loaded.skeleton.name == "coco_wholebody"
        assert loaded.skeleton.flip_indices == wholebody.flip_indices
        assert len(loaded.skeleton.skeleton) == len(wholebody.skeleton) == 65
        assert loaded.codec.input_size == (48, 64) and loaded.spec.depth == 1


def test_a_file_that_does_not_say_its_skeleton_asks_for_the_config(tmp_path):
    from safetensors.torch import save_file

    def bare(name, model):
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / name))
        return tmp_path / name

    vit_s = bare("k5-vit-s.safetensors", vitpose.build_model("vitpose-s", "simple", 5, depth=1, img_size=(64, 48)))
    with pytest.raises(SpecError, match="a 5-keypoint model that does not say which keypoints it predicts.*config"):
        vitpose.load_model(vit_s)
    demo = bare("k5-demo.safetensors", vitpose.build_model(  # configs/demo_k5.yaml's model
        "vitpose-s", "classic", 5, embed_dim=128, depth=4, num_heads=4, deconv_channels=(64, 64), img_size=(128, 96)))
    with pytest.raises(CheckpointError, match="embed dim 128 is none of ViTPose's.*give the training config"):
        vitpose.load_model(demo)
    loaded = vitpose.load_model(demo, config=REPO / "configs" / "demo_k5.yaml")  # the config says
    assert loaded.skeleton.name == "demo_k5" and loaded.skeleton.flip_indices == (0, 2, 1, 4, 3)


def test_training_checkpoints_record_the_spec(tmp_path, k5_skeleton):
    from vitpose.builders import build_model_from_config
    from vitpose.config import load_config
    from vitpose.engine.trainer import checkpoint_payload

    cfg = load_config(REPO / "configs" / "demo_k5.yaml")
    model = build_model_from_config(cfg.model, k5_skeleton)

    class Schedule:
        def state_dict(self):
            return {}

    payload = checkpoint_payload(model, torch.optim.SGD(model.parameters(), lr=0.1), Schedule(),
                                 argparse.Namespace(scaler=None), vitpose.engine.trainer.TrainState(),
                                 cfg.to_dict())
    torch.save(payload, tmp_path / "best.pth")
    loaded = vitpose.load_model(tmp_path / "best.pth")
    assert loaded.spec == model.spec.replace() and loaded.skeleton.flip_indices == (0, 2, 1, 4, 3)
    assert loaded.codec.input_size == tuple(cfg.model.input_size) and loaded.spec.depth == cfg.model.extra["depth"]

    # A checkpoint written before specs existed records its config: that says the same.
    del payload[METADATA_KEY]
    torch.save(payload, tmp_path / "old.pth")
    old = vitpose.load_model(tmp_path / "old.pth")
    assert old.spec == loaded.spec and "training config" in old.spec.origin
    assert skeleton_data(old.skeleton) == skeleton_data(loaded.skeleton)


# -- names ---------------------------------------------------------------------------------------------

def test_names_are_case_insensitive_and_unknown_ones_get_the_closest(tmp_path):
    assert hub.lookup("ViTPose-B").name == "vitpose-b"
    with pytest.raises(hub.UnknownModelError) as err:
        vitpose.load_model("ViTPose-B-Simpel")
    message = str(err.value)
    assert "\n" not in message and "did you mean vitpose-b-simple" in message
    assert isinstance(err.value, vitpose.errors.UserError)
    with pytest.raises(FileNotFoundError, match="nope.pth"):
        vitpose.load_model(tmp_path / "nope.pth")


# -- HF repo ids from a local cache -----------------------------------------------------------------------

def _fill_hf(hf_cache: Path, repo_id: str, revision: str, files: dict[str, bytes], main: bool) -> None:
    """The Hub's cache layout: blobs/<sha256>, snapshots/<rev>/<file> -> blob, refs/main."""
    repo = hf_cache / ("models--" + repo_id.replace("/", "--"))
    for name, payload in files.items():
        blob = repo / "blobs" / hashlib.sha256(payload).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(payload)
        link = repo / "snapshots" / revision / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)


HF_CONFIG = {"model_type": "vitpose", "use_simple_decoder": True, "scale_factor": 4,
             "backbone_config": {"model_type": "vitpose_backbone", "hidden_size": 384, "num_hidden_layers": 1,
                                 "num_attention_heads": 6, "mlp_ratio": 4, "image_size": [256, 192],
                                 "patch_size": [16, 16], "num_experts": 1}}


def hf_layout(model) -> dict:
    """A one-block ViT-S simple model's tensors under HF transformers' VitPose names (q/k/v split,
    a 193-row position embedding whose row 0 is zero)."""
    names = {"backbone.patch_embed.proj": "backbone.embeddings.patch_embeddings.projection",
             "backbone.blocks.0.norm1": "backbone.encoder.layer.0.layernorm_before",
             "backbone.blocks.0.norm2": "backbone.encoder.layer.0.layernorm_after",
             "backbone.blocks.0.attn.proj": "backbone.encoder.layer.0.attention.output.dense",
             "backbone.blocks.0.mlp.fc1": "backbone.encoder.layer.0.mlp.fc1",
             "backbone.blocks.0.mlp.fc2": "backbone.encoder.layer.0.mlp.fc2",
             "backbone.norm": "backbone.layernorm", "head.final_layer": "head.conv"}
    out = {}
    for name, tensor in model.state_dict().items():
        stem, kind = name.rsplit(".", 1)
        if name == "backbone.pos_embed":
            out["backbone.embeddings.position_embeddings"] = torch.cat([torch.zeros_like(tensor[:, :1]), tensor], 1)
        elif stem == "backbone.blocks.0.attn.qkv":
            for part, chunk in zip(("query", "key", "value"), tensor.chunk(3)):
                out[f"backbone.encoder.layer.0.attention.attention.{part}.{kind}"] = chunk.contiguous()
        else:
            out[f"{names[stem]}.{kind}"] = tensor
    return out


@pytest.fixture
def offline_hf(tmp_path, monkeypatch):
    """usyd-community/vitpose-base-simple in a local HF cache: two commits of random one-block, 6-head
    ViT-S simple models in HF's layout (main = rev a, and rev b), HF_HUB_OFFLINE=1. -> {revision: model}"""
    import huggingface_hub.constants as hf_constants
    from safetensors.torch import save

    hf_cache = tmp_path / "hf"
    models = {}
    for seed, revision in ((7, "a" * 40), (8, "b" * 40)):
        torch.manual_seed(seed)
        # 6 heads, not ViT-S's 12: no shape holds the head count, only config.json says it
        models[revision] = vitpose.build_model("vitpose-s", "simple", depth=1, num_heads=6).eval()
        files = {"model.safetensors": save(hf_layout(models[revision])), "config.json": json.dumps(HF_CONFIG).encode()}
        _fill_hf(hf_cache, "usyd-community/vitpose-base-simple", revision, files, main=revision == "a" * 40)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hf_cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return models


def test_from_pretrained_with_an_hf_repo_id_and_revision_offline(offline_hf):
    image = np.random.default_rng(1).integers(0, 255, (128, 96, 3), dtype=np.uint8)
    options = dict(detector="full-frame", device="cpu", flip_test=False)
    for source, revision in (("usyd-community/vitpose-base-simple", "a" * 40),
                             ("usyd-community/vitpose-base-simple@" + "b" * 40, "b" * 40)):
        predictor = vitpose.Predictor.from_pretrained(source, **options)
        assert predictor.skeleton.name == "coco" and predictor.model.backbone.blocks[0].attn.num_heads == 6
        by_hand = vitpose.Predictor(offline_hf[revision], device="cpu", flip_test=False)
        expected = by_hand.predict(image, [[0, 0, 96, 128]])
        poses = predictor(image)
        np.testing.assert_array_equal(poses.keypoints, expected[0])
        np.testing.assert_array_equal(poses.keypoint_scores, expected[1])
    a, b = (vitpose.load_model("usyd-community/vitpose-base-simple" + at).model for at in ("", "@" + "b" * 40))
    assert not torch.equal(a.head.final_layer.weight, b.head.final_layer.weight)  # two commits, two models
    with pytest.raises(hub.DownloadError, match="not in the Hugging Face cache.*HF_HUB_OFFLINE is set"):
        vitpose.load_model("usyd-community/vitpose-huge-simple")


def test_a_cached_download_that_cannot_be_read_says_delete_it(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    hf_cache = tmp_path / "hf"
    _fill_hf(hf_cache, "usyd-community/vitpose-base-simple", "c" * 40, {"model.safetensors": b"\x00" * 100}, True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hf_cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CheckpointError, match="cached download.*delete .*model.safetensors and run again"):
        vitpose.load_model("vitpose-b-simple")


# -- downloads that never hang ---------------------------------------------------------------------------

@pytest.fixture
def silent_server():
    """A local TCP server that accepts every connection and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted, stop = [], threading.Event()

    def accept():
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


def test_a_stalled_mmpose_download_ends_in_one_line(silent_server, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("VITPOSE_DOWNLOAD_TIMEOUT", "0.3")
    monkeypatch.setenv("VITPOSE_DOWNLOAD_TRIES", "2")
    url = f"{silent_server}/td-hm_test-0badc0de_20240101.pth"
    monkeypatch.setitem(hub.MODELS, "test-stalled", hub.ModelInfo("test-stalled", "vitpose-s", "classic", "coco",
                                                                  "mmpose", url, "0badc0de"))
    start = time.monotonic()
    with pytest.raises(hub.DownloadError) as err:
        vitpose.load_model("test-stalled")
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "\n" not in message and "after 2 tries with a 0.3 s timeout" in message
    assert url in message and "curl -L --create-dirs -o" in message
    assert not list((tmp_path / "torch" / "hub" / "checkpoints").glob("*"))  # no partial file left


def test_a_stalled_hf_download_ends_in_one_line(silent_server, tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "ENDPOINT", silent_server)
    monkeypatch.setattr(hf_constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.3)
    monkeypatch.setenv("VITPOSE_DOWNLOAD_TIMEOUT", "0.3")
    import huggingface_hub.utils._http as hf_http

    waits = []  # huggingface_hub's own back-off between its 5 retries: recorded, not slept
    monkeypatch.setattr(hf_http.time, "sleep", waits.append)
    start = time.monotonic()
    with pytest.raises(hub.DownloadError) as err:
        vitpose.load_model("test-org/vitpose-stalled")
    assert time.monotonic() - start < 10 and len(waits) == 5
    message = str(err.value)
    assert "\n" not in message and "hf download test-org/vitpose-stalled model.safetensors" in message
    assert "could not be reached (0.3 s timeout, retried)" in message


# -- refused pickles: one explanation ---------------------------------------------------------------------

def test_refused_pickles_are_explained_the_same_everywhere(tmp_path):
    from vitpose.engine.checkpoint import load_checkpoint

    path = tmp_path / "objects.pth"
    torch.save({"state_dict": tiny(17).state_dict(), "args": argparse.Namespace(lr=1)}, path)
    messages = []
    for attempt in (lambda: load_weights(tiny(17), path), lambda: vitpose.load_model(path),
                    lambda: vitpose.Predictor.from_pretrained(path, detector=None), lambda: load_checkpoint(path),
                    lambda: read_weights(path)):
        with pytest.raises(CheckpointError) as err:
            attempt()
        messages.append(str(err.value))
    assert len(set(messages)) == 1, messages
    assert "not a plain weights file" in messages[0] and "none of its code ran" in messages[0]
    assert "torch.save(torch.load(path, weights_only=False)['state_dict'], new_path)" in messages[0]


def test_the_recorded_spec_key_is_the_documented_one(tmp_path):
    path = vitpose.save_weights(tiny(17), tmp_path / "w.safetensors")
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        recorded = json.loads(f.metadata()[METADATA_KEY])
    assert recorded["num_keypoints"] == 17 and recorded["skeleton"] is None


# -- exports carry and use the skeleton's flip order ---------------------------------------------------

def test_an_ap10k_export_flips_with_ap10ks_order_and_the_gate_checks_it(tmp_path):
    from vitpose.inference.export import GateError, read_export_spec, to_exported_program

    ap10k = dataset_info("ap10k")
    assert ap10k.flip_indices != dataset_info("coco").flip_indices  # both 17 keypoints, other pairs
    model = tiny(17, seed=3)
    model.spec = spec_of_model(model, skeleton=skeleton_data(ap10k))
    crops = torch.from_numpy(np.random.default_rng(3).integers(0, 255, (3, 3, 64, 48), dtype=np.uint8))
    options = dict(flip_test=True, crops=crops, log=None)
    # A graph baked with COCO's left/right order differs from the model's own flip test: refused.
    with pytest.raises(GateError, match="gate FAILED") as err:
        to_exported_program(model, tmp_path / "coco-order.pt2", flip_indices=dataset_info("coco").flip_indices,
                            **options)
    where = err.value.report.runs[0].heatmap_where[1]  # the report names AP-10K's keypoints
    assert f"keypoint {where} ({ap10k.keypoint_names[where]})" in str(err.value)
    assert not (tmp_path / "coco-order.pt2").exists()
    report = to_exported_program(model, tmp_path / "ap10k.pt2", **options)  # the model's own order
    assert report.passed
    recorded = read_export_spec(tmp_path / "ap10k.pt2")
    assert recorded["skeleton"]["name"] == "ap10k" and recorded["skeleton"]["flip_indices"] == list(ap10k.flip_indices)
    program = torch.export.load(str(tmp_path / "ap10k.pt2")).module()
    x = vitpose.data.pixels.normalize_images(crops)
    with torch.no_grad():
        expected = vitpose.flip_test(model, x, flip_indices=ap10k.flip_indices)
        torch.testing.assert_close(program(x), expected, rtol=1e-4, atol=1e-4)

    # ONNX: the same spec in the metadata, and the flip order OnnxPredictor reads from it.
    pytest.importorskip("onnxruntime")
    from vitpose.inference.export import to_onnx
    from vitpose.inference.onnx import OnnxPredictor

    to_onnx(model, tmp_path / "ap10k.onnx", flip_test=False, crops=crops, log=None)
    assert read_export_spec(tmp_path / "ap10k.onnx") == recorded
    assert OnnxPredictor(tmp_path / "ap10k.onnx").flip_indices == list(ap10k.flip_indices)


def test_a_damaged_cached_file_with_a_known_hash_is_fetched_again(tmp_path, monkeypatch):
    """An MMPose name's file name carries its SHA-256 prefix: a cached copy that fails to load and
    to match it is replaced by a fresh download (here from a file:// "server")."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    model = vitpose.build_model("vitpose-s", "simple", depth=1, img_size=(64, 48))
    good = tmp_path / "server" / "td-hm_test.safetensors"
    vitpose.save_weights(model, good)
    digest = hashlib.sha256(good.read_bytes()).hexdigest()[:8]
    served = good.rename(good.with_name(f"td-hm_test-{digest}_20240101.safetensors"))
    info = hub.ModelInfo("test-damaged", "vitpose-s", "simple", "coco", "mmpose", served.as_uri(), digest)
    monkeypatch.setitem(hub.MODELS, "test-damaged", info)
    cached = hub.torch_hub_path(info)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(served.read_bytes()[:1000])  # an interrupted copy
    loaded = vitpose.load_model("test-damaged")
    assert cached.read_bytes() == served.read_bytes()
    torch.testing.assert_close(loaded.model.head.final_layer.weight, model.head.final_layer.weight)
    # Without a way to check it (no hash), the message says what to do.
    monkeypatch.setitem(hub.MODELS, "test-damaged", hub.ModelInfo(*[getattr(info, f) for f in (
        "name", "size", "decoder", "dataset", "source", "location")]))
    cached.write_bytes(b"\x00" * 100)
    with pytest.raises(CheckpointError, match=f"cached download that did not survive: delete {cached} and run again"):
        vitpose.load_model("test-damaged")


# -- vitpose predict --model FILE alone: the file's skeleton flips, draws and writes -----------------

@pytest.mark.parametrize("skeleton_name", ["k5", "coco_wholebody"])
def test_predict_with_the_weights_file_alone_uses_its_skeleton(tmp_path, k5_skeleton, skeleton_name, capsys):
    """`vitpose predict IMG --model FILE --detector full-frame --out D --json J` with no --config:
    the flip test runs with the file's flip pairs, the drawing with its limbs (K=5: COCO's limbs
    would be out of range; K=133: WholeBody's 65), and J has K keypoints per person."""
    import cv2

    from vitpose.cli import main

    info = k5_skeleton if skeleton_name == "k5" else dataset_info("coco_wholebody")
    model = tiny(len(info.keypoint_names), seed=3)
    path = vitpose.save_weights(model, tmp_path / "model.safetensors",
                                spec=spec_of_model(model, skeleton=skeleton_data(info)))
    image = np.random.default_rng(0).integers(0, 255, (80, 60, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "img.png"), image)
    status = main(["predict", str(tmp_path / "img.png"), "--model", str(path), "--detector", "full-frame",
                   "--out", str(tmp_path / "drawn"), "--json", str(tmp_path / "poses.json"), "--precision", "fp32"])
    assert status == 0, capsys.readouterr().err
    records = json.loads((tmp_path / "poses.json").read_text())
    assert len(records) == 1 and len(records[0]["keypoints"]) == 3 * len(info.keypoint_names)
    drawn = cv2.imread(str(tmp_path / "drawn" / "img.png"))
    assert drawn.shape == image.shape and (drawn != image).any()
    expected = vitpose.Predictor(path, device="cpu", flip_test=True, precision="fp32")(image[..., ::-1].copy(),
                                                                                        boxes=[[0, 0, 60, 80]])
    np.testing.assert_allclose(np.array(records[0]["keypoints"]).reshape(-1, 3)[:, :2], expected.keypoints[0],
                               rtol=0, atol=1e-3)
