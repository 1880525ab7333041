"""`vitpose select` and `vitpose audit` (issue 32): the flip views, the checks, the choice, the commands.

The ranking rules are tested on inputs whose answer is known by construction (a label that is the
prediction with left and right exchanged must be called a swap, near-copies must not all be
chosen); the commands are run end to end with a tiny random model (what they write, that a task
file round trips through `vitpose import-annotations`, that --exclude skips, that an interrupted run
keeps what it did and --resume continues). How well the rankings find real errors and hard frames
with a trained model is measured by benchmarks/labelling_loop.py (BENCHMARKS.md).
"""

import json

import cv2
import numpy as np
import pytest
import torch

import vitpose
from vitpose.cli import main
from vitpose.data.metainfo import dataset_info
from vitpose.data.synthetic import make_coco
from vitpose.inference.predictor import Predictor
from vitpose.labelling.audit import Calibration, audit_instance, suspicion
from vitpose.labelling.select import choose_frames, frame_name
from vitpose.models.spec import spec_of_model

COCO = dataset_info("coco")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    torch.manual_seed(0)
    model = vitpose.build_model("vitpose-s", embed_dim=64, depth=1, num_heads=2, deconv_channels=(32, 32),
                                img_size=(128, 96))
    path = tmp_path_factory.mktemp("model") / "tiny.safetensors"
    vitpose.save_weights(model, path, spec=spec_of_model(model))
    return path


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    make_coco(root, num_images=6, seed=3, split="val")
    return root


# ---------------------------------------------------------------------------------------------
# The flip views come from the one pipeline


def test_flip_views_are_the_halves_of_the_flip_test(tiny_model):
    predictor = Predictor(str(tiny_model), device="cpu")
    image = np.random.default_rng(0).integers(0, 255, (140, 110, 3), np.uint8)
    boxes = [[10, 12, 90, 130], [0, 0, 60, 70]]
    views = predictor.flip_views(image, boxes)
    averaged = predictor(image, boxes)
    plain = Predictor(predictor.model, device="cpu", flip_test=False, codec=predictor.codec)(image, boxes)
    # the same crops, the same network, the same decode: equal to the last bit
    np.testing.assert_array_equal(views.poses.keypoints, averaged.keypoints)
    np.testing.assert_array_equal(views.poses.keypoint_scores, averaged.keypoint_scores)
    np.testing.assert_array_equal(views.plain, plain.keypoints)
    assert not np.array_equal(views.plain, views.mirrored)  # a random model does not see a mirror the same way


