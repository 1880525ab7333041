"""Weight files: reading them once (what they record included), writing them, and saying in one
line what is wrong with a file that cannot be read.

- `.safetensors`, `.pth`, `.pt`, `.bin`, `.ckpt`; a training checkpoint's `state_dict` / `model` /
  `module` containers and DDP / torch.compile name prefixes are unwrapped.
- What a file records about itself: its `ModelSpec` (`vitpose.model_spec` in the safetensors
  metadata or at a checkpoint's top level) and a training checkpoint's `config` (`read_weights`).
- Pickle files are read with `torch.load(weights_only=True)`: a file holding other Python objects
  is refused before any of its code can run, with one explanation everywhere (`refused_pickle`).
"""

import pickle
import re
from collections import namedtuple
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from vitpose.errors import UserError
from vitpose.hub import WeightsNotFoundError
from vitpose.models.spec import METADATA_KEY, ModelSpec, spec_of_model
from vitpose.models.wrappers import strip_wrapper_prefixes, unwrap_model

__all__ = ["CheckpointError", "WeightsFile", "describe_file", "read_state_dict", "read_weights", "refused_pickle",
           "save_weights", "torch_load"]

WRAPPER_KEYS = ("state_dict", "model", "module")


class CheckpointError(UserError, RuntimeError):
    """A weights source that cannot be read or does not fit the model."""


# torch's words for a pickle that names a Python object outside its allow list: "Unsupported global:
# GLOBAL mod.Name was not an allowed global" (a module it may import) and "unsupported GLOBAL
# posix.system whose module posix is blocked" (os, subprocess, ...). Garbage bytes fail in the
# same unpickler with other words ("Unsupported operand 73").
REFUSED_GLOBAL = re.compile(r"unsupported global", re.IGNORECASE)


def refused_pickle(path, error: BaseException) -> CheckpointError:
    """The one explanation of a pickle that `torch.load(weights_only=True)` refused because it holds
    Python objects (predict, export, evaluate, load_weights and resume all say this)."""
    # torch's message is long; keep its one specific line ("Unsupported global: ...").
    text = str(error)
    detail = next((ln.strip() for ln in text.splitlines() if REFUSED_GLOBAL.search(ln)),
                  text.splitlines()[0] if text else type(error).__name__)
    return CheckpointError(
        f"{path}: not a plain weights file: it pickles Python objects other than tensors and "
        f"plain containers, so it was refused unread (torch.load weights_only=True) and none of "
        f"its code ran. If you trust the file, re-save just its tensors elsewhere, e.g. "
        f"torch.save(torch.load(path, weights_only=False)['state_dict'], new_path). ({detail})")


def torch_load(path, mmap: bool = False, map_location="cpu"):
    """`torch.load(path, weights_only=True)`; CheckpointError (one line) for any file it refuses."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except pickle.UnpicklingError as e:
        if REFUSED_GLOBAL.search(str(e)):  # garbage bytes fail in the unpickler too
            raise refused_pickle(path, e) from None
        raise CheckpointError(f"{path}: not a readable checkpoint ({describe_file(path)})") from None
    except Exception as e:  # truncated zip, random bytes (torch's unpickler fails in many ways)
        raise CheckpointError(f"{path}: not a readable checkpoint ({describe_file(path)}; "
                              f"{type(e).__name__})") from None


# ----------------------------------------------------------------------------------------------
# Reading sources


def describe_file(path) -> str:
    """What a file that failed to load looks like, in words (for one-line error messages)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(64)
            f.seek(max(size - 22, 0))
            tail = f.read(22)
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if size == 0:
        return "an empty file (0 bytes)"
    mib = f"{size / 2**20:.1f} MiB"
    if head.startswith(b"PK\x03\x04"):
        # A complete zip ends with its end-of-central-directory record ("PK\x05\x06").
        whole = b"PK\x05\x06" in tail
        return f"a torch zip archive of {mib}" + ("" if whole else ", truncated (its end is missing)")
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return f"a legacy pickle of {mib}"
    if len(head) >= 9 and head[8:9] == b"{":
        return f"a safetensors file of {mib}"
    text = head.lstrip().lower()
    if text.startswith((b"<!doctype html", b"<html")):
        return f"an HTML page of {mib} (a failed download?)"
    if all(32 <= c < 127 or c in (9, 10, 13) for c in head):
        return f"a text file of {mib}"
    return f"{mib} of unrecognised bytes (not a torch, pickle or safetensors file)"


