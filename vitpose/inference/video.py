"""Poses on a video file or a webcam: `run_video(predictor, source, args) -> VideoSummary`.

`vitpose predict video.mp4` (and `vitpose predict 0` for webcam 0) land here. The work per batch
of frames: decode (OpenCV VideoCapture, BGR -> RGB), detect (one detector call for the batch),
crop (OpenCV on the CPU; `vitpose.inference.warp` on the model's GPU, bit-equal), pose (the crops of
all the frames of the batch through the model together), decode heatmaps, then in frame order
track / smooth, JSON records, draw, write the video.

Two schedules run these steps (`args.pipeline`):
- "threads": a reader thread decodes ahead, the main thread detects and runs the model, a writer
  thread tracks, draws and writes; bounded queues between them keep memory flat on any length.
  OpenCV's decoder, warps and drawing and torch's kernels release the GIL, so the stages overlap;
  processes would have to copy every frame between them. This pays when the model runs on a GPU
  (the CPU is otherwise idle while the GPU computes).
- "sequential": the same steps one after another in one thread.
- "auto" (default): threads when the model is on CUDA, sequential on the CPU. Measured on the
  2-core CPU of this project (benchmarks/bench_predict.py --pipeline): the model already uses
  both cores, so the extra threads only contend with torch's (threads 0.91x sequential with the
  demo model, where decoding, cropping, drawing and writing are 15% of the time; 1.0x with
  ViTPose-S, where the model is 96-99% of it).

Bad input: a missing or unreadable source raises (naming it). A frame that fails to decode is
counted, skipped (no JSON records; the drawn video repeats the previous frame so that it keeps the
source's frame count and timing) and listed at the end; a video that ends before the frame count
its container declares is reported with the number of frames missing. A frame with nobody in it
has no records.

JSON (`args.json`): COCO results format with `frame` (0-based frame index) in place of `image_id`:
`{"frame", "category_id": 1, "keypoints": [x, y, score] * K, "score", "bbox": [x, y, w, h],
"track_id" (with --track)}`; `score` is the box score times the mean of the keypoint scores above
0.2 (MMPose's rescoring), `bbox` the person box in image pixels.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import torch

from vitpose.data.transforms import crop_geometry
from vitpose.files import write_atomic
from vitpose.topdown import forward_heatmaps, heatmaps_to_keypoints
from vitpose.inference.tracking import KeypointSmoother, Tracker
from vitpose.inference.draw import draw_pose
from vitpose.inference.warp import warp_affine_uint8

__all__ = ["FrameReader", "VideoSummary", "load_frame_boxes", "open_video_writer", "run_video"]

STAGES = ("decode", "detect", "crop", "pose", "decode heatmaps", "track", "draw", "write")
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".m4v", ".webm")
KEYPOINT_SCORE_THR = 0.2  # MMPose's keypoint_score_thr for the instance score
DEFAULT_FPS = 30.0  # for cameras that do not say their rate


# ---------------------------------------------------------------------------------------------
# Reading


def is_webcam(source) -> bool:
    """An int, or a string of digits: a camera index (what OpenCV's VideoCapture(int) opens)."""
    return isinstance(source, int) or (isinstance(source, str) and source.isdigit())


@dataclass
class Frame:
    index: int  # position in the source, counting frames that failed to decode
    bgr: np.ndarray  # (H, W, 3) uint8 as decoded
    rgb: np.ndarray  # the same in RGB (what the detector and the model take)


class FrameReader:
    """Frames of a video file or a camera, with decode failures counted instead of fatal.

    Args:
        source: a video file path, or a camera index (int or digit string).
        max_failures: consecutive failed reads after which the video is taken to have ended
            (a truncated file fails on every read from the cut on).

    Iterating yields `Frame`s. Afterwards: `skipped` (indices of frames that failed to decode
    and were followed by good ones), `missing_at_end` (frames the container declares but that
    never decoded), `frames_decoded`. `fps` is the container's rate (DEFAULT_FPS when a camera
    gives none), `frame_count` the declared count (None when unknown), `size` (w, h).
    """

    def __init__(self, source, max_failures: int = 25):
        self.webcam = is_webcam(source)
        self.name = f"webcam {int(source)}" if self.webcam else str(source)
        if not self.webcam:
            path = Path(source)
            if not path.exists():
                raise FileNotFoundError(f"video not found: {path}")
            if not path.is_file():
                raise ValueError(f"not a video file: {path}")
            if not os.access(path, os.R_OK):
                raise PermissionError(f"video not readable: {path}")
        self.capture = cv2.VideoCapture(int(source) if self.webcam else str(source))
        if not self.capture.isOpened():
            what = "camera could not be opened" if self.webcam else "OpenCV cannot open this file as a video"
            raise ValueError(f"{self.name}: {what}")
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
        self.stop = threading.Event()
        self.decode_seconds = 0.0

    def _expected_more(self, index: int) -> bool:
        return self.frame_count is None or index < self.frame_count

    def __iter__(self):
        index, pending = 0, []  # pending: consecutive failed reads not yet known to be corrupt
        try:
            while not self.stop.is_set():
                start = time.perf_counter()
                ok, bgr = self.capture.read()
                good = ok and bgr is not None and bgr.ndim == 3 and bgr.shape[2] == 3
                if good and self.frames_decoded == 0:
                    self.size = (bgr.shape[1], bgr.shape[0])  # what the container said may be 0x0
                if good and (bgr.shape[1], bgr.shape[0]) != self.size:
                    self.wrong_size.append(index)  # cannot go into a video of the first size
                    good = False
                rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB) if good else None
                self.decode_seconds += time.perf_counter() - start
                if good:
                    self.skipped.extend(pending)  # failures followed by a good frame: corrupt frames
                    pending = []
                    self.frames_decoded += 1
                    yield Frame(index, bgr, rgb)
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
            if self.frame_count is not None:
                self.missing_at_end = max(0, self.frame_count - (self.frames_decoded + len(self.skipped)))
            self.capture.release()