def test_flip_views_use_the_spec_and_the_flip_tests_arithmetic():
    """`forward_flip_views` normalises with the model's spec and flips with its codec's shift, as
    `forward_heatmaps` does: its average is the flip test's to the last bit, and it is the mean of
    the two views it returns (so the flipped-back view carries the MSRA shift too)."""
    from vitpose.topdown import forward_flip_views, forward_heatmaps

    torch.manual_seed(1)
    model = vitpose.build_model("vitpose-s", embed_dim=64, depth=1, num_heads=2, deconv_channels=(32, 32),
                                img_size=(128, 96)).eval()
    model.spec = spec_of_model(model, codec="MSRAHeatmap", pixel_mean=(10.0, 200.0, 90.0),
                               pixel_std=(20.0, 80.0, 160.0))
    assert model.spec.flip_shift
    crops = torch.from_numpy(np.random.default_rng(1).integers(0, 255, (3, 3, 128, 96), np.uint8))
    with torch.no_grad():
        averaged, plain, flipped_back = forward_flip_views(model, crops, flip_indices=COCO.flip_indices)
        expected = forward_heatmaps(model, crops, flip_indices=COCO.flip_indices)
        unflipped = forward_heatmaps(model, crops, flip_test=False)
    torch.testing.assert_close(averaged, expected, rtol=0, atol=0)
    torch.testing.assert_close((plain + flipped_back) * 0.5, averaged, rtol=0, atol=0)
    # the plain view is the model on the spec-normalised crops (a batch of 2N, not N: a tolerance)
    torch.testing.assert_close(plain, unflipped, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# audit's checks on labels whose error is known


def _pose(rng):
    """A plausible COCO pose in a 100x200 box at (50, 20): left keypoints on the image's right."""
    x = np.array([0, -8, 8, -16, 16, -25, 25, -35, 35, -38, 38, -15, 15, -17, 17, -18, 18], float)
    y = np.array([20, 15, 15, 18, 18, 50, 50, 90, 90, 125, 125, 120, 120, 165, 165, 205, 205], float)
    xy = np.stack([100 - x, y], 1) + rng.normal(0, 1, (17, 2))
    return xy


def _calibration(error=0.03):
    return Calibration(error=np.full(17, error), score=np.full(17, 0.5), clear=np.full(17, 0.8),
                       faint=np.full(17, 0.05))


def _audit(label, predicted, scores=None, bbox=(50, 10, 100, 210)):
    scores = np.full(17, 0.6) if scores is None else scores
    return audit_instance(label, bbox, predicted, scores, np.zeros(17), COCO, _calibration())


def test_a_correct_label_raises_no_check():
    rng = np.random.default_rng(1)
    predicted = _pose(rng)
    label = np.concatenate([predicted + rng.normal(0, 1, (17, 2)), np.full((17, 1), 2.0)], 1)
    checks, reasons, _ = _audit(label, predicted)
    assert suspicion(checks) < 0.05 and not reasons, (checks, reasons)


def test_a_left_right_swap_is_named():
    rng = np.random.default_rng(2)
    predicted = _pose(rng)
    label = np.concatenate([predicted[list(COCO.flip_indices)], np.full((17, 1), 2.0)], 1)
    checks, reasons, _ = _audit(label, predicted)
    assert checks["swap"] >= 0.9 and "left/right" in reasons[0]


def test_keypoints_moved_by_a_fifth_of_the_box_are_far():
    rng = np.random.default_rng(3)
    predicted = _pose(rng)
    label = np.concatenate([predicted.copy(), np.full((17, 1), 2.0)], 1)
    label[[9, 14], 0] += 0.2 * 100  # left wrist, right knee: 20 % of the box's width
    checks, _, flagged = _audit(label, predicted)
    assert checks["far"] >= 0.5 and checks["swap"] == 0
    assert {name for name, check, _ in flagged if check == "far"} == {"left_wrist", "right_knee"}


def test_an_untrusted_prediction_is_no_evidence():
    """The same moved keypoints, but the model scores them low: the check stays quiet."""
    rng = np.random.default_rng(3)
    predicted = _pose(rng)
    label = np.concatenate([predicted.copy(), np.full((17, 1), 2.0)], 1)
    label[[9, 14], 0] += 20
    scores = np.full(17, 0.6)
    scores[[9, 14]] = 0.01
    checks, _, _ = _audit(label, predicted, scores)
    assert checks["far"] < 0.1


def test_visibility_flags_against_the_scores_and_a_short_box():
    rng = np.random.default_rng(4)
    predicted = _pose(rng)
    label = np.concatenate([predicted.copy(), np.full((17, 1), 2.0)], 1)
    scores = np.full(17, 0.6)
    label[0, 2], scores[0] = 1, 0.95    # marked hidden, seen clearly
    label[16, 2], scores[16] = 2, 0.01  # marked visible, not found
    checks, reasons, _ = _audit(label, predicted, scores, bbox=(50, 10, 100, 150))  # the box stops above the feet
    assert checks["visibility"] == pytest.approx(2 / 17, abs=1e-3)
    assert any("nose: labelled not visible" in r for r in reasons)
    assert any("right_ankle: labelled visible" in r for r in reasons)
    assert checks["box"] > 0 and any("box misses" in r for r in reasons)


def test_the_logistic_fit_recovers_known_weights():
    from vitpose.labelling.audit import fit_logistic, logistic

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 3))
    truth = np.array([1.5, -2.0, 0.0])
    y = (rng.random(4000) < 1 / (1 + np.exp(-(x @ truth - 1.0)))).astype(float)
    weights = fit_logistic(x * [3, 0.5, 10] + [5, -2, 0], y, l2=1e-6)  # scaled and shifted: the fit standardises
    np.testing.assert_allclose(weights[:3] * [3, 0.5, 10], truth, atol=0.15)
    p = logistic(weights, x * [3, 0.5, 10] + [5, -2, 0])
    assert abs(p.mean() - y.mean()) < 0.01


