"""The scoring rules of `vitpose audit` and `vitpose select`, each on the smallest input that shows it.

Every test builds its input by hand (a few synthetic arrays, no model, no files) and asserts the one
value the rule decides: a shortened limb is flagged, the facing check's gate and value, the tie order
of the ranking, which frame keeps a video's jump, and which person decides a frame's score. Each was
seen to fail with its rule broken (a sign dropped, a threshold or a min/max/argmax exchanged).
"""

import numpy as np
import pytest

from vitpose.data.metainfo import dataset_info
from vitpose.inference.results import FlipViews, Poses
from vitpose.labelling import audit
from vitpose.labelling.calibration import Calibration, bone_lengths
from vitpose.labelling.checks import audit_instance
from vitpose.labelling.labels import LabelledImage
from vitpose.labelling.select import FrameScore, score_frame, settle_jumps

COCO = dataset_info("coco")
BOX = (50, 10, 100, 210)  # x, y, w, h around `_pose`


def _pose():
    """A COCO pose in a 100x200 box at (50, 20), left keypoints on the image's right (no noise)."""
    x = np.array([0, -8, 8, -16, 16, -25, 25, -35, 35, -38, 38, -15, 15, -17, 17, -18, 18], float)
    y = np.array([20, 15, 15, 18, 18, 50, 50, 90, 90, 125, 125, 120, 120, 165, 165, 205, 205], float)
    return np.stack([100 - x, y], 1)


def _labelled(xy):
    return np.concatenate([xy, np.full((len(xy), 1), 2.0)], 1)


def _audit(label, predicted, facing=None, bones=None):
    calibration = Calibration(error=np.full(17, 0.03), score=np.full(17, 0.5), clear=np.full(17, 0.8),
                              faint=np.full(17, 0.05))
    return audit_instance(label, BOX, predicted, np.full(17, 0.6), np.zeros(17), COCO, calibration,
                          facing=facing, bones=bones)


# ---------------------------------------------------------------------------------------------
# audit's checks


def test_a_limb_shortened_to_a_third_is_flagged_by_the_bones_check():
    """A shortened limb is flagged by the bones check, as a stretched one is: the link's distance
    from its usual length counts both ways (z ~ 22 spreads here, bones 1.0)."""
    predicted = _pose()
    links = np.asarray(COCO.skeleton, int).reshape(-1, 2)
    usual = bone_lengths(_labelled(predicted), BOX, links)
    bones = (usual, np.full(len(links), 0.05))
    elbow, wrist = COCO.keypoint_names.index("left_elbow"), COCO.keypoint_names.index("left_wrist")
    assert sum(wrist in link for link in links.tolist()) == 1  # the wrist ends one link only
    label = _labelled(predicted)
    label[wrist, :2] = predicted[elbow] + (predicted[wrist] - predicted[elbow]) / 3
    checks, reasons, flagged = _audit(label, predicted, bones=bones)
    assert checks["bones"] == 1.0, checks
    assert any(r.startswith("left_elbow-left_wrist is 0.3x its usual length") for r in reasons), reasons
    assert any(check == "bones" for _, check, _ in flagged), flagged
    # the label as the file usually has it: nothing
    assert _audit(_labelled(predicted), predicted, bones=bones)[0]["bones"] == 0.0


def test_a_label_only_mirror_probability_of_0_7_gives_no_facing_reason():
    """The facing check speaks only above its gate (the file's P that the label is mirrored over
    0.95): at P 0.70 there is no facing check and no "left/right swapped?" reason."""
    predicted = _pose()
    checks, reasons, _ = _audit(_labelled(predicted), predicted, facing=(0.3, 0.7))
    assert "facing" not in checks, checks
    assert reasons == []


def test_the_facing_check_counts_from_its_gate():
    """The facing check's value rises from 0 at its gate (P 0.95) to 1 at P 1: at P 0.96 it is 0.2,
    not the 0.92 of a value counted from 0.5."""
    predicted = _pose()
    checks, reasons, _ = _audit(_labelled(predicted), predicted, facing=(0.04, 0.96))
    assert checks["facing"] == pytest.approx(0.2, abs=1e-3), checks
    assert any("left/right swapped?" in r and "P 0.96" in r for r in reasons), reasons


def test_people_of_equal_suspicion_are_ranked_by_the_larger_sum_of_checks(monkeypatch):
    """Ties of suspicion are ranked by the larger sum of checks first: two people at suspicion 1.0,
    their checks summing 1.0 (first in the file) and 1.33: the 1.33 one is ranked first."""
    checks = {1: {"far": 1.0}, 2: {"far": 1.0, "bones": 0.33}}
    rng = np.random.default_rng(0)
    people = np.stack([_labelled(_pose() + rng.normal(0, 1, (17, 2))) for _ in checks])
    image = LabelledImage(7, "a.jpg", 200, 240, list(checks), people, np.array([BOX, BOX], float))
    lines = {"a.jpg": {"predicted": people[:, :, :2] + 1.0, "scores": np.full((2, 17), 0.6),
                       "views_apart": np.zeros((2, 17))}}
    seen = iter(checks.values())
    monkeypatch.setattr(audit, "audit_instance", lambda *args, **kwargs: (dict(next(seen)), [], []))
    rows = audit.ranked([image], lines, COCO)
    assert [row["suspicion"] for row in rows] == [1.0, 1.0]
    assert [row["annotation_id"] for row in rows] == [2, 1]


# ---------------------------------------------------------------------------------------------
# select's scores


def _frame(frame, jump, after):
    signals = {"confidence": 0.1, "jump": jump}
    if after is not None:
        signals["after"] = after
    return FrameScore(f"clip_{frame:06d}.jpg", frame, 64, 48, 0.0, signals, [])


def test_only_the_frame_that_jumps_away_and_back_keeps_its_jump():
    """A video's jump is settled two-sided: frame 1 parts from frames 0 and 2, so it alone keeps
    the jump; its neighbours (each with one large jump to or from it) keep the smaller one."""
    frames = [_frame(0, 0.0, None), _frame(1, 0.8, 0), _frame(2, 0.8, 1), _frame(3, 0.0, 2)]
    assert settle_jumps(frames) == pytest.approx([0.05, 0.45, 0.05, 0.05])


def test_a_frame_is_scored_by_its_most_doubtful_person():
    """A frame counts its most doubtful person: a confident person (scores 0.95) and a doubtful one
    (0.2) give the frame 0.4 from the doubtful one, not 0.025 from the confident one."""
    keypoints = np.stack([_pose(), _pose() + [150, 0]])
    scores = np.array([np.full(17, 0.95), np.full(17, 0.2)], np.float32)
    poses = Poses(boxes=np.array([[50, 10, 150, 220], [200, 10, 300, 220]], np.float32),
                  box_scores=np.ones(2, np.float32), keypoints=keypoints, keypoint_scores=scores)
    views = FlipViews(poses, keypoints, scores, keypoints.copy(), scores)  # the two views agree: flip 0
    uncertainty, signals, hardest = score_frame(views, np.asarray(COCO.sigmas))
    assert uncertainty == pytest.approx(0.4, abs=1e-6)
    assert hardest == 1
    assert signals == {"confidence": pytest.approx(0.8), "flip": pytest.approx(0.0)}
