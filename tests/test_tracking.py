"""vitpose.inference.tracking: ids through motion, crossings and gaps; the One-Euro filter by its formula."""

import math

import numpy as np
import pytest

from vitpose.coco_meta import SIGMAS
from vitpose.inference.tracking import KeypointSmoother, OneEuroFilter, Tracker, box_iou, keypoint_oks


def box_at(x, y, w=40.0, h=100.0):
    return np.array([x, y, x + w, y + h])


def test_box_iou_by_hand():
    a = np.array([[0, 0, 10, 10]])
    b = np.array([[5, 0, 15, 10], [20, 20, 30, 30], [0, 0, 10, 10]])
    # overlap 5 x 10 = 50, union 100 + 100 - 50 = 150
    np.testing.assert_allclose(box_iou(a, b), [[50 / 150, 0.0, 1.0]])


def test_keypoint_oks_by_hand():
    a = np.zeros((1, 17, 2))
    b = np.zeros((1, 17, 2))
    b[0, :, 0] = 2.0  # every keypoint 2 px to the right: d^2 = 4
    area = 400.0
    expected = np.mean([math.exp(-4 / (2 * area * (2 * s) ** 2)) for s in SIGMAS])
    np.testing.assert_allclose(keypoint_oks(a, b, [area]), [[expected]], rtol=1e-12)
    visible = np.zeros((1, 1, 17), bool)
    visible[0, 0, 5] = True  # only the left shoulder counts
    np.testing.assert_allclose(keypoint_oks(a, b, [area], visible),
                               [[math.exp(-4 / (2 * area * (2 * 0.079) ** 2))]], rtol=1e-12)


def test_smoothly_moving_box_keeps_its_id():
    tracker = Tracker()
    ids = [tracker.update([box_at(10 + 6 * f, 50 + 2 * f)])[0] for f in range(30)]
    assert ids == [0] * 30


def positions_speeding_up():
    """x of a 40 px wide box: 20 px per frame for 6 frames, then 32 px per frame."""
    steps = [20.0] * 6 + [32.0] * 6
    return np.concatenate([[0.0], np.cumsum(steps)])


def test_speeding_box_keeps_its_id_through_the_velocity_model():
    # At 32 px per frame two consecutive 40 px boxes overlap by IoU 8 * 100 / 7200 = 0.11 < 0.3:
    # only the track moved on by its velocity (about 20 px per frame by then) still matches.
    assert box_iou(box_at(0, 0)[None], box_at(32, 0)[None])[0, 0] < 0.3
    with_motion, without_motion = Tracker(), Tracker(velocity_weight=0.0)
    for x in positions_speeding_up():
        moving_id = with_motion.update([box_at(x, 0)])[0]
        still_id = without_motion.update([box_at(x, 0)])[0]
    assert moving_id == 0
    assert still_id == 6  # without a motion model every 32 px step started a new track


@pytest.mark.parametrize("dy", [0.0, 30.0])
def test_two_crossing_people_keep_their_ids(dy):
    # A walks right, B walks left at the same speed; with dy = 0 their boxes coincide exactly at
    # frame 10, so only the motion model can tell who is who after the crossing.
    tracker = Tracker()
    for f in range(21):
        a = box_at(0 + 10 * f, 0)
        b = box_at(200 - 10 * f, dy)
        order = [a, b] if f % 2 == 0 else [b, a]  # the detector's order changes from frame to frame
        ids = tracker.update(order)
        a_id, b_id = (ids[0], ids[1]) if f % 2 == 0 else (ids[1], ids[0])
        if not (dy == 0 and f == 10):  # at frame 10 the two boxes are the same box
            assert (a_id, b_id) == (0, 1), f"frame {f}: A got {a_id}, B got {b_id}"


def test_short_gap_keeps_the_id_long_gap_gets_a_new_one():
    tracker = Tracker(max_age=5)
    for f in range(5):
        assert tracker.update([box_at(5 * f, 0)], frame=f)[0] == 0
    # frames 5 and 6 missing (detector missed the person, or corrupt frames)
    assert tracker.update([box_at(5 * 7, 0)], frame=7)[0] == 0
    # the same gap passed as empty frames
    tracker.update(np.zeros((0, 4)), frame=8)
    tracker.update(np.zeros((0, 4)), frame=9)
    assert tracker.update([box_at(5 * 10, 0)], frame=10)[0] == 0
    # ten frames missing > max_age: a new id, never a reused one
    assert tracker.update([box_at(5 * 21, 0)], frame=21)[0] == 1


