"""Weights into a model, and the one door from anything that names a model to a loaded one.

- `load_weights(model, source)`: a state dict of any published layout (`vitpose.models.layouts`)
  fitted into a built model; a strict mismatch is one error that names every key and says what the
  file looks like.
- `open_model(source, expert=None)` -> `ModelFile`: a model name of `vitpose.hub`, an HF repo id
  (`org/repo[@revision]`) or a weights / checkpoint file, found (downloaded once, then cached) and
  read once, a ViTPose+ expert chosen. `ModelFile.build(spec=None, device=None)`: the ViTPose of
  `spec`, else of what the file records, else of its tensor shapes (and the HF `config.json`'s
  head count), checked against the tensors before anything is allocated, its weights loaded
  (strict). The skeleton stays plain data here: `vitpose.load_model` (`vitpose.builders`) turns it
  into a `DatasetInfo` and adds what only a training config knows.
"""

import dataclasses
import logging
import math
import re
from collections import namedtuple
from pathlib import Path

import torch

from vitpose import hub
from vitpose.hub import WeightsNotFoundError
from vitpose.models.checkpoint import CheckpointError, WeightsFile, read_state_dict, read_weights
from vitpose.models.layouts import (
    ExpertChoice,
    convert_layout,
    expert_note,
    infer_model_spec,
    is_vitpose_plus,
    select_expert,
)
from vitpose.models.spec import ModelSpec, SpecError

__all__ = ["SKELETON_BY_KEYPOINTS", "LoadReport", "ModelFile", "check_spec", "fit_weights", "load_weights",
           "open_model", "resolve_weights"]

log = logging.getLogger(__name__)

LoadReport = namedtuple("LoadReport", "layout missing unexpected mismatched skipped notes")

EMBED_DIM_TO_SIZE = {384: "ViT-S", 768: "ViT-B", 1024: "ViT-L", 1280: "ViT-H"}


# ----------------------------------------------------------------------------------------------
# Fitting a converted state dict to the model


def _describe(source_sd, converted, model, mismatched, choice=None):
    """What the file looks like, in words, for the error message."""
    hints = []
    target = model.state_dict()
    patch = "backbone.patch_embed.proj.weight" if hasattr(model, "backbone") else "patch_embed.proj.weight"
    if patch in converted and patch in target and converted[patch].shape[0] != target[patch].shape[0]:
        c_file, c_model = converted[patch].shape[0], target[patch].shape[0]
        hints.append(f"{EMBED_DIM_TO_SIZE.get(c_file, f'embed-dim {c_file}')} weights for a "
                     f"{EMBED_DIM_TO_SIZE.get(c_model, f'embed-dim {c_model}')} model")
    blocks_file = {int(m.group(1)) for n in converted for m in [re.search(r"blocks\.(\d+)\.", n)] if m}
    blocks_model = {int(m.group(1)) for n in target for m in [re.search(r"blocks\.(\d+)\.", n)] if m}
    if blocks_file and blocks_model and len(blocks_file) != len(blocks_model):
        hints.append(f"{len(blocks_file)} transformer blocks in the file, {len(blocks_model)} in the model")
    final = "head.final_layer.weight"
    if final in converted and final in target:
        k_file, k_model = converted[final].shape[0], target[final].shape[0]
        if k_file != k_model:
            hints.append(f"a {k_file}-keypoint head (the model has {k_model} keypoints)")
            if choice is not None and choice.heads == "single":
                hints.append(f"an HF vitpose-plus file carries one head (COCO's, {k_file} keypoints); "
                             f"expert={choice.name!r} chose the backbone expert only: build the model with "
                             f"num_keypoints={k_file}, or load with strict=False to keep the model's own head")
            elif choice is not None:
                hints.append(f"expert {choice.name!r} has {k_file} keypoints: build the model with "
                             f"num_keypoints={k_file}")
        elif converted[final].shape[2:] != target[final].shape[2:]:
            kind = "classic" if converted[final].shape[-1] == 1 else "simple"
            hints.append(f"a {kind}-decoder head for a {'simple' if kind == 'classic' else 'classic'}-decoder model")
    has_deconv_file = any(n.startswith("head.deconv_layers.") for n in converted)
    has_deconv_model = any(n.startswith("head.deconv_layers.") for n in target)
    if has_deconv_file != has_deconv_model and not any("decoder head" in h for h in hints):
        hints.append("a classic-decoder checkpoint for a simple-decoder model" if has_deconv_file
                     else "a simple-decoder checkpoint for a classic-decoder model")
    return hints


