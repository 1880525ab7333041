"""vitpose.models.hub without any network: local caches laid out exactly as torch.hub's and the HF Hub's.

- The name table equals MMPose 1.3.2's model-zoo metadata (URLs, hash prefixes, AP) and covers
  every size and decoder.
- `download()` finds cached files with the network refused (sockets fail, HF_HUB_OFFLINE=1 in a
  fresh process), checks a torch.hub download's SHA-256 prefix (a file:// URL), and says what to
  fetch when a file is neither cached nor reachable.
- `model_spec` reads size, decoder and K from tensor names and shapes in every layout.
- `Predictor.from_pretrained` by name from a filled HF cache gives the same poses as the same
  weights loaded by hand; ViTPose+ names need issue 11's `expert=`.
"""

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO
from weights_recipe import load_spec

import vitpose
from vitpose.models import hub
from vitpose.models.hub import DownloadError, ModelInfo, ModelSpec, UnknownModelError

SIZES = ("vitpose-s", "vitpose-b", "vitpose-l", "vitpose-h")
REF_YML = (Path.home() / ".cache/mmpose-ref-venv/lib/python3.11/site-packages/mmpose/.mim/configs"
           / "body_2d_keypoint/topdown_heatmap/coco/vitpose_coco.yml")


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Every socket connection fails: a test that reached for the network would error out."""
    def refuse(*args, **kwargs):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """Fresh torch.hub and HF caches under tmp_path (both libraries read these at call time here)."""
    import huggingface_hub.constants as hf_constants

    torch_home, hf_cache = tmp_path / "torch", tmp_path / "hf"
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hf_cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    return torch_home, hf_cache


def fill_hf_cache(hf_cache: Path, repo_id: str, payload: bytes, revision: str = "a" * 40) -> Path:
    """The HF cache layout: blobs/<sha256>, snapshots/<rev>/model.safetensors -> blob, refs/main."""
    repo = hf_cache / ("models--" + repo_id.replace("/", "--"))
    blob = repo / "blobs" / hashlib.sha256(payload).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(payload)
    snapshot = repo / "snapshots" / revision / "model.safetensors"
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def fill_torch_hub(torch_home: Path, filename: str, payload: bytes) -> Path:
    path = torch_home / "hub" / "checkpoints" / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return path


# -- the table -----------------------------------------------------------------------------------

def test_every_size_and_decoder_has_a_coco_name():
    models = hub.list_models()
    assert len({m.name for m in models}) == len(models)
    for size in SIZES:
        for decoder in ("classic", "simple"):
            assert any(m.size == size and m.decoder == decoder and m.dataset == "coco" and not m.plus
                       for m in models), (size, decoder)
    assert {m.source for m in models} == {"mmpose", "huggingface"}
    for m in models:
        if m.source == "mmpose":
            # The digits torch.hub checks are the ones OpenMMLab put in the file name.
            assert f"-{m.sha256_prefix}_" in m.filename and len(m.sha256_prefix) == 8
            assert m.location.startswith("https://download.openmmlab.com/mmpose/v1/")
        else:
            assert m.location.startswith("usyd-community/vitpose-") and m.filename == "model.safetensors"
    assert hub.lookup("vitpose-b-simple").location == "usyd-community/vitpose-base-simple"
    table = hub.format_model_table()
    assert all(m.name in table for m in models)


def test_mmpose_names_equal_mmpose_model_zoo():
    """URLs, sizes, decoders and AP of the MMPose entries equal MMPose 1.3.2's vitpose_coco.yml."""
    if not REF_YML.is_file():
        pytest.skip(f"MMPose reference venv not found ({REF_YML})")
    import yaml

    zoo = yaml.safe_load(REF_YML.read_text())["Models"]
    size_of = {"Small": "vitpose-s", "Base": "vitpose-b", "Large": "vitpose-l", "Huge": "vitpose-h"}
    expected = {}
    for entry in zoo:
        decoder = "simple" if "Simple Head" in entry["Metadata"]["Architecture"] else "classic"
        expected[entry["Weights"]] = (size_of[entry["Metadata"]["Model Size"]], decoder,
                                      entry["Results"][0]["Metrics"]["AP"])
    mine = {m.location: (m.size, m.decoder, m.coco_ap) for m in hub.list_models() if m.source == "mmpose"}
    assert mine == expected