# ---------------------------------------------------------------------------------------------
# Boxes


def load_frame_boxes(path) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """A COCO detection-results JSON for a video: frame index -> (boxes xyxy (M, 4), scores (M,)).

    Records are `{"frame" (or "image_id"): int, "bbox": [x, y, w, h], "score": float,
    "category_id": 1}`; records of another category are ignored, `score` defaults to 1.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"boxes file not found: {path}")
    try:
        records = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a JSON file ({e})") from None
    if not isinstance(records, list):
        raise ValueError(f"{path}: expected a list of detection records, got {type(records).__name__}")
    per_frame: dict[int, list] = {}
    for i, record in enumerate(records):
        where = f"{path}: record {i}"
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected an object, got {type(record).__name__}")
        if record.get("category_id", 1) != 1:
            continue
        frame = record.get("frame", record.get("image_id"))
        if not isinstance(frame, int) or isinstance(frame, bool) or frame < 0:
            raise ValueError(f"{where}: field 'frame' (or 'image_id') must be a frame index >= 0, got {frame!r}")
        bbox = record.get("bbox")
        if (not isinstance(bbox, list) or len(bbox) != 4
                or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in bbox)):
            raise ValueError(f"{where}: field 'bbox' must be [x, y, w, h] finite numbers, got {bbox!r}")
        if bbox[2] <= 0 or bbox[3] <= 0:
            raise ValueError(f"{where}: field 'bbox' has zero or negative width/height: {bbox}")
        score = record.get("score", 1.0)
        if not isinstance(score, (int, float)) or not math.isfinite(score):
            raise ValueError(f"{where}: field 'score' must be a number, got {score!r}")
        x, y, w, h = (float(v) for v in bbox)
        per_frame.setdefault(frame, []).append((x, y, x + w, y + h, float(score)))
    return {frame: (np.array(rows)[:, :4], np.array(rows)[:, 4]) for frame, rows in per_frame.items()}


def _empty_boxes():
    return np.zeros((0, 4)), np.zeros(0)


def box_source(predictor, args, detector=None) -> Callable:
    """frames (list of Frame) -> list of (boxes xyxy (M, 4), scores (M,)), by the arguments.

    `args.boxes` (a file) wins; then `args.detector == "full-frame"` (one box per frame, score 1);
    `args.detector == "none"` needs `args.boxes`. Otherwise the detector: the `detector` argument,
    else `predictor.detector` (what `Predictor.from_pretrained(..., detector=NAME)` attaches: a
    callable `detector(rgb_images) -> [(boxes xyxy, scores), ...]`), called on the RGB frames of
    a batch at once.
    """
    boxes_file = getattr(args, "boxes", None)
    name = getattr(args, "detector", None)
    if boxes_file:
        table = load_frame_boxes(boxes_file)
        return lambda frames: [table.get(f.index, _empty_boxes()) for f in frames]
    if name == "full-frame":
        return lambda frames: [(np.array([[0.0, 0.0, f.rgb.shape[1], f.rgb.shape[0]]]), np.ones(1))
                               for f in frames]
    if name == "none":
        raise ValueError("no person boxes: --detector none needs --boxes FILE.json "
                         "(or use --detector full-frame for a single-person clip)")
    detector = detector if detector is not None else getattr(predictor, "detector", None)
    if not callable(detector):
        raise ValueError(f"no person detector: this predictor has none attached (build it with "
                         f"Predictor.from_pretrained(..., detector={name or 'default'!r})), or give --boxes")

    def detect(frames):
        results = detector([f.rgb for f in frames])
        if len(results) != len(frames):
            raise RuntimeError(f"the detector returned {len(results)} results for {len(frames)} frames")
        return [(np.asarray(b, np.float64).reshape(-1, 4), np.asarray(s, np.float64).reshape(-1))
                for b, s in results]
    return detect


# ---------------------------------------------------------------------------------------------
# Pose on a batch of frames


class StageTimer:
    """Seconds spent per stage; each stage is timed in one thread, so plain adds are safe."""

    def __init__(self):
        self.seconds = dict.fromkeys(STAGES, 0.0)

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    @contextlib.contextmanager
    def time(self, stage: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - start)


@dataclass
class FramePoses:
    frame: Frame
    boxes: np.ndarray  # (M, 4) xyxy
    box_scores: np.ndarray  # (M,)
    keypoints: np.ndarray  # (M, K, 2) image pixels
    keypoint_scores: np.ndarray  # (M, K)
    track_ids: np.ndarray | None = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _crops_opencv(predictor, frames, centers, scales):
    crops, fixed = [], []
    for frame, center, scale in zip(frames, centers, scales):
        if len(center):
            c, s = predictor.crops(frame.rgb, center, scale)
            crops.append(torch.from_numpy(c))
            fixed.append(s)
    if not crops:
        return None, None
    return torch.cat(crops).to(predictor.device), np.concatenate(fixed)


def _crops_torch(predictor, frames, centers, scales):
    """All crops of the batch in one gather on the model's device (bit-equal to OpenCV's)."""
    input_size = predictor.codec.input_size
    matrices, fixed, image_index = [], [], []
    for i, (center, scale) in enumerate(zip(centers, scales)):
        for c, s in zip(center, scale):
            s_fixed, matrix = crop_geometry(c, s, 0.0, input_size)
            matrices.append(matrix)
            fixed.append(s_fixed)
            image_index.append(i)
    if not matrices:
        return None, None
    images = torch.from_numpy(np.stack([f.rgb for f in frames])).to(predictor.device, non_blocking=True)
    crops = warp_affine_uint8(images, np.stack(matrices), input_size, image_index=np.array(image_index))
    return crops, np.stack(fixed).astype(np.float32)


def pose_batch(predictor, frames: list[Frame], detections, timer: StageTimer, flip_test: bool,
               gpu_warp: bool) -> list[FramePoses]:
    """Keypoints of every box of a batch of frames: the crops of all frames go through the
    model together (`predictor.batch_size` crops per forward pass)."""
    centers, scales, kept = [], [], []
    for frame, (boxes, box_scores) in zip(frames, detections):
        valid = np.all(np.isfinite(boxes), axis=1) & np.all(boxes[:, 2:] > boxes[:, :2], axis=1)
        boxes, box_scores = boxes[valid], box_scores[valid]  # a detector's empty boxes hold nobody
        kept.append((boxes, box_scores))
        if len(boxes):
            c, s = predictor.boxes_to_center_scale(boxes, "xyxy")
        else:
            c, s = np.zeros((0, 2), np.float32), np.zeros((0, 2), np.float32)
        centers.append(c)
        scales.append(s)
    with timer.time("crop"):
        crops, fixed_scales = (_crops_torch if gpu_warp else _crops_opencv)(predictor, frames, centers, scales)
        _sync(predictor.device)
    num_keypoints = len(predictor.flip_indices) if getattr(predictor, "flip_indices", None) is not None else 17
    if crops is None:
        keypoints, scores = np.zeros((0, num_keypoints, 2)), np.zeros((0, num_keypoints), np.float32)
    else:
        batch = int(getattr(predictor, "batch_size", 32))
        heatmaps = []
        with timer.time("pose"), torch.no_grad():
            for start in range(0, len(crops), batch):
                heatmaps.append(forward_heatmaps(predictor.model, crops[start:start + batch], flip_test,
                                                 getattr(predictor, "amp_dtype", None),
                                                 getattr(predictor, "flip_indices", None)).cpu())
        with timer.time("decode heatmaps"):
            keypoints, scores = heatmaps_to_keypoints(torch.cat(heatmaps), np.concatenate(centers),
                                                      fixed_scales, predictor.codec)
    out, start = [], 0
    for frame, (boxes, box_scores) in zip(frames, kept):
        stop = start + len(boxes)
        out.append(FramePoses(frame, boxes, box_scores, keypoints[start:stop], scores[start:stop]))
        start = stop
    return out


# ---------------------------------------------------------------------------------------------
# Output


def instance_score(box_score: float, keypoint_scores: np.ndarray, thr: float = KEYPOINT_SCORE_THR) -> float:
    """Box score times the mean keypoint score over keypoints above thr (0 when none is)."""
    above = keypoint_scores[keypoint_scores > thr]
    return float(box_score) * (float(above.mean()) if above.size else 0.0)


def frame_records(poses: FramePoses) -> list[dict]:
    """COCO results records of one frame (`frame` in place of `image_id`)."""
    records = []
    for m in range(len(poses.boxes)):
        x1, y1, x2, y2 = (float(v) for v in poses.boxes[m])
        flat = np.concatenate([poses.keypoints[m], poses.keypoint_scores[m][:, None]], axis=1).reshape(-1)
        record = {"frame": poses.frame.index, "category_id": 1,
                  "keypoints": [float(v) for v in flat],
                  "score": instance_score(poses.box_scores[m], poses.keypoint_scores[m]),
                  "bbox": [x1, y1, x2 - x1, y2 - y1]}
        if poses.track_ids is not None:
            record["track_id"] = int(poses.track_ids[m])
        records.append(record)
    return records


def _track_colour(track_id: int) -> tuple[int, int, int]:
    hue = (track_id * 47) % 180  # well-separated hues for consecutive ids
    bgr = cv2.cvtColor(np.array([[[hue, 200, 255]]], np.uint8), cv2.COLOR_HSV2BGR)[0, 0]
    return tuple(int(v) for v in bgr)


def draw_frame(poses: FramePoses, keypoint_thr: float = 0.3) -> np.ndarray:
    """The BGR frame with boxes (and track ids) and skeletons (keypoints scoring above thr)."""
    canvas = poses.frame.bgr
    if len(poses.boxes):
        canvas = draw_pose(canvas, poses.keypoints, poses.keypoint_scores, thr=keypoint_thr, channels="bgr")
    else:
        canvas = canvas.copy()
    thickness = max(1, max(canvas.shape[:2]) // 400)
    for m, box in enumerate(poses.boxes):
        colour = _track_colour(int(poses.track_ids[m])) if poses.track_ids is not None else (255, 255, 255)
        p1 = (int(round(box[0])), int(round(box[1])))
        p2 = (int(round(box[2])), int(round(box[3])))
        cv2.rectangle(canvas, p1, p2, colour, thickness, cv2.LINE_AA)
        if poses.track_ids is not None:
            cv2.putText(canvas, str(int(poses.track_ids[m])), (p1[0] + 2, p1[1] + 14 * thickness),
                        cv2.FONT_HERSHEY_SIMPLEX, 0.5 * thickness, colour, thickness, cv2.LINE_AA)
    return canvas


def output_video_path(out, reader: FrameReader) -> Path:
    """`--out DIR` -> DIR/<source stem>.mp4 (webcam N: webcam_N.mp4); a path with a video
    suffix (.mp4, .avi, ...) is used as the file itself."""
    out = Path(out)
    if out.suffix.lower() in VIDEO_SUFFIXES:
        return out
    stem = reader.name.replace(" ", "_") if reader.webcam else Path(reader.name).stem
    return out / f"{stem}.mp4"


def open_video_writer(path: Path, fps: float, size) -> cv2.VideoWriter:
    """An OpenCV writer (mp4v in .mp4/.mov/.m4v, MJPG in .avi, VP80 in .webm, XVID otherwise)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    fourcc = {".mp4": "mp4v", ".mov": "mp4v", ".m4v": "mp4v", ".avi": "MJPG", ".webm": "VP80"}.get(suffix, "XVID")
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), float(fps), tuple(size))
    if not writer.isOpened():
        raise OSError(f"cannot write the video {path} (codec {fourcc}; is the folder writable?)")
    return writer


