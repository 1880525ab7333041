"""`--smooth offline` (vitpose.inference.smoothing): whole tracks of a recorded video, zero lag.

On synthetic tracks (17 keypoints moving on slow sines, 30 frames/s) with Gaussian jitter, low-confidence
outliers and frames without the person:
- the offline smoother's RMS error to the truth is below the raw track's and below the One-Euro
  filter's (`--smooth live`) on the same signal, and its cross-correlation with the truth peaks at
  lag 0 (One-Euro's lags);
- with jitter that grows as the score falls, the score-weighted fit beats equal weights;
- gaps up to `gap` frames are filled, longer ones stay missing;
- the support is finite: records smoothed segment by segment, each with `support(fps)` frames of
  context, equal the records smoothed whole (what `--segment` relies on);
- `SmoothingWriter` holds a unit, smooths it, drops its context frames;
- the command line: `--smooth offline` on a webcam index, `--smooth-gap` without it: one line, exit 2;
  a video cut with `--segment` and merged equals the unsegmented `--smooth offline` run.
"""

import json

import numpy as np
import pytest
from test_video import FPS as VIDEO_FPS
from test_video import blob_detector, options, predictor, video, with_detector  # noqa: F401 - fixtures

from vitpose.cli import main
from vitpose.inference.smoothing import (
    OfflineSmoothing,
    SmoothingWriter,
    savgol_half_window,
    savgol_response,
    smooth_records,
    smooth_track,
    smoothing_mode,
)
from vitpose.inference.tracking import KeypointSmoother

FPS, FRAMES, K = 30.0, 300, 17


def synthetic_track(seed=0, jitter=4.0, outliers=0.1):
    """(truth, noisy, scores, present): keypoints on sines of 0.4-1.2 Hz, Gaussian jitter of `jitter`
    px, a share `outliers` of points scored 0.05 and thrown 40 px off, two stretches without the person."""
    rng = np.random.default_rng(seed)
    t = np.arange(FRAMES)[:, None] / FPS
    k = np.arange(K)
    truth = np.stack([320 + 80 * np.sin(2 * np.pi * (0.4 + 0.05 * k) * t + k),
                      240 + 60 * np.cos(2 * np.pi * (0.5 + 0.04 * k) * t + 0.5 * k)], -1)
    noisy = truth + rng.normal(0, jitter, truth.shape)
    scores = rng.uniform(0.5, 0.95, (FRAMES, K))
    bad = rng.random((FRAMES, K)) < outliers
    scores[bad] = 0.05
    noisy[bad] += rng.normal(0, 40, noisy[bad].shape)
    present = np.ones(FRAMES, bool)
    present[100:104] = False  # a short gap: filled
    present[200:220] = False  # a long one: stays missing
    return truth, noisy, scores, present


def one_euro(noisy, present):
    smoother = KeypointSmoother(FPS)
    return np.stack([smoother.smooth([0], noisy[f][None], f)[0] if present[f] else noisy[f] for f in range(FRAMES)])


def rms(points, truth, present):
    return float(np.sqrt(((points - truth) ** 2).sum(-1)[present].mean()))


def peak_lag(signal, truth, present, reach=6):
    """The lag (frames; > 0: the signal trails the truth) at which the cross-correlation of signal and
    truth (each minus its mean, over the frames with the person, keypoints and coordinates together)
    peaks: the best whole lag, refined by the parabola through it and its two neighbours."""
    frames = np.flatnonzero(present[reach:-reach]) + reach
    a = signal - signal[present].mean(0)
    b = truth - truth[present].mean(0)
    lags = np.arange(-reach, reach + 1)
    correlation = np.array([(a[frames] * b[frames - lag]).sum() for lag in lags])
    best = int(np.clip(correlation.argmax(), 1, len(lags) - 2))
    left, centre, right = correlation[best - 1:best + 2]
    return float(lags[best] + 0.5 * (left - right) / (left - 2 * centre + right))