def test_flags_the_classifier_expects_are_no_surprise_and_flipped_ones_are():
    from vitpose.labelling.audit import flag_surprise

    rng = np.random.default_rng(5)
    p_hidden = np.concatenate([np.full(12, 0.03), np.full(5, 0.8)])
    honest = [flag_surprise(np.where(rng.random(17) < p_hidden, 1, 2), p_hidden)[0] for _ in range(300)]
    assert abs(np.mean(honest)) < 0.2 and 0.7 < np.std(honest) < 1.3  # z: mean 0, spread 1 under the model
    v = np.where(p_hidden > 0.5, 1, 2)
    v[[0, 3, 7, 10]] = 1  # four points that look visible labelled hidden
    z, surprise = flag_surprise(v, p_hidden)
    assert z > 4 and set(np.argsort(-surprise)[:4]) == {0, 3, 7, 10}
    v[16] = 0  # not labelled: no part in it
    assert flag_surprise(v, p_hidden)[1][16] == 0


def _stand_in_predictions(labels, seed=0):
    """Audit progress lines as a model would give them, made from the clean labels: the model
    replaced by the ground truth plus noise, near the trained demo's statistics (AP 0.78 on its
    validation set: median score 0.70 for v=2 and 0.58 for v=1 with wide overlap, median distance
    from the label 0.03 and 0.07 of the box's size, flip views 0.02 and 0.03 apart). A test of the
    checks, not of a model: the same ranking with the fixed visibility rule misses the flips."""
    rng = np.random.default_rng(seed)
    lines = {}
    for image in labels:
        line = {key: [] for key in ("predicted", "scores", "views_apart", "plain_scores", "mirrored_scores")}
        for label, box in zip(image.keypoints, image.boxes):
            size = np.sqrt(box[2] * box[3])
            v = label[:, 2]
            spread = np.select([v == 2, v == 1], [0.02, 0.06], 0.2) * size
            centre = np.array([box[0] + box[2] / 2, box[1] + box[3] / 2])
            predicted = np.where(v[:, None] > 0, label[:, :2], centre) + rng.normal(0, 1, (len(v), 2)) * spread[:, None]
            scores = np.clip(rng.normal(np.select([v == 2, v == 1], [0.71, 0.56], 0.2), 0.15), 0.01, 0.99)
            views_gap = np.select([v == 2, v == 1], [0.02, 0.06], 0.1)
            line["predicted"].append(predicted.tolist())
            line["scores"].append(scores.tolist())
            line["views_apart"].append((np.abs(rng.normal(0, 1, len(v))) * spread / size).tolist())
            line["plain_scores"].append(np.clip(scores + rng.normal(0, 1, len(v)) * views_gap, 0, 1).tolist())
            line["mirrored_scores"].append(np.clip(scores + rng.normal(0, 1, len(v)) * views_gap, 0, 1).tolist())
        lines[image.file_name] = line
    return lines