@dataclass
class VideoSummary:
    """What `run_video` did; `format()` is the text printed at the end."""

    source: str
    fps: float
    frame_count: int | None  # what the container declares (None: a camera, or unknown)
    frames_decoded: int = 0
    frames_done: int = 0
    people: int = 0
    skipped: list[int] = field(default_factory=list)  # frames that failed to decode
    missing_at_end: int = 0
    frames_written: int = 0
    video_path: str | None = None
    json_path: str | None = None
    tracks: int = 0
    wall_seconds: float = 0.0
    stage_seconds: dict = field(default_factory=dict)
    pipeline: str = "threads"
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        """0, or 1 when frames failed to decode or the video ended early (as `vitpose predict`
        exits 1 when it skipped unreadable images)."""
        return 1 if (self.skipped or self.missing_at_end) else 0

    @property
    def frames_per_second(self) -> float:
        return self.frames_done / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def format(self) -> str:
        lines = [f"{self.source}: {self.frames_done} frames, {self.people} people"
                 + (f", {self.tracks} tracks" if self.tracks else "")
                 + f" in {self.wall_seconds:.1f} s ({self.frames_per_second:.2f} frames/s, "
                 f"{self.people / self.wall_seconds if self.wall_seconds > 0 else 0:.2f} people/s; "
                 f"{self.pipeline} pipeline)"]
        if self.skipped:
            shown = ", ".join(map(str, self.skipped[:20])) + (" ..." if len(self.skipped) > 20 else "")
            lines.append(f"  {len(self.skipped)} frame(s) failed to decode and were skipped: {shown}")
        if self.missing_at_end:
            lines.append(f"  the video ended early: {self.missing_at_end} of the {self.frame_count} frames "
                         f"its container declares never decoded")
        if self.interrupted:
            lines.append(f"  stopped by the user after {self.frames_done} frames")
        lines += [f"  {note}" for note in self.notes]
        if self.video_path:
            lines.append(f"  wrote {self.video_path} ({self.frames_written} frames at {self.fps:g} frames/s)")
        if self.json_path:
            lines.append(f"  wrote {self.json_path} ({self.people} poses)")
        total = sum(self.stage_seconds.values())
        if total > 0:
            parts = [f"{stage} {sec:.2f} s ({100 * sec / total:.0f}%)"
                     for stage, sec in self.stage_seconds.items() if sec > 0]
            lines.append("  stage time: " + ", ".join(parts))
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The pipeline


