"""The sources of a prediction run, read one way: image folders, video files and cameras.

- `classify_source(source)`: "webcam" | "dir" | "video" | "image"; `IMAGE_SUFFIXES`, `VIDEO_SUFFIXES`.
- `list_images(sources)`: the image files of folders and files, in order; `survey(sources)`: the
  kinds of the sources and their images (a video or webcam stands alone).
- `FrameReader(source, stop=, start=, end=)`: the one reader of video frames (files, cameras and
  a video segment's frame range) and its one rule for an unreadable frame: a frame that fails to
  decode is counted and skipped (`skipped`), consecutive failures past `max_failures` end the
  video, and frames the container promised but never gave are counted (`missing_at_end`).
- `video_frame_count(path)`: the container's declared count (0 when it says none).
- `check_video_file(path)`, `VideoError`: a video that cannot be used, in one line.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from vitpose.errors import UsageError, UserError
from vitpose.files import opencv_path

__all__ = ["DEFAULT_FPS", "IMAGE_SUFFIXES", "VIDEO_SUFFIXES", "Frame", "FrameReader", "VideoError", "check_video_file",
           "classify_source", "list_images", "survey", "video_frame_count", "video_frame_rate",
           "written_video_problem"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".jp2", ".pgm", ".ppm")
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".flv", ".ts")
DEFAULT_FPS = 30.0  # for cameras that do not say their rate
_DIGITS = re.compile(r"[0-9]+")  # ASCII digits only: "²" is a digit to str.isdigit, not to int()
MAX_WEBCAM_INDEX = 2**31 - 1  # cv2.VideoCapture(index) takes a C int


def classify_source(source) -> str:
    """"webcam" (an int, or ASCII digits that name no file), "dir", "video" (by suffix) or "image".

    Digits too large for a camera index (OpenCV takes a C int) that name no file raise UserError.
    """
    if isinstance(source, int):
        return "webcam"
    text = str(source)
    if _DIGITS.fullmatch(text) and not Path(text).exists():
        if int(text) > MAX_WEBCAM_INDEX:
            raise UserError(f"source not found: {text} (no such file, and too large for a webcam index, "
                            f"0 to {MAX_WEBCAM_INDEX})")
        return "webcam"
    path = Path(source).expanduser()
    if path.is_dir():
        return "dir"
    return "video" if path.suffix.lower() in VIDEO_SUFFIXES else "image"


def survey(sources) -> tuple[list[str], list[Path] | None]:
    """(the kind of each source, its image files): one video or webcam stands alone as the only
    source (then no image list); otherwise the sources' images, as `list_images` lists them."""
    kinds = [classify_source(s) for s in sources]
    streams = [s for s, kind in zip(sources, kinds) if kind in ("video", "webcam")]
    if streams and len(sources) > 1:
        raise UsageError(f"a video or webcam ({streams[0]}) must be the only SOURCE")
    return kinds, None if streams else list_images([str(Path(s).expanduser()) for s in sources])


def list_images(sources) -> list[Path]:
    """Image files of the sources: directories (by suffix, sorted by name) and files as given.

    A file that does not exist stays in the list: it is counted and skipped like an unreadable
    one (and so is a broken link in a directory); when no source exists at all nothing is done."""
    paths = []
    for source in map(Path, sources):
        if source.is_dir():
            found = sorted(p for p in source.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and not p.is_dir())
            if not found:
                videos = sorted(p.name for p in source.iterdir() if p.suffix.lower() in VIDEO_SUFFIXES)
                if videos:  # a folder is read for images only: a video goes alone, as the only SOURCE
                    raise UsageError(f"no images in {source}, but {len(videos)} video file(s) (e.g. {videos[0]}): "
                                     f"give videos one at a time, each as the only SOURCE "
                                     f"(vitpose predict {source / videos[0]} ...)")
                raise UsageError(f"no images in {source} (looked for {', '.join(IMAGE_SUFFIXES)})")
            paths += found
        else:
            paths.append(source)
    if paths and not any(p.exists() for p in paths):
        raise UsageError(f"source not found: {paths[0]}" + (f" (nor the {len(paths) - 1} others)" if len(paths) > 1
                                                            else ""))
    return paths


def _declared(video: Path, prop: int) -> float:
    """A property the container declares (`cv2.CAP_PROP_*`; 0 when the file cannot be opened)."""
    with opencv_path(video) as name:
        capture = cv2.VideoCapture(name)
        try:
            return capture.get(prop) if capture.isOpened() else 0.0
        finally:
            capture.release()


def video_frame_count(video: Path) -> int:
    """The frame count the container declares (0 when it declares none or cannot be opened)."""
    count = _declared(video, cv2.CAP_PROP_FRAME_COUNT)
    return int(count) if count and count > 0 else 0


def video_frame_rate(video: Path) -> float:
    """The frame rate the container declares (DEFAULT_FPS, as `FrameReader` takes, when it declares none)."""
    fps = _declared(video, cv2.CAP_PROP_FPS)
    return float(fps) if fps and math.isfinite(fps) and fps > 0 else DEFAULT_FPS


class VideoError(UserError, ValueError):
    """A video or camera that cannot be used, explained in one line."""


@dataclass
class Frame:
    index: int  # position in the source, counting frames that failed to decode
    bgr: np.ndarray  # (H, W, 3) uint8 as decoded (the predictor takes it with channels="bgr")


