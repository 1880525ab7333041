"""Poses on a video file or a webcam: `run_video(predictor, source, options) -> VideoSummary`.

`vitpose predict video.mp4` (and `vitpose predict 0` for webcam 0) land here. The work per batch
of frames: decode (OpenCV VideoCapture), then the predictor on the batch (`predictor(frames)`:
detect, crop, pose, decode heatmaps: `vitpose.inference.pipeline.TopDown`, the steps images go
through too), then in frame order track / smooth (post-processing of the `Poses`), JSON records,
draw, write the video.

Two schedules run these steps (`options.pipeline`):
- "threads": a reader thread decodes ahead, the main thread runs the predictor, a writer
  thread tracks, draws and writes; bounded queues between them keep memory flat on any length.
  OpenCV's decoder, warps and drawing and torch's kernels release the GIL, so the stages overlap;
  processes would have to copy every frame between them. This pays when the model runs on a GPU
  (the CPU is otherwise idle while the GPU computes).
- "sequential": the same steps one after another in one thread.
- "auto" (default): threads when the model is on CUDA, sequential on the CPU (measured in
  BENCHMARKS.md: on 2 CPU cores the extra threads only contend with torch's).

Bad input: a missing, empty or unreadable source, or a camera that does not open, is one line
(`VideoError`). A frame that fails to decode, or on which the detector or the model fails, is
counted, skipped (no JSON records; the drawn video repeats the previous frame so that it keeps
the source's frame count and timing) and listed at the end; a video that ends before the frame
count its container declares is reported with the number of frames missing. A frame with nobody
in it has no records. `stop` (a threading.Event, set by the command's SIGINT/SIGTERM handler)
ends the run after the frames in flight: the video file is closed (playable), the JSON Lines end
at a whole frame, and the summary says it was interrupted.

JSON (`options.json`): JSON Lines, one COCO results record per person with `frame` (0-based frame
index) in place of `image_id` (`vitpose.inference.pipeline.coco_records`), flushed frame by frame;
`options.json_array` writes one JSON array at the end instead (video files only). `options.resume`
continues a JSON Lines file: the frames it holds are skipped. With `options.smooth == "offline"`
(a video file, no drawn video, no resume) the whole video is one unit of the results writer
(`vitpose.inference.smoothing.SmoothingWriter`): its records are held, and written once every
track can be smoothed as a whole.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vitpose.errors import UserError
from vitpose.inference.draw import draw_people
from vitpose.inference.pipeline import coco_records, video_boxes
from vitpose.inference.pose_formats import POSE_FORMATS, PoseFormatFile
from vitpose.inference.records import rescored
from vitpose.inference.results import Poses
from vitpose.inference.runner import Failures, PredictOptions, offline_smoothing, predict_chunk
from vitpose.inference.smoothing import SmoothingWriter, check_offline_smoothing, smoothing_mode
from vitpose.inference.tracking import DetectionSchedule, KeypointSmoother, Tracker
from vitpose.inference.video_file import VideoFile, VideoWriteError, open_video_writer, output_video_path  # noqa: F401
from vitpose.inference.writers import ResultsFile
from vitpose.run.sources import (  # noqa: F401 - re-exported
    DEFAULT_FPS,
    Frame,
    FrameReader,
    VideoError,
    check_video_file,
    written_video_problem,
)

__all__ = ["FrameReader", "VideoError", "VideoFile", "VideoWriteError", "VideoSummary", "check_video_file",
           "open_video_writer", "output_video_path", "run_video"]

STAGES = ("decode", "detect", "crop", "pose", "decode heatmaps", "track", "draw", "write")


# ---------------------------------------------------------------------------------------------
# Output


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
    failed: list[str] = field(default_factory=list)  # "frame N: why" for frames the predictor failed on
    resumed_from: int = 0  # the first frame done (--resume skips those already in the JSON)
    missing_at_end: int = 0
    frames_written: int = 0
    video_path: str | None = None
    json_path: str | None = None
    tracks: int = 0
    detector_frames: int | None = None  # with --det-every: the frames the detector ran on
    det_every: int = 1
    wall_seconds: float = 0.0
    stage_seconds: dict = field(default_factory=dict)
    pipeline: str = "threads"
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    video_error: str | None = None  # the drawn video could not be written (VideoWriteError)
    whole: bool = False  # the results are a file written whole (--format other than coco): no --resume

    @property
    def exit_status(self) -> int:
        """130 when interrupted; 2 when no frame decoded at all; 1 when frames failed (decode,
        detector, model), the video ended early (as for images that fail) or the drawn video could
        not be written; else 0."""
        if self.interrupted:
            return 130
        if self.frames_decoded == 0 and self.resumed_from == 0:
            return 2
        return 1 if (self.skipped or self.failed or self.missing_at_end or self.video_error) else 0

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
        if self.failed:
            lines.append(f"  {len(self.failed)} frame(s) failed and were skipped: " + "; ".join(self.failed[:5])
                         + (" ..." if len(self.failed) > 5 else ""))
        if self.frames_decoded == 0 and self.resumed_from == 0 and not self.interrupted:
            lines.append("  no frame could be decoded")
        if self.resumed_from:
            lines.append(f"  resumed: frames before {self.resumed_from} were already in {self.json_path}")
        if self.interrupted:
            partial = bool(self.json_path) and self.json_path.endswith(".partial")
            lines.append(f"  interrupted: stopped by the user after {self.frames_done} frames"
                         + (f"; {self.json_path} is written whole: run again to finish it" if self.whole and
                            self.json_path else
                            "; the results so far are in " + self.json_path + " (the earlier file is unchanged; "
                            "run again with --resume to finish them)"
                            if partial else "; run again with --resume to finish the JSON" if self.json_path else ""))
        lines += [f"  {note}" for note in self.notes]
        if self.detector_frames is not None:
            lines.append(f"  detector ran on {self.detector_frames} of {self.frames_done} frames "
                         f"(--det-every {self.det_every}; poses carried the boxes between)")
        if self.video_error:
            lines.append(f"  {self.video_error}")
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


class _Writer:
    """Frame-ordered outputs: tracking and smoothing (post-processing of the `Poses`), JSON
    records, drawing, the video file."""

    def __init__(self, options: PredictOptions, predictor, reader: FrameReader, summary: VideoSummary, results,
                 progress):
        self.timer = predictor.timer
        self.skeleton = getattr(predictor, "skeleton", None)
        self.summary, self.results, self.progress = summary, results, progress
        track, smooth = options.track, smoothing_mode(options.smooth)
        self.report_ids = track
        self.tracker = Tracker(**(options.tracker_options or {})) if (track or smooth) else None
        self.smoother = (KeypointSmoother(reader.fps, **(options.smooth_options or {}))
                         if smooth == "live" else None)
        # offline: the whole video is one unit of the results, smoothed track by track at its end
        self.offline = smooth == "offline"
        self.held = False
        if self.offline and results is not None:
            self.results = SmoothingWriter(results, reader.fps, offline_smoothing(options), keep_track_ids=track)
        self.video = None
        out = options.out
        self.video_path = output_video_path(out, reader.source) if out else None
        self.fps = reader.fps
        self.keypoint_thr = float(options.keypoint_threshold)
        self.rescore = options.rescore
        self.next_index = None  # the next source frame the video needs
        self.last_drawn = None
        if self.tracker is not None and self.report_ids and results is not None and results.done:
            self._replay_tracks(results)

    def _replay_tracks(self, results) -> None:
        """--resume with --track: the tracker goes through the frames already in the JSON with the
        ids given then, so that a person keeps their id across the stop and new people get new ids."""
        frame, rows = None, []
        for record in [*results.kept_records(), None]:
            if record is not None and "track_id" not in record:
                self.summary.notes.append("the resumed JSON has no track ids (an earlier run without --track): "
                                          "track ids start again at 0")
                return
            if rows and (record is None or record["frame"] != frame):
                x, y, w, h = np.asarray([r["bbox"] for r in rows], np.float64).T
                flat = np.asarray([[np.nan if v is None else v for v in r["keypoints"]] for r in rows], np.float64)
                flat = flat.reshape(len(rows), -1, 3)
                self.tracker.replay(np.stack([x, y, x + w, y + h], 1), [r["track_id"] for r in rows],
                                    flat[..., :2], flat[..., 2], frame=frame)
                rows = []
            if record is not None:
                frame = record["frame"]
                rows.append(record)

    def __call__(self, frame: Frame, poses: Poses | None) -> None:
        """One frame's people (None: the predictor failed on it; the video repeats the last picture)."""
        if poses is not None:
            self._post_process(poses)
            if self.results is not None:
                with self.timer.stage("write"):
                    self._write(*rescored(*coco_records(poses), self.rescore))
            self.summary.frames_done += 1
            self.summary.people += len(poses)
        if self.video_path is not None:
            self._draw_and_write(frame, poses)
        if self.progress is not None:
            self.progress.update(1)

    def _write(self, records: list[dict], nonfinite: int) -> None:
        """A frame's records: a unit of their own, or (offline smoothing) added to the video's one."""
        if not self.offline:
            self.results.write(records, nonfinite)
            return
        if not self.held:
            self.results.begin(None)
            self.held = True
        self.results.add(records, nonfinite)

    def _post_process(self, poses: Poses) -> None:
        if self.tracker is None:
            return
        with self.timer.stage("track"):
            ids = self.tracker.update(poses.boxes, poses.keypoints, poses.keypoint_scores, frame=poses.frame,
                                      follows=poses.follows)
            if self.smoother is not None and len(ids):
                poses.keypoints = self.smoother.smooth(ids, poses.keypoints, poses.frame)
            if self.report_ids or self.offline:  # offline smoothing goes by track; its writer drops the ids
                poses.track_ids = ids

    def _draw_and_write(self, frame: Frame, poses: Poses | None) -> None:
        if self.video is None:  # opened at the first frame, with its size
            height, width = frame.bgr.shape[:2]
            self.video = open_video_writer(self.video_path, self.fps, (width, height))
            self.summary.video_path = str(self.video_path)
            self.next_index = frame.index
        drawn = self.last_drawn
        if poses is not None or drawn is None:
            with self.timer.stage("draw"):
                drawn = draw_people(frame.bgr, poses if poses is not None else _nobody(frame),
                                    self.skeleton, self.keypoint_thr, "bgr")
        with self.timer.stage("write"):
            # frames that failed to decode: repeat the previous picture so that the video keeps
            # the source's frame count and timing
            while self.next_index < frame.index:
                self.video.write(drawn if self.last_drawn is None else self.last_drawn)
                self.summary.frames_written += 1
                self.next_index += 1
            self.video.write(drawn)
        self.last_drawn = drawn
        self.summary.frames_written += 1
        self.next_index = frame.index + 1

    def close(self, completed: bool) -> None:
        with self.timer.stage("write"):
            if self.video is not None:
                try:
                    self.video.release()  # writes the container's index: a playable file
                except VideoWriteError as e:  # the JSON is closed all the same
                    self.summary.video_path = None
                    self.summary.video_error = str(e)
            if self.results is not None:
                if self.held:  # the frames done, smoothed (a stopped run's too: it cannot be resumed)
                    self.results.end()
                self.summary.json_path = str(self.results.close(completed))
                if self.results.nonfinite:
                    self.summary.notes.append(f"{self.results.nonfinite} keypoint or score values were not "
                                              f"finite and are written as null")
        if self.tracker is not None and self.report_ids:
            self.summary.tracks = self.tracker.next_id