def _read_file(path):
    return _read_file_with_metadata(path)[0]


def _read_file_with_metadata(path):
    """(the file's object, its safetensors metadata or {})."""
    path = Path(path)
    if not path.is_file():
        raise WeightsNotFoundError(f"weights file not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors import safe_open
        from safetensors.torch import load_file

        try:
            with safe_open(str(path), framework="pt") as f:
                metadata = f.metadata() or {}
            return load_file(str(path), device="cpu"), metadata
        except Exception as e:  # safetensors' own error type for a bad header or a short file
            raise CheckpointError(f"{path}: cannot be read as safetensors ({describe_file(path)}; {e})") from None
    return torch_load(path), {}


WeightsFile = namedtuple("WeightsFile", "state_dict origin spec config")
WeightsFile.__doc__ = """A weights file read once: its plain state dict (wrappers removed), its name, the
ModelSpec it records (None for files made elsewhere) and the training config it records (a dict, or None)."""


def read_weights(source) -> WeightsFile:
    """Read a weights or checkpoint file (or a mapping) once, with what it records about itself:
    the `vitpose.model_spec` of safetensors metadata or of a checkpoint's top level, and a training
    checkpoint's `config`."""
    if isinstance(source, Mapping):
        obj, metadata, origin = source, {}, "weights mapping"
    elif isinstance(source, (str, Path)):
        (obj, metadata), origin = _read_file_with_metadata(source), str(source)
    else:
        raise TypeError(f"source must be a path or a mapping of name -> tensor, got {type(source).__name__}")
    recorded = metadata.get(METADATA_KEY)
    config = None
    if isinstance(obj, Mapping):
        recorded = obj.get(METADATA_KEY, recorded)
        config = obj.get("config") if isinstance(obj.get("config"), Mapping) else None
    spec = None
    if isinstance(recorded, str):
        spec = ModelSpec.from_json(recorded, origin=f"recorded in {origin}")
    elif isinstance(recorded, Mapping):
        spec = ModelSpec.from_dict(dict(recorded), origin=f"recorded in {origin}")
    if isinstance(obj, Mapping) and METADATA_KEY in obj:
        obj = {k: v for k, v in obj.items() if k != METADATA_KEY}
    return WeightsFile(_unwrap(obj, origin), origin, spec, config)


def _unwrap(obj, origin):
    """Descend into `state_dict` / `model` / `module` wrappers; strip `module.` / `_orig_mod.`."""
    while isinstance(obj, Mapping):
        inner = next((obj[k] for k in WRAPPER_KEYS if isinstance(obj.get(k), Mapping)), None)
        if inner is None:
            break
        obj = inner
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{origin}: expected a mapping of parameter names to tensors, got {type(obj).__name__}")
    bad = next((name for name in obj if not isinstance(name, str)), None)
    if bad is not None:
        raise CheckpointError(f"{origin}: key {bad!r} is not a parameter name")
    out = {}
    for name, value in zip(strip_wrapper_prefixes(list(obj)), obj.values()):
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.array(value, order="C"))  # a copy: keeps 0-d shapes, owns its memory
        elif not isinstance(value, torch.Tensor):
            raise CheckpointError(
                f"{origin}: entry {name!r} is a {type(value).__name__}, not a tensor; "
                f"this does not look like a weights file (state dict)"
            )
        out[name] = value
    return out


def read_state_dict(source) -> tuple[dict, str]:
    """(plain state dict, the source's name) of a path or a mapping: wrappers removed."""
    if isinstance(source, Mapping):
        return _unwrap(source, "weights mapping"), "weights mapping"
    if isinstance(source, (str, Path)):
        return _unwrap(_read_file(source), str(source)), str(source)
    raise TypeError(f"source must be a path or a mapping of name -> tensor, got {type(source).__name__}")



def save_weights(model, path, spec: ModelSpec | None = None):
    """Write the model's state dict (parameters and BN buffers) as .safetensors, own layout, with
    its ModelSpec as JSON in the metadata (`vitpose.model_spec`): `spec`, else the model's own
    `.spec` (models from `vitpose.load_model` or a config carry one), else what its modules say
    (architecture and K; no skeleton)."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"save_weights writes .safetensors files, got {path}")
    from safetensors.torch import save_file

    model = unwrap_model(model)
    spec = spec if spec is not None else spec_of_model(model)
    state = {n: t.detach().to("cpu").contiguous() for n, t in model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata={"format": "pt", "layout": "vitpose", METADATA_KEY: spec.to_json()})
    return path