class _Stop(Exception):
    """Raised inside a stage when another stage failed: unwinds without a second traceback."""


_END = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


def _put(q: queue.Queue, item, *stops: threading.Event) -> None:
    while True:
        try:
            q.put(item, timeout=0.1)
            return
        except queue.Full:
            if any(stop.is_set() for stop in stops):
                raise _Stop from None


def _get(q: queue.Queue, stop: threading.Event):
    while True:
        try:
            return q.get(timeout=0.1)
        except queue.Empty:
            if stop.is_set():
                raise _Stop from None


class _Writer:
    """Frame-ordered outputs: tracking, smoothing, JSON records, drawing, the video file."""

    def __init__(self, args, reader: FrameReader, timer: StageTimer, summary: VideoSummary, progress):
        self.timer = timer
        self.summary = summary
        self.progress = progress
        self.records: list[dict] | None = [] if getattr(args, "json", None) else None
        track = bool(getattr(args, "track", False))
        smooth = bool(getattr(args, "smooth", False))
        self.report_ids = track
        self.tracker = Tracker(**(getattr(args, "tracker_options", None) or {})) if (track or smooth) else None
        self.smoother = (KeypointSmoother(reader.fps, **(getattr(args, "smooth_options", None) or {}))
                         if smooth else None)
        self.video = None
        self.video_path = output_video_path(args.out, reader) if getattr(args, "out", None) else None
        self.fps = reader.fps
        self.keypoint_thr = float(getattr(args, "keypoint_threshold", None) or 0.3)
        self.next_index = 0  # the next source frame the video needs
        self.last_drawn = None

    def __call__(self, poses: FramePoses) -> None:
        if self.tracker is not None:
            with self.timer.time("track"):
                ids = self.tracker.update(poses.boxes, poses.keypoints, poses.keypoint_scores, frame=poses.frame.index)
                if self.smoother is not None and len(ids):
                    poses.keypoints = self.smoother.smooth(ids, poses.keypoints, poses.frame.index)
                if self.report_ids:
                    poses.track_ids = ids
        if self.records is not None:
            self.records.extend(frame_records(poses))
        if self.video_path is not None:
            if self.video is None:  # opened at the first frame, with its size
                height, width = poses.frame.bgr.shape[:2]
                self.video = open_video_writer(self.video_path, self.fps, (width, height))
                self.summary.video_path = str(self.video_path)
            with self.timer.time("draw"):
                drawn = draw_frame(poses, self.keypoint_thr)
            with self.timer.time("write"):
                self._write_until(poses.frame.index, drawn)
                self.video.write(drawn)
            self.last_drawn = drawn
            self.summary.frames_written += 1
        self.next_index = poses.frame.index + 1
        self.summary.frames_done += 1
        self.summary.people += len(poses.boxes)
        if self.progress is not None:
            self.progress.update(1)

    def _write_until(self, index: int, like: np.ndarray) -> None:
        # frames that failed to decode: repeat the previous picture (black before the first one)
        # so that the video keeps the source's frame count and timing
        while self.next_index < index:
            filler = self.last_drawn if self.last_drawn is not None else np.zeros_like(like)
            self.video.write(filler)
            self.summary.frames_written += 1
            self.next_index += 1

    def close(self, reader: FrameReader) -> None:
        if self.video is not None:
            with self.timer.time("write"):
                self.video.release()
        if self.records is not None:
            with self.timer.time("write"):
                write_atomic(self.summary.json_path, json.dumps(self.records))
        if self.tracker is not None and self.report_ids:
            self.summary.tracks = self.tracker.next_id