def _nobody(frame: Frame) -> Poses:
    return Poses(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros((0, 0, 2)),
                 np.zeros((0, 0), np.float32), frame=frame.index)


def _predict_frames(predictor, frames: list[Frame], boxes, failures: Failures,
                    schedule: DetectionSchedule | None = None) -> list[tuple[Frame, Poses | None]]:
    """The predictor on a batch of frames (`predict_chunk`: one bad frame costs one frame, its
    failure kept in `failures`). With a `schedule` (`--det-every N`) the frames go one by one:
    each one's boxes come from the previous frame's poses."""
    table, key = boxes
    if schedule is not None and table is None:
        return [_predict_followed(predictor, frame, schedule, failures) for frame in frames]
    lookup = None if table is None else lambda label, size: table.lookup(key, int(label.split()[-1]), size)
    found = predict_chunk(predictor, [f.bgr for f in frames], None, [f"frame {f.index}" for f in frames], failures,
                          box_lookup=lookup)
    for frame, poses in zip(frames, found):
        if poses is not None:
            poses.frame = frame.index
    return list(zip(frames, found))


def _followed(predictor, frame: Frame, schedule: DetectionSchedule):
    """One frame's poses on the carried boxes, detecting again when there are none or someone was lost."""
    carried = schedule.boxes_for(frame.index)
    poses = None
    if carried is not None:
        poses = predictor([frame.bgr], boxes=[carried], channels="bgr")[0]
        poses.follows = schedule.carried_from.copy()
    if poses is None or schedule.lost(poses.keypoint_scores):
        schedule.detector_frames += 1
        poses = predictor([frame.bgr], channels="bgr")[0]
    return [poses]


