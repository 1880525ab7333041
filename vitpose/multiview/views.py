"""The 2D poses of each camera: the JSON Lines `vitpose predict VIDEO --json` writes, read per frame.

A record is one person in one frame (COCO results style): `frame` (or `image_id`), `keypoints`
[x, y, score] * K (null where the model gave no finite value), optionally `track_id` and `p`
(K calibrated probabilities). A keypoint's weight in the triangulation is its `p` when the record
has one, else its score: the confidence the 2D model gave it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitpose.errors import UserError


class ViewsError(UserError):
    """A camera's JSON Lines that cannot be read (one line naming the file and line)."""


@dataclass
class Detection:
    """One person seen by one camera in one frame: pixels (K, 2) (NaN: missing), weights (K,)."""

    pixels: np.ndarray
    weights: np.ndarray
    track_id: int | None = None


def read_views(path) -> dict[int, list[Detection]]:
    """A camera's records -> {frame: [Detection, ...]}; every record must have the same K."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ViewsError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    frames: dict[int, list[Detection]] = {}
    count = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        frame, detection = _record(path, number, line)
        if count is not None and len(detection.weights) != count:
            raise ViewsError(f"{path}:{number}: {len(detection.weights)} keypoints, the lines before have {count}")
        count = len(detection.weights)
        frames.setdefault(frame, []).append(detection)
    if not frames:
        raise ViewsError(f"{path}: no records (vitpose predict VIDEO --json FILE writes them)")
    return frames


def _record(path: Path, number: int, line: str) -> tuple[int, Detection]:
    where = f"{path}:{number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ViewsError(f"{where}: not a JSON line ({e.msg}); expected vitpose predict's JSON Lines") from None
    if not isinstance(record, dict):
        raise ViewsError(f"{where}: expected a JSON object per line (a record of vitpose predict --json)")
    frame = record.get("frame", record.get("image_id"))
    if not isinstance(frame, int) or isinstance(frame, bool):
        raise ViewsError(f"{where}: no integer 'frame' (the records of vitpose predict VIDEO --json have one)")
    values = _numbers(where, record.get("keypoints"), "keypoints")
    if len(values) == 0 or len(values) % 3:
        raise ViewsError(f"{where}: 'keypoints' must be [x, y, score] * K, got {len(values)} numbers")
    triples = values.reshape(-1, 3)
    weights = triples[:, 2]
    if record.get("p") is not None:
        weights = _numbers(where, record["p"], "p")
        if len(weights) != len(triples):
            raise ViewsError(f"{where}: 'p' has {len(weights)} values for {len(triples)} keypoints")
    weights = np.where(np.isfinite(weights), np.clip(weights, 0.0, None), 0.0)
    track = record.get("track_id")
    if track is not None and (not isinstance(track, int) or isinstance(track, bool)):
        raise ViewsError(f"{where}: 'track_id' must be an integer")
    return frame, Detection(triples[:, :2].copy(), weights, track)


def _numbers(where: str, value, field: str) -> np.ndarray:
    if not isinstance(value, list) or not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
                                              for v in value):
        raise ViewsError(f"{where}: '{field}' must be a list of numbers (null for a missing value)")
    return np.array([np.nan if v is None else v for v in value], np.float64)
