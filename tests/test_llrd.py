"""Layer-wise lr decay groups against MMPose's LayerDecayOptimWrapperConstructor (ViTPose-S)."""

import json

import pytest
import torch

from vitpose.engine.optim import mmpose_name, param_groups
from vitpose.models.vitpose import build_model


def _per_param(groups):
    out = {}
    for g in groups:
        for name in g["param_names"]:
            out[mmpose_name(name)] = (g["lr"], g["weight_decay"])
    return out


def test_every_parameter_matches_mmpose(fixtures_dir):
    ref = json.loads((fixtures_dir / "llrd_vitpose_s.json").read_text())
    cfg = ref["paramwise_cfg"]
    with torch.device("meta"):
        model = build_model("vitpose-s")
    groups = param_groups(model, lr=ref["base_lr"], weight_decay=ref["weight_decay"],
                          layer_decay=cfg["layer_decay_rate"])
    got = _per_param(groups)
    assert set(got) == set(ref["params"])
    for name, expected in ref["params"].items():
        assert got[name] == (expected["lr"], expected["weight_decay"]), name  # exact


def test_groups_are_merged_and_scalable():
    with torch.device("meta"):
        model = build_model("vitpose-b", "simple")
    groups = param_groups(model, lr=1.0, weight_decay=0.1, layer_decay=0.75)
    keys = [(g["lr"], g["weight_decay"]) for g in groups]
    assert len(keys) == len(set(keys)) == 2 * 14  # (decay, no decay) for each of NL = 12 + 2 layers
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    for g in groups:
        assert g["lr"] == pytest.approx(0.75 ** (13 - g["layer_id"]))
    torch.optim.AdamW(groups)  # accepted as is


def test_frozen_parameters_are_left_out():
    model = build_model("vitpose-s", depth=1, embed_dim=32, num_heads=2)
    model.backbone.patch_embed.requires_grad_(False)
    names = {n for g in param_groups(model) for n in g["param_names"]}
    assert not any("patch_embed" in n for n in names) and "backbone.pos_embed" in names
