"""The one atomic writer: every file this project writes goes through here.

Atomic writes (`atomic_path`, `atomic_file`, `write_atomic`, `staged_files`): the bytes go to a
temporary file `.NAME.XXXXXXXX.tmp` beside the target, created exclusively (mkstemp: O_EXCL, a
random name, so a file or symbolic link planted at a guessable name is never opened or written
through), then flushed and fsynced (reopened without following links and checked to be the same
file), given the mode the umask gives ordinary files (not mkstemp's 0600), renamed over the
target, and the folder is fsynced: the data is durable before the name points at it, the rename
after. A crash, a kill or a full disk leaves the previous file (or none), never a half-written
one; on an error the temporary file is deleted. A full, over-quota or read-only disk is an
`OutputWriteError` (a UserError and an OSError with the original errno: one line naming the
file, the free space and what was kept); other errors pass on unchanged. Every writer of
results, checkpoints, configs and exports in this project goes through here. `create_exclusive`
makes such a file for writers that keep it (`vitpose predict`'s `.NAME.XXXXXXXX.partial`). A device
or pipe is written directly (`vitpose.files.outputs.stream_kind`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import tempfile
from pathlib import Path

from vitpose.errors import UserError

from .outputs import BLOCK_DEVICE, open_stream, refuse_stream, stream_kind
from .paths import TEMP_SUFFIX, as_path


@functools.cache
def readable_mode() -> int:
    """The mode an ordinary new file gets under this process's umask (0o644 under umask 022)."""
    umask = None
    with contextlib.suppress(OSError, ValueError):  # Linux >= 4.7 reports it without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                umask = int(line.split()[1], 8)
    if umask is None:
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def fsync_dir(directory) -> None:
    """Make a rename in `directory` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class OutputWriteError(UserError, OSError):
    """An output could not be written (disk full, quota, size limit, read-only filesystem): one line
    naming the file, what was kept and the fix. Also an OSError with the original errno, so callers
    that explain OSErrors themselves (checkpoint saving) still can."""

    def __str__(self) -> str:
        return str(self.strerror)


_WRITE_FAILURES = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
                   errno.EFBIG: "the file is larger than its filesystem or a size limit allows",
                   errno.EROFS: "read-only filesystem"}


def free_space(folder) -> str:
    """'0.01 GiB free' on the filesystem of `folder`."""
    with contextlib.suppress(OSError):
        return f"{shutil.disk_usage(folder).free / 2**30:.2f} GiB free"
    return "free space unknown"


def write_error(error: BaseException, path, flag: str | None = None, kept: str = "nothing was replaced"):
    """`error` (raised while writing `path`) as an OutputWriteError when it is one of the failures of
    a full or read-only disk; None otherwise (a bug or another cause: it passes on unchanged)."""
    if isinstance(error, OutputWriteError) or not isinstance(error, OSError) or error.errno not in _WRITE_FAILURES:
        return None
    cause, fix = _WRITE_FAILURES[error.errno], "Choose another place"
    if error.errno != errno.EROFS:
        cause += f" ({free_space(as_path(path).parent)} on its filesystem)"
        fix = "Free some space or choose another place"
    return OutputWriteError(error.errno, f"{flag + ': ' if flag else ''}cannot write {as_path(path)}: {cause}; "
                                         f"{kept}. {fix}")


def create_exclusive(path, suffix: str = TEMP_SUFFIX) -> tuple[int, Path]:
    """A new, empty file `.NAME.XXXXXXXX<suffix>` beside `path`, created exclusively (O_EXCL, a random
    name: a file or link planted at a guessable name is never opened) with the umask's mode;
    returns its open descriptor (read-write) and its path."""
    path = as_path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        os.fchmod(fd, readable_mode())
    except BaseException:
        os.close(fd)
        os.unlink(name)
        raise
    return fd, Path(name)


def create_private(path, name: str, prefix: str | None = None) -> tuple[Path, Path, os.stat_result]:
    """For writers that open a file by its name (OpenCV's VideoWriter, onnx): a new folder beside
    `path` (mkdtemp: a random name, mode 0700, so no other user can put a link in it) and an empty
    file `name` created in it exclusively. Returns (the folder, the file, the file's stat); the
    caller renames the file into place (`rename_into_place`) and removes the folder."""
    path = as_path(path)
    folder = Path(tempfile.mkdtemp(prefix=prefix or f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent))
    file = folder / name
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        created = os.fstat(fd)
        os.close(fd)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder, file, created


def rename_into_place(tmp, path, created: os.stat_result) -> None:
    """fsync the finished temporary file (opened without following links, and checked to be the
    file this process created: `created` is its stat from when it was made), rename it over
    `path`, fsync the folder."""
    tmp, path = as_path(tmp), as_path(path)
    fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)  # ELOOP: a link was put in its place
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (created.st_dev, created.st_ino):
            raise RuntimeError(f"{tmp} was replaced by another file while it was written (another user of the "
                               f"folder?); {path} was not written")
        os.fsync(fd)  # the data is on the disk before the name points at it
        os.fchmod(fd, readable_mode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)  # and the rename itself survives a power cut


def _discard(tmp: Path, error: BaseException, path: Path) -> BaseException | None:
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    return write_error(error, path, kept="the previous file is intact" if path.exists() else "no file was written")


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path for writers that take a file name: `path`'s name in a new private
    folder beside it (`create_private`: nobody else can swap it for a link before the writer opens
    it); when the block ends without an error, that file is fsynced and renamed over `path`. On any
    error it is deleted and `path` is untouched; a full or read-only disk is an OutputWriteError. A
    device or pipe at `path` is refused (OutputPathError): it cannot be replaced."""
    path = as_path(path)
    refuse_stream(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder, tmp, created = create_private(path, path.name)
    try:
        yield tmp
        rename_into_place(tmp, path, created)
    except BaseException as e:
        converted = write_error(e, path, kept="the previous file is intact" if path.exists() else "no file was written")
        if converted is not None:
            raise converted from e
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(path, mode: str = "wb", **open_kwargs):
    """Yield a file object open on a new temporary file beside `path` (the descriptor `create_exclusive`
    made: nothing is reopened by name); on success it is fsynced and renamed over `path` (see
    `atomic_path`)."""
    path = as_path(path)
    refuse_stream(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_exclusive(path)
    created = os.fstat(fd)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
            f.flush()
        rename_into_place(tmp, path, created)
    except BaseException as e:
        converted = _discard(tmp, e, path)
        if converted is not None:
            raise converted from e
        raise


def write_atomic(path, data: bytes | str) -> Path:
    """Write `data` (bytes, or text as UTF-8) to `path` atomically; returns the path. A device or
    pipe at `path` (`stream_kind`: /dev/stdout, a FIFO, /dev/null) is written directly: it cannot
    be replaced; a block device is refused (OutputPathError)."""
    data = data.encode() if isinstance(data, str) else data
    kind = stream_kind(path)
    if kind == BLOCK_DEVICE:
        refuse_stream(as_path(path))
    if kind is not None:
        try:
            with open_stream(path, kind) as f:
                f.write(data)
        except OSError as e:
            converted = write_error(e, path, kept="what was written is incomplete")
            if converted is not None:
                raise converted from e
            raise
        return as_path(path)
    with atomic_file(path, "wb") as f:
        f.write(data)
    return as_path(path)


@contextlib.contextmanager
def staged_files(path):
    """For writers that put several files beside `path` (an ONNX file and its `.data`): yield a
    path in a hidden folder beside `path` (mkdtemp: new, private); on success every file written
    there is fsynced and renamed into place; on any error all of it is deleted and nothing beside
    `path` changes (a full or read-only disk: OutputWriteError)."""
    path = as_path(path)
    refuse_stream(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent))
    try:
        yield stage / path.name
        for staged in sorted(stage.iterdir()):
            rename_into_place(staged, path.parent / staged.name, os.lstat(staged))
    except BaseException as e:
        converted = write_error(e, path, kept="nothing was replaced")
        if converted is not None:
            raise converted from e
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def replace_dir(staged, path) -> Path:
    """Put the finished folder `staged` in the place of the folder `path` (a rename each way: the
    old folder is moved aside first and deleted after, so `path` never holds a mix of the two)."""
    staged, path = as_path(staged), as_path(path)
    old = None
    if path.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", suffix=TEMP_SUFFIX, dir=path.parent))
        os.replace(path, old / path.name)
    os.replace(staged, path)
    fsync_dir(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path
