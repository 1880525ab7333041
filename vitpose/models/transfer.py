"""Initialise a ViTPose from another one's weights: the backbone whole, the head by keypoint name.

Fine-tuning a published model on one's own keypoints keeps what the source learned wherever the
two skeletons agree (docs/recipe.md §9):

- the backbone is copied whole; a position embedding of another patch grid is resampled as timm's
  `resample_abs_pos_embed` does (bicubic, antialiased, align_corners=False, in float32). A
  backbone of another width, depth, MLP width or patch size does not fit and is refused in one
  line naming the dimension;
- the deconvolution layers of the classic head (and their BatchNorm statistics) are copied when
  every one of their shapes matches, else they keep their fresh initialisation;
- the final layer maps features to one heatmap per keypoint: for each keypoint of the target
  skeleton whose name (after the optional rename map) the source skeleton has, its output channel
  (the weight rows and the bias entry) is copied bit for bit from the source channel of that name;
  the other channels keep the fresh initialisation.

Pure tensor operations on names: this module knows nothing of data files or configs. The source
state dict is in this project's own layout (`vitpose.models.layouts.convert_state_dict`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from vitpose.models.checkpoint import CheckpointError

__all__ = ["BackboneMismatchError", "TransferReport", "head_channel_map", "resample_pos_embed",
           "transfer_weights"]

FINAL = "head.final_layer."
DECONV = "head.deconv_layers."
POS_EMBED = "backbone.pos_embed"


class BackboneMismatchError(CheckpointError):
    """An initialisation source whose backbone has another shape than the model's."""


@dataclass
class TransferReport:
    """What `transfer_weights` did. copied: (target keypoint, source keypoint, source channel);
    fresh: target keypoints whose channel kept its initialisation; notes: one line per decision."""

    source: str
    order: list[str] = field(default_factory=list)  # the target keypoints, in channel order
    copied: list[tuple[str, str, int]] = field(default_factory=list)
    fresh: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        """The copied / fresh keypoints as a plain-text table (printed, and written to the work dir)."""
        width = max([len("keypoint")] + [len(t) for t, _, _ in self.copied] + [len(t) for t in self.fresh])
        copied = {t: (s, i) for t, s, i in self.copied}
        lines = [f"head initialised from {self.source}: {len(self.copied)} keypoint(s) copied, "
                 f"{len(self.fresh)} fresh", f"  {'keypoint'.ljust(width)}  init"]
        for name in self.order:
            how = f"copied from {copied[name][0]!r} (source channel {copied[name][1]})" if name in copied else "fresh"
            lines.append(f"  {name.ljust(width)}  {how}")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes]) + "\n"


def resample_pos_embed(pos_embed: torch.Tensor, old_grid, new_grid) -> torch.Tensor:
    """A (1, H*W, C) grid embedding resampled to another (h, w) grid as timm's
    `resample_abs_pos_embed` does for a ViT without prefix tokens: bicubic, antialias=True,
    align_corners=False, computed in float32 and cast back."""
    old_grid, new_grid = tuple(old_grid), tuple(new_grid)
    if old_grid == new_grid:
        return pos_embed
    channels = pos_embed.shape[-1]
    grid = pos_embed.float().reshape(1, old_grid[0], old_grid[1], channels).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=new_grid, mode="bicubic", antialias=True, align_corners=False)
    return grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], channels).to(pos_embed.dtype)


def head_channel_map(source_names, target_names, keypoint_map=None) -> list[int | None]:
    """For each target keypoint, the source channel it is initialised from (None: fresh).

    keypoint_map: {target name: source name} for renamed joints; a target keypoint it does not
    mention is looked up by its own name. Raises ValueError naming an entry whose target name is
    not in the target skeleton or whose source name is not in the source skeleton.
    """
    keypoint_map = dict(keypoint_map or {})
    source_index = {name: i for i, name in enumerate(source_names or ())}
    for target, source in keypoint_map.items():
        if target not in target_names:
            raise ValueError(f"keypoint map entry {target!r}: {source!r}: {target!r} is not a keypoint of the "
                             f"target skeleton ({', '.join(target_names)})")
        if source not in source_index:
            known = ", ".join(source_names) if source_names else "none: the source's keypoint names are unknown"
            raise ValueError(f"keypoint map entry {target!r}: {source!r}: {source!r} is not a keypoint of the "
                             f"source skeleton ({known})")
    return [source_index.get(keypoint_map.get(name, name)) for name in target_names]


_BLOCK = re.compile(r"^backbone\.blocks\.(\d+)\.")


def _depth(state) -> int:
    return len({m.group(1) for n in state for m in [_BLOCK.match(n)] if m})