class FrameReader:
    """Frames of a video file or a camera, with decode failures counted instead of fatal.

    Args:
        source: a video file path, or a camera index (int).
        max_failures: consecutive failed reads after which the video is taken to have ended
            (a truncated file fails on every read from the cut on).
        stop: an Event that ends the iteration (a signal handler's, or the pipeline's own).
        start, end: the frames [start, end) only (a video segment; end None: to the end). The
            frames before `start` are decoded and dropped (`grab`), which is exact in every
            container, where seeking lands on a key frame in some.
        keep: index -> whether to yield that frame; the others are passed by without being
            converted to pixels (`grab`): `vitpose select` scoring every N-th frame.

    Iterating yields `Frame`s. Afterwards: `skipped` (indices of frames that failed to decode
    and were followed by good ones), `missing_at_end` (frames the container declares but that
    never decoded), `frames_decoded`. `fps` is the container's rate (DEFAULT_FPS when a camera
    gives none), `frame_count` the declared count (None when unknown), `size` (w, h).
    """

    def __init__(self, source, max_failures: int = 25, stop: threading.Event | None = None, start: int | None = None,
                 end: int | None = None, keep=None):
        self.webcam = isinstance(source, int)
        self.source = source
        self.name = f"webcam {source}" if self.webcam else str(source)
        if not self.webcam:
            check_video_file(Path(source))
        if self.webcam:
            self.capture = cv2.VideoCapture(source)
        else:  # a name that is not UTF-8 crashes OpenCV: through an ASCII-named link, removed once open
            with opencv_path(source) as name:
                self.capture = cv2.VideoCapture(name)
        if not self.capture.isOpened():
            self.capture.release()
            if self.webcam:
                raise VideoError(f"webcam {source}: the camera could not be opened (is it connected, and "
                                 f"not used by another program? cameras are numbered from 0)")
            raise VideoError(f"{source}: OpenCV cannot open this file as a video (not a video, or a codec "
                             f"this OpenCV build lacks)")
        fps = self.capture.get(cv2.CAP_PROP_FPS)
        self.fps_declared = bool(fps and math.isfinite(fps) and fps > 0)
        self.fps = float(fps) if self.fps_declared else DEFAULT_FPS
        count = self.capture.get(cv2.CAP_PROP_FRAME_COUNT)
        self.frame_count = int(count) if not self.webcam and count and count > 0 else None
        self.size = (int(self.capture.get(cv2.CAP_PROP_FRAME_WIDTH)), int(self.capture.get(cv2.CAP_PROP_FRAME_HEIGHT)))
        self.max_failures = int(max_failures)
        self.skipped: list[int] = []
        self.wrong_size: list[int] = []
        self.missing_at_end = 0
        self.frames_decoded = 0
        self.stop = threading.Event()  # the pipeline's own: set when it ends, whatever the reason
        self.requested = stop  # the caller's (a signal): the run was interrupted
        self.decode_seconds = 0.0
        self.start, self.end, self.keep = int(start or 0), end, keep

    def _stopped(self) -> bool:
        return self.stop.is_set() or (self.requested is not None and self.requested.is_set())

    def _expected_more(self, index: int) -> bool:
        return (self.frame_count is None or index < self.frame_count) and (self.end is None or index < self.end)

    def __iter__(self):
        index, pending = 0, []  # pending: consecutive failed reads not yet known to be corrupt
        try:
            while index < self.start and self.capture.grab():
                index += 1
            if index < self.start:
                return
            while not self._stopped() and (self.end is None or index < self.end):
                if self.keep is not None and not self.keep(index):
                    if not self.capture.grab():
                        break
                    index += 1
                    continue
                start = time.perf_counter()
                ok, bgr = self.capture.read()
                good = ok and bgr is not None and bgr.ndim == 3 and bgr.shape[2] == 3
                if good and self.frames_decoded == 0:
                    self.size = (bgr.shape[1], bgr.shape[0])  # what the container said may be 0x0
                if good and (bgr.shape[1], bgr.shape[0]) != self.size:
                    self.wrong_size.append(index)  # cannot go into a video of the first size
                    good = False
                self.decode_seconds += time.perf_counter() - start
                if good:
                    self.skipped.extend(pending)  # failures followed by a good frame: corrupt frames
                    pending = []
                    self.frames_decoded += 1
                    yield Frame(index, bgr)
                elif self.wrong_size and self.wrong_size[-1] == index:
                    self.skipped.extend(pending + [index])
                    pending = []
                else:
                    pending.append(index)
                    if not self._expected_more(index + 1) or len(pending) >= self.max_failures:
                        break
                index += 1
        finally:
            # Failed reads at the end are the end of the video; those before the declared count
            # are frames the file promised and did not give.
            if self.frame_count is not None and not self._stopped():
                self.missing_at_end = max(0, self.frame_count - (self.frames_decoded + len(self.skipped)))
            self.capture.release()




def check_video_file(path: Path) -> None:
    """A missing, unreadable or empty file: one line before OpenCV sees it."""
    if not path.exists():
        raise VideoError(f"video not found: {path}")
    if not path.is_file():
        raise VideoError(f"not a video file: {path}")
    if not os.access(path, os.R_OK):
        raise VideoError(f"video not readable (permissions): {path}")
    if path.stat().st_size == 0:
        raise VideoError(f"{path}: the file is empty (0 bytes)")


def written_video_problem(path: Path, frames: int) -> str | None:
    """Why a video file just written does not hold its `frames` frames (None: it does): it must
    open, declare that many frames and give the last one; a file that declares another count is
    decoded through. (A full disk can leave a file that opens but stops early.)"""
    if frames == 0:
        return None
    with opencv_path(path) as name:
        capture = cv2.VideoCapture(name)
        try:
            if not capture.isOpened():
                return "the file does not open as a video"
            declared = int(capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
            if declared == frames:
                capture.set(cv2.CAP_PROP_POS_FRAMES, frames - 1)
                if capture.read()[0]:
                    return None
                capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
            decoded = 0
            while capture.grab():
                decoded += 1
            return None if decoded == frames else f"only {decoded} of its {frames} frames decode"
        finally:
            capture.release()
