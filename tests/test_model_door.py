"""The one door to a model (`vitpose.models.loading`, `vitpose.load_model`) and what `--model` takes.

- `vitpose predict --model m.onnx` (a file `vitpose export` wrote) gives the records of the weights it
  was exported from, within the export gate; `vitpose export --model m.onnx` says what the file is.
- Paths before names before HF repo ids: a folder (`./m`, `org/repo`) is named as a folder, never
  fetched as a repo, and the message says what is in it and how to reach the repo.
- A misspelt ViTPose+ expert gets the closest name.
- What a file records is checked before it is trusted: a recorded spec that cannot be a ViTPose, or
  does not describe the file's tensors, is refused before the model's memory is allocated; a cached
  HF `config.json` with a head count no ViT can have is named.
- A pickle that calls `os.system` gets the one "refused" explanation (torch words it differently
  from other refused globals), and never runs.
- The default detector with a truncated file in torchvision's cache names the file and says to delete it.
- `import vitpose.hub` / `from vitpose.hub import download`: the one public path of the hub.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_evaluate import tiny_model
from test_load_model import HF_CONFIG, _fill_hf, hf_layout

import vitpose
from vitpose import hub
from vitpose.builders import skeleton_data
from vitpose.data import dataset_info
from vitpose.models.checkpoint import CheckpointError
from vitpose.models.spec import METADATA_KEY, SpecError, spec_of_model

REPO = Path(__file__).resolve().parents[1]


def _run(argv, capsys):
    from vitpose.cli import main

    status = main([str(a) for a in argv])
    out = capsys.readouterr()
    return status, out.out, out.err


# -- vitpose predict --model m.onnx ------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory, coco_mini_dir):
    """(weights .pth, the .onnx `vitpose export` made of it, the model): a one-block 96-wide model with
    recipe weights (O(1) heatmap peaks) and the 5-keypoint demo skeleton recorded in its spec."""
    from vitpose.cli import main

    pytest.importorskip("onnxruntime")
    folder = tmp_path_factory.mktemp("door")
    info = dataset_info(REPO / "configs" / "demo_k5_skeleton.yaml")
    model = tiny_model(4, decoder="simple", num_keypoints=5).eval()
    spec = spec_of_model(model, skeleton=skeleton_data(info))
    weights = folder / "k5.pth"
    torch.save({"state_dict": model.state_dict(), METADATA_KEY: spec.to_json()}, weights)
    onnx = folder / "k5.onnx"
    assert main(["export", "--model", str(weights), "--out", str(onnx), "--gate-data", str(coco_mini_dir)]) == 0
    return weights, onnx, model


def test_predict_with_an_onnx_file_gives_the_records_of_its_weights(exported, coco_mini_dir, tmp_path, capsys):
    """Both runs: the demo skeleton's 5 keypoints from the files alone (no --config), the same
    people, scores within the gate's 1e-4 heatmap bound (a score is a heatmap maximum: it moves at
    most as much as the heatmap), keypoints within the gate's KEYPOINT_FLOOR_PX crop pixels scaled to
    image pixels (each box is drawn at most this many image pixels per crop pixel)."""
    from vitpose.inference.export import FP32_TOLERANCE, KEYPOINT_FLOOR_PX

    weights, onnx, _ = exported
    images = tmp_path / "images"
    images.mkdir()
    for name in ("000000197388.jpg", "000000000785.jpg"):
        (images / name).write_bytes((coco_mini_dir / name).read_bytes())
    boxes = tmp_path / "boxes.json"
    boxes.write_text(json.dumps([{"image_id": 197388, "bbox": [300, 60, 120, 300], "score": 0.9},
                                 {"image_id": 197388, "bbox": [10, 20, 200, 330], "score": 0.8},
                                 {"image_id": 785, "bbox": [250, 40, 150, 380], "score": 0.7}]))
    records = {}
    for model in (weights, onnx):
        out = tmp_path / f"{model.suffix[1:]}.jsonl"
        status, _, err = _run(["predict", images, "--model", model, "--boxes", boxes, "--json", out,
                               "--precision", "fp32", "--device", "cpu"], capsys)
        assert status == 0, err
        records[model.suffix] = [json.loads(line) for line in out.read_text().splitlines()]
    torch_records, onnx_records = records[".pth"], records[".onnx"]
    assert len(torch_records) == len(onnx_records) == 3
    for a, b in zip(torch_records, onnx_records):
        assert (a["file_name"], a["image_id"], a["bbox"]) == (b["file_name"], b["image_id"], b["bbox"])
        ka, kb = np.array(a["keypoints"]).reshape(-1, 3), np.array(b["keypoints"]).reshape(-1, 3)
        assert ka.shape == (5, 3)
        np.testing.assert_allclose(kb[:, 2], ka[:, 2], rtol=0, atol=FP32_TOLERANCE)
        pixels_per_crop_pixel = 1.25 * max(a["bbox"][2] / 192, a["bbox"][3] / 256)
        np.testing.assert_allclose(kb[:, :2], ka[:, :2], rtol=0, atol=KEYPOINT_FLOOR_PX * pixels_per_crop_pixel)


def test_onnx_files_are_not_weights(exported, tmp_path, capsys):
    _, onnx, _ = exported
    status, _, err = _run(["export", "--model", onnx, "--out", tmp_path / "again.onnx"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "is an exported ONNX file" in err and "the weights file it was exported from" in err
    with pytest.raises(CheckpointError, match="OnnxPredictor"):
        vitpose.load_model(onnx)
    status, _, err = _run(["predict", onnx, "--model", onnx, "--config", "demo_k5"], capsys)
    assert status == 2 and "leave out --config" in err


# -- paths, names, repo ids ------------------------------------------------------------------------------


@pytest.fixture
def no_hub(monkeypatch):
    """Any attempt to reach the Hugging Face Hub fails the test."""
    def fetch(*args, **kwargs):
        pytest.fail(f"fetched from the Hub: {args}")

    monkeypatch.setattr(hub, "download_hf", fetch)
    monkeypatch.setattr(hub, "hf_config", fetch)


def test_a_folder_named_like_a_repo_id_is_the_folder_never_the_repo(tmp_path, monkeypatch, no_hub):
    """`myorg/myrepo` that exists here is a path (item 7: a `dir/name` path that exists is never
    taken as an HF id); the line names a file inside and says how to reach the repo (N24)."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "myorg" / "myrepo"
    folder.mkdir(parents=True)
    vitpose.save_weights(tiny_model(0), folder / "model.safetensors")
    with pytest.raises(hub.WeightsNotFoundError) as err:
        vitpose.load_model("myorg/myrepo")
    message = str(err.value)
    assert "\n" not in message and "myorg/myrepo is a folder" in message
    assert "myorg/myrepo/model.safetensors" in message and "HF repo id myorg/myrepo" in message
    with pytest.raises(hub.WeightsNotFoundError, match="not as the HF repo id myorg/other"):
        vitpose.load_model("myorg/other")  # the folder myorg is here: a path, and the line says so


