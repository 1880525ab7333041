"""Identities across video frames (`--track`) and less keypoint jitter (`--smooth`).

`Tracker` gives every person a `track_id` that stays the same from frame to frame: each frame's
detections are matched greedily to the tracks alive, best similarity first (box IoU, or the
keypoints' OKS), after moving each track by its own velocity to the current frame. A track that
finds no match survives `max_age` frames, so a person missed by the detector for a frame or two,
or a corrupt frame of the video, keeps the id; after a longer gap the person gets a new one.

`OneEuroFilter` is the One-Euro filter of Casiez, Roussel and Vogel, "1 euro filter: a simple
speed-based low-pass filter for noisy input in interactive systems" (CHI 2012): an exponential
smoother whose cutoff frequency rises with the signal's speed, so that a still keypoint stops
shaking while a moving one lags little. `KeypointSmoother` keeps one filter per track.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vitpose.coco_meta import SIGMAS

__all__ = ["DetectionSchedule", "KeypointSmoother", "OneEuroFilter", "Tracker", "box_iou", "keypoint_motion",
           "keypoint_oks", "move_box"]


# ---------------------------------------------------------------------------------------------
# Similarities


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection over union of boxes a (T, 4) and b (D, 4), xyxy pixels -> (T, D) float64."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=-1)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=-1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=-1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def keypoint_oks(a: np.ndarray, b: np.ndarray, areas: np.ndarray, visible: np.ndarray | None = None,
                 sigmas=SIGMAS) -> np.ndarray:
    """COCO's object keypoint similarity of keypoints a (T, K, 2) against b (D, K, 2) -> (T, D).

    OKS = mean over the counted keypoints of exp(-d^2 / (2 * s * (2 sigma_k)^2)), s = the area
    (pixels^2) of b's instance (`areas` (D,)), as COCOeval scores a detection against a person.
    visible (T, D, K) bool says which keypoints count (default: all); a pair with none scores 0.
    """
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    variances = (2 * np.asarray(sigmas, np.float64)) ** 2
    if variances.shape[0] != a.shape[1]:
        raise ValueError(f"{variances.shape[0]} OKS sigmas for {a.shape[1]} keypoints")
    d2 = ((a[:, None] - b[None]) ** 2).sum(-1)  # (T, D, K)
    scale = np.maximum(np.asarray(areas, np.float64), np.spacing(1))[None, :, None]
    similarity = np.exp(-d2 / (2 * scale * variances))
    if visible is None:
        visible = np.ones(d2.shape, bool)
    counted = visible.sum(-1)
    total = np.where(visible, similarity, 0.0).sum(-1)
    return np.divide(total, counted, out=np.zeros_like(total), where=counted > 0)


# ---------------------------------------------------------------------------------------------
# Tracking


@dataclass
class _Track:
    track_id: int
    box: np.ndarray  # (4,) xyxy at `last_frame`
    velocity: np.ndarray  # (4,) box change per frame
    keypoints: np.ndarray | None  # (K, 2) at `last_frame`
    keypoint_scores: np.ndarray | None  # (K,)
    last_frame: int

    def predicted(self, frame: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Box and keypoints moved on by the velocity to `frame` (constant-velocity model)."""
        step = self.velocity * (frame - self.last_frame)
        box = self.box + step
        if self.keypoints is None:
            return box, None
        centre_step = (step[:2] + step[2:]) / 2
        return box, self.keypoints + centre_step