def test_unknown_name_lists_the_names(tmp_path):
    with pytest.raises(UnknownModelError) as err:
        hub.download("vitpose-x")
    message = str(err.value)
    assert "'vitpose-x'" in message
    assert all(m.name in message for m in hub.list_models())
    with pytest.raises(UnknownModelError, match="did you mean vitpose-b-simple"):
        hub.download("vitpose-b-simp")
    # Something that looks like a path is a missing file, not an unknown name.
    with pytest.raises(FileNotFoundError, match="nope.pth"):
        hub.download(tmp_path / "nope.pth")


def test_own_file_passes_through(tmp_path):
    path = tmp_path / "mine.pth"
    path.write_bytes(b"anything")
    assert hub.download(path) == path
    assert hub.download(str(path)) == path


# -- offline ---------------------------------------------------------------------------------------

def test_cached_files_are_found_without_network(caches, monkeypatch):
    torch_home, hf_cache = caches
    snapshot = fill_hf_cache(hf_cache, "usyd-community/vitpose-base-simple", b"hf bytes")
    info = hub.lookup("vitpose-s")
    cached = fill_torch_hub(torch_home, info.filename, b"mmpose bytes")

    def must_not_download(*args, **kwargs):
        raise AssertionError("downloader called for a cached file")

    monkeypatch.setattr(torch.hub, "download_url_to_file", must_not_download)
    assert hub.download("vitpose-s") == cached
    # With the network refused but HF_HUB_OFFLINE unset, HF falls back to its cache.
    assert hub.download("vitpose-b-simple").resolve() == snapshot.resolve()
    assert hub.download("vitpose-b-simple").read_bytes() == b"hf bytes"


SUBPROCESS_PROBE = r"""
import json, socket, sys
def refuse(*a, **k):
    raise OSError("network disabled")
socket.socket.connect = refuse
socket.create_connection = refuse
import vitpose  # `vitpose.hub` as users write it
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = ["ok", str(vitpose.hub.download(name, progress=False))]
    except Exception as e:
        out[name] = [type(e).__name__, str(e)]
print(json.dumps(out))
"""


