"""Which detections in the cameras are the same person, frame by frame, and who is who over time.

- `match="ids"`: the track ids are the same person in every camera (one person filmed, or ids
  joined by hand); a detection without a track id is refused.
- `match="auto"`: in each frame, detections of different cameras are grouped by their epipolar
  distance (the median over the keypoints both see of the symmetric distance, in pixels, between
  a keypoint and the epipolar line of its twin), greedily from the closest pair, a group holding at
  most one detection per camera and every pair in it closer than `max_epipolar`. Groups seen by
  one camera only are left out (a point needs two views). Groups then join people over time: the
  person whose (camera, track id) pairs the group shares most, else the one whose last 3D centre
  (the group's keypoints triangulated) is nearest, within the person's size; else a new person.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vitpose.multiview.triangulation import dlt
from vitpose.multiview.views import ViewsError


@dataclass
class Person:
    """One person's observations: frames (T,), normalised points (T, C, K, 2), pixels (T, C, K, 2),
    weights (T, C, K)."""

    frames: list = field(default_factory=list)
    normalized: list = field(default_factory=list)
    pixels: list = field(default_factory=list)
    weights: list = field(default_factory=list)
    keys: set = field(default_factory=set)
    centre: np.ndarray | None = None
    size: float = 0.0

    def arrays(self):
        return (np.array(self.frames), np.stack(self.normalized), np.stack(self.pixels), np.stack(self.weights))


def skew(v: np.ndarray) -> np.ndarray:
    return np.array([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]])


def essential(extrinsics: np.ndarray, a: int, b: int) -> np.ndarray:
    """E with x_b^T E x_a = 0 for normalised points of cameras a and b."""
    ra, ta, rb, tb = extrinsics[a, :, :3], extrinsics[a, :, 3], extrinsics[b, :, :3], extrinsics[b, :, 3]
    r = rb @ ra.T
    return skew(tb - r @ ta) @ r


def epipolar_distance(xa, xb, wa, wb, e: np.ndarray, fa: float, fb: float) -> float:
    """Median symmetric epipolar distance (pixels) over the keypoints both detections see."""
    ok = (wa > 0) & (wb > 0) & np.isfinite(xa).all(1) & np.isfinite(xb).all(1)
    if ok.sum() < 3:
        return np.inf
    ha = np.concatenate([xa[ok], np.ones((ok.sum(), 1))], 1)
    hb = np.concatenate([xb[ok], np.ones((ok.sum(), 1))], 1)
    lines_b, lines_a = ha @ e.T, hb @ e  # lines in b of a's points, in a of b's points
    algebraic = np.abs((hb * lines_b).sum(1))
    distance = 0.5 * (fb * algebraic / np.linalg.norm(lines_b[:, :2], axis=1)
                      + fa * algebraic / np.linalg.norm(lines_a[:, :2], axis=1))
    return float(np.median(distance))


def group_frame(detections: list[list], extrinsics: np.ndarray, focal: np.ndarray, max_epipolar: float) -> list[dict]:
    """One frame's detections per camera [(normalised (K, 2), Detection), ...] -> groups {camera: index}."""
    nodes = [(c, i) for c, found in enumerate(detections) for i in range(len(found))]
    costs = {}
    for p, (ca, ia) in enumerate(nodes):
        for cb, ib in nodes[p + 1:]:
            if cb != ca:
                xa, da = detections[ca][ia]
                xb, db = detections[cb][ib]
                costs[(ca, ia), (cb, ib)] = costs[(cb, ib), (ca, ia)] = epipolar_distance(
                    xa, xb, da.weights, db.weights, essential(extrinsics, ca, cb), focal[ca].mean(), focal[cb].mean())
    groups = {node: {node[0]: node[1]} for node in nodes}
    for (a, b), cost in sorted(costs.items(), key=lambda item: item[1]):
        if cost > max_epipolar or groups[a] is groups[b] or set(groups[a]) & set(groups[b]):
            continue
        if all(costs[(x, y), (u, v)] <= max_epipolar for x, y in groups[a].items() for u, v in groups[b].items()):
            merged = {**groups[a], **groups[b]}
            for node in merged.items():
                groups[node] = merged
    unique = {id(g): g for g in groups.values()}
    return [g for g in unique.values() if len(g) >= 2]


def associate(views: list[dict], cameras: list, match: str = "auto", max_epipolar: float = 40.0) -> list[Person]:
    """Every camera's {frame: [Detection]} -> the people seen by two cameras or more."""
    extrinsics = np.stack([c.extrinsics() for c in cameras])
    focal = np.stack([c.focal for c in cameras])
    keypoints = len(next(iter(views[0].values()))[0].weights)
    people: list[Person] = []
    by_id: dict = {}
    for frame in sorted(set().union(*views)):
        found = [[(camera.normalized(d.pixels), d) for d in view.get(frame, [])] for camera, view in zip(cameras, views)]
        if match == "ids":
            groups = _groups_by_id(found, frame)
        else:
            groups = group_frame(found, extrinsics, focal, max_epipolar)
        busy: list[Person] = []
        for group in groups:
            normalized = np.full((len(cameras), keypoints, 2), np.nan)
            pixels, weights = normalized.copy(), np.zeros((len(cameras), keypoints))
            for c, i in group.items():
                normalized[c], detection = found[c][i]
                pixels[c], weights[c] = detection.pixels, detection.weights
            keys = {(c, found[c][i][1].track_id) for c, i in group.items() if found[c][i][1].track_id is not None}
            person = (by_id.setdefault(min(t for _, t in keys), Person()) if match == "ids"
                      else _who(people, keys, normalized, weights, extrinsics, busy))
            busy.append(person)
            if match == "ids" and person not in people:
                people.append(person)
            person.frames.append(frame)
            person.normalized.append(normalized)
            person.pixels.append(pixels)
            person.weights.append(weights)
            person.keys |= keys
    return people


def _groups_by_id(found: list[list], frame: int) -> list[dict]:
    groups: dict = {}
    for c, detections in enumerate(found):
        for i, (_, detection) in enumerate(detections):
            if detection.track_id is None:
                raise ViewsError(f"--match ids: camera {c + 1}, frame {frame}: a record without 'track_id' "
                                 f"(run vitpose predict with --track, or use --match auto)")
            groups.setdefault(detection.track_id, {})[c] = i
    return [g for g in groups.values() if len(g) >= 2]


def _who(people: list[Person], keys: set, normalized, weights, extrinsics, busy: list) -> Person:
    """The person a frame's group continues (shared track ids, else the nearest centre), or a new one."""
    points = dlt(normalized.transpose(1, 0, 2), weights.T, extrinsics)
    points = points[np.isfinite(points).all(1)]
    centre = points.mean(0) if len(points) else None
    size = float(np.linalg.norm(points.max(0) - points.min(0))) if len(points) else 0.0
    free = [p for p in people if all(p is not b for b in busy)]
    shared = [(len(p.keys & keys), p) for p in free if p.keys & keys]
    person = max(shared, key=lambda item: item[0])[1] if shared else None
    if person is None and centre is not None:
        near = [(np.linalg.norm(p.centre - centre), p) for p in free if p.centre is not None]
        near = [(d, p) for d, p in near if d < max(p.size, size)]
        person = min(near, key=lambda item: item[0])[1] if near else None
    if person is None:
        person = Person()
        people.append(person)
    if centre is not None:
        person.centre, person.size = centre, max(person.size, size)
    return person