class Tracker:
    """Greedy frame-to-frame association with stable ids through short gaps.

    Args:
        max_age: frames a track may go unmatched and still take a detection again (default 5,
            i.e. 1/6 s at 30 frames/s). A person missed for more frames gets a new id.
        min_similarity: the least IoU (or OKS) for a detection to continue a track (default 0.3);
            below it the detection starts a new track.
        metric: "iou" (boxes; default) or "oks" (keypoints, COCO sigmas, the detection's box
            area as the scale; needs keypoints in `update`). OKS tells apart two people whose
            boxes overlap but whose bodies do not.
        velocity_weight: how much of each new displacement goes into a track's velocity
            (exponential average per frame; 1 = last displacement only, 0 = no motion model).
        keypoint_thr: with metric "oks", keypoints scoring at most this in either frame are not
            counted.
        sigmas: per-keypoint OKS sigmas (default COCO-17's).

    `update(boxes, keypoints=None, keypoint_scores=None, frame=None, follows=None) -> ids (D,) int64`:
    call once per frame in order; a frame with nobody (D = 0, e.g. boxes (0, 4), keypoints (0, K, 2)
    or []) returns no ids and ages the tracks. `frame` is the frame index (default: the previous one
    + 1); frames that were skipped (corrupt or not decoded) count towards a track's age. Ids start at
    0 and are never reused. `follows` (D,) says, where known, that detection d is the same person
    as detection follows[d] of the previous `update` (-1: not known), as `--det-every` knows of the
    people it carried on their poses: those continue that track whatever the similarity. The others
    are associated: every (track, detection) pair is scored against the track moved by its velocity
    to this frame; pairs are taken from the best down (ties: lower track index, then lower
    detection index) while both are free and the score is at least `min_similarity`.
    """

    def __init__(self, max_age: int = 5, min_similarity: float = 0.3, metric: str = "iou",
                 velocity_weight: float = 0.5, keypoint_thr: float = 0.3, sigmas=SIGMAS):
        if metric not in ("iou", "oks"):
            raise ValueError(f"metric must be 'iou' or 'oks', got {metric!r}")
        if max_age < 0:
            raise ValueError(f"max_age must be >= 0 frames, got {max_age}")
        if not 0.0 <= velocity_weight <= 1.0:
            raise ValueError(f"velocity_weight must be in [0, 1], got {velocity_weight}")
        self.max_age = int(max_age)
        self.min_similarity = float(min_similarity)
        self.metric = metric
        self.velocity_weight = float(velocity_weight)
        self.keypoint_thr = float(keypoint_thr)
        self.sigmas = tuple(sigmas)
        self.tracks: list[_Track] = []
        self.next_id = 0
        self.frame = -1
        self.last_ids = np.zeros(0, np.int64)  # the ids the previous update returned

    def update(self, boxes, keypoints=None, keypoint_scores=None, frame: int | None = None,
               follows=None) -> np.ndarray:
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        frame = self.frame + 1 if frame is None else int(frame)
        if frame <= self.frame:
            raise ValueError(f"frames must come in increasing order: got {frame} after {self.frame}")
        if self.metric == "oks" and keypoints is None:
            raise ValueError("Tracker(metric='oks') needs the keypoints of every detection")
        if keypoints is not None:
            keypoints = np.asarray(keypoints, np.float64)
            # a frame with nobody: (0, K, 2) or an empty list; reshape(0, -1, 2) cannot infer K
            num_keypoints = keypoints.size // (2 * len(boxes)) if len(boxes) else 0
            keypoints = keypoints.reshape(len(boxes), num_keypoints, 2)
            if keypoint_scores is None:
                keypoint_scores = np.ones(keypoints.shape[:2])
            keypoint_scores = np.asarray(keypoint_scores, np.float64).reshape(keypoints.shape[:2])
        self.frame = frame
        # A track unmatched for more than max_age frames in between ends here.
        self.tracks = [t for t in self.tracks if frame - t.last_frame - 1 <= self.max_age]

        similarity = self._similarity(boxes, keypoints, keypoint_scores, frame)
        ids = np.full(len(boxes), -1, np.int64)
        used_tracks = set()
        for d, t in self._followed(follows, len(boxes)):
            used_tracks.add(t)
            ids[d] = self.tracks[t].track_id
            self._continue(self.tracks[t], boxes[d], keypoints, keypoint_scores, d, frame)
        order = np.argsort(-similarity, axis=None, kind="stable")
        for flat in order:
            t, d = divmod(int(flat), len(boxes))
            if similarity[t, d] < self.min_similarity:
                break
            if t in used_tracks or ids[d] >= 0:
                continue
            used_tracks.add(t)
            ids[d] = self.tracks[t].track_id
            self._continue(self.tracks[t], boxes[d], keypoints, keypoint_scores, d, frame)
        for d in np.nonzero(ids < 0)[0]:
            ids[d] = self._start(boxes[d], keypoints, keypoint_scores, d, frame)
        self.last_ids = ids.copy()
        return ids

    def replay(self, boxes, track_ids, keypoints=None, keypoint_scores=None, frame: int | None = None) -> None:
        """Feed one frame of a run done before, with the ids that run gave (a resumed `--track` run
        replays the frames already in its JSON): each id's track continues (or starts) exactly as
        `update` left it then, so the people of the next frames keep their ids, and new people get
        ids above every one used. Arguments as in `update`, plus track_ids (D,)."""
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        track_ids = np.asarray(track_ids, np.int64).reshape(-1)
        if len(track_ids) != len(boxes):
            raise ValueError(f"{len(track_ids)} track ids for {len(boxes)} boxes")
        frame = self.frame + 1 if frame is None else int(frame)
        if frame <= self.frame:
            raise ValueError(f"frames must come in increasing order: got {frame} after {self.frame}")
        if keypoints is not None:
            num_keypoints = np.asarray(keypoints).size // (2 * len(boxes)) if len(boxes) else 0
            keypoints = np.asarray(keypoints, np.float64).reshape(len(boxes), num_keypoints, 2)
            if keypoint_scores is None:
                keypoint_scores = np.ones(keypoints.shape[:2])
            keypoint_scores = np.asarray(keypoint_scores, np.float64).reshape(keypoints.shape[:2])
        self.frame = frame
        self.tracks = [t for t in self.tracks if frame - t.last_frame - 1 <= self.max_age]
        by_id = {t.track_id: t for t in self.tracks}
        for d, track_id in enumerate(track_ids.tolist()):
            if track_id in by_id:
                self._continue(by_id[track_id], boxes[d], keypoints, keypoint_scores, d, frame)
            else:
                self.tracks.append(_Track(int(track_id), boxes[d].copy(), np.zeros(4),
                                          None if keypoints is None else keypoints[d].copy(),
                                          None if keypoints is None else keypoint_scores[d].copy(), frame))
            self.next_id = max(self.next_id, int(track_id) + 1)
        self.last_ids = track_ids.copy()

    def _followed(self, follows, count: int) -> list[tuple[int, int]]:
        """(detection, track index) pairs that `follows` names: tracks of the previous update that are alive."""
        if follows is None:
            return []
        follows = np.asarray(follows, np.int64).reshape(-1)
        if len(follows) != count:
            raise ValueError(f"follows names {len(follows)} detections, the frame has {count}")
        index_of = {track.track_id: t for t, track in enumerate(self.tracks)}
        pairs, taken = [], set()
        for d, previous in enumerate(follows.tolist()):
            if not 0 <= previous < len(self.last_ids):
                continue
            t = index_of.get(int(self.last_ids[previous]))
            if t is not None and t not in taken:
                taken.add(t)
                pairs.append((d, t))
        return pairs

    def _similarity(self, boxes, keypoints, keypoint_scores, frame) -> np.ndarray:
        if not self.tracks or not len(boxes):
            return np.zeros((len(self.tracks), len(boxes)))
        predicted = [t.predicted(frame) for t in self.tracks]
        if self.metric == "iou":
            return box_iou(np.stack([box for box, _ in predicted]), boxes)
        if any(kpts is None for _, kpts in predicted):
            raise ValueError("Tracker(metric='oks'): a track was started without keypoints")
        track_kpts = np.stack([kpts for _, kpts in predicted])
        track_scores = np.stack([t.keypoint_scores for t in self.tracks])
        visible = (track_scores[:, None, :] > self.keypoint_thr) & (keypoint_scores[None] > self.keypoint_thr)
        areas = np.prod(np.clip(boxes[:, 2:] - boxes[:, :2], 0, None), axis=-1)
        return keypoint_oks(track_kpts, keypoints, areas, visible, self.sigmas)

    def _continue(self, track: _Track, box, keypoints, keypoint_scores, d, frame) -> None:
        displacement = (box - track.box) / (frame - track.last_frame)
        w = self.velocity_weight
        track.velocity = w * displacement + (1 - w) * track.velocity
        track.box = box.copy()
        if keypoints is not None:
            track.keypoints = keypoints[d].copy()
            track.keypoint_scores = keypoint_scores[d].copy()
        track.last_frame = frame

    def _start(self, box, keypoints, keypoint_scores, d, frame) -> int:
        track = _Track(self.next_id, box.copy(), np.zeros(4),
                       None if keypoints is None else keypoints[d].copy(),
                       None if keypoints is None else keypoint_scores[d].copy(), frame)
        self.tracks.append(track)
        self.next_id += 1
        return track.track_id


