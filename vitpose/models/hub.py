"""Published ViTPose weights by name: `list_models()`, `download(name)`, `model_spec(name_or_path)`.

Two kinds of host, each through its own library's cache so that the usual settings work:
- MMPose 1.x checkpoints on MMPose's download server go through `torch.hub`
  (`$TORCH_HOME/hub/checkpoints/<file>`, default `~/.cache/torch/hub/checkpoints`). The file name
  carries the first 8 hex digits of the file's SHA-256 (OpenMMLab's `publish_model` convention);
  the download is checked against them and a file that fails is never left in the cache.
  torch.hub would not find these digits itself (its pattern wants `-<hex>.` and these names
  continue `-<hex>_<date>.`), so the prefix is recorded here and passed explicitly.
- Hugging Face repos (`usyd-community/vitpose-*`) go through `huggingface_hub.hf_hub_download(
  repo_id, "model.safetensors")` at the repo's default revision, so `HF_HOME`, `HF_HUB_CACHE`
  and `HF_HUB_OFFLINE=1` behave as in every HF library.

Offline: a cached file is used without any network access. `HF_HUB_OFFLINE=1` also keeps the
torch.hub names off the network. A name that is neither cached nor downloadable raises
`DownloadError` saying which file to fetch, from where, and where to put it.

A path to an existing file passes through unchanged; `model_spec` then reads the model size,
decoder and number of keypoints from the file's tensor names and shapes (no weights are loaded).
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DownloadError", "ModelInfo", "ModelSpec", "UnknownModelError", "download", "list_models",
           "model_spec", "is_offline"]

MMPOSE_URL = "https://download.openmmlab.com/mmpose/v1/body_2d_keypoint/topdown_heatmap/coco/"
HF_FILENAME = "model.safetensors"
# ViTPose+ experts in the order of HF's `dataset_index` (0 = COCO, the head HF's files carry).
PLUS_EXPERTS = ("coco", "aic", "mpii", "ap10k", "apt36k", "coco_wholebody")
WEIGHT_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors", ".ckpt")


class UnknownModelError(ValueError):
    """A model name that is neither a published name nor an existing file."""


class DownloadError(RuntimeError):
    """Weights that are not cached and could not be downloaded (offline, no network, bad hash)."""


@dataclass(frozen=True)
class ModelInfo:
    """One published checkpoint.

    name: what `download` and `Predictor.from_pretrained` take. size: `build_model`'s name
    ("vitpose-s" ...). decoder: "classic" | "simple". dataset: what it was trained on.
    source: "mmpose" (MMPose's server, torch.hub) | "huggingface". location: the URL or the
    repo id. sha256_prefix: the digits the download is checked against (MMPose files).
    coco_ap: COCO val2017 AP with MMPose's detection boxes, as the host publishes it (None:
    not published with the file). plus: a ViTPose+ (mixture-of-experts) file.
    """

    name: str
    size: str
    decoder: str
    dataset: str
    source: str
    location: str
    sha256_prefix: str | None = None
    coco_ap: float | None = None
    plus: bool = False

    @property
    def filename(self) -> str:
        return self.location.rsplit("/", 1)[-1] if self.source == "mmpose" else HF_FILENAME


@dataclass(frozen=True)
class ModelSpec:
    """What to build for a weights file: `build_model(size, decoder, num_keypoints)`.

    expert: the ViTPose+ expert to take from a mixture-of-experts file (None for plain files).
    """

    size: str
    decoder: str
    num_keypoints: int = 17
    expert: str | None = None


def _mmpose(name, size, decoder, stem, sha, date, ap):
    url = f"{MMPOSE_URL}td-hm_ViTPose-{stem}_8xb64-210e_coco-256x192-{sha}_{date}.pth"
    return ModelInfo(name, size, decoder, "coco", "mmpose", url, sha, ap)


def _hf(name, size, decoder, repo, dataset="coco", plus=False):
    return ModelInfo(name, size, decoder, dataset, "huggingface", f"usyd-community/{repo}", plus=plus)


# MMPose 1.3.2's configs/body_2d_keypoint/topdown_heatmap/coco/vitpose_coco.yml (URLs and AP);
# the HF repos of the usyd-community organisation (converted from the official ViTPose release).
# ViT-B exists on both hosts: the short names are HF's (faster CDN, the names HF users know),
# MMPose's files are "-mmpose".
_TABLE = (
    _mmpose("vitpose-s", "vitpose-s", "classic", "small", "62d7a712", "20230314", 0.739),
    _mmpose("vitpose-s-simple", "vitpose-s", "simple", "small-simple", "4c101a76", "20230314", 0.736),
    _hf("vitpose-b", "vitpose-b", "classic", "vitpose-base"),
    _hf("vitpose-b-simple", "vitpose-b", "simple", "vitpose-base-simple"),
    _mmpose("vitpose-b-mmpose", "vitpose-b", "classic", "base", "216eae50", "20230314", 0.757),
    _mmpose("vitpose-b-simple-mmpose", "vitpose-b", "simple", "base-simple", "0b8234ea", "20230407", 0.756),
    _mmpose("vitpose-l", "vitpose-l", "classic", "large", "53609f55", "20230314", 0.782),
    _mmpose("vitpose-l-simple", "vitpose-l", "simple", "large-simple", "3a7ee9e1", "20230314", 0.780),
    _mmpose("vitpose-h", "vitpose-h", "classic", "huge", "e32adcd4", "20230314", 0.788),
    _mmpose("vitpose-h-simple", "vitpose-h", "simple", "huge-simple", "ffd48c05", "20230314", 0.789),
    _hf("vitpose-b-coco-aic-mpii", "vitpose-b", "classic", "vitpose-base-coco-aic-mpii", "coco+aic+mpii"),
    _hf("vitpose-plus-s", "vitpose-s", "classic", "vitpose-plus-small", "6 datasets (ViTPose+)", plus=True),
    _hf("vitpose-plus-b", "vitpose-b", "classic", "vitpose-plus-base", "6 datasets (ViTPose+)", plus=True),
    _hf("vitpose-plus-l", "vitpose-l", "classic", "vitpose-plus-large", "6 datasets (ViTPose+)", plus=True),
    _hf("vitpose-plus-h", "vitpose-h", "classic", "vitpose-plus-huge", "6 datasets (ViTPose+)", plus=True),
)
MODELS: dict[str, ModelInfo] = {info.name: info for info in _TABLE}


def list_models() -> list[ModelInfo]:
    """Every published name with its size, decoder, dataset and source."""
    return list(MODELS.values())


def format_model_table() -> str:
    """`list_models()` as a plain-text table (for messages and the command line)."""
    rows = [("name", "size", "decoder", "dataset", "source", "COCO AP")]
    for m in MODELS.values():
        rows.append((m.name, m.size, m.decoder, m.dataset, m.source, f"{m.coco_ap:.3f}" if m.coco_ap else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def is_offline() -> bool:
    """HF_HUB_OFFLINE=1 (or TRANSFORMERS_OFFLINE=1): no network for any name, HF's or MMPose's."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def _looks_like_path(text: str) -> bool:
    return os.sep in text or "/" in text or text.endswith(WEIGHT_SUFFIXES) or text.startswith(".")