def test_a_folder_in_the_current_directory_is_named_as_a_folder(tmp_path, monkeypatch, capsys, no_hub):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    status, _, err = _run(["export", "--model", "./m", "--out", "m.onnx"], capsys)
    assert status == 2 and "./m is a folder, not a weights file" in err and "holds no weights file" in err
    assert "unknown model" not in err


def test_a_misspelt_expert_gets_the_closest_name(tmp_path):
    """Item 7: did-you-mean for ViTPose+ expert names, through the door and `load_weights`."""
    state = {f"backbone.blocks.0.mlp.experts.{i}.weight": torch.zeros(2, 4) for i in range(6)}
    state["backbone.blocks.0.mlp.fc2.weight"] = torch.zeros(2, 4)
    path = tmp_path / "plus.pth"
    torch.save(state, path)
    for attempt in (lambda: vitpose.load_model(path, expert="wholbody"),
                    lambda: vitpose.load_weights(tiny_model(0), path, expert="Whole-body")):
        with pytest.raises(CheckpointError) as err:
            attempt()
        assert "did you mean 'coco_wholebody'?" in str(err.value)
    with pytest.raises(CheckpointError, match=r"did you mean 'ap10k'\?"):
        vitpose.load_model(path, expert="ap-10")


# -- what a file records is checked before it is trusted (N21, N22) ---------------------------------------