# ---------------------------------------------------------------------------------------------
# Smoothing


def smoothing_factor(cutoff, dt: float):
    """Exponential smoothing factor of a first-order low-pass at `cutoff` Hz sampled every dt s:
    alpha = 1 / (1 + tau / dt) with tau = 1 / (2 pi cutoff) (Casiez et al. 2012, eq. 4)."""
    tau = 1.0 / (2.0 * math.pi * np.asarray(cutoff, np.float64))
    return 1.0 / (1.0 + tau / dt)


class OneEuroFilter:
    """The One-Euro filter on arrays of any fixed shape, each element filtered on its own.

    Args:
        min_cutoff: cutoff frequency in Hz when the signal is still (default 1.0). Lower = less
            jitter at rest, more lag.
        beta: speed coefficient in s per signal unit, i.e. s/pixel for keypoints (default 0.05):
            the cutoff is min_cutoff + beta * |speed|, speed in units (pixels) per second, so a
            keypoint moving at 100 px/s is filtered at 1 + 5 = 6 Hz. Higher = less lag in motion.
        d_cutoff: cutoff frequency in Hz of the low-pass on the speed itself (default 1.0).

    `filter(x, dt)`: x the new sample, dt the seconds since the previous sample (1/fps, more across
    skipped frames). The first sample passes unchanged. Then, with x_prev the previous output:
        dx = (x - x_prev) / dt;  dx_hat = dx_prev_hat + alpha(d_cutoff, dt) * (dx - dx_prev_hat)
        cutoff = min_cutoff + beta * |dx_hat|;  x_hat = x_prev + alpha(cutoff, dt) * (x - x_prev)
    with dx_hat starting at 0. Written as increments, a constant signal is returned exactly.
    """

    def __init__(self, min_cutoff: float = 1.0, beta: float = 0.05, d_cutoff: float = 1.0):
        if min_cutoff <= 0 or d_cutoff <= 0 or beta < 0:
            raise ValueError(f"One-Euro needs min_cutoff > 0, d_cutoff > 0, beta >= 0; got "
                             f"min_cutoff={min_cutoff}, beta={beta}, d_cutoff={d_cutoff}")
        self.min_cutoff = float(min_cutoff)
        self.beta = float(beta)
        self.d_cutoff = float(d_cutoff)
        self.x_prev: np.ndarray | None = None
        self.dx_prev: np.ndarray | None = None

    def filter(self, x, dt: float) -> np.ndarray:
        x = np.asarray(x, np.float64)
        if self.x_prev is None:
            self.x_prev = x.copy()
            self.dx_prev = np.zeros_like(x)
            return x.copy()
        if not dt > 0:
            raise ValueError(f"One-Euro needs a positive time step, got dt={dt}")
        if x.shape != self.x_prev.shape:
            raise ValueError(f"One-Euro filter of shape {self.x_prev.shape} got a sample of shape {x.shape}")
        dx = (x - self.x_prev) / dt
        dx_hat = self.dx_prev + smoothing_factor(self.d_cutoff, dt) * (dx - self.dx_prev)
        cutoff = self.min_cutoff + self.beta * np.abs(dx_hat)
        x_hat = self.x_prev + smoothing_factor(cutoff, dt) * (x - self.x_prev)
        self.x_prev, self.dx_prev = x_hat, dx_hat
        return x_hat.copy()

    __call__ = filter