def lookup(name: str) -> ModelInfo:
    """The published checkpoint called `name`; UnknownModelError lists the names."""
    if name in MODELS:
        return MODELS[name]
    close = difflib.get_close_matches(name, list(MODELS), n=3, cutoff=0.75)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise UnknownModelError(f"unknown model {name!r}{hint}; give a weights file path or one of these names:\n"
                            + format_model_table())


def download(name_or_path: str | os.PathLike, progress: bool = True, check_hash: bool = True) -> Path:
    """The local path of a published checkpoint (downloaded once, then cached), or a user's own file.

    Args:
        name_or_path: a name from `list_models()` or the path of an existing weights file.
        progress: show the download's progress bar.
        check_hash: check an MMPose download against the SHA-256 prefix in its file name.
    Raises:
        FileNotFoundError: a path (it has a directory part or a weights suffix) that does not exist.
        UnknownModelError: neither a file nor a published name (the message lists the names).
        DownloadError: not cached and not downloadable; the message says what to fetch and where.
    """
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    text = str(name_or_path)
    if text not in MODELS and _looks_like_path(text):
        raise FileNotFoundError(f"weights file not found: {text} (and it is not a model name; see "
                                f"vitpose.hub.list_models())")
    info = lookup(text)
    if info.source == "huggingface":
        return _download_hf(info)
    return _download_torch_hub(info, progress, check_hash)


