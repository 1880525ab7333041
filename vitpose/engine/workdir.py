"""The work directory of a run: one run at a time, no silent overwrite, no stale temp files.

- `claim_work_dir` takes an exclusive lock (`WORK_DIR/.lock`, an `fcntl.flock` held for the whole
  run, with the owner's PID and host written in it). The kernel drops a flock when its process dies, so the
  lock of a killed run (kill -9, a power cut) is stale by construction and is taken over with a
  message naming the dead PID; a live owner makes the second run fail at once with its PID.
- A fresh start (no `--resume`) in a directory that already holds this project's checkpoints is
  refused: it would overwrite `last.pth`, `best.pth` and `config.yaml` of the earlier run. The
  message names the files and the two ways on (`--resume auto`, or `--overwrite`).
- Temp files of interrupted checkpoint writes (`.last.pth.XXXX.tmp`, possibly several GB each at
  ViTPose-H size) are removed once the lock is held.
- `write_text_atomic` writes `config.yaml` through a temp file and a rename, so a full disk or a
  kill leaves the previous file, never an empty one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from pathlib import Path

from vitpose.engine.checkpoint import checkpoint_files
from vitpose.errors import UserError
from vitpose.files import TEMP_SUFFIX, write_atomic

LOCK_NAME = ".lock"


class WorkDirError(UserError, RuntimeError):
    """The work directory cannot be used as asked (another run holds it, or a fresh start would
    overwrite an earlier run)."""


@contextlib.contextmanager
def claim_work_dir(work_dir: str | Path, resume: str | None, overwrite: bool = False, say=print):
    """Lock `work_dir` for this run (released when the block ends or the process dies).

    Args:
        work_dir: the run's directory (created if needed).
        resume: the `--resume` value (None for a fresh start).
        overwrite: allow a fresh start over an earlier run's checkpoints.
        say: where messages go (stale lock taken over, temp files removed).
    Raises WorkDirError when another live process holds the directory, or when a fresh start
    would overwrite checkpoints.
    """
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    lock_path = work_dir / LOCK_NAME
    try:  # never through a link planted at the lock's name: the lock file is truncated and written
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise WorkDirError(f"{lock_path} is a symbolic link, not this project's lock file; delete it (or choose "
                           f"another --work-dir)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        owner = _read_owner(fd)
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise WorkDirError(f"{work_dir} is in use by another run ({owner}); wait for it to end, stop it "
                           f"(kill -TERM saves a checkpoint first), or choose another --work-dir") from None
    try:
        previous = _read_owner(fd)
        if previous:  # the file names an owner, but the kernel released its lock: that process is gone
            say(takeover_message(work_dir, previous))
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner_line().encode(), 0)
        check_fresh_start(work_dir, resume, overwrite)
        removed = remove_temp_files(work_dir)
        if removed:
            say(f"{work_dir}: removed {len(removed)} temp file(s) of interrupted checkpoint writes "
                f"({', '.join(p.name for p in removed)})")
        yield work_dir
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # a clean end leaves no owner behind
        os.close(fd)  # releases the flock


def owner_line(pid: int | None = None, host: str | None = None) -> str:
    """What the lock file says of its holder: the PID alone means nothing on another machine."""
    return f"pid {os.getpid() if pid is None else pid} on {socket.gethostname() if host is None else host}\n"


def takeover_message(work_dir, previous: str) -> str:
    """The line said when a lock is taken over. On this host a released flock means the process is
    gone; a holder on another host may be alive on a shared file system that does not carry locks
    between machines (some NFS and Lustre mounts), which only its owner can check."""
    host = previous.rsplit(" on ", 1)[1].strip() if " on " in previous else None
    if host is None or host == socket.gethostname():
        return f"{work_dir}: taking over the lock of a run that is gone ({previous})"
    return (f"{work_dir}: taking over the lock of a run on another machine ({previous}): its lock is released, "
            f"so it has ended, unless this file system does not share locks between machines; then make sure "
            f"nothing runs there on this directory")


def check_fresh_start(work_dir: str | Path, resume: str | None, overwrite: bool) -> None:
    """WorkDirError when a fresh start (no --resume, no --overwrite) would overwrite checkpoints."""
    if resume or overwrite:
        return
    existing = [p.name for p in checkpoint_files(work_dir)]
    if existing:
        raise WorkDirError(
            f"{work_dir} already holds a run's checkpoints ({', '.join(existing)}); a fresh start would "
            f"overwrite them. Continue that run with --resume auto, start over with --overwrite, "
            f"or choose another --work-dir")


def _read_owner(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    return ""


def remove_temp_files(work_dir: str | Path) -> list[Path]:
    """Delete the temp files that interrupted atomic writes left in `work_dir`; returns them."""
    removed = []
    for path in Path(work_dir).iterdir():
        if path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX) and path.is_file():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
    return removed


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` via a temp file in the same directory, fsync and rename."""
    return write_atomic(path, text)