def _fit(converted, model, layout, backbone_only):
    target = model.state_dict()
    missing, mismatched = [], []
    for name, tensor in target.items():
        if name not in converted:
            if name.endswith("num_batches_tracked"):
                continue  # older files lack it; BatchNorm starts its count at 0
            if backbone_only and not name.startswith("backbone.") and hasattr(model, "backbone"):
                continue  # backbone initialisation: the head keeps its own init
            if layout == "mae" and re.match(r"^(backbone\.)?norm\.", name):
                continue  # MAE's encoder norm is not ViTPose's final norm (see module doc)
            missing.append(name)
        elif tuple(converted[name].shape) != tuple(tensor.shape):
            mismatched.append(f"{name}: file {tuple(converted[name].shape)} vs model {tuple(tensor.shape)}")
    unexpected = sorted(n for n in converted if n not in target)
    return missing, unexpected, mismatched


def load_weights(model, source, strict=True, expert=None, *, origin=None):
    """Load weights of any supported layout into `model` (a ViTPose or a bare VisionTransformer).

    Args:
        model: the model to fill.
        source: a .pth/.pt/.bin/.safetensors path or a mapping name -> tensor / ndarray.
        strict: True: any missing, unexpected or wrongly shaped key raises one CheckpointError that
            names them all and says what the file looks like. False: loads what fits, logs the rest.
        expert: for a ViTPose+ (mixture-of-experts) file, required: the dataset whose expert (and,
            in an official file, head) to load, by name ("coco", "aic", "mpii", "ap10k", "apt36k",
            "coco_wholebody") or index 0..5 (HF's dataset_index). HF vitpose-plus files have COCO's
            head only, whatever the expert. Given for any other file, it is an error.
        origin: the name messages give a mapping source (default "weights mapping").

    Returns a LoadReport(layout, missing, unexpected, mismatched, skipped, notes).
    """
    state_dict, read_origin = read_state_dict(source)
    origin = origin or read_origin
    fitting, report = fit_weights(model, state_dict, strict, expert, origin=origin)
    model.load_state_dict(fitting, strict=False)
    for note in report.notes:
        log.info("%s: %s", origin, note)
    if report.skipped:
        log.info("%s: skipped keys with no counterpart in the model: %s", origin, ", ".join(report.skipped))
    if report.missing or report.unexpected or report.mismatched:
        log.warning("%s: loaded non-strictly; missing %s, unexpected %s, mismatched %s",
                    origin, report.missing, report.unexpected, report.mismatched)
    return report


def fit_weights(model, state_dict, strict=True, expert=None, *, origin="weights mapping") -> tuple[dict, LoadReport]:
    """What `load_weights` would load into `model` (the converted tensors that fit it) and its
    report, without loading: `model` may live on the meta device, so a file that does not fit is
    refused before the model's memory is allocated. `state_dict`: plain, as `read_state_dict` gives
    it. Strict mismatches raise CheckpointError."""
    state_dict, choice = select_expert(state_dict, expert, origin)
    converted, layout, skipped, notes, backbone_only = convert_layout(state_dict, model)
    missing, unexpected, mismatched = _fit(converted, model, layout, backbone_only)
    if choice is not None:
        layout = f"vitpose+ {layout}"
        notes.insert(0, expert_note(choice))
    if strict and (missing or unexpected or mismatched):
        parts = []  # one line, as every UserError (the command prints it after "error:")
        hints = _describe(state_dict, converted, model, mismatched, choice)
        if hints:
            parts.append("the file looks like " + "; ".join(hints))
        for title, items in (("missing in the file", missing), ("unexpected in the file", unexpected),
                             ("shape mismatch", mismatched)):
            if items:
                parts.append(f"{title} ({len(items)}): " + ", ".join(items[:40]) + (" ..." if len(items) > 40 else ""))
        raise CheckpointError(f"{origin} ({layout} layout) does not fit {type(model).__name__}: " + "; ".join(parts))
    bad = set(unexpected) | {m.split(":", 1)[0] for m in mismatched}
    fitting = {n: v for n, v in converted.items() if n not in bad}
    return fitting, LoadReport(layout, missing, unexpected, mismatched, skipped, notes)