def test_offline_beats_raw_and_one_euro_with_zero_lag():
    truth, noisy, scores, present = synthetic_track()
    smoothed, done = smooth_track(noisy, scores, present, fps=FPS)
    live = one_euro(noisy, present)
    errors = {"raw": rms(noisy, truth, present), "one_euro": rms(live, truth, present),
              "offline": rms(smoothed, truth, present)}
    print(errors, {"lag_offline": peak_lag(smoothed, truth, present), "lag_one_euro": peak_lag(live, truth, present)})
    # the points of the frames with the person are smoothed (outliers refilled), but for an outlier at a
    # track's end or beside the long gap, which has no observed point after (or before) it to bridge from
    assert done[present].mean() > 0.99
    assert errors["offline"] < 0.5 * errors["one_euro"] < errors["raw"]
    assert abs(peak_lag(smoothed, truth, present)) < 0.05  # zero lag: the peak at 0
    assert peak_lag(live, truth, present) > 0.2  # the causal filter trails the motion
    # on jitter alone (no outliers) too: below the raw jitter and the One-Euro filter's
    truth, noisy, scores, present = synthetic_track(seed=1, outliers=0.0)
    smoothed, _ = smooth_track(noisy, scores, present, fps=FPS)
    live = one_euro(noisy, present)
    print({"raw": rms(noisy, truth, present), "one_euro": rms(live, truth, present),
           "offline": rms(smoothed, truth, present)})
    assert rms(smoothed, truth, present) < 0.8 * min(rms(live, truth, present), rms(noisy, truth, present))


def test_confident_points_weigh_more():
    """Jitter that grows as the score falls (as a model's does): the score-weighted fit beats the
    same fit with equal weights."""
    truth, _, _, present = synthetic_track(outliers=0.0)
    rng = np.random.default_rng(5)
    scores = rng.uniform(0.3, 1.0, truth.shape[:2])
    noisy = truth + rng.normal(0, 1, truth.shape) * (12 * (1 - scores) + 0.5)[..., None]
    weighted, _ = smooth_track(noisy, scores, present, fps=FPS)
    equal, _ = smooth_track(noisy, np.ones_like(scores), present, fps=FPS)
    assert rms(weighted, truth, present) < 0.9 * rms(equal, truth, present)


def test_short_gaps_are_filled_and_long_ones_stay_missing():
    truth, noisy, scores, present = synthetic_track(jitter=0.0, outliers=0.0)
    settings = OfflineSmoothing(gap=4)
    smoothed, done = smooth_track(noisy, scores, present, fps=FPS, settings=settings)
    assert done[100:104].all() and not done[200:220].any()
    # bridged along the motion: the fit through the points around the gap follows the curve, where
    # a straight line across it is off by up to 13 px
    straight = truth[99] + (truth[104] - truth[99]) * (np.arange(1, 5) / 5)[:, None, None]
    assert np.abs(smoothed[100:104] - truth[100:104]).max() < 0.5 * np.abs(straight - truth[100:104]).max()
    np.testing.assert_array_equal(smoothed[200:220], noisy[200:220])  # nothing made up
    _, done = smooth_track(noisy, scores, present, fps=FPS, settings=OfflineSmoothing(gap=3))
    assert not done[100:104].any()  # a 4-frame gap is longer than 3
    # a constant and a straight line pass unchanged (the local quadratic fits them exactly)
    line = np.stack([np.linspace(0, 50, 40), np.full(40, 7.0)], -1)[:, None].repeat(3, 1)
    out, _ = smooth_track(line, np.full((40, 3), 0.9), fps=FPS)
    np.testing.assert_allclose(out, line, atol=1e-9)


def test_half_window_meets_the_cutoff_and_is_savitzky_golay():
    for fps, cutoff in ((30, 6), (60, 6), (120, 3), (25, 4)):
        half = savgol_half_window(fps, cutoff)
        assert savgol_response(half, 2, cutoff / fps) <= 2 ** -0.5 < savgol_response(half - 1, 2, cutoff / fps)
    assert savgol_half_window(10, 6) == 2  # at or above Nyquist: the least window that smooths
    # equal weights: the classic Savitzky-Golay 5-point quadratic, (-3, 12, 17, 12, -3) / 35
    x = np.random.default_rng(2).normal(size=(20, 1, 2))
    out, _ = smooth_track(x, np.ones((20, 1)), fps=10, settings=OfflineSmoothing(cutoff=6))
    expected = np.tensordot(np.lib.stride_tricks.sliding_window_view(x, 5, axis=0), [-3, 12, 17, 12, -3], 1) / 35
    np.testing.assert_allclose(out[2:-2], expected, atol=1e-9)
    assert [smoothing_mode(v) for v in (False, None, True, "live", "offline")] == [None, None, "live", "live", "offline"]


