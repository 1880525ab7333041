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
from vitpose.inference.record_check import check_record


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
            raise ViewsError(f"{path}:{number}: {len(detection.weights)} keypoints where the first has {count}: "
                             f"one model's records")
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
    check_record(record, where, video=True)
    frame = record.get("frame", record.get("image_id"))
    triples = np.array([np.nan if v is None else v for v in record["keypoints"]], np.float64).reshape(-1, 3)
    weights = triples[:, 2]
    if record.get("p") is not None:
        weights = np.array([np.nan if v is None else v for v in record["p"]], np.float64)
    weights = np.where(np.isfinite(weights), np.clip(weights, 0.0, None), 0.0)
    track = record.get("track_id")
    return frame, Detection(triples[:, :2].copy(), weights, track)