class KeypointSmoother:
    """One `OneEuroFilter` per track on its keypoints (K, 2) in image pixels.

    Args:
        fps: the video's frame rate; the time step between two frames f0 < f1 is (f1 - f0) / fps.
        min_cutoff, beta, d_cutoff: the One-Euro parameters (see `OneEuroFilter`).
        max_age: a track unseen for more than this many frames is forgotten (its filter restarts
            if the id comes back).

    `smooth(track_ids (M,), keypoints (M, K, 2), frame) -> smoothed keypoints (M, K, 2)`; M may be 0
    (a frame with nobody). Scores are not filtered.
    """

    def __init__(self, fps: float, min_cutoff: float = 1.0, beta: float = 0.05, d_cutoff: float = 1.0,
                 max_age: int = 30):
        if not fps > 0:
            raise ValueError(f"KeypointSmoother needs the video's frame rate > 0, got {fps}")
        self.fps = float(fps)
        self.params = dict(min_cutoff=min_cutoff, beta=beta, d_cutoff=d_cutoff)
        OneEuroFilter(**self.params)  # checks the parameters now, not at the first track
        self.max_age = int(max_age)
        self.filters: dict[int, tuple[OneEuroFilter, int]] = {}

    def smooth(self, track_ids, keypoints, frame: int) -> np.ndarray:
        track_ids = np.asarray(track_ids, np.int64).reshape(-1)
        keypoints = np.asarray(keypoints, np.float64)
        if not len(track_ids):  # a frame with nobody: nothing to filter, but old tracks still age out
            keypoints = keypoints.reshape(0, *(keypoints.shape[1:] if keypoints.ndim == 3 else (0, 2)))
        out = np.empty_like(keypoints)
        for i, track_id in enumerate(np.asarray(track_ids).tolist()):
            one_euro, last = self.filters.get(track_id, (None, None))
            if one_euro is None:
                one_euro, last = OneEuroFilter(**self.params), frame
            out[i] = one_euro.filter(keypoints[i], max(frame - last, 1) / self.fps)
            self.filters[track_id] = (one_euro, frame)
        self.filters = {k: v for k, v in self.filters.items() if frame - v[1] <= self.max_age}
        return out


