"""One way to run a predictor over work: `predict_chunk` and the failures it keeps.

Local images, video frames, video segments, Ray's actors and the server's batcher all hand the
predictor a chunk of images at once (the crops of several images share forward passes), and all
need the same rule when that call fails: try the chunk's items one by one, so one bad item costs
that item alone, and say which failed and why. That rule lives here once:

- `predict_chunk(predictor, images, boxes, labels, failures)` -> one `Poses` or None per image.
  `boxes` holds, per image, the caller's boxes ((M, 4|5) xyxy array or `Detections`) or None (the
  predictor's detector finds the people), or is None for all; `box_lookup` (optional) gives an
  image's boxes from its label and size (a `--boxes` file, checked against the image's size).
- `Failures`: what failed, as `label: Error: message` lines, with each error kept for the caller
  (the server answers each request with its own). An error that is not the user's (not a
  `UserError`) may be a bug: its traceback is printed once, so a bug is never only "an input
  failed".
- `predict_units(predictor, items, writer, finish, ...) -> RunSummary`: the one runner of work
  units (the images of `vitpose predict`, the segments of a video): `Item`s of consecutive units in
  chunks through `predict_chunk`, each unit's records one unit of the writer (`begin` at its first
  prediction, `add` per item, `end` after its last item), so a stopped or failed run keeps every
  complete unit and `--resume` does the rest. `RunSummary`: the counts, the failures, the exit
  status and the one printer of a run's closing lines.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vitpose.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, UserError
from vitpose.inference.smoothing import OfflineSmoothing

__all__ = ["Failures", "Item", "PredictOptions", "RunSummary", "offline_smoothing", "predict_chunk", "predict_units"]


@dataclass(frozen=True)
class PredictOptions:
    """What a prediction run does with its predictor, typed (`vitpose predict` builds it from its
    flags in `vitpose.cli.predict`; the library takes it, never the parsed command line).

    Outputs: `json` (results file, or a directory / `{shard}` pattern of a sharded run),
    `json_array` (one JSON list at the end), `resume`, `format` ("coco" | "labelstudio" | "cvat"),
    `mark_below` (`mark_by`: what it compares), `out` (drawings, or a drawn video), `keypoint_threshold` (drawing). Video: `track`,
    `smooth` (False; "live" or True: the One-Euro filter as frames come; "offline": each track smoothed
    whole, `vitpose.inference.smoothing`, with `smooth_gap` and `smooth_cutoff`), `det_every` /
    `det_lost_ratio` (the detector on every N-th frame), `batch_frames` (frames per call; default
    `batch_images`, 1 for a camera), `pipeline` ("auto" | "threads" | "sequential"),
    `tracker_options` / `smooth_options` (keyword arguments of `Tracker` / `KeypointSmoother`, or
    of `OfflineSmoothing` for "offline"). Work: `sources`, `boxes` (a detection results JSON), `batch_images`,
    `progress` (a progress bar), `quiet` (no summary). Scale-out: `shard` ("K/N"), `segment`
    (frames per unit of a video), `nproc_per_node`, `engine` ("local" | "ray"), `workers`,
    `ray_address`, `argv` (the command's own arguments, for a launcher that starts it again),
    `model` (the command's `ModelOptions`: `model`, `device`, ..., `kwargs()` for `open_predictor`,
    `open()`; for runs that open the model elsewhere: Ray's actors).
    """

    sources: tuple[str, ...] = ()
    model: object = None  # what opens the model: vitpose.cli.options.ModelOptions (model, device, ...)
    boxes: Path | str | None = None
    out: Path | str | None = None
    json: Path | str | None = None
    json_array: bool = False
    resume: bool = False
    format: str = "coco"
    mark_below: float = 0.3
    mark_by: str = "auto"  # what mark_below compares: p where the records carry it (annotation_draft.MARK_BY)
    rescore: str = "none"  # "calibrated": instance scores from p (vitpose.evaluation.rescoring)
    keypoint_threshold: float = 0.3
    track: bool = False
    smooth: bool | str | None = False  # None/False off, "live" (True) the One-Euro filter, "offline" whole tracks
    smooth_gap: int = 10
    smooth_cutoff: float = 6.0
    det_every: int = 1
    det_lost_ratio: float = 0.5
    batch_images: int = 8
    batch_frames: int | None = None
    pipeline: str = "auto"
    progress: bool = True
    quiet: bool = False
    tracker_options: dict | None = None
    smooth_options: dict | None = None
    shard: str | None = None
    segment: int | None = None
    nproc_per_node: int | None = None
    engine: str = "local"
    workers: int | None = None
    ray_address: str | None = None
    argv: tuple[str, ...] = ()


def offline_smoothing(options: PredictOptions) -> OfflineSmoothing:
    """The settings of `--smooth offline` (`smooth_options` may add `min_score` and `order`)."""
    return OfflineSmoothing(**{"cutoff": options.smooth_cutoff, "gap": options.smooth_gap,
                               **(options.smooth_options or {})})


class Failures:
    """The items that failed: `lines` (`label: Error: message`), `errors` ({label: exception})."""

    def __init__(self, prog: str = "vitpose predict", show_tracebacks: bool = True):
        self.prog = prog
        self.show_tracebacks = show_tracebacks
        self.lines: list[str] = []
        self.errors: dict = {}
        self.traceback_shown = False

    def __len__(self) -> int:
        return len(self.lines)

    def __bool__(self) -> bool:
        return bool(self.lines)

    def note(self, line: str) -> None:
        """A failure found before the predictor (an unreadable file): its line only."""
        self.lines.append(line)

    def add(self, label, error: BaseException) -> None:
        self.errors[label] = error
        self.lines.append(f"{label}: {type(error).__name__}: {error}")
        if isinstance(error, UserError) or self.traceback_shown or not self.show_tracebacks:
            return
        # not an input the code explains: maybe a bug. The item is counted and skipped like a bad
        # input, but its traceback is shown, once.
        self.traceback_shown = True
        print(f"{self.prog}: {label} failed with an error that is not about the input; its traceback (a bug in "
              f"vitpose, please report it unless it names the file):", file=sys.stderr)
        traceback.print_exception(type(error), error, error.__traceback__)

    def report(self, noun: str, limit: int = 20) -> None:
        """The closing list on stderr: how many `noun` failed, the first `limit` of them."""
        if not self.lines:
            return
        print(f"{self.prog}: {len(self.lines)} {noun}:", file=sys.stderr)
        for line in self.lines[:limit]:
            print(f"  {line}", file=sys.stderr)
        if len(self.lines) > limit:
            print(f"  ... and {len(self.lines) - limit} more", file=sys.stderr)


def _as_array(found):
    """`Detections` -> (M, 5) xyxy + score, what every predictor's call takes."""
    return found.as_array() if hasattr(found, "as_array") else found


def _boxes_of(images, labels, boxes, box_lookup):
    if box_lookup is not None:
        return [_as_array(box_lookup(label, (image.shape[1], image.shape[0]))) for image, label in zip(images, labels)]
    return None if boxes is None else [_as_array(b) for b in boxes]


def predict_chunk(predictor, images: Sequence, boxes: Sequence | None, labels: Sequence, failures: Failures, *,
                  box_lookup: Callable | None = None, channels: str = "bgr", box_format: str = "xyxy") -> list:
    """`predictor(images, boxes=...)` in one call; when it fails, item by item. -> [Poses | None].

    images: (H, W, 3) uint8 arrays; boxes: per image an (M, 4|5) array, `Detections` or None (the
    detector), or None for all; labels: what names each item in `failures` (a file name, `frame 12`,
    a request number); box_lookup(label, (w, h)) -> the item's boxes (instead of `boxes`), whose
    errors (a box far outside its image) stop the run: the file is the user's to fix."""
    images, labels = list(images), list(labels)
    if not images:
        return []
    # The boxes first, outside the per-item rule: a --boxes file whose box lies far outside its image
    # is the user's file to fix, and every path (local, segments, Ray) refuses it the same way.
    given = _boxes_of(images, labels, boxes, box_lookup)
    try:
        extra = {} if box_format == "xyxy" else {"box_format": box_format}
        return list(predictor(images, boxes=given, channels=channels, **extra))
    except Exception as e:  # noqa: BLE001 - any failure on one item's pixels or boxes costs that item
        if len(images) == 1:
            failures.add(labels[0], e)
            return [None]
    per_item = [None] * len(images) if given is None else given
    return [predict_chunk(predictor, [image], [b] if given is not None else None, [label], failures,
                          channels=channels, box_format=box_format)[0]
            for image, b, label in zip(images, per_item, labels)]


# ---------------------------------------------------------------------------------------------
# The runner of work units


@dataclass
class Item:
    """One image of a unit of work: `unit` (what the writer's `begin` takes: an image's name, a
    video segment's `WorkUnit`), `label` (how failures and `--boxes` name it: a file name, `frame 12`),
    the BGR pixels, a frame's `index`, and whether it is its unit's `last` item."""

    unit: object
    label: str
    image: object
    index: int | None = None
    last: bool = True


@dataclass
class RunSummary:
    """What a run did: `items` predicted (images, frames), `people`, `nobody` (items with nobody),
    `units` completed, `skipped` (units already in the results, `--resume`), the `failures`, and
    whether it was `interrupted` (by `signal_name`)."""

    noun: str = "images"
    items: int = 0
    people: int = 0
    nobody: int = 0
    failures: Failures = field(default_factory=Failures)
    units: int = 0
    skipped: int = 0
    interrupted: bool = False
    signal_name: str | None = None

    @property
    def exit_status(self) -> int:
        """0 done, 1 some items failed (each listed), 130 interrupted (`--resume` finishes it)."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_FAILED if self.failures else EXIT_OK

    def report(self, where=None, *, detail: str = "", json=None, written=(), out=None, lines=(),
               resumable: bool = True) -> int:
        """The closing lines of a run (the one printer of `vitpose predict`'s images, segments and
        Ray runs) -> its exit status. where: the results file as closed (a `.partial` beside `json`
        when the run did not complete); detail: after the people (" in 3 segments"); written: the
        outputs; lines: more lines for `out` (the stage timings, a precision's reason); resumable:
        False for a file written whole (`--format` other than coco), which --resume cannot continue."""
        out = out or sys.stdout
        print(f"{self.items} {self.noun}, {self.people} people{detail}"
              + (f", {self.nobody} {self.noun} with nobody found" if self.nobody else "")
              + (f" ({self.skipped} already in {json or where}, skipped)" if self.skipped else ""), file=out)
        for line in lines:
            print(line, file=out)
        if written:
            print("written: " + ", ".join(str(p) for p in written), file=out)
        if self.interrupted:
            print(f"vitpose predict: interrupted by {self.signal_name or 'the user'} after {self.items} {self.noun}"
                  f"{_resume_hint(where, json) if resumable else _rerun_hint(json)}", file=sys.stderr)
        self.failures.report(f"{self.noun} skipped (missing, unreadable or failed) or not written")
        return self.exit_status


def _resume_hint(where, json) -> str:
    if json is None:
        return ""
    if where is not None and Path(where) != Path(json):
        return (f"; {json} is unchanged, this run's results so far are in {where} (run again with --resume to "
                f"finish them)")
    return f"; run again with --resume to finish {json}"


def _rerun_hint(json) -> str:
    return "" if json is None else f"; {json} is written whole: run again to finish it"


def _chunks(items: Iterable[Item], batch: int, max_pixels: int | None, stop) -> Iterator[list[Item]]:
    """Consecutive items, `batch` at a time or fewer when their pixels reach `max_pixels`; none
    once `stop` is set (the items in hand are finished first)."""
    chunk, pixels = [], 0
    for item in items:
        chunk.append(item)
        pixels += item.image.shape[0] * item.image.shape[1]
        if len(chunk) >= batch or (max_pixels is not None and pixels >= max_pixels):
            yield chunk
            chunk, pixels = [], 0
            if stop is not None and stop.is_set():
                return
    if chunk and not (stop is not None and stop.is_set()):
        yield chunk


def predict_units(predictor, items: Iterable[Item], writer, finish: Callable, stop=None, *, batch: int = 8,
                  max_pixels: int | None = None, box_lookup: Callable | None = None,
                  summary: RunSummary | None = None) -> RunSummary:
    """The items of consecutive units through the predictor, a chunk at a time (`predict_chunk`:
    one bad item costs itself); for each prediction `finish(item, poses) -> (records, nonfinite)`
    (tracking, drawing, the records) and the records added to the item's unit in `writer` (None:
    no results file). A unit is ended after its last item when one of its items was predicted; a
    stop (`stop`, a threading.Event) ends the run after the chunk in hand, its open unit not ended
    (`--resume` does it again)."""
    summary = summary if summary is not None else RunSummary()
    timer = getattr(predictor, "timer", None)
    open_unit = None
    for chunk in _chunks(items, batch, max_pixels, stop):
        found = predict_chunk(predictor, [item.image for item in chunk], None, [item.label for item in chunk],
                              summary.failures, box_lookup=box_lookup)
        for item, poses in zip(chunk, found):
            if poses is not None:
                if open_unit is None or open_unit != item.unit:
                    open_unit = item.unit
                    if writer is not None:
                        writer.begin(item.unit)
                records, nonfinite = finish(item, poses)
                if writer is not None:
                    with timer.stage("write") if timer is not None else contextlib.nullcontext():
                        writer.add(records, nonfinite)
                people = len(poses)
                summary.items += 1
                summary.people += people
                summary.nobody += people == 0
            if item.last and open_unit is not None and open_unit == item.unit:
                if writer is not None:
                    writer.end()
                open_unit = None
                summary.units += 1
    summary.interrupted = summary.interrupted or (stop is not None and stop.is_set())
    return summary