def test_the_checks_find_planted_errors_against_a_stand_in_model(tmp_path):
    """The ranking logic on the benchmark's corruption (benchmarks/labelling_loop.py: 5 % of the
    people, swaps, shifts, four visibility flags flipped), the model replaced by the ground truth
    plus noise (`_stand_in_predictions`): a test of the checks, fast enough for every run. The
    model's part is `test_audit_finds_planted_errors_with_a_trained_model` (slow)."""
    from benchmarks.labelling_loop import random_recall, top_k_recall

    rows, planted, _ = _ranked_planted_set(tmp_path)
    ranking = [row["annotation_id"] for row in rows]
    k = len(planted)
    found = [planted[i] for i in ranking[:k] if i in planted]
    assert top_k_recall(ranking, planted) >= 0.8, (found, planted)
    assert set(found) == {"swap", "shift", "visibility"}
    assert top_k_recall(ranking, planted) >= 5 * random_recall(ranking, planted)
    flips = [row for row in rows[:k] if planted.get(row["annotation_id"]) == "visibility"]
    assert all(any("labelled not visible" in r or "labelled visible" in r for r in row["reasons"]) for row in flips)


def _ranked_planted_set(tmp_path, model_errors=False):
    """An 80-image synthetic set with 5 % of its people corrupted (`corrupt_coco`, seed 0), ranked by
    the audit against the stand-in model (`_with_model_errors` when `model_errors`): (rows, the
    planted errors {annotation_id: kind}, the people the stand-in mirrored)."""
    from benchmarks.labelling_loop import corrupt_coco
    from vitpose.labelling.audit import ranked, read_labels

    root = tmp_path / "set"
    make_coco(root, num_images=80, seed=11, split="val")
    clean = root / "annotations/person_keypoints_val2017.json"
    lines, mirrored = _stand_in_predictions(read_labels(clean, 17)), set()
    if model_errors:
        lines, mirrored = _with_model_errors(read_labels(clean, 17), lines)
    corrupted = tmp_path / "corrupted.json"
    planted = corrupt_coco(clean, corrupted, COCO.flip_indices, fraction=0.05, seed=0)
    return ranked(read_labels(corrupted, 17), lines, COCO), planted, mirrored


def _with_model_errors(labels, lines, seed=1, missed=0.1, mirrored=3):
    """The stand-in model made wrong the way the trained demo is: on a share of the people it
    misses three keypoints by as much as a shifted label (20 % of the box), and it mirrors a few
    people whose left/right order their labels make plausible (face labelled visible)."""
    rng = np.random.default_rng(seed)
    people = [(image, m) for image in labels for m in range(len(image.annotation_ids))
              if (image.keypoints[m][:, 2] > 0).sum() >= 8]
    chosen = rng.permutation(len(people))
    facing_camera = [i for i in chosen if people[i][0].keypoints[people[i][1]][0, 2] == 2]
    mirror = set(facing_camera[:mirrored])
    for i in chosen[:round(missed * len(people))]:
        image, m = people[i]
        if i in mirror:
            continue
        box, predicted = image.boxes[m], np.asarray(lines[image.file_name]["predicted"][m])
        for k in rng.choice(np.flatnonzero(image.keypoints[m][:, 2] > 0), 3, replace=False):
            angle = rng.uniform(0, 2 * np.pi)
            predicted[k] += 0.2 * np.array([box[2] * np.cos(angle), box[3] * np.sin(angle)])
        lines[image.file_name]["predicted"][m] = predicted.tolist()
    for i in mirror:
        image, m = people[i]
        predicted = np.asarray(lines[image.file_name]["predicted"][m])
        lines[image.file_name]["predicted"][m] = predicted[list(COCO.flip_indices)].tolist()
    return lines, {people[i][0].annotation_ids[people[i][1]] for i in mirror}