def check_backbone_fits(source_state, target_state, source: str) -> None:
    """BackboneMismatchError, in one line naming the dimension, unless the source's backbone has
    the model's shapes (the position embedding's token count aside: it is resampled)."""
    patch = "backbone.patch_embed.proj.weight"
    if patch not in source_state:
        raise BackboneMismatchError(f"{source}: no backbone weights in it ({patch} is missing); not a ViTPose "
                                    f"checkpoint")
    dims = [("embed dim", source_state[patch].shape[0], target_state[patch].shape[0]),
            ("depth (transformer blocks)", _depth(source_state), _depth(target_state)),
            ("patch size", tuple(source_state[patch].shape[2:]), tuple(target_state[patch].shape[2:]))]
    fc1 = "backbone.blocks.0.mlp.fc1.weight"
    if fc1 in source_state and fc1 in target_state:
        dims.append(("MLP width", source_state[fc1].shape[0], target_state[fc1].shape[0]))
    for what, theirs, ours in dims:
        if theirs != ours:
            raise BackboneMismatchError(f"{source}: its backbone does not fit the model: {what} {theirs} in the "
                                        f"source, {ours} in the model (model.name / model.extra)")
    for name, tensor in target_state.items():
        if not name.startswith("backbone.") or name == POS_EMBED:
            continue
        if name not in source_state or source_state[name].shape != tensor.shape:
            found = tuple(source_state[name].shape) if name in source_state else "missing"
            raise BackboneMismatchError(f"{source}: its backbone does not fit the model: {name} is {found} in "
                                        f"the source, {tuple(tensor.shape)} in the model")


def _copy_backbone(target_state, source_state, source_grid, target_grid, notes) -> None:
    for name, tensor in target_state.items():
        if not name.startswith("backbone."):
            continue
        value = source_state[name]
        if name == POS_EMBED and value.shape != tensor.shape:
            if source_grid is None or source_grid[0] * source_grid[1] != value.shape[1]:
                raise BackboneMismatchError(f"position embedding of {value.shape[1]} tokens: the source's patch "
                                            f"grid is unknown, cannot resample it to {tuple(target_grid)}")
            value = resample_pos_embed(value, source_grid, target_grid)
            notes.append(f"position embedding resampled from a {source_grid[0]}x{source_grid[1]} to a "
                         f"{target_grid[0]}x{target_grid[1]} patch grid (the input size differs; timm's rule)")
        tensor.copy_(value)


def _copy_deconv(target_state, source_state, notes) -> None:
    names = [n for n in target_state if n.startswith(DECONV)]
    if not names:
        return
    fits = all(n in source_state and source_state[n].shape == target_state[n].shape for n in names)
    if fits:
        for name in names:
            target_state[name].copy_(source_state[name])
        notes.append(f"deconvolution layers copied ({len(names)} tensors)")
    else:
        notes.append("deconvolution layers start fresh: the source has none or other shapes")


def transfer_weights(model, source_state, source_names, target_names, keypoint_map=None,
                     source_grid=None, source: str = "the source") -> TransferReport:
    """Initialise `model` (a ViTPose) from `source_state` (own layout); see the module doc.

    source_names: the source skeleton's keypoint names in channel order (None: unknown, every
    channel starts fresh); target_names: the model's. source_grid: the source's (h, w) patch grid,
    needed only when its position embedding has another token count than the model's.
    """
    target_state = model.state_dict()
    check_backbone_fits(source_state, target_state, source)
    report = TransferReport(source, order=list(target_names))
    channels = head_channel_map(source_names, target_names, keypoint_map)
    with torch.no_grad():
        _copy_backbone(target_state, source_state, source_grid, model.backbone.patch_embed.grid_size, report.notes)
        _copy_deconv(target_state, source_state, report.notes)
        weight, bias = target_state[FINAL + "weight"], target_state[FINAL + "bias"]
        src_weight, src_bias = source_state.get(FINAL + "weight"), source_state.get(FINAL + "bias")
        head_fits = src_weight is not None and src_bias is not None and src_weight.shape[1:] == weight.shape[1:]
        if source_names is None:
            report.notes.append("the source's keypoint names are unknown: every heatmap channel starts fresh")
        elif not head_fits:
            report.notes.append("the source's final layer has another input width or kernel (another decoder): "
                                "every heatmap channel starts fresh")
        for k, (name, j) in enumerate(zip(target_names, channels)):
            if j is None or not head_fits or source_names is None:
                report.fresh.append(name)
                continue
            weight[k].copy_(src_weight[j])
            bias[k].copy_(src_bias[j])
            report.copied.append((name, source_names[j], j))
    return report