def _predict_followed(predictor, frame: Frame, schedule: DetectionSchedule, failures: Failures):
    """One frame under `--det-every` (`predict_chunk` on a one-frame chunk of `_followed`)."""
    poses = predict_chunk(lambda images, **_: _followed(predictor, frame, schedule), [frame.bgr], None,
                          [f"frame {frame.index}"], failures)[0]
    if poses is None:
        schedule.carried = None  # detect on the next frame
        return frame, None
    poses.frame = frame.index
    schedule.update(poses, (frame.bgr.shape[1], frame.bgr.shape[0]), carried=poses.follows is not None)
    return frame, poses


def _schedule(options: PredictOptions, predictor, webcam: bool) -> tuple[str, int]:
    pipeline = options.pipeline or "auto"
    if pipeline not in ("auto", "threads", "sequential"):
        raise ValueError(f"pipeline must be 'auto', 'threads' or 'sequential', got {pipeline!r}")
    if pipeline == "auto":
        pipeline = "threads" if getattr(predictor, "device", None) is not None and \
            predictor.device.type == "cuda" else "sequential"
    batch_frames = options.batch_frames
    if batch_frames is None:  # a camera: each frame as soon as it comes
        batch_frames = 1 if webcam else (options.batch_images or 8)
    if int(batch_frames) < 1:
        raise UserError(f"--batch-images: frames per batch must be >= 1, got {batch_frames}")
    return pipeline, int(batch_frames)


