"""Files: the one atomic writer, output paths checked before the work, images through numpy buffers.

- Atomic writes (`atomic_path`, `atomic_file`, `write_atomic`, `staged_files`): the bytes go to a
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
  makes such a file for writers that keep it (`vitpose predict`'s `.NAME.XXXXXXXX.partial`).
- Devices and pipes (`stream_kind`): an output that is a character device, a FIFO or a socket
  (`--json /dev/stdout`, a FIFO, /dev/null), or this process's own stdout/stderr reached by a name,
  cannot be replaced by a rename: `write_atomic` writes it directly (`open_stream`); the writers
  that must rename (videos, exports, checkpoints) refuse it, and a block device is never an output.
- `check_output(path, flag, kind, inputs, streams)`: an output flag is checked before any work starts:
  file vs folder, the nearest existing folder above it is a folder in which a file can in fact be
  created (an exclusive create and delete: `os.access` says yes to root in /proc), an existing file
  is writable, a device or pipe only where the writer streams, and the output is not one of the
  run's inputs. Missing folders are created by the writer. Failures are `OutputPathError`, one line
  that names the flag and the fix.
- `read_image` / `write_image`: images are read with `np.fromfile` + `cv2.imdecode` and written with
  `cv2.imencode` + an atomic write, never through OpenCV's path functions, so any file name the OS
  allows (bytes that are not UTF-8 included: pass `bytes`, or the `str` that `os.fsdecode` makes
  of them) works; OpenCV's `imread`/`imwrite` crash or fail on such names. Videos, which OpenCV
  reads and writes only by path, go through `opencv_path`: an ASCII-named symbolic link to the
  file when its name is not UTF-8.
- Pixel limit: before decoding, the image's size is read from its header (PNG's IHDR, JPEG's SOF
  marker; Pillow's lazy header reading for other formats) and an image over the limit is refused
  (`ImageTooLargeError`, one line with the size, the limit and how to raise it). The limit is
  `DEFAULT_MAX_PIXELS` (150 megapixels: 450 MB as BGR uint8, more than any common camera's sensor),
  overridden per call with `max_pixels=` or for a whole run with the environment variable
  `VITPOSE_MAX_PIXELS` (0 = no limit). A 570 KB PNG can otherwise decode to 30000x20000 pixels
  and take gigabytes.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import stat
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from vitpose.errors import UserError

__all__ = ["DEFAULT_MAX_PIXELS", "MAX_PIXELS_ENV", "ImageReadError", "ImageTooLargeError", "OutputPathError",
           "OutputWriteError", "TEMP_SUFFIX", "atomic_file", "atomic_path", "check_output", "check_pixel_limit",
           "create_exclusive", "create_private", "image_header_size", "max_pixels_limit", "open_stream", "opencv_can_open",
           "opencv_path", "read_bytes", "read_image", "readable_mode", "rename_into_place", "replace_dir", "staged_files",
           "stream_kind", "write_atomic", "write_error", "write_image"]

TEMP_SUFFIX = ".tmp"  # temp files are `.NAME.XXXXXXXX.tmp` beside their target
DEFAULT_MAX_PIXELS = 150_000_000
MAX_PIXELS_ENV = "VITPOSE_MAX_PIXELS"


class OutputPathError(UserError):
    """An output flag names a place that cannot or must not be written (one line naming the flag)."""


class ImageReadError(UserError):
    """An image file is missing, unreadable or not an image (one line naming the file)."""


class ImageTooLargeError(ImageReadError):
    """An image's header says it is larger than the pixel limit; it was not decoded."""


def as_path(path) -> Path:
    """A Path of a str, bytes (any byte string the OS allows, kept through surrogateescape) or PathLike."""
    return Path(os.fsdecode(path)) if isinstance(path, bytes) else Path(path)


def opencv_can_open(path) -> bool:
    """Whether OpenCV's path functions take `path`: its str must encode as UTF-8 (a name that is
    not UTF-8 holds surrogates after os.fsdecode, and cv2 crashes on them)."""
    try:
        str(as_path(path)).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@contextlib.contextmanager
def opencv_path(path):
    """Yield a str naming the existing file `path` that OpenCV's path functions (VideoCapture,
    VideoWriter) can take: `path` itself when its name is UTF-8, else a symbolic link with an
    ASCII name in a new temporary folder (made with bytes, os.fsencode), removed afterwards."""
    path = as_path(path)
    if opencv_can_open(path):
        yield str(path)
        return
    folder = tempfile.mkdtemp(prefix="vitpose-")
    link = os.path.join(folder, "file" + (path.suffix if opencv_can_open(path.suffix) else ""))
    try:
        os.symlink(os.fsencode(path.absolute()), os.fsencode(link))
        yield link
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Atomic writes


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


def _refuse_stream(path: Path) -> None:
    kind = stream_kind(path)
    if kind is not None:
        raise OutputPathError(f"{path} is a {'block device' if kind == BLOCK_DEVICE else 'device or pipe'}, not a "
                              f"file; this output must be written to a file name")


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
    _refuse_stream(path)
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
    _refuse_stream(path)
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
        _refuse_stream(as_path(path))
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
    _refuse_stream(path)
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


