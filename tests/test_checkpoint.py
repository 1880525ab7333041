"""Checkpoint interop: files and wrappers, layout detection, MAE init, refusals and diagnoses."""

import pickle

import pytest
import torch
import torch.nn.functional as F

from vitpose.engine.optim import mmpose_name
from vitpose.models.checkpoint import CheckpointError, save_weights
from vitpose.models.layouts import convert_state_dict
from vitpose.models.loading import load_weights
from vitpose.models.vitpose import build_model

TINY = dict(depth=2, embed_dim=64, num_heads=4, deconv_channels=(32, 32))


def tiny(decoder="classic", seed=0, **kwargs):
    torch.manual_seed(seed)
    return build_model("vitpose-s", decoder=decoder, **{**TINY, **kwargs})


def assert_same(model, other):
    theirs = other.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(theirs[name], tensor), name


def to_official(sd):
    out = {}
    for name, t in sd.items():
        name = name.replace("backbone.norm.", "backbone.last_norm.").replace("head.", "keypoint_head.", 1)
        if name == "backbone.pos_embed":
            t = torch.cat([torch.zeros_like(t[:, :1]), t], 1)
        out[name] = t
    return out


@pytest.fixture
def model():
    m = tiny().train()
    m(torch.randn(2, 3, 256, 192))  # non-trivial BN buffers
    return m.eval()


@pytest.mark.parametrize("suffix", [".pth", ".pt", ".bin", ".safetensors"])
def test_file_formats_round_trip(tmp_path, model, suffix):
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        save_weights(model, path)
    else:
        torch.save({"state_dict": model.state_dict(), "meta": {"epoch": 3}}, path)
    other = tiny(seed=1)
    load_weights(other, path)
    assert_same(model, other)


def test_wrappers_and_numpy_mapping(model):
    wrapped = {"model": {f"module._orig_mod.{n}": t.numpy() for n, t in model.state_dict().items()}}
    other = tiny(seed=1)
    assert load_weights(other, wrapped).layout == "own"
    assert_same(model, other)


def test_mmpose1x_names(model):
    other = tiny(seed=1)
    report = load_weights(other, {mmpose_name(n): t for n, t in model.state_dict().items()})
    assert report.layout == "mmpose1x"
    assert_same(model, other)
    assert mmpose_name("backbone.blocks.3.mlp.fc1.weight") == "backbone.layers.3.ffn.layers.0.0.weight"
    assert mmpose_name("backbone.norm.bias") == "backbone.ln1.bias"


def test_official_layout_folds_row0(model):
    sd = to_official(model.state_dict())
    pos = sd["backbone.pos_embed"]
    row0 = torch.randn(1, 1, pos.shape[-1])
    sd["backbone.pos_embed"] = torch.cat([row0, pos[:, 1:] - row0], 1)
    sd["backbone.cls_token"] = torch.zeros(1, 1, pos.shape[-1])
    other = tiny(seed=1)
    report = load_weights(other, sd)
    assert report.layout == "official" and "backbone.cls_token" in report.skipped
    torch.testing.assert_close(other.backbone.pos_embed, model.backbone.pos_embed, rtol=0, atol=1e-6)


def test_hf_layout_concatenates_qkv(model):
    sd = {}
    for name, t in model.state_dict().items():
        if ".attn.qkv." in name:
            i, kind = name.split(".")[2], name.rsplit(".", 1)[1]
            for part, chunk in zip(("query", "key", "value"), t.chunk(3)):
                sd[f"backbone.encoder.layer.{i}.attention.attention.{part}.{kind}"] = chunk
            continue
        if name == "backbone.pos_embed":
            sd["backbone.embeddings.position_embeddings"] = torch.cat([torch.zeros_like(t[:, :1]), t], 1)
            continue
        new = (name.replace("backbone.patch_embed.proj.", "backbone.embeddings.patch_embeddings.projection.")
               .replace("backbone.blocks.", "backbone.encoder.layer.").replace(".norm1.", ".layernorm_before.")
               .replace(".norm2.", ".layernorm_after.").replace(".attn.proj.", ".attention.output.dense.")
               .replace("backbone.norm.", "backbone.layernorm.").replace("deconv_layers.0.", "deconv1.")
               .replace("deconv_layers.1.", "batchnorm1.").replace("deconv_layers.3.", "deconv2.")
               .replace("deconv_layers.4.", "batchnorm2.").replace("final_layer.", "conv."))
        sd[new] = t
    other = tiny(seed=1)
    assert load_weights(other, sd).layout == "hf"
    assert_same(model, other)