def _detection_schedule(options: PredictOptions, boxes) -> DetectionSchedule | None:
    """`--det-every N` (N > 1): the detector on every N-th frame, carried poses between."""
    every = options.det_every or 1
    if int(every) < 1:
        raise UserError(f"--det-every: detect every N frames with N >= 1, got {every}")
    if int(every) == 1:
        return None
    if boxes[0] is not None:
        raise UserError("--det-every with --boxes: the boxes file already gives every frame's people; leave one out")
    return DetectionSchedule(int(every), lost_ratio=options.det_lost_ratio or 0.5)


def _results_file(options: PredictOptions, webcam: bool, predictor=None, reader: FrameReader | None = None):
    if not options.json:
        return None
    if options.format in POSE_FORMATS:  # OpenPose, DeepLabCut, AlphaPose, NWB: written at the end
        from vitpose.data.metainfo import dataset_info

        skeleton = getattr(predictor, "skeleton", None) or dataset_info("coco")
        source = reader.source if reader is not None else "video"
        stem = f"webcam{source}" if webcam else Path(str(source)).stem
        return PoseFormatFile(options.json, options.format, skeleton, stem=stem, video=True, source=str(source),
                              fps=reader.fps if reader is not None else None)
    if options.json_array and webcam:
        raise UserError("--json-array: a webcam runs until it is stopped; its results are JSON Lines only")
    return ResultsFile(options.json, "frame", array=options.json_array, resume=options.resume)