# ----------------------------------------------------------------------------------------------
# The door: a model name, an HF repo id or a weights file -> a built model with its weights

# A head of this many keypoints, with no skeleton recorded, is this built-in dataset's (the
# published checkpoints of MMPose, the official release and HF; AP-10K's 17 need `expert=`).
SKELETON_BY_KEYPOINTS = {17: "coco", 133: "coco_wholebody", 14: "aic", 16: "mpii"}
# Files `vitpose export` writes: graphs, not weights.
EXPORTED = {".onnx": "an exported ONNX file: run it with vitpose.OnnxPredictor(path) or `vitpose predict --model "
                     "FILE.onnx`",
            ".pt2": "an exported torch.export program: run it with torch.export.load(path).module()"}


def resolve_weights(source) -> tuple[Path, "hub.ModelInfo | None", "tuple[str, str | None] | None"]:
    """(local weights file, the named model or None, (HF repo id, revision) or None) of a source.

    A path that exists is that path, never an HF repo id (a folder `org/repo` here is the folder,
    and the message says how to reach the repo); then a name of `vitpose.hub.list_models()` (any
    case); then `org/repo[@revision]` when no folder `org` is here. Anything else: one line, with
    the closest names for a misspelt name.
    """
    if not isinstance(source, (str, Path)):
        raise TypeError(f"source must be a model name, an HF repo id or a path, got {type(source).__name__}")
    path = Path(source).expanduser()
    text = str(source).strip()
    if path.is_file():
        if path.suffix.lower() in EXPORTED:
            raise CheckpointError(f"{path} is {EXPORTED[path.suffix.lower()]}; loading a model (and exporting "
                                  f"one) needs the weights file it was exported from")
        return path, None, None
    repo = hub.parse_repo_id(text)
    if path.is_dir():
        raise WeightsNotFoundError(_folder_message(path, text, repo))
    if text.lower() in hub.MODELS:
        info = hub.lookup(text)
        return hub.download(info.name), info, None
    if repo is not None and not path.parent.is_dir():
        return hub.download_hf(*repo), None, repo
    if path.suffix or path.parent.is_dir() and str(path.parent) != ".":
        shadow = (f"; a folder {path.parent} is here, so this is read as a path, not as the HF repo id {repo[0]} "
                  f"(for the repo, run from a folder without ./{path.parent})") if repo is not None else ""
        raise WeightsNotFoundError(f"weights file not found: {text}{shadow}")
    hub.lookup(text)  # an unknown name: one line with the closest names
    raise AssertionError("unreachable")


def _folder_message(path: Path, text: str, repo) -> str:
    """A folder given as a model: what is in it, and the HF repo it hides when it is named like one."""
    try:
        inside = sorted(p.name for p in path.iterdir() if p.suffix.lower() in (*hub.WEIGHT_SUFFIXES, *EXPORTED))
    except OSError:
        inside = []
    what = (f"give one of its files, e.g. {path / inside[0]}" + (f" (it holds {', '.join(inside[:4])})"
                                                                  if len(inside) > 1 else "")
            if inside else "it holds no weights file (.safetensors, .pth, .pt, .bin, .ckpt)")
    shadow = (f"; a folder here wins over the HF repo id {repo[0]}: for the repo, run from a folder without "
              f"./{repo[0]}") if repo is not None else ""
    return f"{text} is a folder, not a weights file: {what}{shadow}"


