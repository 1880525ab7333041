"""Model tests in timm's manner: sizes, forward/backward, checkpointing, save/load, input sizes."""

import pytest
import torch
import torch.nn.functional as F

from vitpose.coco_meta import FLIP_INDICES
from vitpose.models.checkpoint import save_weights
from vitpose.models.loading import load_weights
from vitpose.models.vit import resize_pos_embed
from vitpose.models.vitpose import MODEL_SIZES, build_model, flip_test

# docs/model.md §4 (millions), counted with the official 193-row pos_embed: this model keeps 192
# rows, i.e. C fewer parameters (well inside the 0.1% tolerance).
PARAMS_M = {
    "vitpose-t": (5.52, 7.36, 5.55),  # this project's distillation student (no published model): counted here
    "vitpose-s": (21.66, 24.29, 21.72),
    "vitpose-b": (85.80, 90.00, 85.91),
    "vitpose-l": (303.30, 308.55, 303.45),
    "vitpose-h": (630.91, 637.21, 631.11),
    "vitpose-n": (0.987, 2.434, 1.002),
}
TINY = dict(depth=2, embed_dim=64, num_heads=4)


def _count(module):
    return sum(p.numel() for p in module.parameters())


def tiny(decoder="classic", **kwargs):
    return build_model("vitpose-s", decoder=decoder, deconv_channels=(32, 32), **{**TINY, **kwargs})


@pytest.mark.parametrize("name", sorted(MODEL_SIZES))
def test_parameter_counts_match_spec(name):
    backbone_m, classic_m, simple_m = PARAMS_M[name]
    with torch.device("meta"):  # no memory, no init cost: ViT-H has 630M parameters
        classic = build_model(name, "classic")
        simple = build_model(name, "simple")
    assert _count(classic.backbone) == pytest.approx(backbone_m * 1e6, rel=1e-3)
    assert _count(classic) == pytest.approx(classic_m * 1e6, rel=1e-3)
    assert _count(simple) == pytest.approx(simple_m * 1e6, rel=1e-3)
    assert classic.backbone.pos_embed.shape == (1, 192, MODEL_SIZES[name]["embed_dim"])


def test_spec_table_sizes():
    s = build_model("vitpose-s", depth=1)
    assert s.backbone.blocks[0].attn.num_heads == 12 and s.backbone.blocks[0].attn.head_dim == 32
    assert s.backbone.blocks[0].mlp.fc1.out_features == 1536
    assert s.backbone.patch_embed.proj.padding == (2, 2)
    assert s.backbone.blocks[0].norm1.eps == 1e-6 and s.backbone.norm.eps == 1e-6
    names = {n for n, _ in s.named_parameters()}
    assert {"backbone.patch_embed.proj.weight", "backbone.pos_embed", "backbone.blocks.0.attn.qkv.bias",
            "backbone.blocks.0.mlp.fc2.weight", "backbone.norm.weight", "head.deconv_layers.0.weight",
            "head.deconv_layers.1.weight", "head.deconv_layers.3.weight", "head.deconv_layers.4.bias",
            "head.final_layer.weight"} <= names


def test_drop_path_rates_are_linear():
    model = build_model("vitpose-b", depth=4, embed_dim=48, num_heads=4)
    rates = [0.0] + [blk.drop_path.drop_prob for blk in model.backbone.blocks[1:]]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3])


@pytest.mark.parametrize("decoder", ["classic", "simple"])
def test_forward_shape_and_finite(decoder):
    torch.manual_seed(0)
    model = tiny(decoder).eval()
    x = torch.randn(2, 3, 256, 192)
    with torch.no_grad():
        feats = model.backbone(x)
        heatmaps = model(x)
    assert feats.shape == (2, 64, 16, 12)
    assert heatmaps.shape == (2, 17, 64, 48)
    assert torch.isfinite(heatmaps).all()