def run_video(predictor, source, options: PredictOptions, stop: threading.Event | None = None) -> VideoSummary:
    """Poses on every frame of a video file or camera, with the `vitpose predict` options.

    Args:
        predictor: a `vitpose.Predictor` or `OnnxPredictor` (called on batches of frames; its
            detector finds the people unless `options.boxes`; its `skeleton` draws them).
        source: a video file path, or a camera index (int).
        options: a `vitpose.inference.runner.PredictOptions`; what a video run reads of it:
            `out` (a folder for <stem>.mp4, or a .mp4/.avi path), `json` (a path), `json_array`,
            `resume`, `track`, `smooth` ("live" / True: One-Euro; "offline": whole tracks, see
            `vitpose.inference.smoothing`), `boxes` (a detection-results JSON keyed by `frame`).
            Extra knobs: `batch_frames` (frames per predictor call; default `batch_images` or 8, 1
            for a camera), `pipeline` ("auto" | "threads" | "sequential"), `progress` (default
            True), `quiet` (no summary print), `keypoint_threshold` (drawing; default 0.3),
            `tracker_options` / `smooth_options` (dicts of `Tracker` / `KeypointSmoother` arguments),
            `det_every` (the detector on every N-th frame, poses carry people between) and
            `det_lost_ratio` (a carried person whose mean keypoint score falls below this share
            of their previous frame's, default 0.5, makes that frame detect again).
        stop: an Event that ends the run cleanly after the frames in flight (SIGINT / SIGTERM).
    Returns:
        a `VideoSummary` (also printed to stderr unless `options.quiet`); a command returns its
        `exit_status`.
    """
    started = time.perf_counter()
    webcam = isinstance(source, int)
    pipeline, batch_frames = _schedule(options, predictor, webcam)
    boxes = video_boxes(options.boxes)
    if options.resume and options.out:
        raise UserError("--resume with --out: a drawn video cannot be continued; leave out --out")
    check_offline_smoothing(options.smooth, webcam=webcam, out=options.out, resume=options.resume)
    reader = FrameReader(source, stop=stop)
    if boxes[0] is None and getattr(predictor, "detector", None) is None:
        reader.capture.release()
        raise UserError("no person boxes: this predictor has no detector; give --boxes FILE.json, or build it "
                        "with a detector (--detector default | full-frame | NAME)")
    results = _results_file(options, webcam, predictor, reader)
    summary = _new_summary(reader, pipeline, results)
    # a file written whole cannot be continued: another format's, or the tracks --smooth offline
    # writes once at the end (check_offline_smoothing refuses --resume there)
    summary.whole = options.format != "coco" or smoothing_mode(options.smooth) == "offline"
    predictor.timer.reset()
    progress = _progress_bar(options, reader, summary.resumed_from)
    writer = _Writer(options, predictor, reader, summary, results, progress)
    frames = (f for f in reader if f.index >= summary.resumed_from)
    schedule = _detection_schedule(options, boxes)

    failures = Failures(show_tracebacks=False)
    failures.lines = summary.failed  # the summary lists them

    def process(batch: list[Frame]):
        return _predict_frames(predictor, batch, boxes, failures, schedule)

    try:
        if pipeline == "sequential":
            for batch in _batches(frames, batch_frames):
                for frame, poses in process(batch):
                    writer(frame, poses)
        else:
            _run_threads(frames, reader, process, writer, batch_frames)
    except KeyboardInterrupt:
        summary.interrupted = True
    finally:
        summary.interrupted = summary.interrupted or (stop is not None and stop.is_set())
        reader.stop.set()  # ends the reader thread (and a camera) whatever happened
        if progress is not None:
            progress.close()
        writer.close(completed=not summary.interrupted)
        _finish_summary(summary, reader, predictor.timer, started)
        if schedule is not None:
            summary.detector_frames, summary.det_every = schedule.detector_frames, schedule.every
    if not options.quiet:
        print(summary.format(), file=sys.stderr)
    return summary


def _new_summary(reader: FrameReader, pipeline: str, results) -> VideoSummary:
    summary = VideoSummary(source=reader.name, fps=reader.fps, frame_count=reader.frame_count, pipeline=pipeline)
    if not reader.fps_declared:
        summary.notes.append(f"the source gives no frame rate: {DEFAULT_FPS:g} frames/s assumed")
    summary.resumed_from = max(results.done) + 1 if results is not None and results.done else 0
    return summary


def _progress_bar(options: PredictOptions, reader: FrameReader, initial: int):
    """tqdm over the frames (on stderr) unless `options.progress` is False."""
    if not options.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=reader.frame_count, unit="frame", desc=reader.name, file=sys.stderr,
                dynamic_ncols=True, leave=False, initial=initial)


def _finish_summary(summary: VideoSummary, reader: FrameReader, timer, started: float) -> None:
    timer.add("decode", reader.decode_seconds)
    summary.frames_decoded = reader.frames_decoded
    summary.skipped = [i for i in reader.skipped if i >= summary.resumed_from]
    summary.missing_at_end = 0 if summary.interrupted else reader.missing_at_end
    if reader.wrong_size:
        summary.notes.append(f"{len(reader.wrong_size)} frame(s) had another size than the first "
                             f"{reader.size[0]}x{reader.size[1]} and were skipped: {reader.wrong_size[:20]}")
    summary.stage_seconds = {k: v for k, v in timer.ordered(STAGES).items() if v > 0}
    summary.wall_seconds = time.perf_counter() - started


class _Stop(Exception):
    """Raised inside a stage when another stage failed: unwinds without a second traceback."""


_END = object()


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


def _batches(frames_iter, size: int):
    batch = []
    for frame in frames_iter:
        batch.append(frame)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _run_threads(frames_in, reader: FrameReader, process, writer: _Writer, batch_frames: int) -> None:
    """Reader thread -> (main) detect, crop, pose -> writer thread, with bounded queues.

    An error in any stage stops all three and is raised here. Ctrl-C stops the reader; the writer
    still writes what the model has finished, so the outputs end cleanly at a frame."""
    abort = threading.Event()
    frames_q: queue.Queue = queue.Queue(maxsize=2 * batch_frames)
    results_q: queue.Queue = queue.Queue(maxsize=2 * batch_frames)
    errors: list[BaseException] = []

    def read():
        try:
            for frame in frames_in:
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
                writer(*item)
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
            for pair in process(batch):
                _put(results_q, pair, abort)
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
