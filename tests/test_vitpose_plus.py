"""ViTPose+ (mixture-of-experts) checkpoints load one dataset's expert and head into the plain model.

tests/fixtures/vitpose_plus_tiny.json and _io.npz (tools/reference/make_vitpose_plus.py): a tiny HF
ViTPose+ whose weights come from a seed (tests/vitpose_plus_recipe.py), HF transformers' heatmaps
for `dataset_index` 0..5, and the SHA-256 of what the official repository's tools/model_split.py
makes of the same weights in the official layout.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from vitpose_plus_recipe import CONFIG, DATASETS, KEYPOINTS, head_channels, hf_weights, official_from_hf

from vitpose.models.checkpoint import CheckpointError, save_weights
from vitpose.models.loading import load_weights
from vitpose.models.vitpose import build_model

FIXTURES = Path(__file__).parent / "fixtures"
INFO = json.loads((FIXTURES / "vitpose_plus_tiny.json").read_text())
TOL = 1e-4


@pytest.fixture(scope="module")
def io():
    return np.load(FIXTURES / "vitpose_plus_tiny_io.npz")


@pytest.fixture(scope="module")
def hf():
    return hf_weights(INFO["spec"], INFO["seed"])


@pytest.fixture(scope="module")
def official(hf):
    return official_from_hf(hf)


def plain(num_keypoints=17):
    torch.manual_seed(0)
    return build_model("vitpose-s", num_keypoints=num_keypoints, img_size=tuple(CONFIG["image_size"]),
                       embed_dim=CONFIG["hidden_size"], depth=CONFIG["num_hidden_layers"],
                       num_heads=CONFIG["num_attention_heads"]).eval()


def heatmaps(model, io):
    with torch.no_grad():
        return model(torch.from_numpy(io["input"])).numpy()


def test_fixture_is_the_recipes_model():
    assert INFO["config"] == CONFIG and INFO["datasets"] == list(DATASETS) and INFO["keypoints"] == list(KEYPOINTS)
    names = [entry["name"] for entry in INFO["spec"]]
    assert "backbone.encoder.layer.1.mlp.experts.5.weight" in names
    fc2 = next(e for e in INFO["spec"] if e["name"] == "backbone.encoder.layer.0.mlp.fc2.weight")
    assert fc2["shape"] == [CONFIG["hidden_size"] - CONFIG["part_features"], 4 * CONFIG["hidden_size"]]


@pytest.mark.parametrize("index", range(6))
def test_hf_file_matches_hf_dataset_index(hf, io, index):
    for expert in (index, DATASETS[index]):
        model = plain()
        report = load_weights(model, hf, expert=expert)
        assert report.layout == "vitpose+ hf" and f"expert {DATASETS[index]!r}" in report.notes[0]
        assert np.abs(heatmaps(model, io) - io[f"heatmaps_{index}"]).max() < TOL


def test_hf_safetensors_file_loads_by_path(hf, io, tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "vitpose-plus-tiny.safetensors"
    save_file({n: np.array(v, order="C") for n, v in hf.items()}, str(path))
    model = plain()
    load_weights(model, path, expert="ap10k")
    assert np.abs(heatmaps(model, io) - io["heatmaps_3"]).max() < TOL
    # The plain model saved and read back is an ordinary file: no expert needed any more.
    saved = save_weights(model, tmp_path / "ap10k.safetensors")
    again = plain()
    load_weights(again, saved)
    assert np.array_equal(heatmaps(again, io), heatmaps(model, io))


@pytest.mark.parametrize("index", range(6))
def test_official_file_gives_each_dataset_its_expert_and_head(official, io, index):
    # Each official head is HF's COCO head with its channels in a per-dataset order (recipe).
    model = plain(KEYPOINTS[index])
    report = load_weights(model, {"state_dict": official}, expert=DATASETS[index])
    assert report.layout == "vitpose+ official"
    expected = io[f"heatmaps_{index}"][:, head_channels(index)]
    assert heatmaps(model, io).shape[1] == KEYPOINTS[index]
    assert np.abs(heatmaps(model, io) - expected).max() < TOL


@pytest.mark.parametrize("index", range(6))
def test_official_file_equals_the_official_model_split(official, index):
    split = INFO["official_model_split"]
    if not isinstance(split, dict):
        pytest.skip("the fixture was made without the official model_split.py")
    model = plain(KEYPOINTS[index])
    load_weights(model, official, expert=index)
    ours = {("keypoint_head." + n[len("head."):] if n.startswith("head.") else n): t
            for n, t in model.state_dict().items()}
    expected = split[DATASETS[index]]
    digest = hashlib.sha256()
    for name in expected["names"]:
        digest.update(ours[name].contiguous().numpy().tobytes())
    assert digest.hexdigest() == expected["sha256"]


def test_wholebody_alias_and_index_agree(official):
    a, b = plain(133), plain(133)
    load_weights(a, official, expert="wholebody")
    load_weights(b, official, expert=5)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


# ---- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["hf", "official"])
def test_without_expert_the_file_is_refused_naming_the_choices(hf, official, layout):
    source = hf if layout == "hf" else official
    with pytest.raises(CheckpointError, match=r"ViTPose\+ multi-dataset checkpoint \(6 mixture-of-experts") as e:
        load_weights(plain(), source)
    for i, name in enumerate(DATASETS):
        assert f"'{name}' ({i})" in str(e.value)
    with pytest.raises(CheckpointError, match="choose one dataset with expert="):
        load_weights(plain(), source, strict=False)


@pytest.mark.parametrize("expert, match", [
    ("crowdpose", r"unknown ViTPose\+ expert 'crowdpose'; the file's experts are 'coco' \(0\), 'aic' \(1\)"),
    (6, r"expert=6 is not one of the file's 6 experts"),
    (True, r"expert=True is not one of"),
])
def test_unknown_expert(hf, expert, match):
    with pytest.raises(CheckpointError, match=match):
        load_weights(plain(), hf, expert=expert)


def test_head_whose_keypoints_do_not_match_the_model(hf, official):
    # HF files carry COCO's head only: expert='aic' chooses the backbone expert, not a 14-joint head.
    with pytest.raises(CheckpointError, match=r"17-keypoint head \(the model has 14 keypoints\)") as e:
        load_weights(plain(14), hf, expert="aic")
    assert "HF vitpose-plus file carries one head (COCO's, 17 keypoints)" in str(e.value)
    assert "num_keypoints=17" in str(e.value)
    with pytest.raises(CheckpointError, match=r"expert 'aic' has 14 keypoints: build the model with num_keypoints=14"):
        load_weights(plain(17), official, expert="aic")


def test_non_strict_keeps_the_models_head_and_loads_the_expert(hf, io):
    model = plain(14)
    head_before = model.head.final_layer.weight.clone()
    report = load_weights(model, hf, expert="mpii", strict=False)
    assert torch.equal(model.head.final_layer.weight, head_before)
    assert "head.final_layer.weight" in " ".join(report.mismatched)
    reference = plain()
    load_weights(reference, hf, expert="mpii")
    with torch.no_grad():
        x = torch.from_numpy(io["input"])
        assert torch.equal(model.backbone(x), reference.backbone(x))


def test_expert_for_a_plain_file_is_an_error():
    with pytest.raises(CheckpointError, match=r"expert='coco' was given, but this is not a ViTPose\+"):
        load_weights(plain(), plain().state_dict(), expert="coco")


def test_a_missing_expert_tensor_is_named(hf):
    broken = dict(hf)
    del broken["backbone.encoder.layer.1.mlp.experts.2.bias"]
    with pytest.raises(CheckpointError, match=r"backbone.encoder.layer.1.mlp.fc2.bias has no expert 2"):
        load_weights(plain(), broken, expert=2)