def torch_hub_path(info: ModelInfo) -> Path:
    """Where torch.hub keeps (or will keep) an MMPose checkpoint."""
    import torch.hub

    return Path(torch.hub.get_dir()) / "checkpoints" / info.filename


def _download_torch_hub(info: ModelInfo, progress: bool, check_hash: bool) -> Path:
    import torch.hub

    target = torch_hub_path(info)
    if target.is_file():
        return target  # checked when it was downloaded, as torch.hub does
    how = (f"fetch {info.location} into {target} once with network access, e.g. "
           f"`vitpose.hub.download({info.name!r})` or `curl -L --create-dirs -o {target} {info.location}`")
    if is_offline():
        raise DownloadError(f"{info.name} is not in the torch.hub cache and HF_HUB_OFFLINE is set: {how}")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Writes to a temporary file and moves it into place only after the hash matched.
        torch.hub.download_url_to_file(info.location, str(target), info.sha256_prefix if check_hash else None,
                                       progress=progress)
    except RuntimeError as e:
        if "hash" not in str(e):
            raise
        raise DownloadError(f"{info.name}: the download from {info.location} failed its SHA-256 check "
                            f"({e}); nothing was cached. Retry, or pass check_hash=False if you trust the "
                            f"server's file.") from None
    except OSError as e:  # URLError, connection refused, DNS, disk
        raise DownloadError(f"{info.name} could not be downloaded ({type(e).__name__}: {e}); {how}") from None
    return target


def _download_hf(info: ModelInfo) -> Path:
    try:
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise DownloadError(f"{info.name} is hosted on the Hugging Face Hub: `pip install huggingface_hub`") from None
    try:
        return Path(hf_hub_download(info.location, HF_FILENAME))
    except LocalEntryNotFoundError as e:
        reason = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hub could not be reached"
        raise DownloadError(
            f"{info.name} ({info.location}/{HF_FILENAME}) is not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}) and {reason}. Fetch it once with network access: "
            f"`hf download {info.location} {HF_FILENAME}` or `vitpose.hub.download({info.name!r})`; "
            f"then offline runs (HF_HUB_OFFLINE=1) find it. ({type(e).__name__})") from None
    except HfHubHTTPError as e:
        raise DownloadError(f"{info.name}: the Hub refused {info.location}/{HF_FILENAME}: {e}") from None


# ----------------------------------------------------------------------------------------------
# What to build for a file: size, decoder, keypoints, from tensor names and shapes alone.
# (Private here; issue 13 adds `infer_model_spec(state_dict)` to vitpose.models.checkpoint.)

# The transformer-block index in every layout: own/official `blocks.N.`, MMPose `layers.N.`,
# HF `encoder.layer.N.` (names without the `backbone.` prefix).
_BLOCK = re.compile(r"^(?:blocks|layers|encoder\.layer)\.(\d+)\.")
# The heatmap layer (output channels = K): `final_layer` (own, MMPose, official), HF `conv`.
_FINAL = re.compile(r"^(?:head|keypoint_head)\.(?:final_layer|conv)\.weight$")