def test_the_label_priors_find_shifts_the_model_misses_and_spare_people_it_mirrors(tmp_path):
    """Where the model misses people by as much as a shift, the far check cannot tell a shifted
    label from the model's slip: the bones check (each link's length for its box against the
    file's) can. Where the model mirrors a person whose label puts left and right the usual way
    for how it is labelled (the face visible), the swap check is discounted (the facing prior
    learnt from the file). Here: 6 of the 7 planted errors in the top 7; without the facing prior 3
    (the three mirrored people take three places), without the bones check 5."""
    from benchmarks.labelling_loop import random_recall, top_k_recall

    rows, planted, mirrored = _ranked_planted_set(tmp_path, model_errors=True)
    ranking = [row["annotation_id"] for row in rows]
    k = len(planted)
    found = [planted[i] for i in ranking[:k] if i in planted]
    assert top_k_recall(ranking, planted) >= 0.8, (found, planted)
    assert top_k_recall(ranking, planted) >= 5 * random_recall(ranking, planted)
    assert not mirrored & set(ranking[:k]) - set(planted)
    shifts = [row for row in rows[:k] if planted.get(row["annotation_id"]) == "shift"]
    assert shifts and all(any("its usual length" in r for r in row["reasons"]) for row in shifts)
    honest_mirrored = [row for row in rows if row["annotation_id"] in mirrored - set(planted)]
    assert all(any("the model may have mirrored" in r for r in row["reasons"]) for row in honest_mirrored)


# ---------------------------------------------------------------------------------------------
# select's choice


def test_near_copies_are_not_all_chosen():
    # frames 0-4 are copies of one hard moment, 5-9 are distinct and a little less hard
    features = np.concatenate([np.zeros((5, 4)) + 1e-3 * np.arange(5)[:, None], np.eye(5, 4) * 3 + 5], 0)
    features[9] = [-5, 0, 0, 0]
    uncertainty = np.array([0.9] * 5 + [0.6] * 5)
    diverse = choose_frames(uncertainty, features, 4, diversity=1.0)
    assert sum(i < 5 for i in diverse) == 1, diverse
    assert choose_frames(uncertainty, features, 4, diversity=0.0) == [0, 1, 2, 3]


# ---------------------------------------------------------------------------------------------
# The commands


def _video(path, frames):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, frames[0].shape[1::-1])
    for frame in frames:
        writer.write(frame)
    writer.release()


def test_select_writes_tasks_that_import_back_and_skips_labelled_frames(tmp_path, tiny_model, synthetic, capsys):
    image = cv2.imread(str(synthetic / "val2017" / "000000000001.jpg"))
    frames = [np.roll(image, 3 * i, axis=1) for i in range(6)]
    video = tmp_path / "clip.avi"
    _video(video, frames)
    out = tmp_path / "next.json"
    argv = ["select", video, "--model", tiny_model, "--count", 2, "--out", out, "--detector", "full-frame",
            "--device", "cpu"]
    assert main([str(a) for a in argv]) == 0
    tasks = json.loads(out.read_text())
    assert len(tasks) == 2 and all("vitpose_select" in t["data"] for t in tasks)
    lines = [json.loads(line) for line in (tmp_path / "next.json.progress.jsonl").read_text().splitlines()]
    assert [line["frame"] for line in lines] == list(range(6))
    chosen = sorted(t["data"]["image"].rsplit("=", 1)[1] for t in tasks)
    assert sorted(p.name for p in (tmp_path / "next_frames").iterdir()) == chosen

    # an annotator accepts the pre-annotations; the export imports back as a COCO file
    export = tmp_path / "export.json"
    export.write_text(json.dumps([{"id": i, "data": t["data"], "annotations": [{"result": t["predictions"][0]["result"]}]}
                                  for i, t in enumerate(tasks)]))
    labelled = tmp_path / "labelled.json"
    assert main(["import-annotations", str(export), "--format", "labelstudio", "--skeleton", "coco",
                 "--out", str(labelled)]) == 0
    coco = json.loads(labelled.read_text())
    assert sorted(i["file_name"] for i in coco["images"]) == chosen
    assert len(coco["annotations"]) == 2

    # the next round skips what was labelled
    again = tmp_path / "again.json"
    capsys.readouterr()
    assert main([str(a) for a in argv[:-4]] + ["--out", str(again), "--exclude", str(labelled), "--detector",
                                                "full-frame", "--device", "cpu", "--count", "4"]) == 0
    scored = [json.loads(line)["item"] for line in (tmp_path / "again.json.progress.jsonl").read_text().splitlines()]
    assert set(scored) == {frame_name(video, i) for i in range(6)} - set(chosen)
    assert "2 labelled frames" in capsys.readouterr().out


