"""A drawn video file: `output_video_path` (where `--out` puts it), `open_video_writer` /
`VideoFile` (written beside its place, checked to hold every frame written, then renamed into
place: an interrupted or full-disk run never leaves a broken video under the name), and
`VideoWriteError`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import cv2
import numpy as np

from vitpose.errors import UserError
from vitpose.files import as_path, create_private, free_space, opencv_path, rename_into_place
from vitpose.run.sources import VIDEO_SUFFIXES, VideoError, written_video_problem

__all__ = ["VideoFile", "VideoWriteError", "open_video_writer", "output_video_path"]


def output_video_path(out, source) -> Path:
    """`--out DIR` -> DIR/<source stem>.mp4 (webcam N: webcam_N.mp4); a path with a video
    suffix (.mp4, .avi, ...) is used as the file itself. source: a path or a camera index."""
    out = Path(out)
    if out.suffix.lower() in VIDEO_SUFFIXES:
        return out
    stem = f"webcam_{source}" if isinstance(source, int) else Path(source).stem
    return out / f"{stem}.mp4"


def open_video_writer(path: Path, fps: float, size) -> VideoFile:
    """A `VideoFile` (mp4v in .mp4/.mov/.m4v, MJPG in .avi, VP80 in .webm, XVID otherwise)."""
    return VideoFile(path, fps, size)


class VideoWriteError(UserError):
    """The drawn video could not be written (disk full, a size limit): one line; no file is left."""

    exit_status = 1


class VideoFile:
    """A video being written to `path`, with OpenCV's VideoWriter's `write(bgr)` and `release()`.

    The frames go to an ASCII-named file `video.mp4` in a new private folder beside `path`
    (`.vitpose-video.XXXXXXXX.tmp/`, `vitpose.files.create_private`: OpenCV opens it by name, and
    nobody else can put a link there first; OpenCV picks the container by the suffix, and crashes
    on names that are not UTF-8; such a folder is reached through `vitpose.files.opencv_path`'s link). `release()` closes it
    (OpenCV writes the container's index: a playable file), checks it (OpenCV's writer reports no
    error: a full disk only prints warnings, and leaves a file that does not open or lacks frames),
    and renames it over `path` with `vitpose.files.rename_into_place` (checked to be the file made
    here, fsynced, the umask's mode, the folder fsynced). A file that does not hold the frames
    written is deleted and `VideoWriteError` says so. A run stopped by SIGINT/SIGTERM releases it
    too, so the video it leaves plays up to the last frame."""

    def __init__(self, path, fps: float, size):
        self.path = as_path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        suffix = self.path.suffix.lower()
        self.fourcc = {".mp4": "mp4v", ".mov": "mp4v", ".m4v": "mp4v", ".avi": "MJPG", ".webm": "VP80"}.get(suffix,
                                                                                                       "XVID")
        self.frames = 0
        self.stage, self.staged, self.created = create_private(
            self.path, "video" + (suffix if suffix.isascii() else ".mp4"), prefix=".vitpose-video.")
        with opencv_path(self.staged) as name:  # the writer has the file open once it is built
            self.writer = cv2.VideoWriter(name, cv2.VideoWriter_fourcc(*self.fourcc), float(fps), tuple(size))
        if not self.writer.isOpened():
            self.writer.release()
            shutil.rmtree(self.stage, ignore_errors=True)
            raise VideoError(f"--out: cannot write the video {self.path} (codec {self.fourcc}; is the folder "
                             f"writable?)")

    def write(self, bgr: np.ndarray) -> None:
        self.writer.write(bgr)
        self.frames += 1

    def release(self) -> None:
        """Close, check and rename into place; VideoWriteError (the staged file deleted) when the
        file does not hold the frames written."""
        self.writer.release()
        if not os.path.exists(self.staged):  # released before
            return
        try:
            problem = self._unreadable()
            if problem is not None:
                raise VideoWriteError(f"--out: could not write the video {self.path}: {problem} after "
                                      f"{self.frames} frames were written (disk full? "
                                      f"{free_space(self.path.parent)} on its filesystem); no video was left. "
                                      f"Free some space or choose another place")
            rename_into_place(self.staged, self.path, self.created)
        finally:
            shutil.rmtree(self.stage, ignore_errors=True)

    def _unreadable(self) -> str | None:
        """Why the closed file does not hold the frames written (None: it does)."""
        return written_video_problem(self.staged, self.frames)