def model_spec(name_or_path: str | os.PathLike, expert: str | None = None) -> ModelSpec:
    """What `build_model` needs for a published name or a weights file.

    Args:
        name_or_path: a name from `list_models()` or a weights file (read for names and shapes only).
        expert: for ViTPose+ files, the expert to take ("coco" by default; see PLUS_EXPERTS).
    """
    if expert is not None and expert not in PLUS_EXPERTS:
        raise ValueError(f"expert must be one of {', '.join(PLUS_EXPERTS)}, got {expert!r}")
    path = Path(name_or_path).expanduser()
    if str(name_or_path) in MODELS and not path.is_file():
        info = MODELS[str(name_or_path)]
        spec = ModelSpec(info.size, info.decoder, 17, "coco" if info.plus else None)
    else:
        spec = spec_from_shapes(tensor_shapes(download(name_or_path)), origin=str(name_or_path))
    if expert is not None:
        if spec.expert is None:
            raise ValueError(f"expert={expert!r}: {name_or_path} is not a ViTPose+ (mixture-of-experts) file")
        spec = ModelSpec(spec.size, spec.decoder, spec.num_keypoints, expert)
    return spec


def tensor_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of a weights file, wrappers (`state_dict`, `module.`) removed.

    safetensors headers are read without the tensors; pickles are memory-mapped."""
    from vitpose.models.checkpoint import CheckpointError, describe_file, strip_wrapper_prefixes

    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                return {strip_wrapper_prefixes(k): tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        except Exception as e:  # safetensors' own error type for a bad header
            raise CheckpointError(f"{path}: cannot be read as safetensors ({describe_file(path)}; {e})") from None
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # not a zip (legacy pickle cannot be mapped), foreign objects, garbage
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:
            raise CheckpointError(f"{path}: not a readable checkpoint ({describe_file(path)}; "
                                  f"{type(e).__name__})") from None
    while isinstance(obj, dict) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
        inner = next((obj[k] for k in ("state_dict", "model", "module") if isinstance(obj.get(k), dict)), None)
        if inner is None:
            break
        obj = inner
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a mapping of parameter names to tensors, got {type(obj).__name__}")
    return {strip_wrapper_prefixes(k): tuple(v.shape) for k, v in obj.items() if isinstance(v, torch.Tensor)}


def spec_from_shapes(shapes: dict[str, tuple[int, ...]], origin: str = "weights") -> ModelSpec:
    """Size (embedding width and depth), decoder (deconvolutions or not) and K of a ViTPose file.

    Works for this project's, MMPose 1.x, official ViTPose / ViTPose+ and HF layouts."""
    from vitpose.models.vitpose import MODEL_SIZES

    body = {n[len("backbone."):]: s for n, s in shapes.items() if n.startswith("backbone.")}
    # The patch embedding is the only convolution on the 3 image channels: its rows are the width.
    widths = {s[0] for s in body.values() if len(s) == 4 and s[1] == 3}
    depth = len({m.group(1) for n in body for m in [_BLOCK.match(n)] if m})
    finals = [s for n, s in shapes.items() if _FINAL.match(n)]
    if len(widths) != 1 or not depth or len(finals) != 1:
        raise ValueError(f"{origin}: not a ViTPose checkpoint this project can read by itself (found "
                         f"{len(widths)} patch embeddings, {depth} transformer blocks, {len(finals)} "
                         f"heatmap layers); give --config / build the model yourself")
    width = widths.pop()
    size = next((n for n, cfg in MODEL_SIZES.items()
                 if cfg["embed_dim"] == width and cfg["depth"] == depth), None)
    if size is None:
        raise ValueError(f"{origin}: a ViT with width {width} and {depth} blocks is none of "
                         f"{sorted(MODEL_SIZES)}; give --config / build the model yourself")
    decoder = "classic" if any("deconv" in n for n in shapes) else "simple"
    plus = any(".experts." in n for n in body)
    return ModelSpec(size, decoder, int(finals[0][0]), "coco" if plus else None)
