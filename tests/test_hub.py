"""vitpose.hub without any network: local caches laid out exactly as torch.hub's and the HF Hub's.

- The name table equals MMPose 1.3.2's model-zoo metadata (URLs, hash prefixes, AP) and covers
  every size and decoder.
- `download()` finds cached files with the network refused (sockets fail, HF_HUB_OFFLINE=1 in a
  fresh process), checks a torch.hub download's SHA-256 prefix (a file:// URL), and says what to
  fetch when a file is neither cached nor reachable.
- `infer_model_spec` reads size, decoder and K from tensor names and shapes in every layout.
- `Predictor.from_pretrained` by name from a filled HF cache gives the same poses as the same
  weights loaded by hand; ViTPose+ names take `expert=` (COCO's by default).
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
from vitpose import hub
from vitpose.hub import DownloadError, ModelInfo, UnknownModelError
from vitpose.models.checkpoint import CheckpointError
from vitpose.models.layouts import infer_model_spec
from vitpose.models.vitpose import MODEL_SIZES

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
    monkeypatch.setenv("VITPOSE_DOWNLOAD_TRIES", "1")  # the refused network fails at once; no pauses
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

    monkeypatch.setattr(hub, "fetch_url", must_not_download)
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
    monkeypatch.setattr(hub, "fetch_url", lambda *a, **k: pytest.fail("downloaded offline"))
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


# -- what to build: the one shape reader (vitpose.models.layouts.infer_model_spec) -----------------

@pytest.mark.parametrize("decoder", ["classic", "simple"])
@pytest.mark.parametrize("layout", ["mmpose1x", "official0x", "hf"])
def test_spec_from_the_published_layouts(fixtures_dir, layout, decoder):
    with torch.device("meta"):
        shapes = {e["name"]: torch.empty(e["shape"]) for e in load_spec(fixtures_dir, decoder, layout)}
    spec = infer_model_spec(shapes)
    assert (spec.size, spec.decoder, spec.num_keypoints, spec.num_heads) == ("vitpose-s", decoder, 17, 12)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("decoder", ["classic", "simple"])
def test_spec_of_every_size_in_own_layout(size, decoder):
    k = 133 if size == "vitpose-h" else 17
    with torch.device("meta"):  # shapes only, no memory
        model = vitpose.build_model(size, decoder=decoder, num_keypoints=k)
    spec = infer_model_spec(model.state_dict())
    assert (spec.size, spec.decoder, spec.num_keypoints) == (size, decoder, k)
    assert (spec.embed_dim, spec.depth, spec.num_heads) == tuple(MODEL_SIZES[size][n] for n in ("embed_dim", "depth",
                                                                                               "num_heads"))


def test_spec_refuses_other_files():
    with pytest.raises(CheckpointError, match="not a ViTPose checkpoint|backbone-only"):
        infer_model_spec({"fc.weight": torch.zeros(10, 5)})


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


def test_plus_names_take_an_expert_coco_by_default(caches, monkeypatch):
    """A ViTPose+ name loads one expert: "coco" unless `expert=` (any spelling of the one list) says."""
    _, hf_cache = caches
    torch.manual_seed(0)
    plain = vitpose.build_model("vitpose-s", depth=1)
    state = {k: v for k, v in plain.state_dict().items()}
    for i in range(6):  # six experts of 96 rows each, on top of fc2's 288 shared rows (official layout names)
        state[f"backbone.blocks.0.mlp.experts.{i}.weight"] = torch.randn(96, 1536) * 0.01 + i
        state[f"backbone.blocks.0.mlp.experts.{i}.bias"] = torch.zeros(96)
    state["backbone.blocks.0.mlp.fc2.weight"] = state["backbone.blocks.0.mlp.fc2.weight"][:288]
    state["backbone.blocks.0.mlp.fc2.bias"] = state["backbone.blocks.0.mlp.fc2.bias"][:288]
    path = hf_cache.parent / "plus.safetensors"
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    fill_hf_cache(hf_cache, "usyd-community/vitpose-plus-small", path.read_bytes())
    coco = vitpose.Predictor.from_pretrained("vitpose-plus-s", detector=None, device="cpu")
    wholebody = vitpose.Predictor.from_pretrained("ViTPose-Plus-S", detector=None, device="cpu", expert="wholebody")
    fc2 = [p.model.backbone.blocks[0].mlp.fc2.weight for p in (coco, wholebody)]
    fc2 = [w.detach() for w in fc2]
    assert float(fc2[0][288:].mean()) == pytest.approx(0, abs=0.05)  # expert 0
    assert float(fc2[1][288:].mean()) == pytest.approx(5, abs=0.05)  # expert 5: coco_wholebody
    # An HF vitpose-plus file carries COCO's head: the skeleton is COCO's whatever the backbone expert.
    assert coco.skeleton.name == wholebody.skeleton.name == "coco"
    with pytest.raises(Exception, match="unknown ViTPose. expert 'wholebdy'"):
        vitpose.load_model("vitpose-plus-s", expert="wholebdy")


def test_a_hub_download_without_huggingface_hub_names_the_package(monkeypatch):
    from vitpose.errors import MissingExtraError, UserError

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` fails
    with pytest.raises(MissingExtraError) as err:
        hub.download_hf("someone/vitpose-b")
    assert isinstance(err.value, UserError) and isinstance(err.value, ImportError)
    assert str(err.value) == ("downloading someone/vitpose-b from the Hugging Face Hub needs huggingface_hub, which is "
                              "not installed: pip install huggingface_hub")
