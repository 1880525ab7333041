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
    vitpose.model_spec  the model's ModelSpec as plain data (vitpose.models.spec: architecture,
                 codec, skeleton), so `vitpose.load_model(path)` needs no config
    best_ap      best validation AP so far (or None), best_epoch
    world_size   the processes that trained it (a mid-epoch position is exact only with the same)

Writes go through `vitpose.files.atomic_file`: a temporary file in the same directory, fsynced, renamed over the
target and the directory is fsynced: a crash or a full disk leaves the previous file intact (a
full disk raises `CheckpointSaveError`, one line naming the target and the free space). Files get
the permissions the umask gives ordinary files (group-readable like the logs), not mkstemp's 0600.

`find_resume_checkpoint` chooses by the iteration each file records (ties go to `last.pth`), never
by modification time: a `touch`, a restore from backup or an rsync without times cannot rewind a run.
"""

from __future__ import annotations

import contextlib
import errno
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitpose.errors import UserError
from vitpose.files import TEMP_SUFFIX, atomic_file, readable_mode  # noqa: F401 - re-exported for workdir
from vitpose.models.checkpoint import CheckpointError, torch_load
from vitpose.models.wrappers import strip_wrapper_prefixes, unwrap_model

REQUIRED_KEYS = ("model", "optimizer", "epoch", "batch", "iteration")
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class CheckpointSaveError(UserError, OSError):
    """A checkpoint could not be written (disk full, quota, permissions); the previous one is intact."""


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


def _is_disk_full(error: BaseException) -> bool:
    # torch's zip writer reports a short write as a RuntimeError ("... unexpected pos ..."),
    # without an errno; treat it like ENOSPC when the disk is in fact (nearly) full.
    if isinstance(error, OSError):
        return error.errno in _DISK_FULL
    return isinstance(error, RuntimeError) and ("unexpected pos" in str(error) or "file write failed" in str(error))


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write `state` to `path` atomically (temp file, fsync, rename, fsync the directory).

    Raises CheckpointSaveError (the target, the free space, and that the previous file is intact)
    when the disk is full or the file cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_file(path) as f:  # the temp file is deleted on any error
            torch.save(state, f)
    except BaseException as e:
        if _is_disk_full(e) or isinstance(e, PermissionError):
            free = shutil.disk_usage(path.parent).free / 2**30
            kept = "the previous checkpoint is intact" if path.exists() else "no earlier checkpoint of that name"
            cause = "permission denied" if isinstance(e, PermissionError) else "disk full"
            raise CheckpointSaveError(
                f"cannot write {path}: {cause} ({free:.2f} GiB free on its disk); {kept}. Free some space, "
                f"then continue with --resume auto") from None
        raise
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False
                    ) -> dict[str, Any]:
    """Read a training checkpoint with `weights_only=True`.

    mmap: map the tensors instead of reading them (cheap when only the counters are needed).
    Raises CheckpointError (one line: the file and what it looks like) if it is unusable.
    """
    path = Path(path)
    state = torch_load(path, mmap=mmap, map_location=map_location)  # refused pickles explained as everywhere
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a training checkpoint")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise CheckpointError(f"{path}: not a training checkpoint of this project (no {', '.join(missing)}); "
                              f"weights-only files are for model.pretrained or evaluate.py")
    return state


_CHECKPOINT_NAME = re.compile(r"^(last|best|epoch_\d+)\.pth$")


def checkpoint_files(work_dir: str | Path) -> list[Path]:
    """This project's checkpoints in `work_dir` (last.pth, best.pth, epoch_N.pth), by name."""
    work_dir = Path(work_dir)
    if not work_dir.is_dir():
        return []
    return sorted(p for p in work_dir.iterdir() if p.is_file() and _CHECKPOINT_NAME.match(p.name))


def find_resume_checkpoint(work_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint in `work_dir` that records the most progress, and its contents; or None.

    Every candidate is actually read (its tensors memory-mapped, so this is cheap): a truncated or
    corrupt file (a crash during a copy, a full disk) is skipped with a warning instead of failing
    the run again at every restart. The largest recorded iteration wins; on a tie `last.pth`,
    which records the run's position most completely (e.g. a pending epoch end).
    """
    ranked = []
    for path in checkpoint_files(work_dir):
        try:
            state = load_checkpoint(path, mmap=True)
        except CheckpointError as e:
            warnings.warn(f"skipping unusable checkpoint: {e}", stacklevel=2)
            continue
        ranked.append((int(state["iteration"]), path.name == "last.pth", path))
        del state
    if not ranked:
        return None
    path = max(ranked)[2]
    return path, load_checkpoint(path)


def prune_epoch_checkpoints(work_dir: str | Path, keep_last: int | None) -> list[Path]:
    """Delete all but the `keep_last` newest `epoch_N.pth` (by N); returns the deleted files."""
    if keep_last is None:
        return []
    numbered = sorted((int(p.stem.split("_")[1]), p) for p in checkpoint_files(work_dir) if p.name.startswith("epoch_"))
    doomed = [p for _, p in numbered[: max(len(numbered) - keep_last, 0)]]
    for p in doomed:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    return doomed