def test_select_cvat_and_an_interrupted_run_resumes(tmp_path, tiny_model, synthetic, monkeypatch):
    from vitpose.labelling import select as select_module

    out = tmp_path / "next.xml"
    argv = ["select", str(synthetic / "val2017"), "--model", str(tiny_model), "--count", "3", "--out", str(out),
            "--format", "cvat", "--boxes", str(synthetic / "person_detection_results" / "val_detections.json"),
            "--device", "cpu"]
    real = select_module.score_frame
    calls = []

    def stop_after_two(*args, **kwargs):  # Ctrl-C during the third frame: it finishes, then stops
        calls.append(1)
        if len(calls) == 3:
            import os
            import signal
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(select_module, "score_frame", stop_after_two)
    assert main(argv) == 130 and not out.exists()
    progress = tmp_path / "next.xml.progress.jsonl"
    kept = [json.loads(line)["item"] for line in progress.read_text().splitlines()]
    assert kept == ["000000000001.jpg", "000000000002.jpg", "000000000003.jpg"]
    counted = []
    monkeypatch.setattr(select_module, "score_frame", lambda *a, **k: (counted.append(1), real(*a, **k))[1])
    assert main(argv + ["--resume"]) == 0
    assert len(counted) == 4  # frames 3-6: the last kept one may be incomplete, so it is done again
    items = [json.loads(line)["item"] for line in progress.read_text().splitlines()]
    assert items == [f"{i:012d}.jpg" for i in range(1, 7)]  # the last kept frame is done again, none twice
    assert out.read_text().count("<image ") == 3

    assert main(["import-annotations", str(out), "--format", "cvat", "--out", str(tmp_path / "back.json")]) == 0


def test_audit_writes_a_ranking_a_page_and_review_tasks(tmp_path, tiny_model, synthetic):
    ann = synthetic / "annotations" / "person_keypoints_val2017.json"
    out_json, out_html, tasks = tmp_path / "audit.json", tmp_path / "audit.html", tmp_path / "review.json"
    assert main(["audit", "--model", str(tiny_model), "--annotations", str(ann), "--images", str(synthetic / "val2017"),
              "--out", str(out_json), "--out", str(out_html), "--tasks", str(tasks), "--flag", "0", "--top", "3",
              "--device", "cpu"]) == 0
    report = json.loads(out_json.read_text())
    people = sum(1 for a in json.loads(ann.read_text())["annotations"] if a["num_keypoints"] > 0)
    assert report["instances"] == len(report["ranking"]) == people and report["flagged"] == 3
    suspicions = [row["suspicion"] for row in report["ranking"]]
    assert suspicions == sorted(suspicions, reverse=True)
    page = out_html.read_text()
    assert page.count("<tr>") == 4 and page.count("data:image/jpeg;base64,") == 6  # label | model per row
    review = json.loads(tasks.read_text())
    export = tmp_path / "export.json"
    export.write_text(json.dumps([{"id": i, "data": t["data"], "annotations": [{"result": t["predictions"][0]["result"]}]}
                                  for i, t in enumerate(review)]))
    assert main(["import-annotations", str(export), "--format", "labelstudio", "--skeleton", "coco",
                 "--out", str(tmp_path / "fixed.json")]) == 0