def test_gap_limit_is_max_age_exactly():
    for max_age in (0, 2):
        tracker = Tracker(max_age=max_age)
        tracker.update([box_at(0, 0)], frame=0)
        assert tracker.update([box_at(0, 0)], frame=max_age + 1)[0] == 0  # max_age frames missed
        assert tracker.update([box_at(0, 0)], frame=2 * max_age + 3)[0] == 1  # max_age + 1 missed


def test_oks_metric_separates_overlapping_boxes_by_pose():
    rng = np.random.default_rng(0)
    kpts_a = rng.uniform(0, 100, (17, 2))
    kpts_b = rng.uniform(0, 100, (17, 2))
    same_box = np.array([0, 0, 100, 100.0])
    tracker = Tracker(metric="oks")
    first = tracker.update([same_box, same_box], [kpts_a, kpts_b])
    # the next frame lists them in the other order; box IoU (1 for both) could not tell them apart
    second = tracker.update([same_box, same_box], [kpts_b + 1, kpts_a + 1])
    assert second.tolist() == first[::-1].tolist()
    with pytest.raises(ValueError, match="needs the keypoints"):
        tracker.update([same_box])


def test_tracker_rejects_bad_arguments():
    with pytest.raises(ValueError, match="metric"):
        Tracker(metric="euclid")
    tracker = Tracker()
    tracker.update([box_at(0, 0)], frame=3)
    with pytest.raises(ValueError, match="increasing order"):
        tracker.update([box_at(0, 0)], frame=3)


def test_one_euro_constant_signal_is_identity():
    one_euro = OneEuroFilter(min_cutoff=0.5, beta=0.3)
    signal = np.array([[123.456, -7.25], [0.1, 1e6]])
    for _ in range(20):
        np.testing.assert_array_equal(one_euro(signal, 1 / 30), signal)


def test_one_euro_step_matches_the_formula_by_hand():
    # min_cutoff 1 Hz, beta 0.1 s/px, d_cutoff 1 Hz, 30 frames/s; input 0, 1, 1.
    one_euro = OneEuroFilter(min_cutoff=1.0, beta=0.1, d_cutoff=1.0)
    assert one_euro(0.0, 1 / 30) == 0.0
    # sample 2: dx = (1 - 0) * 30 = 30 px/s
    #   alpha_d = 1 / (1 + 30 / (2 pi * 1)) = 0.173170719549154
    #   dx_hat = 0 + alpha_d * 30 = 5.19512158647462
    #   cutoff = 1 + 0.1 * 5.19512158647462 = 1.51951215864746 Hz
    #   alpha = 1 / (1 + 30 / (2 pi * 1.51951215864746)) = 0.241416177801511 -> x_hat = alpha
    assert one_euro(1.0, 1 / 30) == pytest.approx(0.241416177801511, abs=1e-14)
    # sample 3: dx = (1 - 0.241416177801511) * 30 = 22.7575146659547
    #   dx_hat = 5.19512158647462 + 0.173170719549154 * (22.7575146659547 - 5.19512158647462) = 8.23641383305327
    #   cutoff = 1.82364138330533 Hz; alpha = 1 / (1 + 30 / (2 pi * 1.82364138330533)) = 0.276380921850291
    #   x_hat = 0.241416177801511 + 0.276380921850291 * (1 - 0.241416177801511) = 0.451074273881447
    assert one_euro(1.0, 1 / 30) == pytest.approx(0.451074273881447, abs=1e-14)


def test_one_euro_without_speed_term_is_an_exponential_smoother():
    # beta = 0: alpha is fixed, so the step response is 1 - (1 - alpha)^n.
    one_euro = OneEuroFilter(min_cutoff=2.0, beta=0.0)
    alpha = 1 / (1 + 25 / (2 * math.pi * 2.0))
    one_euro(0.0, 1 / 25)
    for n in range(1, 6):
        assert one_euro(1.0, 1 / 25) == pytest.approx(1 - (1 - alpha) ** n, abs=1e-14)