# ---------------------------------------------------------------------------------------------
# Detection every N frames (`--det-every N`)


def keypoint_motion(before: np.ndarray, before_scores, after: np.ndarray, after_scores,
                    min_score: float = 0.3) -> tuple[np.ndarray, np.ndarray, float]:
    """How one person's keypoints moved between two frames: (centre before (2,), centre after
    (2,), scale) of the similarity p_after ~ centre_after + scale * (p_before - centre_before).

    The keypoints scored above `min_score` in both frames count: centres are their means, scale
    the ratio of their RMS spreads about them, clipped to [0.9, 1.1] per frame (someone walking
    towards a camera at 30 frames/s grows ~1.5% a frame; a bigger ratio is a keypoint that jumped). With
    fewer than two such keypoints, all keypoints count, the move is their median displacement
    (robust to the unconfident ones that jump) and the scale 1."""
    before, after = np.asarray(before, np.float64), np.asarray(after, np.float64)
    both = (np.asarray(before_scores) > min_score) & (np.asarray(after_scores) > min_score)
    if both.sum() < 2:
        centre = np.median(before, axis=0)
        return centre, centre + np.median(after - before, axis=0), 1.0
    before, after = before[both], after[both]
    centre_before, centre_after = before.mean(axis=0), after.mean(axis=0)
    spread_before = np.sqrt(((before - centre_before) ** 2).sum(-1).mean())
    spread_after = np.sqrt(((after - centre_after) ** 2).sum(-1).mean())
    scale = float(np.clip(spread_after / spread_before, 0.9, 1.1)) if spread_before > 0 else 1.0
    return centre_before, centre_after, scale


def move_box(box: np.ndarray, centre_from: np.ndarray, centre_to: np.ndarray, scale: float) -> np.ndarray:
    """The xyxy box under the similarity p -> centre_to + scale * (p - centre_from)."""
    corners = np.asarray(box, np.float64).reshape(2, 2)
    return (centre_to + scale * (corners - centre_from)).reshape(4)