def records_of_tracks(seed=3):
    """Two people's records over FRAMES frames (the second leaves at frame 150)."""
    out = []
    tracks = [synthetic_track(seed), synthetic_track(seed + 1)]
    for f in range(FRAMES):
        for track_id, (_, noisy, scores, present) in enumerate(tracks):
            if present[f] and not (track_id == 1 and f >= 150):
                flat = np.concatenate([noisy[f], scores[f][:, None]], 1).reshape(-1).tolist()
                out.append({"frame": f, "keypoints": flat, "score": 0.8, "track_id": track_id})
    return out


def test_segments_with_context_equal_the_whole_tracks():
    records = records_of_tracks()
    settings = OfflineSmoothing()
    whole = smooth_records(records, FPS, settings)
    assert [(r["frame"], r["track_id"]) for r in whole] == [(r["frame"], r["track_id"]) for r in records]
    context = settings.support(FPS)
    pieces = []
    for start in range(0, FRAMES, 37):
        stop = start + 37
        held = [r for r in records if start - context <= r["frame"] < stop + context]
        pieces += smooth_records(held, FPS, settings, keep=(start, stop))
    assert len(pieces) == len(whole)
    got, expected = (np.array([r["keypoints"] for r in rs], float) for rs in (pieces, whole))
    np.testing.assert_allclose(got, expected, atol=1e-9, rtol=0)
    raw = np.array([r["keypoints"] for r in records], float)
    assert np.abs(expected - raw).max() > 1  # it did smooth
    np.testing.assert_array_equal(expected[:, 2::3], raw[:, 2::3])  # scores kept


class Recorder:
    def __init__(self):
        self.units, self.nonfinite = [], 0

    def begin(self, unit):
        self.units.append([unit, []])

    def add(self, records, nonfinite=0):
        self.units[-1][1] += records
        self.nonfinite += nonfinite

    def end(self):
        pass

    def close(self, completed):
        return "closed" if completed else "partial"


class Segment:
    start, stop = 10, 20


def test_smoothing_writer_holds_a_unit_and_drops_its_context():
    records = [r for r in records_of_tracks() if r["frame"] < 40]
    inner = Recorder()
    writer = SmoothingWriter(inner, FPS, keep_track_ids=False)
    writer.begin(Segment())
    for f in range(40):
        writer.add([r for r in records if r["frame"] == f], nonfinite=1)
    assert inner.units == []  # held until the unit ends
    writer.end()
    (unit, written), = inner.units
    assert isinstance(unit, Segment) and {r["frame"] for r in written} == set(range(10, 20))
    assert all("track_id" not in r for r in written) and inner.nonfinite == 10  # the segment's own frames'
    writer.begin(Segment())
    writer.add(records[:2])
    assert writer.close(False) == "partial" and len(inner.units) == 1  # a unit not ended is dropped


# ---- the command line -------------------------------------------------------------------------