def _read_cached(path: Path, named) -> WeightsFile:
    """read_weights; a cached download that cannot be read is fetched again when its hash is known
    and does not match (a truncated or damaged file), else named with the fix."""
    try:
        return read_weights(path)
    except CheckpointError as e:
        if not hub.is_cached_download(path):
            raise
        if named is not None and named.sha256_prefix and not hub.is_offline() and not hub.matches_hash(
                path, named.sha256_prefix):
            path.unlink()
            return read_weights(hub.download(named.name))
        raise CheckpointError(f"{e} -- it is a cached download that did not survive: delete {path} "
                              f"and run again to fetch it anew") from None


def check_spec(spec: ModelSpec, origin: str = "") -> None:
    """SpecError naming every field of `spec` that no ViTPose can have (a zero patch size, a head
    count that does not divide the width, ...), before anything is built from it."""
    problems = [f"{name} {getattr(spec, name)} (must be at least 1)"
                for name in ("embed_dim", "depth", "num_heads", "patch_size", "num_keypoints") if getattr(spec, name) < 1]
    if spec.num_heads >= 1 and spec.embed_dim % spec.num_heads:
        problems.append(f"num_heads {spec.num_heads} does not divide embed_dim {spec.embed_dim}")
    if not (math.isfinite(spec.mlp_ratio) and spec.mlp_ratio > 0):
        problems.append(f"mlp_ratio {spec.mlp_ratio} (must be positive)")
    if not (math.isfinite(spec.sigma) and spec.sigma > 0):
        problems.append(f"sigma {spec.sigma} (must be positive)")
    for name in ("input_size", "heatmap_size"):
        if min(getattr(spec, name)) < 1:
            problems.append(f"{name} {list(getattr(spec, name))} (must be positive)")
    if spec.patch_size >= 1 and min(spec.input_size) >= 1 and min(spec.input_size) < spec.patch_size:
        problems.append(f"input_size {list(spec.input_size)} is smaller than one {spec.patch_size}-pixel patch")
    if spec.decoder == "classic" and (not spec.deconv_channels or min(spec.deconv_channels) < 1):
        problems.append(f"deconv_channels {list(spec.deconv_channels)} (must be positive)")
    if problems:
        raise SpecError(f"model spec ({spec.origin or origin}): " + "; ".join(problems))