def test_the_audit_page_escapes_every_value_of_its_inputs(tmp_path, tiny_model, synthetic):
    """An annotation id is text from the COCO file: the page shows it, never runs it."""
    ann = json.loads((synthetic / "annotations" / "person_keypoints_val2017.json").read_text())
    script = "<script>alert(1)</script>"
    for a in ann["annotations"]:
        a["id"] = f"{script}{a['id']}"
    hostile, out_html = tmp_path / "hostile.json", tmp_path / "audit.html"
    hostile.write_text(json.dumps(ann))
    assert main(["audit", "--model", str(tiny_model), "--annotations", str(hostile), "--images",
                 str(synthetic / "val2017"), "--out", str(out_html), "--flag", "0", "--device", "cpu"]) == 0
    page = out_html.read_text()
    assert "<script" not in page.lower() and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_audit_refuses_to_write_over_its_input(tmp_path, tiny_model, synthetic, capsys):
    ann = synthetic / "annotations" / "person_keypoints_val2017.json"
    before = ann.read_bytes()
    assert main(["audit", "--model", str(tiny_model), "--annotations", str(ann), "--images", str(synthetic / "val2017"),
              "--out", str(ann), "--device", "cpu"]) == 2
    assert ann.read_bytes() == before
    assert "--out" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# With a trained model (slow: the demo trained for 40 epochs, ~10-20 min on a CPU)


@pytest.fixture(scope="module")
def trained_demo(tmp_path_factory):
    import train

    work = tmp_path_factory.mktemp("demo")
    code = train.main(["--demo", "--work-dir", str(work), "--data-root", str(work / "data"), "--epochs", "40",
                       "--set", "schedule.milestones=[32,38]"])
    assert code == 0
    return work / "best.pth", work / "data"


@pytest.mark.slow
def test_audit_finds_planted_errors_with_a_trained_model(tmp_path, trained_demo, capsys):
    """5 % of the validation people corrupted (benchmarks/labelling_loop.py, seed 0): all three
    kinds are in audit's top k (k = the number corrupted), far above a random ranking. With this
    model (BENCHMARKS.md, 30 corruption seeds): top-k recall 0.6-0.9, mean 0.80; seed 0: 0.8 (4
    swaps, 1 shift, 3 flips), top-2k 1.0. The bounds held on 30 of 30 seeds (top-k >= 0.6, 3 swaps
    and a shift, 8x random), 29 (top-2k >= 0.8) and 28 (a flip); the issue's 80 % is required of
    the mean over seeds (BENCHMARKS.md), not of one seed here."""
    from benchmarks.labelling_loop import corrupt_coco, random_recall, top_k_recall

    model, root = trained_demo
    corrupted = tmp_path / "corrupted.json"
    planted = corrupt_coco(root / "annotations/person_keypoints_val2017.json", corrupted, COCO.flip_indices)
    report = tmp_path / "audit.json"
    assert main(["audit", "--model", str(model), "--annotations", str(corrupted), "--images", str(root / "val2017"),
                 "--out", str(report), "--device", "cpu"]) == 0
    ranking = [row["annotation_id"] for row in json.loads(report.read_text())["ranking"]]
    k = len(planted)
    found = [planted[i] for i in ranking[:k] if i in planted]
    in_2k = [planted[i] for i in ranking[:2 * k] if i in planted]
    print(f"top-{k} recall {top_k_recall(ranking, planted):.2f} ({found}), top-{2 * k} {len(in_2k) / k:.2f}, "
          f"random {random_recall(ranking, planted):.2f}")
    assert top_k_recall(ranking, planted) >= 0.6, (found, planted)
    assert found.count("visibility") >= 1 and found.count("swap") >= 3 and found.count("shift") >= 1, found
    assert len(in_2k) >= 0.8 * k, in_2k
    assert top_k_recall(ranking, planted) >= 8 * random_recall(ranking, planted)


@pytest.mark.slow
def test_select_over_represents_hard_frames_with_a_trained_model(tmp_path, trained_demo, capsys):
    from benchmarks.labelling_loop import hard_video

    model, root = trained_demo
    video, boxes = tmp_path / "hard.avi", tmp_path / "boxes.json"
    hard = hard_video(root, video, boxes)
    out = tmp_path / "next.json"
    assert main(["select", str(video), "--model", str(model), "--count", "8", "--out", str(out), "--boxes", str(boxes),
                 "--device", "cpu"]) == 0
    lines = [json.loads(line) for line in (tmp_path / "next.json.progress.jsonl").read_text().splitlines()]
    frame_of = {line["item"]: line["frame"] for line in lines}
    chosen = [frame_of[t["data"]["image"].rsplit("=", 1)[1]] for t in json.loads(out.read_text())]
    base = len(hard) / len(lines)
    assert sum(f in hard for f in chosen) / len(chosen) >= 2 * base, (chosen, sorted(hard))


