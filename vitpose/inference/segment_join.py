"""The track ids of a video cut into segments (`vitpose predict --segment`), joined across each
border as one tracker would have numbered them (`join_tracks`, used by `vitpose merge`). No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["JOIN_MIN_IOU", "join_tracks"]

# The tracker's default least IoU for a detection to continue a track (vitpose.inference.tracking):
# the join across a segment border uses the same rule.
JOIN_MIN_IOU = 0.3


def _iou(a: list[float], b: list[float]) -> float:
    """IoU of two [x, y, w, h] boxes."""
    ax2, ay2, bx2, by2 = a[0] + a[2], a[1] + a[3], b[0] + b[2], b[1] + b[3]
    w = max(0.0, min(ax2, bx2) - max(a[0], b[0]))
    h = max(0.0, min(ay2, by2) - max(a[1], b[1]))
    inter = w * h
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else 0.0


def join_tracks(segments: Sequence[list[dict]], starts: Sequence[int]) -> tuple[list[dict], int]:
    """The records of a video's consecutive segments with one set of track ids -> (records, joins).

    Each segment's tracker numbered its people from 0. The first segment keeps its ids. In each
    later one, the people of its first frame are matched to those of the previous segment's last
    frame (the frame before) by box IoU, best pair first, at least JOIN_MIN_IOU (the tracker's own
    threshold) and take their ids; every other track gets the next unused id, in the order the
    segment numbered them (its order of appearance), as one tracker would have.

    Where this differs from one unsplit run (documented in the README): a person not detected in
    either border frame but tracked within the tracker's `max_age` across it gets a new id; the
    tracker's motion model is not used at the border, so a fast person whose boxes overlap less
    than JOIN_MIN_IOU between the two frames gets a new id; two people who swap places exactly at
    a border may swap ids.
    """
    out, joins, next_id = [], 0, 0
    previous_last: list[dict] = []
    previous_start = None
    for records, start in zip(segments, starts):
        tracked = [r for r in records if r.get("track_id") is not None]
        mapping: dict[int, int] = {}
        if previous_start is not None and tracked:
            first = [r for r in tracked if r["frame"] == start]
            last = [r for r in previous_last if r["frame"] == start - 1]
            pairs = sorted(((_iou(a["bbox"], b["bbox"]), i, j) for i, a in enumerate(last) for j, b in enumerate(first)),
                           key=lambda p: (-p[0], p[1], p[2]))
            used_a, used_b = set(), set()
            for iou, i, j in pairs:
                if iou < JOIN_MIN_IOU:
                    break
                if i in used_a or j in used_b or first[j]["track_id"] in mapping:
                    continue
                used_a.add(i)
                used_b.add(j)
                mapping[first[j]["track_id"]] = last[i]["track_id"]
                joins += 1
        for local in sorted({r["track_id"] for r in tracked}):
            if local not in mapping:
                mapping[local] = next_id
                next_id += 1
            else:
                next_id = max(next_id, mapping[local] + 1)
        segment_out = []
        for r in records:
            r = dict(r)
            if r.get("track_id") is not None:
                r["track_id"] = mapping[r["track_id"]]
            segment_out.append(r)
        out += segment_out
        previous_last = [r for r in segment_out if r.get("track_id") is not None]
        previous_start = start
    return out, joins
