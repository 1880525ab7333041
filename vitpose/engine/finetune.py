"""Fine-tuning: initialise a run from a pose model (`model.init` / `--init`) and freeze its backbone
for the first epochs (`train.freeze_backbone_epochs`). docs/recipe.md §9.

Two calls from training: `init_from_source(model, cfg, skeleton, work_dir)` once, after the model
is built and before the optimizer is; `apply_backbone_freeze(model, epoch, cfg)` at the start of
each epoch (a resumed run calls it too, so the epoch alone decides: resume keeps it right).

`read_init_source` is the one place that reads a source: `vitpose.load_model` (names, HF repo ids,
files of every layout, ViTPose+ experts, the skeleton the source records or implies), reduced to
the source's weights in this project's layout, its keypoint names and its patch grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vitpose.builders import load_model
from vitpose.config import ConfigError
from vitpose.errors import UserError
from vitpose.models.checkpoint import CheckpointError
from vitpose.models.transfer import TransferReport, transfer_weights

__all__ = ["InitSource", "apply_backbone_freeze", "init_from_source", "read_init_source"]

TABLE_FILE = "init_keypoints.txt"


@dataclass
class InitSource:
    """A source's weights in this project's layout (its own patch grid), its keypoint names in
    channel order, its (h, w) patch grid and what it is, in words."""

    state_dict: dict
    keypoint_names: tuple[str, ...]
    grid: tuple[int, int]
    note: str


def read_init_source(source: str, expert: str | None = None) -> InitSource:
    """The weights and keypoint names of a model name, HF repo id, weights or checkpoint file:
    whatever `vitpose.load_model` takes (its layouts, experts, caches and skeleton rules)."""
    loaded = load_model(source, expert=expert, device="cpu")
    model = loaded.model
    spec = loaded.spec
    note = (f"source: {spec.embed_dim}-d, {spec.depth}-block ViT, {spec.decoder} decoder, the "
            f"{loaded.skeleton.name!r} skeleton ({loaded.skeleton.num_keypoints} keypoints; the spec from {spec.origin})")
    return InitSource(model.state_dict(), tuple(loaded.skeleton.keypoint_names),
                      tuple(model.backbone.patch_embed.grid_size), note)


def init_from_source(model, cfg, skeleton, work_dir: Path | None, is_main: bool = True) -> TransferReport:
    """Initialise `model` from `cfg.model.init` (see the module doc); prints the copied / fresh
    table and writes it to WORK_DIR/init_keypoints.txt (main process)."""
    try:
        source = read_init_source(cfg.model.init, cfg.model.init_expert)
    except CheckpointError:
        raise
    except UserError as e:  # not found, not cached, unknown name, no skeleton: one line, the field named
        raise CheckpointError(f"model.init = {cfg.model.init!r}: {e}") from None
    try:
        report = transfer_weights(model, source.state_dict, source.keypoint_names, skeleton.keypoint_names,
                                  cfg.model.init_keypoint_map, source.grid, source=cfg.model.init)
    except ValueError as e:  # a keypoint map entry naming no keypoint
        raise ConfigError(f"model.init_keypoint_map: {e}") from None
    if source.note:
        report.notes.insert(0, source.note)
    if is_main:
        print(report.table(), end="")
        if work_dir is not None:
            from vitpose.engine.workdir import write_text_atomic

            write_text_atomic(Path(work_dir) / TABLE_FILE, report.table())
    return report


def apply_backbone_freeze(model, epoch: int, cfg, say=print, head_only: bool = False) -> bool:
    """Backbone parameters train from epoch `train.freeze_backbone_epochs` on and get no gradient
    (so AdamW leaves them, weight decay included, untouched) before, and in a head-only stage
    (`head_only`: a distillation's last `distill.head_epochs`). Returns whether that changed:
    a DDP or compiled wrapper must then be rebuilt around the model."""
    frozen = epoch < cfg.train.freeze_backbone_epochs or head_only
    params = list(model.backbone.parameters())
    if all(p.requires_grad != frozen for p in params):
        return False
    for p in params:
        p.requires_grad_(not frozen)
    if frozen and head_only:
        say(f"epoch {epoch}: backbone frozen for the head-only stage (distill.head_epochs={cfg.distill.head_epochs})")
    elif frozen:
        say(f"epoch {epoch}: backbone frozen (train.freeze_backbone_epochs={cfg.train.freeze_backbone_epochs}); "
            f"only the head trains")
    elif cfg.train.freeze_backbone_epochs:
        say(f"epoch {epoch}: backbone unfrozen")
    return True
