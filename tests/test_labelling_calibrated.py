"""`vitpose select` and `vitpose audit` with a calibrated model's `p` and `visibility`
(docs/calibration.md §5.5), and exactly as before without them."""

import numpy as np
import pytest
from test_labelling import COCO, _audit, _calibration, _pose, _stand_in_predictions

from vitpose.data.synthetic import make_coco
from vitpose.inference.results import FlipViews, Poses
from vitpose.labelling.audit import audit_instance, calibrated_lines, ranked, read_labels
from vitpose.labelling.select import score_frame


def _views(p=None, visibility=None):
    rng = np.random.default_rng(0)
    keypoints = np.stack([_pose(rng), _pose(rng) + 150])
    scores = rng.uniform(0.2, 0.9, (2, 17)).astype(np.float32)
    poses = Poses(np.array([[40, 0, 160, 230], [190, 150, 310, 380]], np.float32), np.ones(2, np.float32),
                  keypoints, scores)
    if p is not None:  # what a runtime sets for a calibrated model (None: the field is absent)
        poses.keypoint_p, poses.keypoint_visibility = p, visibility
    return FlipViews(poses, keypoints, scores, keypoints + 1.0, scores)


def test_select_confidence_is_one_minus_the_mean_p_of_a_calibrated_model():
    plain = _views()
    _, signals, hardest = score_frame(plain, COCO.sigmas)
    assert signals["confidence"] == pytest.approx(1 - plain.poses.keypoint_scores[hardest].mean(), abs=1e-4)
    p = np.full((2, 17), 0.9, np.float32)
    p[1] = 0.1  # the second person: the model is sure it is wrong
    calibrated = _views(p, np.full((2, 17), 2, np.int8))
    _, signals, hardest = score_frame(calibrated, COCO.sigmas)
    assert hardest == 1 and signals["confidence"] == pytest.approx(0.9, abs=1e-4)


def test_audit_checks_the_flags_against_the_models_states():
    rng = np.random.default_rng(4)
    predicted = _pose(rng)
    label = np.concatenate([predicted.copy(), np.full((17, 1), 2.0)], 1)
    label[0, 2] = 1  # labelled hidden
    states = np.full(17, 2)
    states[16] = 1  # the model calls the right ankle occluded, labelled visible
    checks, reasons, flagged = audit_instance(label, (50, 10, 100, 210), predicted, np.full(17, 0.6), np.zeros(17),
                                              COCO, _calibration(), visibility=states)
    assert checks["visibility"] == pytest.approx(2 / 17, abs=1e-3)
    assert any("nose: labelled not visible, the model sees it" in r for r in reasons)
    assert any("right_ankle: labelled visible, the model calls it occluded" in r for r in reasons)
    # without states: the fixed score rule, as before (0.6 is neither clear nor faint: no flag)
    checks, reasons, _ = _audit(label, predicted)
    assert checks["visibility"] == 0 and not any("visible" in r for r in reasons)


def test_audit_ranks_with_p_and_states_when_every_line_carries_them(tmp_path):
    from benchmarks.labelling_loop import corrupt_coco

    root = tmp_path / "set"
    make_coco(root, num_images=30, seed=11, split="val")
    clean = root / "annotations/person_keypoints_val2017.json"
    labels = read_labels(clean, 17)
    lines = _stand_in_predictions(labels)
    assert calibrated_lines(lines) is lines  # no p: the lines as they are
    for image in labels:  # a calibrated stand-in: p high where labelled, states = the clean flags
        lines[image.file_name]["p"] = [np.where(k[:, 2] > 0, 0.9, 0.1).tolist() for k in image.keypoints]
        lines[image.file_name]["visibility"] = [k[:, 2].astype(int).tolist() for k in image.keypoints]
    corrupted = tmp_path / "corrupted.json"
    planted = corrupt_coco(clean, corrupted, COCO.flip_indices, fraction=0.1, seed=0)
    rows = ranked(read_labels(corrupted, 17), lines, COCO)
    flips = [a for a, kind in planted.items() if kind == "visibility"]
    assert flips
    by_id = {row["annotation_id"]: row for row in rows}
    for annotation_id in flips:  # every flipped flag contradicts the model's states
        assert by_id[annotation_id]["checks"]["visibility"] > 0
        assert any("the model" in r for r in by_id[annotation_id]["reasons"])
    clean_rows = [row for row in rows if row["annotation_id"] not in planted]
    assert all(row["checks"]["visibility"] == 0 for row in clean_rows)
    assert calibrated_lines(lines)[labels[0].file_name]["scores"] == lines[labels[0].file_name]["p"]
