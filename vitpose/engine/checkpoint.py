"""Training checkpoints: atomic writes, `weights_only=True` loading, newest-valid lookup.

A checkpoint is one `torch.save` dict of tensors and plain Python values only (no pickled
objects), so `torch.load(path, weights_only=True)` reads it:

    model        state dict without `module.` / `_orig_mod.` prefixes (DDP, torch.compile)
    optimizer    optimizer.state_dict()
    scheduler    schedule settings (the schedule itself is a function of the counters)
    scaler       GradScaler.state_dict() or None
    epoch        0-based epoch the next step belongs to
    batch        batches of that epoch already trained (0 at an epoch boundary)
    iteration    optimizer steps done so far
    nonfinite_in_row  non-finite losses in a row before this point (train.max_nonfinite)
    rng          torch CPU/CUDA states as uint8 tensors; numpy and Python states as tensors
    config       the resolved run config (plain dict)
    best_ap      best validation AP so far (or None), best_epoch

Writes go to a temporary file in the same directory, are flushed and fsynced, renamed over the
target and the directory is fsynced: a crash or a full disk leaves the previous file intact.
"""

from __future__ import annotations

import os
import random
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitpose.models.checkpoint import strip_wrapper_prefixes, unwrap_model

REQUIRED_KEYS = ("model", "optimizer", "epoch", "batch", "iteration")


def clean_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip wrapper prefixes (compile inside DDP gives `module._orig_mod.`)."""
    return {strip_wrapper_prefixes(key): value for key, value in state_dict.items()}


def model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return clean_state_dict(unwrap_model(model).state_dict())


# ---------------------------------------------------------------------------------------------
# RNG states as tensors and plain values (loadable with weights_only=True)


def rng_state() -> dict[str, Any]:
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": str(np_name),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_gauss),
        },
        "python": {
            "version": int(py_version),
            "internal": torch.tensor(py_internal, dtype=torch.int64),
            "gauss_next": py_gauss,
        },
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["internal"].tolist()), p["gauss_next"]))
    cuda_states = state.get("cuda") or []
    if cuda_states and torch.cuda.is_available():
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:  # a different machine: keep what can be kept
            for i, s in enumerate(cuda_states[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(s, i)


# ---------------------------------------------------------------------------------------------
# Atomic save and safe load


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write `state` to `path` atomically (temp file, fsync, rename, fsync the directory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a training checkpoint with `weights_only=True`; raises ValueError if it is unusable."""
    path = Path(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated zip, bad pickle, disallowed global...
        raise ValueError(f"checkpoint {path} cannot be read ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {path} holds a {type(state).__name__}, expected a dict")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise ValueError(f"checkpoint {path} is not a training checkpoint: missing {', '.join(missing)}")
    return state


_CHECKPOINT_NAME = re.compile(r"^(last|best|epoch_\d+)\.pth$")


def checkpoint_files(work_dir: str | Path) -> list[Path]:
    """This project's checkpoints in `work_dir`, newest first (by modification time)."""
    work_dir = Path(work_dir)
    if not work_dir.is_dir():
        return []
    files = [p for p in work_dir.iterdir() if p.is_file() and _CHECKPOINT_NAME.match(p.name)]
    return sorted(files, key=lambda p: p.stat().st_mtime_ns, reverse=True)


def find_resume_checkpoint(work_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest valid checkpoint in `work_dir` and its contents, or None.

    Candidates are tried newest first and actually loaded: a truncated or corrupt file (a crash
    during a copy, a full disk) is skipped with a warning instead of failing the run again at
    every restart.
    """
    for path in checkpoint_files(work_dir):
        try:
            return path, load_checkpoint(path)
        except ValueError as e:
            warnings.warn(f"skipping unusable checkpoint: {e}", stacklevel=2)
    return None
