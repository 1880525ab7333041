"""Fine-tuning: initialise a run from a pose model (`model.init` / `--init`) and freeze its backbone
for the first epochs (`train.freeze_backbone_epochs`). docs/recipe.md §9.

Two calls from training: `init_from_source(model, cfg, skeleton, work_dir)` once, after the model
is built and before the optimizer is; `apply_backbone_freeze(model, epoch, cfg)` at the start of
each epoch (a resumed run calls it too, so the epoch alone decides: resume keeps it right).

`read_init_source` is the one place that reads a source; it returns the source's weights in this
project's layout and its keypoint names. (It goes through `vitpose.models.hub` for names and
`vitpose.models.checkpoint` for files; `vitpose.load_model` can replace its body.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from vitpose.config import ConfigError
from vitpose.data.metainfo import BUILTIN_NAMES, dataset_info
from vitpose.models import hub
from vitpose.models.checkpoint import (CheckpointError, _grid_of, _read_file, _unwrap, convert_state_dict, detect_layout,
                                       select_expert)
from vitpose.models.transfer import TransferReport, transfer_weights

__all__ = ["InitSource", "apply_backbone_freeze", "init_from_source", "read_init_source"]

HF_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Heads whose keypoint count names one built-in skeleton, for files that carry no names.
SKELETON_OF_K = {17: "coco", 14: "aic", 16: "mpii", 133: "coco_wholebody"}
TABLE_FILE = "init_keypoints.txt"


@dataclass
class InitSource:
    """A source's weights in this project's layout (its own patch grid), its keypoint names in
    channel order (None: unknown), its patch grid (None: unknown) and how the names were found."""

    state_dict: dict
    keypoint_names: tuple[str, ...] | None
    grid: tuple[int, int] | None
    note: str


def resolve_source_file(source: str) -> tuple[Path, hub.ModelInfo | None]:
    """The local file of a source: an existing file, a published name, or an HF repo id (each from
    its library's cache when it is there; see vitpose.models.hub)."""
    path = Path(source).expanduser()
    if path.is_file():
        return path, None
    if source in hub.MODELS:
        return hub.download(source), hub.MODELS[source]
    if HF_REPO_ID.match(source) and not source.endswith(hub.WEIGHT_SUFFIXES):
        info = next((m for m in hub.MODELS.values() if m.location == source), None)
        info = info or hub.ModelInfo(source, "?", "?", "?", "huggingface", source)
        return hub._download_hf(info), info
    return hub.download(source), None  # raises: not found, naming the published models


def _names_from_config(payload, note_list) -> tuple[str, ...] | None:
    """The skeleton a train.py checkpoint was trained with (its resolved config's data.dataset_info)."""
    data = ((payload.get("config") or {}).get("data") or {}) if isinstance(payload, dict) else {}
    value = data.get("dataset_info")
    if not value:
        return None
    candidates = [value] if value in BUILTIN_NAMES else [Path(value), Path(data.get("root", "")) / value]
    for candidate in candidates:
        if candidate in BUILTIN_NAMES or Path(candidate).is_file():
            note_list.append(f"keypoint names from the checkpoint's config (data.dataset_info: {value})")
            return dataset_info(candidate).keypoint_names
    note_list.append(f"the checkpoint's skeleton file {value} is not found")
    return None


def read_init_source(source: str, expert: str | None = None) -> InitSource:
    """The weights and keypoint names of a model name, HF repo id, weights or checkpoint file."""
    path, info = resolve_source_file(source)
    payload = _read_file(path)
    state, choice = select_expert(_unwrap(payload, str(path)), expert, str(path))
    layout, _ = detect_layout(state)
    notes = []
    names = _names_from_config(payload, notes)
    pos = next((v for n, v in state.items() if n.endswith(("pos_embed", "position_embeddings"))), None)
    tokens = None if pos is None else pos.shape[1] - (1 if layout in ("official", "hf") else 0)
    # A stand-in with the source's own token count: the conversion folds the class-token row of
    # official/HF files but resizes nothing (the transfer resamples, with a message).
    config_size = (((payload.get("config") or {}).get("model") or {}).get("input_size")
                   if isinstance(payload, dict) else None)
    grid = (config_size[1] // 16, config_size[0] // 16) if config_size else (
        _grid_of(tokens, (16, 12)) if tokens else None)
    stand_in = SimpleNamespace(backbone=SimpleNamespace(
        pos_embed=torch.empty(1, tokens or 0, 0), patch_embed=SimpleNamespace(
            grid_size=grid or (tokens or 1, 1), proj=SimpleNamespace(weight=torch.empty(0, 0, 0, 0)))))
    converted = convert_state_dict(state, stand_in)
    final = converted.get("head.final_layer.weight")
    if names is None and choice is not None and choice.heads == "official":
        names = dataset_info(choice.name).keypoint_names
        notes.append(f"keypoint names of the ViTPose+ expert {choice.name!r}")
    elif names is None and final is not None and final.shape[0] in SKELETON_OF_K:
        names = dataset_info(SKELETON_OF_K[final.shape[0]]).keypoint_names
        notes.append(f"{final.shape[0]} heatmap channels: taken as {SKELETON_OF_K[final.shape[0]]}'s keypoints")
    if names is not None and final is not None and len(names) != final.shape[0]:
        notes.append(f"{len(names)} keypoint names for {final.shape[0]} heatmap channels: names not used")
        names = None
    return InitSource(converted, None if names is None else tuple(names), grid, "; ".join(notes))


def init_from_source(model, cfg, skeleton, work_dir: Path | None, is_main: bool = True) -> TransferReport:
    """Initialise `model` from `cfg.model.init` (see the module doc); prints the copied / fresh
    table and writes it to WORK_DIR/init_keypoints.txt (main process)."""
    try:
        source = read_init_source(cfg.model.init, cfg.model.init_expert)
    except (FileNotFoundError, hub.UnknownModelError, hub.DownloadError) as e:
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


def apply_backbone_freeze(model, epoch: int, cfg, say=print) -> bool:
    """Backbone parameters train from epoch `train.freeze_backbone_epochs` on and get no gradient
    (so AdamW leaves them, weight decay included, untouched) before. Returns whether that changed:
    a DDP or compiled wrapper must then be rebuilt around the model."""
    frozen = epoch < cfg.train.freeze_backbone_epochs
    params = list(model.backbone.parameters())
    if all(p.requires_grad != frozen for p in params):
        return False
    for p in params:
        p.requires_grad_(not frozen)
    if frozen:
        say(f"epoch {epoch}: backbone frozen (train.freeze_backbone_epochs={cfg.train.freeze_backbone_epochs}); "
            f"only the head trains")
    elif cfg.train.freeze_backbone_epochs:
        say(f"epoch {epoch}: backbone unfrozen")
    return True