def _batches(frames_iter, size: int):
    batch = []
    for frame in frames_iter:
        batch.append(frame)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def run_video(predictor, source, args, detector=None) -> VideoSummary:
    """Poses on every frame of a video file or camera, with the `vitpose predict` options.

    Args:
        predictor: a `vitpose.Predictor` (its model, codec, device, flip_test, crops and
            boxes_to_center_scale are used; `predictor.detector`, when set, finds the people).
        source: a video file path, or a camera index (int or digit string).
        args: an argparse.Namespace (or any object) with `vitpose predict`'s flags, each optional:
            `out` (a folder for <stem>.mp4, or a .mp4/.avi path), `json` (a path), `track`,
            `smooth`, `no_flip`, `detector` ("full-frame", "none", or a name: the predictor's
            detector), `boxes` (a detection-results JSON keyed by `frame`); `device` is the
            predictor's already. Extra knobs: `batch_frames` (frames per model batch; default
            `batch_images` or 8, 1 for a camera), `pipeline` ("auto" | "threads" | "sequential"),
            `gpu_warp` (None = crops warped on the GPU when the model runs there), `progress`
            (default True), `quiet` (no summary print), `keypoint_threshold` (drawing; default
            0.3), `tracker_options` / `smooth_options` (dicts of `vitpose.inference.tracking.Tracker` /
            `KeypointSmoother` arguments).
        detector: a callable `detector(list of RGB frames) -> list of (boxes xyxy, scores)`
            that overrides `predictor.detector`.
    Returns:
        a `VideoSummary` (also printed to stderr unless `args.quiet`); a command returns its
        `exit_status`.
    """
    started = time.perf_counter()
    reader = FrameReader(source)
    summary = VideoSummary(source=reader.name, fps=reader.fps, frame_count=reader.frame_count)
    if not reader.fps_declared:
        summary.notes.append(f"the source gives no frame rate: {DEFAULT_FPS:g} frames/s assumed")
    pipeline = getattr(args, "pipeline", None) or "auto"
    if pipeline not in ("auto", "threads", "sequential"):
        raise ValueError(f"pipeline must be 'auto', 'threads' or 'sequential', got {pipeline!r}")
    if pipeline == "auto":
        pipeline = "threads" if predictor.device.type == "cuda" else "sequential"
    summary.pipeline = pipeline
    if getattr(args, "json", None):
        summary.json_path = str(args.json)
    batch_frames = getattr(args, "batch_frames", None)
    if batch_frames is None:  # a camera: each frame as soon as it comes
        batch_frames = 1 if reader.webcam else (getattr(args, "batch_images", None) or 8)
    batch_frames = int(batch_frames)
    if batch_frames < 1:
        raise ValueError(f"frames per batch must be >= 1, got {batch_frames}")
    flip_test = bool(predictor.flip_test) and not getattr(args, "no_flip", False)
    gpu_warp = getattr(args, "gpu_warp", None)
    gpu_warp = predictor.device.type == "cuda" if gpu_warp is None else bool(gpu_warp)
    detect = box_source(predictor, args, detector)
    timer = StageTimer()
    progress = None
    if getattr(args, "progress", True):
        from tqdm import tqdm

        progress = tqdm(total=reader.frame_count, unit="frame", desc=reader.name, file=sys.stderr,
                        dynamic_ncols=True, leave=False)
    writer = _Writer(args, reader, timer, summary, progress)

    def process(batch: list[Frame]) -> list[FramePoses]:
        with timer.time("detect"):
            detections = detect(batch)
        return pose_batch(predictor, batch, detections, timer, flip_test, gpu_warp)

    try:
        if pipeline == "sequential":
            for batch in _batches(reader, batch_frames):
                for poses in process(batch):
                    writer(poses)
        else:
            _run_threads(reader, process, writer, batch_frames)
    except KeyboardInterrupt:
        summary.interrupted = True
    finally:
        reader.stop.set()
        if progress is not None:
            progress.close()
        writer.close(reader)
        timer.add("decode", reader.decode_seconds)
        summary.frames_decoded = reader.frames_decoded
        summary.skipped = list(reader.skipped)
        summary.missing_at_end = reader.missing_at_end
        if reader.wrong_size:
            summary.notes.append(f"{len(reader.wrong_size)} frame(s) had another size than the first "
                                 f"{reader.size[0]}x{reader.size[1]} and were skipped: {reader.wrong_size[:20]}")
        summary.stage_seconds = {k: v for k, v in timer.seconds.items() if v > 0}
        summary.wall_seconds = time.perf_counter() - started
    if not getattr(args, "quiet", False):
        print(summary.format(), file=sys.stderr)
    return summary


