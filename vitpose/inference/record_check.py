"""The one check of a record that `vitpose predict --json` writes, for every reader of a run's records.

A record is one person in one image or video frame (COCO results style): `keypoints` [x, y, score]
* K (null where the model gave no finite value); `frame` (a video's) or `file_name` / `image_id`
(an image's); optionally `track_id`, `p` (K calibrated probabilities in [0, 1]), `visibility`,
`bbox` [x, y, w, h] and `score`. `vitpose convert` (`pose_table.read_run`) and `vitpose
triangulate` (`multiview.views.read_views`) both call `check_record`, so a hand-edited or truncated
file gets the same one line (file, line, field, what it must be) from both, before any array is
sized from it, instead of a traceback deep inside the writer.
"""

from __future__ import annotations

import math

from vitpose.errors import UserError

__all__ = ["MAX_FRAME", "RecordError", "check_record"]

# A video's tables and OpenPose's files span every frame from 0 to the last one with a person, so a
# frame index sizes the output: past this (about 4 days at 30 frames/s) it is a mistaken field, not a video.
MAX_FRAME = 10_000_000


class RecordError(UserError):
    """A record of a run's results that cannot be used (one line naming the file, the line and the field)."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(where: str, record: dict, field: str, length: int | None = None, unit: bool = False) -> None:
    """`field` is a list of numbers or nulls (of `length`; in [0, 1] where `unit`)."""
    value = record[field]
    if not isinstance(value, list) or not all(v is None or _is_number(v) for v in value):
        raise RecordError(f"{where}: '{field}' must be a list of numbers (null for a missing value)")
    if length is not None and len(value) != length:
        raise RecordError(f"{where}: '{field}' has {len(value)} values; it must have {length}")
    if unit and any(v is not None and not (0.0 <= v <= 1.0) for v in value):
        bad = next(v for v in value if v is not None and not (0.0 <= v <= 1.0))
        raise RecordError(f"{where}: '{field}' holds {bad}: a probability is in [0, 1] (null where missing)")


def check_record(record, where: str, video: bool | None = None) -> dict:
    """The record, checked; else RecordError naming `where` ("FILE: line N") and the field.

    video: True needs `frame` (a video's records), False an image's name; None takes either."""
    if not isinstance(record, dict):
        raise RecordError(f"{where}: not a JSON object (a record of vitpose predict --json)")
    if "keypoints" not in record or not any(k in record for k in ("frame", "file_name", "image_id")):
        raise RecordError(f"{where}: not a record of vitpose predict --json (it needs 'keypoints' and 'frame' or "
                          f"'file_name')")
    _numbers(where, record, "keypoints")
    flat = record["keypoints"]
    if not flat or len(flat) % 3:
        raise RecordError(f"{where}: 'keypoints' must be [x, y, score] * K, got {len(flat)} numbers")
    if "frame" in record or video:
        frame = record.get("frame", record.get("image_id"))
        if not _is_int(frame) or not 0 <= frame <= MAX_FRAME:
            raise RecordError(f"{where}: 'frame' must be a video's frame index, an integer from 0 to {MAX_FRAME:,}; "
                              f"got {frame!r}")
    else:
        if "file_name" in record and not isinstance(record["file_name"], str):
            raise RecordError(f"{where}: 'file_name' must be the image's file name (a string), "
                              f"got {record['file_name']!r}")
        if "image_id" in record and not (_is_int(record["image_id"]) or isinstance(record["image_id"], str)):
            raise RecordError(f"{where}: 'image_id' must be an integer or a string, got {record['image_id']!r}")
    if record.get("p") is not None:
        _numbers(where, record, "p", len(flat) // 3, unit=True)
    if record.get("track_id") is not None and not _is_int(record["track_id"]):
        raise RecordError(f"{where}: 'track_id' must be an integer (or null), got {record['track_id']!r}")
    if record.get("bbox") is not None:
        _numbers(where, record, "bbox", 4)
    score = record.get("score")
    if score is not None and not (_is_number(score) and not math.isinf(score)):
        raise RecordError(f"{where}: 'score' must be a number (or null), got {score!r}")
    return record
