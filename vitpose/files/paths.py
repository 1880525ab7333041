"""Paths as the OS gives them, and the links OpenCV's path functions need.

`as_path` takes a str, bytes (any byte string the OS allows, kept through surrogateescape) or a
PathLike. Videos, which OpenCV reads and writes only by path, go through `opencv_path`: an
ASCII-named symbolic link to the file when its name is not UTF-8 (OpenCV's path functions crash or
fail on such names).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

TEMP_SUFFIX = ".tmp"  # temp files are `.NAME.XXXXXXXX.tmp` beside their target


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