def _run_threads(reader: FrameReader, process, writer: _Writer, batch_frames: int) -> None:
    """Reader thread -> (main) detect, crop, pose -> writer thread, with bounded queues.

    An error in any stage stops all three and is raised here. Ctrl-C stops the reader; the writer
    still writes what the model has finished, so the outputs end cleanly at a frame."""
    abort = threading.Event()
    frames_q: queue.Queue = queue.Queue(maxsize=2 * batch_frames)
    results_q: queue.Queue = queue.Queue(maxsize=2 * batch_frames)
    errors: list[BaseException] = []

    def read():
        try:
            for frame in reader:
                _put(frames_q, frame, abort, reader.stop)
            _put(frames_q, _END, abort, reader.stop)
        except _Stop:
            pass
        except BaseException as e:  # handed to the main thread, which raises it
            errors.append(e)
            abort.set()

    def write():
        try:
            while True:
                item = _get(results_q, abort)
                if item is _END:
                    return
                writer(item)
        except _Stop:
            pass
        except BaseException as e:
            errors.append(e)
            abort.set()

    threads = [threading.Thread(target=read, name="vitpose-read", daemon=True),
               threading.Thread(target=write, name="vitpose-write", daemon=True)]
    for t in threads:
        t.start()

    def frames():
        while True:
            item = _get(frames_q, abort)
            if item is _END:
                return
            yield item

    interrupted = False
    try:
        for batch in _batches(frames(), batch_frames):
            for poses in process(batch):
                _put(results_q, poses, abort)
    except _Stop:
        pass
    except KeyboardInterrupt:
        interrupted = True
    except BaseException:
        abort.set()
        raise
    finally:
        reader.stop.set()
        if not abort.is_set():
            try:
                _put(results_q, _END, abort)  # the writer finishes what is queued, then ends
            except _Stop:
                pass
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.1)
    if errors:
        raise errors[0]
    if interrupted:
        raise KeyboardInterrupt