@pytest.mark.parametrize("decoder", ["classic", "simple"])
def test_backward_reaches_every_parameter(decoder):
    torch.manual_seed(0)
    model = tiny(decoder, drop_path_rate=0.0).train()
    model(torch.randn(2, 3, 256, 192)).square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_grad_checkpointing_same_outputs_and_grads():
    torch.manual_seed(0)
    model = tiny(drop_path_rate=0.3).train()
    x = torch.randn(2, 3, 256, 192)

    def run(enable):
        model.zero_grad()
        model.set_grad_checkpointing(enable)
        torch.manual_seed(1)  # the same drop-path draws in both runs
        out = model(x)
        out.square().mean().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    out_a, grads_a = run(False)
    out_b, grads_b = run(True)
    assert torch.equal(out_a, out_b)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-5, atol=1e-9, msg=name)


def test_save_load_is_bit_exact(tmp_path):
    torch.manual_seed(0)
    model = tiny().train()
    model(torch.randn(2, 3, 256, 192))  # move the BN running stats off their init
    path = save_weights(model, tmp_path / "w.safetensors")
    torch.manual_seed(1)
    other = tiny()
    report = load_weights(other, path)
    assert report.layout == "own"
    theirs = other.state_dict()
    for name, tensor in model.state_dict().items():
        assert theirs[name].dtype == tensor.dtype and torch.equal(theirs[name], tensor), name


def test_other_input_size_resizes_pos_embed():
    torch.manual_seed(0)
    model = tiny().eval()
    x = torch.randn(1, 3, 320, 224)  # 20 x 14 patch grid
    with torch.no_grad():
        out = model(x)
    assert out.shape == (1, 17, 80, 56)
    # The same as a model built for that size whose embedding is the bicubic resize.
    big = tiny(img_size=(320, 224)).eval()
    state = model.state_dict()
    state["backbone.pos_embed"] = resize_pos_embed(state["backbone.pos_embed"], (16, 12), (20, 14))
    big.load_state_dict(state)
    assert big.backbone.pos_embed.shape == (1, 280, 64)
    with torch.no_grad():
        torch.testing.assert_close(big(x), out)
    # the default size does not touch the embedding
    assert resize_pos_embed(state["backbone.pos_embed"], (20, 14), (20, 14)) is state["backbone.pos_embed"]


def test_flip_test_formula():
    torch.manual_seed(0)
    model = tiny("simple").eval()
    x = torch.randn(2, 3, 256, 192)
    with torch.no_grad():
        expected = (model(x) + model(x.flip(-1)).flip(-1)[:, list(FLIP_INDICES)]) / 2
        torch.testing.assert_close(flip_test(model, x), expected)
        identity = list(range(17))
        torch.testing.assert_close(flip_test(model, x, identity), (model(x) + model(x.flip(-1)).flip(-1)) / 2)


def test_group_matcher_and_no_weight_decay_follow_timm():
    from timm.models import group_parameters

    model = tiny()
    groups = group_parameters(model, model.group_matcher())
    # group 0: stem; 1..depth: blocks, the final norm joining the last block (timm's
    # MATCH_PREV_GROUP); the head, unmatched, last
    assert set(groups[0]) == {"backbone.patch_embed.proj.weight", "backbone.patch_embed.proj.bias",
                              "backbone.pos_embed"}
    assert all(n.startswith("backbone.blocks.0.") for n in groups[1])
    assert all(n.startswith(("backbone.blocks.1.", "backbone.norm.")) for n in groups[2])
    assert {"backbone.norm.weight", "backbone.norm.bias"} <= set(groups[2])
    assert all(n.startswith("head.") for n in groups[3]) and len(groups) == 4
    assert model.no_weight_decay() == {"backbone.pos_embed"}


def test_build_model_rejects_unknown_names():
    with pytest.raises(ValueError, match="vitpose-s"):
        build_model("vitpose-xl")
    with pytest.raises(ValueError, match="classic"):
        build_model("vitpose-s", decoder="fancy", depth=1)


def test_simple_head_is_relu_bilinear_conv():
    torch.manual_seed(0)
    model = tiny("simple").eval()
    feats = torch.randn(1, 64, 16, 12)
    up = F.interpolate(feats.clamp(min=0), size=(64, 48), mode="bilinear", align_corners=False)
    with torch.no_grad():
        torch.testing.assert_close(model.head(feats), model.head.final_layer(up))