def test_mae_backbone_init():
    # MAE ViT-H style: no prefix, class token, (1, 1 + 14*14, C) embedding, patch-14 kernel,
    # an encoder `norm` and decoder weights that the pose model does not use.
    model = tiny(seed=1)
    own = model.backbone.state_dict()
    C = own["pos_embed"].shape[-1]
    grid = torch.randn(1, 14 * 14, C)
    kernel = torch.randn(C, 3, 14, 14)
    mae = {n: torch.randn_like(t) for n, t in own.items() if n.startswith("blocks.")}
    mae.update({
        "cls_token": torch.randn(1, 1, C),
        "pos_embed": torch.cat([torch.zeros(1, 1, C), grid], 1),
        "patch_embed.proj.weight": kernel,
        "patch_embed.proj.bias": torch.randn(C),
        "norm.weight": torch.randn(C),
        "norm.bias": torch.randn(C),
        "mask_token": torch.randn(1, 1, 32),
        "decoder_embed.weight": torch.randn(32, C),
    })
    head_before = {n: t.clone() for n, t in model.head.state_dict().items()}
    report = load_weights(model, {"model": mae})
    assert report.layout == "mae"
    assert {"cls_token", "norm.weight", "norm.bias", "mask_token", "decoder_embed.weight"} <= set(report.skipped)
    expected = F.interpolate(grid.reshape(1, 14, 14, C).permute(0, 3, 1, 2), size=(16, 12),
                             mode="bicubic", align_corners=False).permute(0, 2, 3, 1).reshape(1, 192, C)
    torch.testing.assert_close(model.backbone.pos_embed.data, expected)
    w = model.backbone.patch_embed.proj.weight.data
    assert torch.equal(w[:, :, 1:15, 1:15], kernel)
    border = w.clone()
    border[:, :, 1:15, 1:15] = 0  # the zero padding around the 14x14 kernel, compared exactly (sums of
    assert not border.any()       # tensors of other shapes round differently: 30040.6602 vs .6621)
    assert torch.equal(model.backbone.blocks[1].mlp.fc2.weight.data, mae["blocks.1.mlp.fc2.weight"])
    # the final LayerNorm keeps its (1, 0) init, as in the official repo; the head is untouched
    assert torch.equal(model.backbone.norm.weight.data, torch.ones(C))
    assert torch.equal(model.backbone.norm.bias.data, torch.zeros(C))
    for name, t in model.head.state_dict().items():
        assert torch.equal(t, head_before[name]), name


def test_refuses_pickled_code_without_running_it(tmp_path):
    marker = tmp_path / "code_ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        pickle.dump({"state_dict": {"w": torch.zeros(1)}, "payload": Payload()}, f, protocol=2)
    # control: an unrestricted unpickler would run the payload
    with open(path, "rb") as f:
        pickle.load(f).get("payload").close()
    assert marker.exists()
    marker.unlink()

    torch.save({"state_dict": {"w": torch.zeros(1)}, "payload": Payload()}, tmp_path / "evil2.pth")
    for p in (path, tmp_path / "evil2.pth"):
        with pytest.raises(CheckpointError, match="not a plain weights file") as e:
            load_weights(tiny(), p)
        assert str(p) in str(e.value)
        assert not marker.exists()


def test_non_tensor_entry_is_named():
    with pytest.raises(CheckpointError, match="'backbone.pos_embed' is a str"):
        load_weights(tiny(), {"backbone.pos_embed": "oops"})


def test_strict_error_lists_keys_and_diagnoses_embed_dim():
    with torch.device("meta"):
        small = build_model("vitpose-s", depth=2)
        base = build_model("vitpose-b", depth=2)
    with pytest.raises(CheckpointError) as e:
        load_weights(small, base.state_dict())
    msg = str(e.value)
    assert "ViT-B weights for a ViT-S model" in msg
    assert "backbone.blocks.0.attn.qkv.weight: file (2304, 768) vs model (1152, 384)" in msg


def test_strict_error_for_16_keypoint_head_and_decoder_kind():
    sd = tiny(num_keypoints=16).state_dict()
    with pytest.raises(CheckpointError, match="16-keypoint head") as e:
        load_weights(tiny(), sd)
    assert "head.final_layer.weight" in str(e.value)
    with pytest.raises(CheckpointError, match="classic-decoder") as e:
        load_weights(tiny("simple"), tiny().state_dict())
    assert "unexpected in the file" in str(e.value) and "head.deconv_layers.0.weight" in str(e.value)


def test_vitpose_plus_is_recognised():
    sd = to_official(tiny().state_dict())
    sd["backbone.blocks.0.mlp.experts.0.weight"] = torch.zeros(8, 64)
    sd["associate_keypoint_heads.0.final_layer.weight"] = torch.zeros(14, 32, 1, 1)
    with pytest.raises(CheckpointError, match="ViTPose\\+ multi-dataset checkpoint") as e:
        load_weights(tiny(), sd)
    assert "backbone.blocks.0.mlp.experts.0.weight" in str(e.value)
    assert "associate_keypoint_heads.0.final_layer.weight" in str(e.value)


def test_missing_keys_are_named_and_non_strict_loads_the_rest(model):
    sd = dict(model.state_dict())
    del sd["backbone.blocks.1.attn.proj.weight"]
    sd["head.final_layer.weight"] = torch.zeros(5, 32, 1, 1)
    with pytest.raises(CheckpointError, match="missing in the file \\(1\\): backbone.blocks.1.attn.proj.weight"):
        load_weights(tiny(seed=1), sd)
    other = tiny(seed=1)
    before = other.backbone.blocks[1].attn.proj.weight.clone()
    report = load_weights(other, sd, strict=False)
    assert report.missing == ["backbone.blocks.1.attn.proj.weight"]
    assert [m.split(":")[0] for m in report.mismatched] == ["head.final_layer.weight"]
    assert torch.equal(other.backbone.blocks[1].attn.proj.weight, before)
    assert torch.equal(other.backbone.pos_embed, model.backbone.pos_embed)


def test_full_checkpoint_into_bare_backbone(model):
    backbone = tiny(seed=1).backbone
    report = load_weights(backbone, model.state_dict())
    assert any(n.startswith("head.") for n in report.skipped)
    for name, t in model.backbone.state_dict().items():
        assert torch.equal(backbone.state_dict()[name], t), name


def test_convert_state_dict_returns_own_names(model):
    converted = convert_state_dict({mmpose_name(n): t for n, t in model.state_dict().items()}, model)
    assert set(converted) == set(model.state_dict())
