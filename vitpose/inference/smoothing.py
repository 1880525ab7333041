"""Offline smoothing of recorded video (`vitpose predict VIDEO --smooth offline`): each track's
keypoints as a whole, zero lag, gaps filled. No torch, no SciPy: NumPy only.

The live filter (`--smooth` / `--smooth live`, `vitpose.inference.tracking.OneEuroFilter`) is
causal: it sees only the frames before, so it lags behind motion and cannot undo a jump until
after it. A recorded video has every frame, so each keypoint of each track is smoothed here with
the frames on both sides:

1. Observed points: the track has a record in the frame and the keypoint's score is at least
   `min_score` (default 0.3); the rest are missing.
2. Gaps of at most `gap` frames between two observed points are filled by linear interpolation;
   longer gaps, and the frames before a track's first or after its last observed point, stay
   missing (never made up).
3. A confidence-weighted Savitzky-Golay filter: at each frame a polynomial of degree `order`
   (default 2) is fitted by weighted least squares to the 2M+1 frames around it, each observed
   point weighted by its score, each filled point by `FILL_WEIGHT` (so it only bridges), missing
   points not at all; the smoothed point is the fit at the frame. With all weights equal this is
   the classic Savitzky-Golay filter; it is symmetric, so there is no lag (zero phase). The half
   window M is the least whose Savitzky-Golay response has fallen to -3 dB at `cutoff` Hz at the
   video's frame rate (default 6 Hz, as Pose2Sim's Butterworth filter), so the setting reads as
   a Butterworth cutoff does.

Why Savitzky-Golay and not a Butterworth filter run forwards and backwards (Pose2Sim's
`filtfilt`): (a) its support is finite: the smoothed point at frame t depends on frames
t - `support(fps)` .. t + `support(fps)` only (M, plus the gap filling's reach), so a video cut
into `--segment` units, each run with that many frames of context on both sides, gives the very
numbers of one run; an IIR filter's response and filtfilt's edge padding reach the whole track,
so segments would only approximate it; (b) confidence weighting is a weighted least-squares fit,
where filtfilt takes evenly weighted samples; (c) track ends, gaps and short tracks are the same
fit on fewer points (filtfilt needs a track longer than its padding, 15 frames at order 4);
(d) no SciPy dependency.

`smooth_track` works on one track's arrays; `smooth_records` on the COCO records `vitpose
predict` writes (by `track_id`); `SmoothingWriter` is the writer protocol around another writer
(`vitpose.inference.writers`): it holds each unit's records (a whole video, or a segment with its
context) until the unit ends, smooths them, drops the context frames and hands the unit on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vitpose.errors import UsageError

__all__ = ["FILL_WEIGHT", "OfflineSmoothing", "SmoothingWriter", "check_offline_smoothing", "savgol_half_window", "smooth_records",
           "smooth_track", "smoothing_mode"]

FILL_WEIGHT = 0.01  # an interpolated point's weight: it bridges a gap, the observed points decide
SMOOTH_MODES = ("live", "offline")
MAX_HALF_WINDOW = 1000  # frames: a cutoff far below the frame rate is a window of this, not an endless search


def smoothing_mode(value) -> str | None:
    """`PredictOptions.smooth` -> None (off), "live" (One-Euro, causal) or "offline" (whole tracks).
    True is "live" (what `--smooth` meant before it took a value)."""
    if value is None or value is False:
        return None
    if value is True:
        return "live"
    if value not in SMOOTH_MODES:
        raise UsageError(f"--smooth: expected live or offline, got {value!r}")
    return value


def check_offline_smoothing(smooth, *, webcam: bool, out=None, resume: bool = False) -> None:
    """`--smooth offline` needs a recorded video's every frame before it writes: one line for what
    it cannot do (a live camera, a drawn video drawn as it goes, a continued --json)."""
    if smoothing_mode(smooth) != "offline":
        return
    if webcam:
        raise UsageError("--smooth offline smooths a recorded video's whole tracks; a webcam is live: use --smooth live")
    if out:
        raise UsageError("--out draws each frame as it is done, before --smooth offline has the whole track: leave out "
                         "--out, or draw with --smooth live")
    if resume:
        raise UsageError("--resume: --smooth offline writes the video's tracks once every frame is done, so a stopped "
                         "run cannot be continued; cut the video with --segment FRAMES to resume it by segments")


def savgol_response(half_window: int, order: int, frequency: float) -> float:
    """|H(f)| of the (unweighted) Savitzky-Golay smoother of half window M and degree `order`
    at `frequency` in cycles per frame."""
    offsets = np.arange(-half_window, half_window + 1, dtype=np.float64)
    vander = np.vander(offsets / half_window, order + 1, increasing=True)
    centre = np.linalg.pinv(vander)[0]  # the weights that give the fit's value at offset 0
    return float(abs(np.sum(centre * np.cos(2 * np.pi * frequency * offsets))))


def savgol_half_window(fps: float, cutoff: float, order: int = 2) -> int:
    """The least half window M (frames) whose Savitzky-Golay response is down to -3 dB at `cutoff`
    Hz for a video at `fps` frames/s; at least the least window that smooths at all (2M + 1 >
    order + 1), which is also what a cutoff at or above half the frame rate gets."""
    if not fps > 0:
        raise ValueError(f"offline smoothing needs the video's frame rate > 0, got {fps}")
    if not cutoff > 0:
        raise ValueError(f"offline smoothing needs a cutoff > 0 Hz, got {cutoff}")
    frequency = min(cutoff / fps, 0.5)
    half = order // 2 + 1
    while savgol_response(half, order, frequency) > 1 / math.sqrt(2) and half < MAX_HALF_WINDOW:
        half += 1
    return half


@dataclass(frozen=True)
class OfflineSmoothing:
    """The settings of offline smoothing: `cutoff` (Hz, default 6), `gap` (the longest gap filled,
    frames, default 10), `min_score` (points scored lower count as missing, default 0.3), `order`
    (the local polynomial's degree, default 2)."""

    cutoff: float = 6.0
    gap: int = 10
    min_score: float = 0.3
    order: int = 2

    def __post_init__(self):
        if not self.cutoff > 0:
            raise UsageError(f"--smooth-cutoff must be > 0 Hz, got {self.cutoff}")
        if int(self.gap) != self.gap or self.gap < 0:
            raise UsageError(f"--smooth-gap must be a whole number of frames >= 0, got {self.gap}")
        if not 0 <= self.min_score <= 1:
            raise ValueError(f"min_score must be in [0, 1], got {self.min_score}")
        if self.order not in (1, 2, 3, 4):
            raise ValueError(f"order must be 1, 2, 3 or 4, got {self.order}")

    def half_window(self, fps: float) -> int:
        return savgol_half_window(fps, self.cutoff, self.order)

    def support(self, fps: float) -> int:
        """How far (frames) a smoothed point reaches on each side: the fit's half window plus the
        gap filling's (a gap of `gap` frames and the observed points at its two ends)."""
        return self.half_window(fps) + int(self.gap) + 1


def _filled(points: np.ndarray, observed: np.ndarray, gap: int) -> tuple[np.ndarray, np.ndarray]:
    """Linear interpolation across gaps of at most `gap` frames between observed points
    -> (points with the gaps filled, which points were filled (T, K))."""
    count = len(observed)
    t = np.arange(count)[:, None]
    before = np.maximum.accumulate(np.where(observed, t, -1), axis=0)
    after = np.minimum.accumulate(np.where(observed, t, count)[::-1], axis=0)[::-1]
    fillable = ~observed & (before >= 0) & (after < count) & (after - before - 1 <= gap)
    lo, hi = np.clip(before, 0, count - 1), np.clip(after, 0, count - 1)
    start = np.take_along_axis(points, lo[..., None], axis=0)
    end = np.take_along_axis(points, hi[..., None], axis=0)
    share = np.where(fillable, (t - before) / np.maximum(after - before, 1), 0.0)[..., None]
    values = np.where(fillable[..., None], start + share * (end - start), points)
    return values, fillable


def smooth_track(points, scores, present=None, *, fps: float, settings: OfflineSmoothing = OfflineSmoothing()
                 ) -> tuple[np.ndarray, np.ndarray]:
    """One track over consecutive frames -> (smoothed points (T, K, 2), smoothed (T, K) bool).

    points (T, K, 2) pixels (NaN where unknown), scores (T, K), present (T,) whether the track has
    a record in the frame (default: every frame). Where `smoothed` is False (a missing point not
    in a filled gap, or a window with fewer than order + 1 points) the input is returned as it was.
    """
    points = np.asarray(points, np.float64)
    scores = np.asarray(scores, np.float64)
    count = len(points)
    present = np.ones(count, bool) if present is None else np.asarray(present, bool)
    observed = present[:, None] & (scores >= settings.min_score) & np.isfinite(points).all(-1)
    if count == 0:
        return points.copy(), observed
    clean = np.where(observed[..., None], points, 0.0)
    values, fillable = _filled(clean, observed, int(settings.gap))
    weights = np.where(observed, scores, np.where(fillable, FILL_WEIGHT, 0.0))
    half, order = settings.half_window(fps), settings.order
    u = np.arange(-half, half + 1, dtype=np.float64) / half  # offsets scaled to [-1, 1]: a well-conditioned fit
    powers = u[:, None] ** np.arange(2 * order + 1)  # (W, 2p+1)
    pad = [(half, half)] + [(0, 0)] * (weights.ndim - 1)
    window_w = np.lib.stride_tricks.sliding_window_view(np.pad(weights, pad), 2 * half + 1, axis=0)  # (T, K, W)
    weighted = weights[..., None] * values
    window_wy = np.lib.stride_tricks.sliding_window_view(np.pad(weighted, pad + [(0, 0)]), 2 * half + 1, axis=0)
    moments = window_w @ powers  # (T, K, 2p+1): sum of w u^j
    rhs = window_wy @ powers[:, :order + 1]  # (T, K, 2, p+1): sum of w y u^j
    index = np.arange(order + 1)
    normal = moments[..., index[:, None] + index[None, :]]  # (T, K, p+1, p+1)
    enough = (window_w > 0).sum(-1) >= order + 1
    smoothed = (observed | fillable) & enough
    normal = np.where(smoothed[..., None, None], normal, np.eye(order + 1))
    coefficients = np.linalg.solve(normal[:, :, None], rhs[..., None])[..., 0]  # (T, K, 2, p+1)
    out = np.where(smoothed[..., None], coefficients[..., 0], points)
    return out, smoothed


def _track_arrays(rows: list[tuple[int, dict]]):
    """One track's records (index in the list, record) -> (first frame, points, scores, present)."""
    frames = [record["frame"] for _, record in rows]
    first, count = min(frames), max(frames) - min(frames) + 1
    flat = np.asarray([[np.nan if v is None else v for v in record["keypoints"]] for _, record in rows], np.float64)
    flat = flat.reshape(len(rows), -1, 3)
    points = np.full((count, flat.shape[1], 2), np.nan)
    scores = np.zeros((count, flat.shape[1]))
    present = np.zeros(count, bool)
    at = np.asarray(frames) - first
    points[at], scores[at], present[at] = flat[..., :2], np.nan_to_num(flat[..., 2], nan=0.0), True
    return first, points, scores, present


def smooth_records(records: list[dict], fps: float, settings: OfflineSmoothing = OfflineSmoothing(),
                   keep: tuple[int | None, int | None] | None = None) -> list[dict]:
    """COCO records of consecutive video frames (`frame`, `track_id`, `keypoints` [x, y, s, ...])
    with each track's keypoints smoothed (`smooth_track`) -> new records in the same order; the
    scores, boxes and records without a `track_id` are kept as they are. keep (start, stop): only
    the records of frames start <= frame < stop are returned (None: no bound), the others having
    served as context."""
    by_track: dict[int, list[tuple[int, dict]]] = {}
    for i, record in enumerate(records):
        if record.get("track_id") is not None:
            by_track.setdefault(record["track_id"], []).append((i, record))
    out = [dict(r) for r in records]
    for rows in by_track.values():
        if len({record["frame"] for _, record in rows}) != len(rows):
            continue  # one id twice in a frame is not one person's track: left as it is
        first, points, scores, present = _track_arrays(rows)
        smoothed, changed = smooth_track(points, scores, present, fps=fps, settings=settings)
        for i, record in rows:
            at = record["frame"] - first
            flat = [None if v is None else float(v) for v in record["keypoints"]]
            for k in np.flatnonzero(changed[at]).tolist():
                flat[3 * k], flat[3 * k + 1] = float(smoothed[at, k, 0]), float(smoothed[at, k, 1])
            out[i]["keypoints"] = flat
    start, stop = keep if keep is not None else (None, None)
    return [r for r in out if (start is None or r["frame"] >= start) and (stop is None or r["frame"] < stop)]


class SmoothingWriter:
    """The writer protocol (`begin(unit) / add(records) / end() / close(completed)`) around another
    writer: a unit's records are held until `end()`, smoothed track by track (`smooth_records`),
    then handed on as one unit. A unit with `start` / `stop` (a `--segment` frame range, run with
    context frames on both sides) hands on only its own frames. A unit not ended (a stopped run) is
    dropped, as the inner writer drops an unfinished unit. `keep_track_ids=False`: the records lose
    the `track_id` that smoothing needed (`--smooth` without `--track`). Anything else (`done`,
    `nonfinite`, ...) is the inner writer's."""

    def __init__(self, inner, fps: float, settings: OfflineSmoothing = OfflineSmoothing(),
                 keep_track_ids: bool = True):
        self.inner, self.fps, self.settings, self.keep_track_ids = inner, float(fps), settings, keep_track_ids
        self.unit, self.held = None, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def begin(self, unit) -> None:
        self.unit, self.held = unit, []

    def add(self, records: list[dict], nonfinite: int = 0) -> None:
        self.held.append((records, nonfinite))

    def end(self) -> None:
        start, stop = getattr(self.unit, "start", None), getattr(self.unit, "stop", None)
        inside = [(records, bad) for records, bad in self.held
                  if not records or ((start is None or records[0]["frame"] >= start)
                                     and (stop is None or records[0]["frame"] < stop))]
        smoothed = smooth_records([r for records, _ in self.held for r in records], self.fps, self.settings,
                                  keep=(start, stop))
        if not self.keep_track_ids:
            smoothed = [{k: v for k, v in r.items() if k != "track_id"} for r in smoothed]
        self.inner.begin(self.unit)
        self.inner.add(smoothed, sum(bad for _, bad in inside))
        self.inner.end()
        self.unit, self.held = None, []

    def write(self, records: list[dict], nonfinite: int = 0, unit=None) -> None:
        """One unit's records at once (`begin(unit)`, `add`, `end`)."""
        self.begin(unit)
        self.add(records, nonfinite)
        self.end()

    def close(self, completed: bool):
        self.unit, self.held = None, []
        return self.inner.close(completed)
