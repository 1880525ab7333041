"""The records of a prediction run as one table of poses, what the 3D tools' file formats are written from.

`vitpose predict --json` writes COCO keypoint results, one record per person (`image_id` and
`file_name` for images, `frame` for videos; `keypoints` [x, y, s] * K with null for a value that was
not finite; `track_id` with --track; optionally `p`, K calibrated probabilities, and `visibility`).
`pose_table(records)` lays them out as arrays: one row per image or frame, one column per
individual, K keypoints each; what is missing is NaN. `read_run(path)` reads the JSON Lines (or JSON
list) a run wrote, and refuses a line that is not a record in one line naming it.

Individuals: with track ids, one per track, in id order (a track absent from a frame is NaN there);
without them, the n-th person of each image or frame (no identity across frames). `single` says
that no image or frame holds more than one person: the single-animal layout of DeepLabCut, which
aniposelib reads. No torch, no pandas: numpy only (`vitpose convert` imports this).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitpose.inference.record_check import RecordError, check_record

__all__ = ["PoseTable", "RunFileError", "keypoint_confidence", "pose_table", "read_run"]


# A results file that cannot be read as a run's records (one line naming the file and line): the one
# error of a bad record, whichever reader meets it.
RunFileError = RecordError


@dataclass
class PoseTable:
    """A run's poses as arrays.

    labels: one per row: frame indices (int, every frame from 0 to the last with a person) for a
    video, the records' file names for images. video: whether the labels are frames.
    individuals: the column names ("track3", or "person0" without track ids); track_ids: the column's
    track id, or None. xy: (T, I, K, 2) image pixels; confidence: (T, I, K) the calibrated `p` where
    the record has it, else the keypoint score; both NaN where missing. present: (T, I) a record
    there. boxes: (T, I, 4) [x, y, w, h]; scores: (T, I) instance scores (NaN where absent).
    """

    labels: list
    video: bool
    individuals: list[str]
    track_ids: list[int | None]
    xy: np.ndarray
    confidence: np.ndarray
    present: np.ndarray
    boxes: np.ndarray
    scores: np.ndarray

    @property
    def num_keypoints(self) -> int:
        return self.xy.shape[2]

    @property
    def single(self) -> bool:
        """No image or frame holds more than one person (DeepLabCut's single-animal layout)."""
        return bool((self.present.sum(axis=1) <= 1).all())

    def one_column(self) -> PoseTable:
        """The table with each row's one person in a single column (only when `single`)."""
        if not self.single:
            raise ValueError("one_column: some image or frame holds more than one person")
        if not self.individuals:
            return self
        which = self.present.argmax(axis=1)
        rows = np.arange(len(self.labels))
        return PoseTable(self.labels, self.video, ["individual0"], [None], self.xy[rows, which][:, None],
                         self.confidence[rows, which][:, None], self.present[rows, which][:, None],
                         self.boxes[rows, which][:, None], self.scores[rows, which][:, None])


def _number(value) -> float:
    return math.nan if value is None else float(value)


def keypoint_confidence(record: dict) -> list[float]:
    """A record's per-keypoint confidence: its calibrated `p` where it has one, else the keypoint
    scores (NaN where null)."""
    flat = record["keypoints"]
    scores = [_number(v) for v in flat[2::3]]
    p = record.get("p")
    if p is None:
        return scores
    return [_number(v) for v in p]


def _label_of(record: dict, video: bool):
    return int(record["frame"]) if video else record.get("file_name", record.get("image_id"))


def _columns(records: list[dict], labels_of: list) -> tuple[list[str], list[int | None], list[int]]:
    """Each record's column, and the columns' names and track ids."""
    if records and all(r.get("track_id") is not None for r in records):
        ids = sorted({int(r["track_id"]) for r in records})
        where = {t: i for i, t in enumerate(ids)}
        return [f"track{t}" for t in ids], list(ids), [where[int(r["track_id"])] for r in records]
    seen: dict = {}
    column = []
    for label in labels_of:
        column.append(seen.get(label, 0))
        seen[label] = column[-1] + 1
    width = max(seen.values(), default=0)
    return [f"person{i}" for i in range(width)], [None] * width, column


def pose_table(records: list[dict], num_keypoints: int | None = None) -> PoseTable:
    """The records of one run (one video, or one folder of images) -> a `PoseTable`.

    num_keypoints: K when there may be no records (an empty run); else read from the records.
    Raises RunFileError for records of a video and of images mixed, or of unequal K."""
    video = bool(records) and "frame" in records[0]
    if any(("frame" in r) != video for r in records):
        raise RunFileError("the records mix video frames ('frame') and images ('file_name'): convert one run at a time")
    K = len(records[0]["keypoints"]) // 3 if records else int(num_keypoints or 0)
    if any(len(r["keypoints"]) != 3 * K for r in records):
        raise RunFileError(f"the records have different numbers of keypoints (the first has {K}): one model's run only")
    labels_of = [_label_of(r, video) for r in records]
    if video:
        labels = list(range(max(labels_of) + 1)) if records else []
    else:
        labels = list(dict.fromkeys(labels_of))
    row_of = {label: i for i, label in enumerate(labels)}
    individuals, track_ids, column = _columns(records, labels_of)
    T, N = len(labels), len(individuals)
    xy = np.full((T, N, K, 2), np.nan)
    confidence = np.full((T, N, K), np.nan)
    present = np.zeros((T, N), bool)
    boxes = np.full((T, N, 4), np.nan)
    scores = np.full((T, N), np.nan)
    for record, label, c in zip(records, labels_of, column):
        t = row_of[label]
        if present[t, c]:
            raise RunFileError(f"two records of {individuals[c]} in {'frame' if video else 'image'} {label!r}: "
                               f"one run's records only")
        flat = np.array([_number(v) for v in record["keypoints"]]).reshape(K, 3)
        xy[t, c] = flat[:, :2]
        confidence[t, c] = keypoint_confidence(record)
        present[t, c] = True
        boxes[t, c] = [_number(v) for v in record.get("bbox") or [None] * 4]
        scores[t, c] = _number(record.get("score"))
    return PoseTable(labels, video, individuals, track_ids, xy, confidence, present, boxes, scores)


def _check_records(records: list, where) -> list[dict]:
    """Each record checked (`record_check.check_record`), and all of one run: every record a video
    frame's or every one an image's, with the same number of keypoints. where(i): the i-th's place."""
    for i, record in enumerate(records):
        check_record(record, where(i))
        first = records[0]
        if ("frame" in record) != ("frame" in first) or len(record["keypoints"]) != len(first["keypoints"]):
            mixed_kinds = ("frame" in record) != ("frame" in first)
            what = ("video frames ('frame') and images ('file_name')" if mixed_kinds else
                    f"{len(record['keypoints']) // 3} keypoints where the first has {len(first['keypoints']) // 3}")
            raise RunFileError(f"{where(i)}: the records mix {what}: convert one model's run at a time")
    return records


def read_run(path) -> list[dict]:
    """The records of a results file of `vitpose predict --json`: JSON Lines, or one JSON list.

    Raises RunFileError (one line naming the file and the line) for a file that cannot be read, a
    line that is not JSON, or a record without keypoints."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RunFileError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise RunFileError(f"{path}: not a JSON list of records (line {e.lineno}: {e.msg})") from None
        if not isinstance(records, list):
            raise RunFileError(f"{path}: not a JSON list of records")
        return _check_records(records, lambda i: f"{path}: record {i + 1}")
    records, numbers = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise RunFileError(f"{path}: line {number} is not JSON ({e.msg}); a file of vitpose predict --json "
                               f"(JSON Lines) is one record a line") from None
        records.append(record)
        numbers.append(number)
    return _check_records(records, lambda i: f"{path}: line {numbers[i]}")