class DetectionSchedule:
    """When to run the detector on a video (rtmlib's `det_frequency`, easy_ViTPose's `--yolo-step`),
    and who each carried person is.

    The detector runs on every `every`-th frame; on the frames between, each person of the frame
    before is looked for again on a carried box: their box moved the way their keypoints moved
    (`keypoint_motion`: translation and scale, applied once to fit this frame and once more as
    a constant-velocity guess for the next one). A box moved with the pose keeps the detector's
    shape: the keypoints' own extent (rtmlib's `pose_to_bbox`) shrinks to the confident joints
    when a model is unsure of the legs or the feet, and the pose on a shrunken box is worse again.
    A person is lost when their mean keypoint score on the carried box falls below `lost_ratio`
    times their mean score on the frame before (the pose slipped off the person: an absolute
    threshold would re-detect every frame where someone is merely occluded or small), or when the
    carried box, clipped to the image, is under `min_box_side` pixels (they left the frame); then
    that frame is detected again.

    `boxes_for(index)` -> the carried boxes (M, 5: xyxy clipped to the image + the detector's score
    of the person) or None (run the detector); `lost(scores)` says whether a frame's poses on the
    carried boxes need the detector after all; `update(poses, image_size, carried=)` after each
    frame. `carried_from` (M,) gives, for each carried box, the person's index in the poses of the
    frame before: the same person by construction, so the tracker keeps their id
    (`Tracker.update(follows=...)`) however the carried box overlaps the detector's."""

    def __init__(self, every: int, lost_ratio: float = 0.5, min_box_side: float = 4.0, min_score: float = 0.3):
        if int(every) < 1:
            raise ValueError(f"--det-every must be >= 1, got {every}")
        self.every, self.lost_ratio, self.min_box_side, self.min_score = int(every), lost_ratio, min_box_side, min_score
        self.carried: np.ndarray | None = None
        self.carried_from = np.zeros(0, np.int64)
        self.carried_means = np.zeros(0)  # each carried person's mean keypoint score on the frame before
        self._fitted = np.zeros((0, 4))  # each carried person's box on the frame before (not clipped)
        self._keypoints = self._scores = None  # their keypoints and scores on the frame before
        self.detector_frames = 0

    def boxes_for(self, index: int) -> np.ndarray | None:
        if self.every == 1 or index % self.every == 0 or self.carried is None or not len(self.carried):
            return None
        return self.carried

    def lost(self, keypoint_scores: np.ndarray) -> bool:
        """Whether the poses found on the carried boxes (in their order) lost someone."""
        scores = np.asarray(keypoint_scores, np.float64).reshape(len(keypoint_scores), -1)
        if len(scores) == 0 or len(scores) != len(self.carried_means):
            return True
        return bool((scores.mean(axis=1) < self.lost_ratio * self.carried_means).any())

    def update(self, poses, image_size, carried: bool = False) -> None:
        """poses: a `Poses` (boxes, box_scores, keypoints, keypoint_scores) of the frame just done;
        carried: whether they were found on `self.carried` (in its order), else on the detector's boxes."""
        count = len(poses)
        keypoints = np.asarray(poses.keypoints, np.float64)
        scores = np.asarray(poses.keypoint_scores, np.float64)
        if not count:  # nobody: (0, K, 2), (0, 0, 2) or []
            keypoints, scores = np.zeros((0, 0, 2)), np.zeros((0, 0))
        fitted = np.asarray(poses.boxes, np.float64).reshape(count, 4).copy()
        following = fitted.copy()
        if carried:
            for m in range(count):
                centre_from, centre_to, scale = keypoint_motion(self._keypoints[m], self._scores[m], keypoints[m],
                                                                scores[m], self.min_score)
                fitted[m] = move_box(self._fitted[m], centre_from, centre_to, scale)
                following[m] = move_box(fitted[m], centre_to, 2 * centre_to - centre_from, scale)
        w, h = image_size
        following = np.clip(following, 0, [w, h, w, h])
        sides = np.minimum(following[:, 2] - following[:, 0], following[:, 3] - following[:, 1])
        keep = np.nonzero(sides >= self.min_box_side)[0]
        box_scores = np.asarray(poses.box_scores, np.float32).reshape(-1)[keep]
        self.carried = np.concatenate([following[keep].astype(np.float32), box_scores[:, None]], axis=1)
        self.carried_from = keep
        self.carried_means = scores[keep].mean(axis=1) if count else np.zeros(0)
        self._fitted, self._keypoints, self._scores = fitted[keep], keypoints[keep], scores[keep]