def test_both_commands_take_the_skeleton_the_model_records(tmp_path, capsys):
    """A 5-keypoint model (its skeleton in its file): the tasks name its keypoints, the audit
    reads a 5-keypoint COCO file and its swap check uses that skeleton's flip pairs."""
    import dataclasses

    from conftest import REPO

    from vitpose.builders import skeleton_data

    info = dataset_info(REPO / "configs" / "demo_k5_skeleton.yaml")
    torch.manual_seed(1)
    model = vitpose.build_model("vitpose-s", num_keypoints=5, embed_dim=64, depth=1, num_heads=2,
                                deconv_channels=(32, 32), img_size=(128, 96))
    spec = dataclasses.replace(spec_of_model(model), skeleton=skeleton_data(info))
    weights = tmp_path / "k5.safetensors"
    vitpose.save_weights(model, weights, spec=spec)
    root = tmp_path / "k5"
    make_coco(root, num_images=3, seed=5, split="val", dataset_info=info)
    out = tmp_path / "next.json"
    assert main(["select", str(root / "val2017"), "--model", str(weights), "--count", "2", "--out", str(out),
                 "--detector", "full-frame", "--device", "cpu"]) == 0
    names = {r["value"]["keypointlabels"][0] for t in json.loads(out.read_text())
             for r in t["predictions"][0]["result"] if r["type"] == "keypointlabels"}
    assert names == set(info.keypoint_names)
    report = tmp_path / "audit.json"
    assert main(["audit", "--model", str(weights), "--annotations", str(root / "annotations/person_keypoints_val2017.json"),
                 "--images", str(root / "val2017"), "--out", str(report), "--device", "cpu"]) == 0
    assert json.loads(report.read_text())["instances"] > 0

    # the swap check on this skeleton: the label with its wrists and ankles exchanged
    rng = np.random.default_rng(0)
    predicted = np.array([[50, 10], [80, 60], [20, 60], [65, 120], [35, 120]], float) + rng.normal(0, 1, (5, 2))
    label = np.concatenate([predicted[list(info.flip_indices)], np.full((5, 1), 2.0)], 1)
    calibration = Calibration(error=np.full(5, 0.03), score=np.full(5, 0.5), clear=np.full(5, 0.8),
                              faint=np.full(5, 0.05))
    checks, _, _ = audit_instance(label, (10, 0, 80, 130), predicted, np.full(5, 0.6), np.zeros(5), info, calibration)
    assert checks["swap"] >= 0.9


def test_an_interrupted_audit_keeps_its_images_and_resumes(tmp_path, tiny_model, synthetic, monkeypatch):
    import os
    import signal

    from vitpose.labelling import audit as audit_module

    ann = synthetic / "annotations" / "person_keypoints_val2017.json"
    report = tmp_path / "audit.json"
    argv = ["audit", "--model", str(tiny_model), "--annotations", str(ann), "--images", str(synthetic / "val2017"),
            "--out", str(report), "--device", "cpu"]
    real, calls = audit_module.predict_image, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during the second image: it finishes, then stops
        return real(*args)

    monkeypatch.setattr(audit_module, "predict_image", interrupted)
    assert main(argv) == 130 and not report.exists()
    progress = tmp_path / "audit.json.progress.jsonl"
    assert len(progress.read_text().splitlines()) == 2
    calls.clear()
    monkeypatch.setattr(audit_module, "predict_image", lambda *a: (calls.append(1), real(*a))[1])
    assert main(argv + ["--resume"]) == 0
    images = [json.loads(line)["image"] for line in progress.read_text().splitlines()]
    assert len(images) == len(set(images)) == len(calls) + 1  # the last kept image is done again
    assert json.loads(report.read_text())["instances"] > 0