def test_one_euro_rejects_bad_parameters():
    with pytest.raises(ValueError, match="min_cutoff"):
        OneEuroFilter(min_cutoff=0.0)
    one_euro = OneEuroFilter()
    one_euro(np.zeros(2), 0.1)
    with pytest.raises(ValueError, match="shape"):
        one_euro(np.zeros(3), 0.1)
    with pytest.raises(ValueError, match="time step"):
        one_euro(np.zeros(2), 0.0)


def test_keypoint_smoother_filters_each_track_on_its_own_time_step():
    smoother = KeypointSmoother(fps=10.0, beta=0.0, min_cutoff=1.0)
    a0, b0 = np.zeros((17, 2)), np.full((17, 2), 50.0)
    np.testing.assert_array_equal(smoother.smooth([3, 7], np.stack([a0, b0]), frame=0), np.stack([a0, b0]))
    # both tracks seen again 1 frame later (dt 0.1 s), then track 7 alone 3 frames later (dt 0.3 s)
    out = smoother.smooth([7, 3], np.stack([b0 + 1, a0 + 1]), frame=1)
    alpha_1 = 1 / (1 + 10 / (2 * math.pi))
    np.testing.assert_allclose(out[0], b0 + alpha_1, rtol=1e-14)
    np.testing.assert_allclose(out[1], a0 + alpha_1, rtol=1e-14)
    out = smoother.smooth([7], (b0 + 1)[None], frame=4)
    alpha_3 = 1 / (1 + 1 / (0.3 * 2 * math.pi))
    np.testing.assert_allclose(out[0], b0 + alpha_1 + alpha_3 * (1 - alpha_1), rtol=1e-12)


# ---- frames with nobody (#18 item 3): the first frame, and frames in the middle ---------------------------

def nobody(num_keypoints=17):
    """What the video pipeline passes for a frame without people."""
    return np.zeros((0, 4)), np.zeros((0, num_keypoints, 2)), np.zeros((0, num_keypoints))


@pytest.mark.parametrize("metric", ["iou", "oks"])
def test_tracker_accepts_frames_with_nobody_first_and_in_the_middle(metric):
    rng = np.random.default_rng(0)
    pose = rng.uniform(0, 1, (17, 2)) * [40, 100]
    tracker = Tracker(metric=metric)
    ids = []
    for frame in range(8):
        if frame in (0, 3, 4):  # nobody at the start and for two frames in the middle (< max_age 5)
            boxes, keypoints, scores = nobody()
        else:
            x = 10.0 + 3 * frame
            boxes, keypoints, scores = box_at(x, 20)[None], (pose + [x, 20])[None], np.ones((1, 17))
        got = tracker.update(boxes, keypoints, scores, frame=frame)
        assert got.shape == (len(boxes),) and got.dtype == np.int64
        ids.append(got.tolist())
    assert ids == [[], [0], [0], [], [], [0], [0], [0]]  # one person, one id, through both gaps
    assert tracker.next_id == 1
    assert tracker.update([], [], [], frame=20).tolist() == []  # lists, and a gap past max_age
    assert tracker.tracks == []


def test_smoother_skips_frames_with_nobody_and_filters_across_the_gap():
    fps, track = 10.0, 7
    smoother = KeypointSmoother(fps)
    reference = OneEuroFilter()
    samples = {1: np.full((17, 2), 5.0), 4: np.full((17, 2), 8.0), 5: np.full((17, 2), 9.5)}
    last = None
    for frame in range(6):
        if frame not in samples:
            out = smoother.smooth(np.zeros(0, np.int64), np.zeros((0, 17, 2)), frame)
            assert out.shape == (0, 17, 2)
            continue
        out = smoother.smooth([track], samples[frame][None], frame)
        dt = (frame - last) / fps if last is not None else 1 / fps  # 3 frames across the gap
        np.testing.assert_array_equal(out[0], reference.filter(samples[frame], dt))
        last = frame
    assert smoother.smooth([], [], 6).shape == (0, 0, 2)
