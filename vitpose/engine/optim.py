"""Layer-wise learning-rate decay parameter groups (MMPose LayerDecayOptimWrapperConstructor).

docs/recipe.md §2: with NL = depth + 2, `pos_embed` and `patch_embed` get layer 0, `blocks.i` gets
i + 1 and everything else (final norm, head) NL - 1; lr = base_lr * decay ** (NL - 1 - layer).
Weight decay is 0 for 1-D parameters, names ending in `.bias` and names containing `pos_embed`.
"""

import re

import torch

from vitpose.engine.schedule import LRSchedule
from vitpose.models.layouts import MMPOSE1X_NAMES, rename_rules
from vitpose.models.wrappers import strip_wrapper_prefixes, unwrap_model

# docs/model.md §1.1: layer_decay_rate of each size's config.
LAYER_DECAY = {"vitpose-s": 0.8, "vitpose-b": 0.75, "vitpose-l": 0.8, "vitpose-h": 0.85}

_BLOCK = re.compile(r"^(?:backbone\.)?blocks\.(\d+)\.")
_STEM = re.compile(r"^(?:backbone\.)?(pos_embed|patch_embed\.|cls_token|mask_token)")

# own name -> MMPose 1.x name: the loader's table, the other way round
_TO_MMPOSE = rename_rules(MMPOSE1X_NAMES, prefix="backbone.", reverse=True)


def mmpose_name(name):
    """This project's parameter name -> MMPose 1.x's (e.g. backbone.blocks.0.mlp.fc1.weight ->
    backbone.layers.0.ffn.layers.0.0.weight). Head names are the same in both."""
    name = strip_wrapper_prefixes(name)
    for pattern, repl in _TO_MMPOSE:
        new, n = re.subn(pattern, repl, name)
        if n:
            return new
    return name


def layer_id(name, num_layers):
    name = strip_wrapper_prefixes(name)
    if _STEM.match(name):
        return 0
    m = _BLOCK.match(name)
    if m:
        return int(m.group(1)) + 1
    return num_layers - 1


def _depth(model):
    model = unwrap_model(model)
    backbone = getattr(model, "backbone", model)
    return len(backbone.blocks)


def param_groups(model, lr=5e-4, weight_decay=0.1, layer_decay=0.8):
    """AdamW parameter groups, one per (layer, decay/no-decay), with per-layer lr.

    Each group carries `lr`, `weight_decay`, `layer_id` and `param_names`; `LRSchedule` keeps
    each group's `lr` as its base and multiplies it by the schedule's factor.
    """
    num_layers = _depth(model) + 2
    groups = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        lid = layer_id(name, num_layers)
        no_decay = param.ndim == 1 or name.endswith(".bias") or "pos_embed" in name
        key = (lid, no_decay)
        if key not in groups:
            scale = layer_decay ** (num_layers - lid - 1)
            groups[key] = {
                "params": [],
                "param_names": [],
                "lr": scale * lr,
                "weight_decay": 0.0 if no_decay else weight_decay,
                "layer_id": lid,
            }
        groups[key]["params"].append(param)
        groups[key]["param_names"].append(name)
    return [groups[k] for k in sorted(groups)]


def base_lr(optim_cfg, global_batch: int) -> float:
    """The configured lr, linearly scaled by global batch / base_batch_size when `optim.scale_lr`."""
    if not optim_cfg.scale_lr:
        return optim_cfg.lr
    return optim_cfg.lr * global_batch / optim_cfg.base_batch_size


def build_optimizer(model, optim_cfg, schedule_cfg, global_batch: int) -> tuple[torch.optim.AdamW, LRSchedule]:
    """AdamW over the layer-decay groups of `model` and the warmup + step schedule that drives it.

    One builder for train.py and `vitpose.cli.tune`, so a tuning run's step is the training step.
    global_batch: samples per optimizer step over all processes (batch x processes x accum_steps).
    """
    lr = base_lr(optim_cfg, global_batch)
    groups = param_groups(model, lr=lr, weight_decay=optim_cfg.weight_decay, layer_decay=optim_cfg.layer_decay)
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=tuple(optim_cfg.betas), weight_decay=optim_cfg.weight_decay)
    return optimizer, LRSchedule.from_config(optimizer, schedule_cfg)


__all__ = ["LAYER_DECAY", "base_lr", "build_optimizer", "layer_id", "mmpose_name", "param_groups"]