def test_offline_env_in_a_fresh_process(tmp_path):
    """HF_HUB_OFFLINE=1, HF_HUB_CACHE and TORCH_HOME as a user sets them (read at import time)."""
    torch_home, hf_cache = tmp_path / "torch", tmp_path / "hf"
    snapshot = fill_hf_cache(hf_cache, "usyd-community/vitpose-base-simple", b"hf bytes")
    cached = fill_torch_hub(torch_home, hub.lookup("vitpose-s").filename, b"mmpose bytes")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hf_cache), "TORCH_HOME": str(torch_home),
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    names = ["vitpose-b-simple", "vitpose-s", "vitpose-b", "vitpose-l"]
    run = subprocess.run([sys.executable, "-c", SUBPROCESS_PROBE, *names], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["vitpose-b-simple"] == ["ok", str(snapshot)]
    assert out["vitpose-s"] == ["ok", str(cached)]
    # Not cached: the message says what to fetch and where it goes.
    kind, message = out["vitpose-b"]
    assert kind == "DownloadError" and "HF_HUB_OFFLINE is set" in message
    assert "hf download usyd-community/vitpose-base model.safetensors" in message and str(hf_cache) in message
    kind, message = out["vitpose-l"]
    large = hub.lookup("vitpose-l")
    assert kind == "DownloadError" and large.location in message
    assert str(torch_home / "hub" / "checkpoints" / large.filename) in message


def test_offline_torch_hub_name_is_not_downloaded(caches, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(torch.hub, "download_url_to_file", lambda *a, **k: pytest.fail("downloaded offline"))
    with pytest.raises(DownloadError, match="HF_HUB_OFFLINE is set: fetch https://download.openmmlab.com"):
        hub.download("vitpose-h")


def test_unreachable_server_says_what_to_fetch(caches):
    torch_home, _ = caches
    with pytest.raises(DownloadError, match="could not be downloaded") as err:
        hub.download("vitpose-h-simple", progress=False)
    assert f"curl -L --create-dirs -o {torch_home}" in str(err.value)
    assert not list((torch_home / "hub" / "checkpoints").glob("*"))


def test_torch_hub_download_checks_the_sha256_prefix(caches, tmp_path, monkeypatch):
    torch_home, _ = caches
    server = tmp_path / "server"
    server.mkdir()
    payload = b"weights of a test-only model"
    digest = hashlib.sha256(payload).hexdigest()[:8]
    source = server / f"td-hm_test-{digest}_20240101.pth"
    source.write_bytes(payload)
    good = ModelInfo("test-good", "vitpose-s", "classic", "coco", "mmpose", source.as_uri(), digest)
    bad = ModelInfo("test-bad", "vitpose-s", "classic", "coco", "mmpose", source.as_uri(), "0badc0de")
    monkeypatch.setitem(hub.MODELS, "test-bad", bad)
    monkeypatch.setitem(hub.MODELS, "test-good", good)

    with pytest.raises(DownloadError, match="failed its SHA-256 check"):
        hub.download("test-bad", progress=False)
    checkpoints = torch_home / "hub" / "checkpoints"
    assert not list(checkpoints.iterdir())  # neither the file nor a temporary one is left

    path = hub.download("test-good", progress=False)
    assert path == checkpoints / source.name and path.read_bytes() == payload
    source.unlink()  # the "server" is gone: the cache answers
    assert hub.download("test-good", progress=False) == path


# -- what to build -------------------------------------------------------------------------------

@pytest.mark.parametrize("decoder", ["classic", "simple"])
@pytest.mark.parametrize("layout", ["mmpose1x", "official0x", "hf"])
def test_spec_from_the_published_layouts(fixtures_dir, layout, decoder):
    shapes = {e["name"]: tuple(e["shape"]) for e in load_spec(fixtures_dir, decoder, layout)}
    assert hub.spec_from_shapes(shapes) == ModelSpec("vitpose-s", decoder, 17, None)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("decoder", ["classic", "simple"])
def test_spec_of_every_size_in_own_layout(size, decoder):
    with torch.device("meta"):  # shapes only, no memory
        model = vitpose.build_model(size, decoder=decoder, num_keypoints=133 if size == "vitpose-h" else 17)
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    assert hub.spec_from_shapes(shapes) == ModelSpec(size, decoder, 133 if size == "vitpose-h" else 17)


def test_spec_of_a_vitpose_plus_file_and_of_other_files():
    with torch.device("meta"):
        model = vitpose.build_model("vitpose-b")
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    plus = {**shapes, "backbone.blocks.0.mlp.experts.0.weight": (192, 3072)}
    assert hub.spec_from_shapes(plus) == ModelSpec("vitpose-b", "classic", 17, "coco")
    odd = {n: s for n, s in shapes.items() if not n.startswith("backbone.blocks.11.")}
    with pytest.raises(ValueError, match="width 768 and 11 blocks is none of"):
        hub.spec_from_shapes(odd, origin="odd.pth")
    with pytest.raises(ValueError, match="not a ViTPose checkpoint"):
        hub.spec_from_shapes({"fc.weight": (10, 5)})


def test_tensor_shapes_of_wrapped_files(tmp_path):
    model = vitpose.build_model("vitpose-s", decoder="simple", depth=1)
    state = {"module." + n: t for n, t in model.state_dict().items()}
    torch.save({"meta": {"epoch": 3}, "state_dict": state}, tmp_path / "wrapped.pth")
    shapes = hub.tensor_shapes(tmp_path / "wrapped.pth")
    assert shapes == {n: tuple(t.shape) for n, t in model.state_dict().items()}
    vitpose.save_weights(model, tmp_path / "w.safetensors")
    assert hub.tensor_shapes(tmp_path / "w.safetensors") == shapes
    (tmp_path / "junk.pth").write_bytes(b"<html>not found</html>")
    with pytest.raises(Exception, match="junk.pth: not a readable checkpoint"):
        hub.tensor_shapes(tmp_path / "junk.pth")


def test_spec_of_names_and_files(tmp_path):
    assert hub.model_spec("vitpose-l-simple") == ModelSpec("vitpose-l", "simple", 17, None)
    assert hub.model_spec("vitpose-plus-b") == ModelSpec("vitpose-b", "classic", 17, "coco")
    assert hub.model_spec("vitpose-plus-b", expert="aic").expert == "aic"
    with pytest.raises(ValueError, match="expert must be one of coco, aic, mpii, ap10k, apt36k, coco_wholebody"):
        hub.model_spec("vitpose-plus-b", expert="cocoa")
    with pytest.raises(ValueError, match="vitpose-s is not a ViTPose"):
        hub.model_spec("vitpose-s", expert="coco")
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "classifier.pth")
    with pytest.raises(ValueError, match="classifier.pth: not a ViTPose checkpoint"):
        hub.model_spec(tmp_path / "classifier.pth")


# -- from_pretrained -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_simple_weights(tmp_path_factory):
    """Random ViT-S simple-decoder weights (the smallest published architecture), own layout."""
    torch.manual_seed(5)
    model = vitpose.build_model("vitpose-s", decoder="simple")
    path = tmp_path_factory.mktemp("weights") / "vitpose-s-simple.safetensors"
    vitpose.save_weights(model, path)
    return path


def test_from_pretrained_by_name_from_the_hf_cache(caches, monkeypatch, small_simple_weights):
    _, hf_cache = caches
    monkeypatch.setitem(hub.MODELS, "test-small", ModelInfo("test-small", "vitpose-s", "simple", "coco",
                                                            "huggingface", "test-org/vitpose-small-simple"))
    fill_hf_cache(hf_cache, "test-org/vitpose-small-simple", small_simple_weights.read_bytes())
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (120, 90, 3), dtype=np.uint8)
    options = {"detector": "full-frame", "device": "cpu", "flip_test": False}
    by_name = vitpose.Predictor.from_pretrained("test-small", **options)
    by_path = vitpose.Predictor.from_pretrained(small_simple_weights, **options)  # size and decoder from the file
    model = vitpose.build_model("vitpose-s", decoder="simple")
    vitpose.load_weights(model, small_simple_weights)
    by_hand = vitpose.Predictor(model, device="cpu", flip_test=False).predict(image, [[0, 0, 90, 120]])
    for predictor in (by_name, by_path):
        poses = predictor(image)
        np.testing.assert_array_equal(poses.boxes, [[0, 0, 90, 120]])
        np.testing.assert_array_equal(poses.keypoints, by_hand[0])
        np.testing.assert_array_equal(poses.keypoint_scores, by_hand[1])


def test_plus_names_need_expert_support(caches, monkeypatch):
    """ViTPose+ files load one expert through load_weights(..., expert=)."""
    _, hf_cache = caches
    fill_hf_cache(hf_cache, "usyd-community/vitpose-plus-small", b"not read here")
    import vitpose.models.checkpoint as checkpoint
    import vitpose.models.vitpose as models

    build = models.build_model
    monkeypatch.setattr(models, "build_model", lambda *a, **k: build(*a, **k, depth=1))  # fast: one block

    calls = []

    def with_expert(model, source, strict=True, expert=None):
        calls.append((type(model).__name__, Path(source).name, expert, model.backbone.embed_dim))

    monkeypatch.setattr(checkpoint, "load_weights", with_expert)
    vitpose.Predictor.from_pretrained("vitpose-plus-s", detector=None, device="cpu")
    vitpose.Predictor.from_pretrained("vitpose-plus-s", detector=None, device="cpu", expert="aic")
    assert calls == [("ViTPose", "model.safetensors", "coco", 384), ("ViTPose", "model.safetensors", "aic", 384)]
