"""Where an output may go: devices and pipes told apart from files, and output flags checked before the work.

- Devices and pipes (`stream_kind`): an output that is a character device, a FIFO or a socket
  (`--json /dev/stdout`, a FIFO, /dev/null), or this process's own stdout/stderr reached by a name,
  cannot be replaced by a rename: `write_atomic` writes it directly (`open_stream`); the writers
  that must rename (videos, exports, checkpoints) refuse it (`refuse_stream`), and a block device is
  never an output.
- `check_output(path, flag, kind, inputs, streams)`: an output flag is checked before any work starts:
  file vs folder, the nearest existing folder above it is a folder in which a file can in fact be
  created (an exclusive create and delete: `os.access` says yes to root in /proc), an existing file
  is writable, a device or pipe only where the writer streams, and the output is not one of the
  run's inputs nor inside an input folder. Missing folders are created by the writer. Failures are
  `OutputPathError`, one line that names the flag and the fix.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from pathlib import Path

from vitpose.errors import UserError

from .paths import TEMP_SUFFIX, as_path


class OutputPathError(UserError):
    """An output flag names a place that cannot or must not be written (one line naming the flag)."""



# Outputs that are not files: a device (/dev/null, a terminal), a pipe (`--json /dev/stdout | jq`,
# a FIFO) or a socket cannot be replaced by a rename (as root that would put a regular file in the
# place of /dev/stdout for every later process): they are written directly, as a stream. A block
# device (a disk) is never an output. `stream_kind` tells them apart; this process's own standard
# output or error reached by a name (/dev/stdout, /proc/self/fd/1, or the file stdout is redirected
# to) is written through its file descriptor, so that the shell's redirection gets the bytes in
# order with nothing lost.
STREAM, STDOUT, STDERR, BLOCK_DEVICE = "stream", "stdout", "stderr", "block device"


def stream_kind(path) -> str | None:
    """STDOUT / STDERR when `path` is this process's standard output / error (after links), STREAM
    for another device, pipe or socket, BLOCK_DEVICE for a disk; None for a regular file, a folder
    or a path that does not exist."""
    try:
        st = os.stat(as_path(path))
    except (OSError, ValueError):
        return None
    for fd, name in ((1, STDOUT), (2, STDERR)):
        with contextlib.suppress(OSError):
            if os.path.samestat(st, os.fstat(fd)):
                return name
    if stat.S_ISBLK(st.st_mode):
        return BLOCK_DEVICE
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    return STREAM


def open_stream(path, kind: str | None = None):
    """A binary file object writing to the stream `path` (see `stream_kind`): a duplicate of this
    process's stdout / stderr descriptor (Python's own buffer flushed first), else the device or pipe
    opened for writing (a FIFO waits for its reader, as a shell's redirection does)."""
    kind = kind or stream_kind(path)
    if kind in (STDOUT, STDERR):
        stream = sys.stdout if kind == STDOUT else sys.stderr
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
        return os.fdopen(os.dup(1 if kind == STDOUT else 2), "wb")
    if kind != STREAM:
        raise ValueError(f"{as_path(path)} is not a device, pipe or standard stream ({kind})")
    return open(as_path(path), "wb")  # noqa: SIM115 - the caller closes it


def refuse_stream(path: Path) -> None:
    kind = stream_kind(path)
    if kind is not None:
        raise OutputPathError(f"{path} is a {'block device' if kind == BLOCK_DEVICE else 'device or pipe'}, not a "
                              f"file; this output must be written to a file name")



# ---------------------------------------------------------------------------------------------
# Output paths, checked before the work


def _same_file(a: Path, b: Path) -> bool:
    with contextlib.suppress(OSError):
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def _inside_folder(path: Path, folder: Path) -> bool:
    """Whether `path` lies under the existing folder `folder` (links resolved): an input folder
    (images, a labelled set) is the user's, and what a run writes stays out of it."""
    if not folder.is_dir():
        return False
    return os.path.realpath(folder) in map(str, Path(os.path.realpath(path)).parents)


def _nearest_existing(path: Path) -> Path:
    above = path.absolute().parent
    while not above.exists() and above != above.parent:
        above = above.parent
    return above


def _cannot_create_in(folder: Path) -> str | None:
    """Why no file can be created in `folder` (None: one can). A real, exclusive create and delete:
    os.access says yes to root in /proc or on some network filesystems where creating fails."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".vitpose-probe.", suffix=TEMP_SUFFIX, dir=folder)
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def check_output(path, flag: str, kind: str = "file", inputs=(), streams: bool = False, stdout: bool = True) -> Path:
    """Refuse, before any work, an output that cannot be written or would replace an input.

    Args:
        path: where the command will write (a file, or a folder with kind="dir").
        flag: the option that named it (`--json`, `--out`), quoted in the message.
        kind: "file" or "dir".
        inputs: the run's input files and folders (None entries are ignored); the output must not
            be one of them (same file after links are resolved), nor lie inside an input folder.
        streams: whether this output may be a device or pipe (`stream_kind`: /dev/stdout, a FIFO,
            /dev/null), which the writer then writes directly; else such a path is refused (a video,
            an export: they are replaced by a rename, which would put a regular file in place of the
            device). A block device is always refused.
        stdout: with streams, whether this process's own standard output may be the output (no for
            a command whose report goes there).
    Returns the path (expanded). Raises OutputPathError, one line naming the flag and the fix.
    Folders that do not exist yet are fine: the writer creates them (that a file can be created in
    the nearest existing folder is tried, not assumed).
    """
    if kind not in ("file", "dir"):
        raise ValueError(f"kind must be 'file' or 'dir', got {kind!r}")
    path = as_path(path).expanduser()
    what = f"{flag} {path}"
    for given in inputs:
        if given is not None and _same_file(path, as_path(given).expanduser()):
            raise OutputPathError(f"{what} would replace the input {given}; write to another name")
        if given is not None and _inside_folder(path, as_path(given).expanduser()):
            raise OutputPathError(f"{what} is inside the input folder {given}, which a run only reads; "
                                  f"write outside it")
    if kind == "file" and path.is_dir():
        raise OutputPathError(f"{what} is a folder; {flag} takes a file name")
    if kind == "dir" and path.exists() and not path.is_dir():
        raise OutputPathError(f"{what} is a file; {flag} takes a folder (created if missing)")
    special = stream_kind(path) if kind == "file" else None
    if special == BLOCK_DEVICE:
        raise OutputPathError(f"{what} is a block device (a disk); {flag} takes a file name")
    if special is not None and not streams:
        raise OutputPathError(f"{what} is a device or pipe, not a regular file; {flag} is written to a file and "
                              f"renamed into place: give a file name")
    if special in (STDOUT, STDERR) and not stdout:
        which = "output" if special == STDOUT else "error"
        raise OutputPathError(f"{what} is this command's standard {which}, which carries its report; "
                              f"give a file name")
    if special is not None:
        if special == STREAM and not os.access(path, os.W_OK):
            raise OutputPathError(f"{what} is not writable; choose another place")
        return path
    above = _nearest_existing(path)
    if not above.is_dir():
        raise OutputPathError(f"{what}: {above} is a file, not a folder; choose a place under a folder")
    if not os.access(above, os.W_OK | os.X_OK):
        raise OutputPathError(f"{what}: the folder {above} is not writable; choose another place")
    if path.exists() and not os.access(path, os.W_OK | (os.X_OK if kind == "dir" else 0)):
        raise OutputPathError(f"{what} exists and is not writable; choose another place")
    why = _cannot_create_in(path if kind == "dir" and path.is_dir() else above)
    if why is not None:
        raise OutputPathError(f"{what}: cannot create files in {path if kind == 'dir' and path.is_dir() else above} "
                              f"({why}); choose another place")
    return path