# ---------------------------------------------------------------------------------------------
# Output paths, checked before the work


def _same_file(a: Path, b: Path) -> bool:
    with contextlib.suppress(OSError):
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


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
            be one of them (same file after links are resolved).
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


# ---------------------------------------------------------------------------------------------
# Images through numpy buffers


def read_bytes(path) -> np.ndarray:
    """The file's bytes as a uint8 array (what cv2.imdecode takes). Raises OSError as open() does."""
    with open(as_path(path), "rb") as f:
        return np.fromfile(f, dtype=np.uint8)


_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # frame headers (DHT, JPG, DAC are not)
_JPEG_STANDALONE = frozenset(range(0xD0, 0xDA)) | {0x01}  # RSTn, SOI, EOI, TEM: no length field


def _jpeg_size(data: memoryview) -> tuple[int, int] | None:
    i = 2
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _JPEG_STANDALONE:
            i += 2
            continue
        if marker in _JPEG_SOF:
            height = int.from_bytes(data[i + 5:i + 7], "big")
            width = int.from_bytes(data[i + 7:i + 9], "big")
            return (width, height) if height else None  # height 0: defined later by a DNL marker
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return None


def _pillow_size(buf: np.ndarray, max_pixels: int) -> tuple[int, int] | None:
    import io

    from PIL import Image  # lazily: only formats other than PNG and JPEG need it

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(memoryview(buf))) as img:
                return tuple(int(v) for v in img.size)
    except Image.DecompressionBombError:
        # Pillow refuses headers over its own limit (2 x Image.MAX_IMAGE_PIXELS) without saying the size
        bomb = 2 * int(Image.MAX_IMAGE_PIXELS or 0)
        return (bomb + 1, 1) if 0 < max_pixels <= bomb else None
    except Exception:  # not a format Pillow knows: OpenCV may still decode it
        return None


def image_header_size(buf: np.ndarray, max_pixels: int = 0) -> tuple[int, int] | None:
    """(width, height) from an encoded image's header without decoding it; None if unknown."""
    data = memoryview(buf).cast("B")
    head = bytes(data[:24])
    if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
        return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if head[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return _pillow_size(buf, max_pixels)


def max_pixels_limit(max_pixels: int | None = None) -> int:
    """The pixel limit in force: `max_pixels` if given, else $VITPOSE_MAX_PIXELS, else the default
    (0 = no limit)."""
    if max_pixels is not None:
        return int(max_pixels)
    value = os.environ.get(MAX_PIXELS_ENV, "").strip()
    if not value:
        return DEFAULT_MAX_PIXELS
    try:
        return int(float(value))
    except ValueError:
        raise UserError(f"{MAX_PIXELS_ENV}={value!r} is not a number of pixels (e.g. 300000000; 0 = no limit)") from None


def check_pixel_limit(buf: np.ndarray, path, max_pixels: int | None = None) -> None:
    """Raise ImageTooLargeError when the header of the encoded image `buf` says it is over the limit."""
    limit = max_pixels_limit(max_pixels)
    if limit <= 0:
        return
    size = image_header_size(buf, limit)
    if size is None or size[0] * size[1] <= limit:
        return
    width, height = size
    raise ImageTooLargeError(
        f"{as_path(path)}: the image is {width}x{height} ({width * height / 1e6:.0f} megapixels, "
        f"{width * height * 3 / 2**30:.1f} GiB decoded), over the limit of {limit / 1e6:g} megapixels; "
        f"not decoded. To read it, raise the limit: {MAX_PIXELS_ENV}={width * height} (0 = no limit) "
        f"or max_pixels= in Python")


def read_image(path, max_pixels: int | None = None):
    """Read an image file as uint8 BGR (H, W, 3) (cv2.IMREAD_COLOR: grey replicated, alpha dropped,
    EXIF orientation applied), refusing one over the pixel limit before decoding.

    Raises ImageReadError (missing, unreadable, not an image) or ImageTooLargeError, one line each.
    """
    import cv2

    try:
        buf = read_bytes(path)
    except FileNotFoundError:
        raise ImageReadError(f"{as_path(path)}: image file not found") from None
    except OSError as e:
        raise ImageReadError(f"{as_path(path)}: image file unreadable ({e.strerror or e})") from None
    if buf.size == 0:
        raise ImageReadError(f"{as_path(path)}: image file is empty")
    check_pixel_limit(buf, path, max_pixels)
    image = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    if image is None:
        raise ImageReadError(f"{as_path(path)}: not an image OpenCV can decode (corrupt or unsupported format)")
    return image


def write_image(path, image, params=()) -> Path:
    """Encode `image` (BGR or grey uint8) in the format of `path`'s suffix and write it atomically.

    Raises ValueError when OpenCV has no encoder for the suffix or the encoding fails.
    """
    import cv2

    path = as_path(path)
    suffix = path.suffix.lower()
    try:
        ok, encoded = cv2.imencode(suffix, image, list(params))
    except cv2.error:
        ok = False
    if not ok:
        raise ValueError(f"{path}: cannot encode an image as {suffix!r} (use .jpg or .png)")
    write_atomic(path, encoded.tobytes())
    return path