def predict(argv, capsys):
    code = main(["predict", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_offline_on_a_webcam_and_its_flags_alone_are_refused_in_one_line(tmp_path, capsys):
    model = ["--model", tmp_path / "absent.safetensors", "--detector", "full-frame", "--device", "cpu"]
    for argv, why in ((["0", "--smooth", "offline"], "a webcam is live: use --smooth live"),
                      (["0", "--smooth-gap", "3"], "--smooth-gap sets up --smooth offline"),
                      (["0", "--smooth", "offline", "--smooth-cutoff", "0"], "--smooth-cutoff must be > 0")):
        code, _, err = predict([*argv, *model], capsys)
        assert code == 2 and why in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_segmented_offline_run_equals_the_unsegmented_one(tmp_path, capsys):
    from test_evaluate import tiny_model
    from test_shard import write_video

    import vitpose

    weights = tmp_path / "tiny.safetensors"
    vitpose.save_weights(tiny_model(seed=11), weights)
    write_video(tmp_path / "clip.avi", frames=36)
    boxes = []
    for f in range(36):
        boxes.append({"frame": f, "bbox": [2 + f * 0.5, 5, 30, 60], "score": 0.9})
        if 8 <= f < 30:
            boxes.append({"frame": f, "bbox": [60 - f * 0.3, 10, 30, 55], "score": 0.8})
    (tmp_path / "dets.json").write_text(json.dumps(boxes))
    base = [tmp_path / "clip.avi", "--model", weights, "--boxes", tmp_path / "dets.json", "--device", "cpu",
            "--precision", "fp32", "--batch-images", "1", "--batch-size", "1", "--track"]
    code, _, err = predict([*base, "--json", tmp_path / "raw.jsonl"], capsys)
    assert code == 0, err
    code, _, err = predict([*base, "--smooth", "offline", "--json", tmp_path / "one.jsonl"], capsys)
    assert code == 0, err
    code, printed, err = predict([*base, "--smooth", "offline", "--segment", "10", "--json", tmp_path / "seg"], capsys)
    assert code == 0 and "frames of context each side" in printed, err
    assert main(["merge", str(tmp_path / "seg"), "--json", str(tmp_path / "merged.jsonl")]) == 0
    capsys.readouterr()
    read = [[json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
            for name in ("raw.jsonl", "one.jsonl", "merged.jsonl")]
    raw, one, merged = read
    assert [(r["frame"], r["track_id"], r["bbox"]) for r in merged] == [(r["frame"], r["track_id"], r["bbox"]) for r in one]
    keypoints = [np.array([r["keypoints"] for r in rs], float) for rs in read]
    np.testing.assert_allclose(keypoints[2], keypoints[1], atol=1e-4, rtol=0)  # segments == one run
    assert np.abs(keypoints[1] - keypoints[0]).max() > 0.1  # and it smoothed
    np.testing.assert_array_equal(keypoints[1][:, 2::3], keypoints[0][:, 2::3])


# ---- run_video: the whole video is one unit of the smoothing writer ------------------------------


def test_run_video_offline_is_the_tracks_of_the_raw_run_smoothed(predictor, video, tmp_path):  # noqa: F811 (fixtures)
    """The two walking figures of tests/test_video.py (12 frames at 12.5 frames/s)."""
    from vitpose.errors import UserError
    from vitpose.inference.pipeline import read_records
    from vitpose.inference.video import run_video

    def run(name, **kw):
        args = options(tmp_path, json=str(tmp_path / name), **kw)
        summary = run_video(with_detector(predictor, blob_detector), str(video), args)
        assert summary.exit_status == 0
        return read_records(tmp_path / name)

    raw = run("raw.jsonl", track=True)
    expected = smooth_records(raw, VIDEO_FPS, OfflineSmoothing(gap=2))
    smoothed = run("offline.jsonl", track=True, smooth="offline", smooth_gap=2)
    assert [{k: v for k, v in r.items() if k != "keypoints"} for r in smoothed] == \
        [{k: v for k, v in r.items() if k != "keypoints"} for r in raw]
    np.testing.assert_allclose([r["keypoints"] for r in smoothed], [r["keypoints"] for r in expected], atol=1e-6)
    assert np.abs(np.array([r["keypoints"] for r in smoothed]) - [r["keypoints"] for r in raw]).max() > 0.1
    untracked = run("ids.jsonl", smooth="offline", smooth_gap=2)  # tracked inside, the ids not written
    assert all("track_id" not in r for r in untracked)
    assert [r["keypoints"] for r in untracked] == [r["keypoints"] for r in smoothed]
    with pytest.raises(UserError, match="--out"):
        run_video(predictor, str(video), options(tmp_path, smooth="offline", out=str(tmp_path / "drawn")))


def test_bare_smooth_before_the_source_still_means_the_live_filter():
    """`--smooth` took no value before `offline` existed: `--smooth clip.mp4` keeps its old meaning."""
    import argparse

    import vitpose.cli as cli
    from vitpose.cli import predict
    from vitpose.errors import UsageError

    parser = argparse.ArgumentParser()
    predict.add_parser(parser.add_subparsers(parser_class=cli.CommandParser))
    for argv, smooth, sources in ((["--smooth", "clip.mp4"], "live", ("clip.mp4",)),
                                  (["clip.mp4", "--smooth"], "live", ("clip.mp4",)),
                                  (["--smooth", "offline", "a.mp4", "b.mp4"], "offline", ("a.mp4", "b.mp4")),
                                  (["a.mp4", "--smooth", "offline"], "offline", ("a.mp4",))):
        args = parser.parse_args(["predict", *argv])
        assert (args.smooth, predict.given_sources(args)) == (smooth, sources), argv
    with pytest.raises(UsageError, match="at least one image"):
        predict.given_sources(parser.parse_args(["predict", "--smooth"]))
