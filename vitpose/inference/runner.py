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
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence

from vitpose.errors import UserError

__all__ = ["Failures", "predict_chunk"]


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


def _boxes_of(images, labels, boxes, box_lookup):
    if box_lookup is not None:
        return [box_lookup(label, (image.shape[1], image.shape[0])) for image, label in zip(images, labels)]
    return None if boxes is None else list(boxes)


def predict_chunk(predictor, images: Sequence, boxes: Sequence | None, labels: Sequence, failures: Failures, *,
                  box_lookup: Callable | None = None, channels: str = "bgr", box_format: str = "xyxy") -> list:
    """`predictor(images, boxes=...)` in one call; when it fails, item by item. -> [Poses | None].

    images: (H, W, 3) uint8 arrays; boxes: per image an (M, 4|5) array, `Detections` or None (the
    detector), or None for all; labels: what names each item in `failures` (a file name, `frame 12`,
    a request number); box_lookup(label, (w, h)) -> the item's boxes (instead of `boxes`), whose
    errors (a box far outside its image) cost that item like any other."""
    images, labels = list(images), list(labels)
    if not images:
        return []
    try:
        given = _boxes_of(images, labels, boxes, box_lookup)
        return list(predictor(images, boxes=given, box_format=box_format, channels=channels))
    except Exception as e:  # noqa: BLE001 - any failure on one item's pixels or boxes costs that item
        if len(images) == 1:
            failures.add(labels[0], e)
            return [None]
    per_item = [None] * len(images) if boxes is None else list(boxes)
    return [predict_chunk(predictor, [image], [b] if boxes is not None else None, [label], failures,
                          box_lookup=box_lookup, channels=channels, box_format=box_format)[0]
            for image, b, label in zip(images, per_item, labels)]