@dataclasses.dataclass
class ModelFile:
    """A model source found and read once (`open_model`).

    path: the local weights file. weights: what was read (state dict, what the file records: its
    `spec` and training `config`). state: the state dict to load (one ViTPose+ expert's when the
    file is a mixture of experts). choice: that expert (None otherwise). named: the `vitpose.hub`
    entry of a model name. repo: (HF repo id, revision) of a repo id.
    """

    path: Path
    weights: WeightsFile
    state: dict
    choice: ExpertChoice | None = None
    named: "hub.ModelInfo | None" = None
    repo: "tuple[str, str | None] | None" = None

    @property
    def origin(self) -> str:
        return self.weights.origin

    def expert_skeleton(self) -> str | None:
        """The built-in skeleton of the chosen ViTPose+ expert when the file's head is that expert's
        (official files carry one head per expert, HF's only COCO's)."""
        if self.choice is not None and (self.choice.heads == "official" or self.choice.index == 0):
            return self.choice.name
        return None

    def build(self, spec: "ModelSpec | torch.nn.Module | None" = None, device=None):
        """(model, spec, LoadReport): the ViTPose with the file's weights (strict), eval mode, on `device`
        (None/"auto": CUDA when available).

        spec: what to build: a ModelSpec, or a model already built on the meta device (a training
        config's, carrying `.spec`); None: the spec the file records, else its tensor shapes (and
        an HF repo's `config.json` head count). The spec is checked (`check_spec`) and a recorded
        one against the file's tensors on the meta device, so a damaged record is refused before
        the model's memory is allocated.
        """
        from vitpose.device import resolve_device

        recorded = spec is None and self.weights.spec is not None
        model = spec if isinstance(spec, torch.nn.Module) else None
        if model is not None:
            spec = model.spec
        spec = spec or self.weights.spec or self._spec_from_shapes()
        if self.choice is not None:
            spec = spec.replace(expert=self.choice.name)
        check_spec(spec, self.origin)
        if model is None:
            with torch.device("meta"):  # no memory and no random init: every tensor is loaded below
                model = spec.build()
        if recorded:
            self._check_recorded_grid(model, spec)
        try:
            fitting, report = fit_weights(model, self.state, origin=self.origin)
        except CheckpointError as e:
            if not recorded:
                raise
            raise CheckpointError(f"{self.origin}: the model spec recorded in the file does not describe its "
                                  f"tensors (a damaged or edited record): re-save the weights, or give the "
                                  f"training config (config= / --config)\n{e}") from None
        model = model.to_empty(device="cpu")
        for name, buffer in model.named_buffers():
            if name.endswith("num_batches_tracked"):
                buffer.zero_()  # the one entry strict loading lets older files lack
        model.load_state_dict(fitting, strict=False)  # strict: fit_weights refused any missing or extra key
        model.spec = spec
        model.to(resolve_device(device)).eval()
        return model, spec, report

    def _check_recorded_grid(self, model, spec: ModelSpec) -> None:
        """A recorded spec's input size must give the file's own position-embedding rows (one more
        for a class-token row): loading would otherwise resample the embedding to that grid."""
        # this project's, MMPose's and the official `pos_embed`; HF's `embeddings.position_embeddings`
        pos = next((v for n, v in self.state.items() if n.endswith(("pos_embed", "position_embeddings"))), None)
        rows = pos.shape[1] if pos is not None and pos.ndim == 3 else None
        tokens = model.backbone.pos_embed.shape[1]
        if rows is not None and rows not in (tokens, tokens + 1):
            raise CheckpointError(f"{self.origin}: the model spec recorded in the file says input_size "
                                  f"{list(spec.input_size)} ({tokens} patches), but its position embedding has "
                                  f"{rows} rows (a damaged or edited record): re-save the weights, or give the "
                                  f"training config (config= / --config)")

    def _spec_from_shapes(self) -> ModelSpec:
        """A spec for a file made elsewhere: its shapes, plus the head count of an HF repo's
        config.json (no shape holds it)."""
        spec = infer_model_spec(self.state, origin=self.origin)
        if self.repo is None:
            return spec
        config = hub.hf_config(*self.repo)
        backbone = config.get("backbone_config") if isinstance(config, dict) else None
        heads = backbone.get("num_attention_heads") if isinstance(backbone, dict) else None
        if heads is None:
            return spec
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or spec.embed_dim % heads:
            raise CheckpointError(
                f"{self.repo[0]}: its config.json says backbone_config.num_attention_heads {heads!r}, but a ViT of "
                f"width {spec.embed_dim} needs a positive whole number that divides it (ViTPose: "
                f"{spec.num_heads}); if the cached config.json is damaged, delete it from the Hugging Face "
                f"cache and run again")
        return spec.replace(num_heads=heads, origin=spec.origin + " + HF config.json")


def open_model(source, expert=None) -> ModelFile:
    """Find and read a model source once: a name of `vitpose.hub.list_models()` (any case), an HF
    repo id `org/repo` or `org/repo@REVISION`, or a weights / checkpoint file (`resolve_weights`).

    expert: the ViTPose+ expert of a mixture-of-experts file (a name of
    `vitpose.models.spec.EXPERTS`, an alias such as "wholebody", or an index); names and repo ids of
    ViTPose+ models default to "coco", files must say.
    """
    path, named, repo = resolve_weights(source)
    weights = _read_cached(path, named)
    if (named is not None and named.plus) or (repo is not None and is_vitpose_plus(weights.state_dict)):
        expert = "coco" if expert is None else expert  # HF's dataset_index 0, as the name table says
    state, choice = select_expert(weights.state_dict, expert, weights.origin)
    return ModelFile(path, weights, state, choice, named, repo)