@pytest.fixture
def no_allocation(monkeypatch):
    """Building the model's memory (`to_empty` after the meta-device build) fails the test."""
    def to_empty(self, *args, **kwargs):
        pytest.fail("the model's memory was allocated before the file was checked")

    monkeypatch.setattr(torch.nn.Module, "to_empty", to_empty)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
@pytest.mark.parametrize("change, expected", [
    (dict(patch_size=0), "patch_size 0 (must be at least 1)"),
    (dict(num_heads=7), "num_heads 7 does not divide embed_dim 96"),
    (dict(embed_dim=8192, depth=64, num_heads=64), "does not describe its tensors"),
    (dict(input_size=(100000, 100000)), "its position embedding has 192 rows"),
])
def test_a_recorded_spec_is_checked_before_anything_is_allocated(tmp_path, no_allocation, suffix, change, expected):
    model = tiny_model(1)
    bad = spec_of_model(model).replace(**change)
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        vitpose.save_weights(model, path, spec=bad)
    else:
        torch.save({"state_dict": model.state_dict(), METADATA_KEY: bad.to_json()}, path)
    with pytest.raises((SpecError, CheckpointError)) as err:
        vitpose.load_model(path, device="cpu")
    assert expected in str(err.value) and str(path) in str(err.value).splitlines()[0]


@pytest.mark.parametrize("heads", [[12], -12, 0, 5, "six", True])
def test_a_cached_hf_config_with_a_bad_head_count_is_named(tmp_path, monkeypatch, heads):
    import huggingface_hub.constants as hf_constants
    from safetensors.torch import save

    torch.manual_seed(0)
    model = vitpose.build_model("vitpose-s", "simple", depth=1, num_heads=6).eval()
    config = json.loads(json.dumps(HF_CONFIG))
    config["backbone_config"]["num_attention_heads"] = heads
    files = {"model.safetensors": save(hf_layout(model)), "config.json": json.dumps(config).encode()}
    _fill_hf(tmp_path / "hf", "test-org/vitpose-bad-heads", "c" * 40, files, main=True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError) as err:
        vitpose.load_model("test-org/vitpose-bad-heads", device="cpu")
    message = str(err.value)
    assert "\n" not in message and message.startswith("test-org/vitpose-bad-heads: its config.json")
    assert f"num_attention_heads {heads!r}" in message and "delete it" in message


# -- refused pickles (round-3 row 91) ------------------------------------------------------------------------


class _System:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.mark.parametrize("zipfile", [True, False], ids=["torch-zip", "legacy"])
def test_a_pickle_calling_os_system_is_refused_with_the_one_explanation(tmp_path, zipfile):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "x": _System(f"touch {marker}")}, path,
               _use_new_zipfile_serialization=zipfile)
    for attempt in (lambda: vitpose.load_model(path), lambda: vitpose.load_weights(tiny_model(0), path)):
        with pytest.raises(CheckpointError) as err:
            attempt()
        message = str(err.value)
        assert "not a plain weights file" in message and "none of its code ran" in message
        assert "system" in message  # torch's own line names the global it refused
    assert not marker.exists()


# -- the default detector's cache (round-3 row 55) ----------------------------------------------------------


def test_a_truncated_detector_file_in_torchvisions_cache_is_named(tmp_path, monkeypatch):
    from vitpose.inference.detect import DETECTORS, build_detector, default_detector_name

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    name = default_detector_name(torch.device("cpu"))
    cached = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(DETECTORS[name].weights_url())
    cached.parent.mkdir(parents=True)
    torch.save({"w": torch.zeros(50000)}, cached)
    cached.write_bytes(cached.read_bytes()[:100000])  # a download cut short
    with pytest.raises(CheckpointError) as err:
        build_detector(name)
    message = str(err.value)
    assert "\n" not in message and str(cached) in message and f"delete {cached}" in message
    assert "truncated" in message


# -- one public path for the hub ---------------------------------------------------------------------------------


def test_the_hub_has_one_public_path():
    import subprocess

    code = ("import vitpose.hub; from vitpose.hub import download, list_models; import vitpose, importlib.util; "
            "assert vitpose.hub.download is download and len(list_models()) > 0; "
            "assert importlib.util.find_spec('vitpose.models.hub') is None")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 0, done.stderr
