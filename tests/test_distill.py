"""`vitpose distill`: a student trained on a teacher's heatmaps and features through the training loop.

A tiny teacher is trained once (seconds), then CI-sized distillations on a 5-image synthetic set:
the student's file records the teacher and both scores and works as any model file; a run stopped
and resumed ends with the same bits as an uninterrupted one; flags are checked in one line.
"""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from vitpose.cli import main
from vitpose.engine.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.input_size=[48, 64]", "model.heatmap_size=[12, 16]", "model.sigma=1.0",
        "model.extra={embed_dim: 32, depth: 2, num_heads: 2, deconv_channels: [16, 16]}",
        "data.synthetic_train_images=5", "data.synthetic_val_images=2", "loader.batch_size=3",
        "loader.val_batch_size=8", "schedule.warmup_iters=4", "schedule.milestones=[1]", "train.val_every=100",
        "train.log_every=1", "train.checkpoint_minutes=0", "train.tensorboard=false"]
STUDENT = "model.extra={embed_dim: 32, depth: 1, num_heads: 2}"


def sets(*items):
    return [arg for s in items for arg in ("--set", s)]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """(teacher file, data root): a 2-block 32-d demo model after 2 epochs on 5 synthetic images."""
    root = tmp_path_factory.mktemp("teacher")
    argv = ["train", "--demo", "--data-root", str(root / "data"), "--work-dir", str(root / "run"), "--epochs", "2",
            "--workers", "0", *sets(*TINY, "train.val_every=1")]
    assert main(argv) == 0
    return root / "run" / "best.pth", root / "data"


def distill_argv(teacher, work_dir, *extra):
    path, data = teacher
    return ["distill", "--teacher", str(path), "--data", str(data), "--work-dir", str(work_dir), "--workers", "0",
            "--epochs", "3", *sets(STUDENT, "train.val_every=100", "train.log_every=1", "schedule.warmup_iters=4",
                                   "train.checkpoint_minutes=0", "train.tensorboard=false"), *extra]


@pytest.fixture(scope="module")
def student(teacher, tmp_path_factory):
    work = tmp_path_factory.mktemp("student")
    assert main(distill_argv(teacher, work, "--set", "model.drop_path_rate=0.2")) == 0
    return work


def test_vitpose_t_is_a_size():
    from vitpose.models.vitpose import MODEL_SIZES, build_model

    assert MODEL_SIZES["vitpose-t"] == dict(embed_dim=192, depth=12, num_heads=3, drop_path_rate=0.0)
    model = build_model("t", "simple", img_size=(64, 48), depth=1)
    assert model.backbone.embed_dim == 192 and model(torch.zeros(1, 3, 64, 48)).shape == (1, 17, 16, 12)


def test_the_students_file_records_the_teacher_the_losses_and_both_scores(teacher, student):
    from vitpose.engine.distill import file_sha256

    saved = load_checkpoint(student / "last.pth")
    record = saved["distill"]
    assert record["teacher"] == str(teacher[0].resolve()) and record["teacher_sha256"] == file_sha256(teacher[0])
    assert isinstance(record["teacher_ap"], float) and isinstance(record["student_ap"], float)
    assert record["losses"]["gt"] == 1.0 and record["losses"]["feature_steps"] == 3 * 3  # 3 epochs of 3 steps
    assert set(record["projector"]) == {"weight", "bias"} and record["projector"]["weight"].shape == (32, 32, 1, 1)
    assert record["init"] == "the teacher's blocks [1] (head: random)"  # same width, half the depth
    spec = saved["vitpose.model_spec"]  # inherited from the teacher: sizes, codec, K
    assert spec["decoder"] == "simple" and spec["depth"] == 1 and spec["embed_dim"] == 32
    assert tuple(spec["input_size"]) == (48, 64) and tuple(spec["heatmap_size"]) == (12, 16)
    assert "teacher" not in " ".join(saved["model"])  # the teacher's weights are not in the student's file


def test_the_student_starts_from_every_other_teacher_block():
    from vitpose.engine.distill import init_student, teacher_block_indices
    from vitpose.models.vitpose import build_model

    assert teacher_block_indices(6, 12) == [1, 3, 5, 7, 9, 11] and teacher_block_indices(1, 4) == [3]
    teacher = build_model("t", "simple", img_size=(64, 48), embed_dim=32, depth=4, num_heads=2)
    student = build_model("t", "simple", img_size=(64, 48), embed_dim=32, depth=2, num_heads=2)
    assert init_student(student, teacher, "auto") == "the teacher's blocks [1, 3] and head"
    for mine, theirs in ((student.backbone.blocks[0], teacher.backbone.blocks[1]),
                         (student.backbone.blocks[1], teacher.backbone.blocks[3]), (student.head, teacher.head)):
        assert all(torch.equal(a, b) for a, b in zip(mine.state_dict().values(), theirs.state_dict().values()))
    narrow = build_model("t", "simple", img_size=(64, 48), embed_dim=16, depth=2, num_heads=2)
    assert init_student(narrow, teacher, "auto").startswith("random initialisation")


def test_a_distillation_stopped_and_resumed_is_bit_identical(teacher, student, tmp_path):
    from test_train_resume import assert_bitwise_equal

    argv = distill_argv(teacher, tmp_path, "--set", "model.drop_path_rate=0.2")
    assert main([*argv, "--set", "train.stop_at_iteration=4"]) == 0  # mid-epoch 1 of 3
    assert load_checkpoint(tmp_path / "last.pth")["iteration"] == 4
    resumed = ["distill", *argv[3:], "--resume", "auto"]  # no --teacher: the checkpoint's record names it
    assert main(resumed) == 0
    a, b = load_checkpoint(student / "last.pth"), load_checkpoint(tmp_path / "last.pth")
    for key in ("model", "optimizer", "iteration", "epoch", "rng"):
        assert_bitwise_equal(a[key], b[key], key)
    assert_bitwise_equal(a["distill"]["projector"], b["distill"]["projector"], "projector")


def test_a_resume_refuses_a_teacher_that_changed(teacher, tmp_path, capsys):
    path, data = teacher
    copy = tmp_path / "teacher.pth"
    shutil.copy(path, copy)
    argv = distill_argv((copy, data), tmp_path / "run")
    assert main([*argv, "--set", "train.stop_at_iteration=1"]) == 0
    state = torch.load(copy, weights_only=True)
    state["epoch"] = 99  # another file at the recorded path
    torch.save(state, copy)
    capsys.readouterr()
    assert main([*argv, "--resume", "auto"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sha256" in err[0] and "distill.teacher" in err[0], err


def test_predict_takes_the_student_as_any_model(student, teacher, tmp_path):
    image = next((teacher[1] / "val2017").glob("*.jpg"))
    out = tmp_path / "poses.json"
    assert main(["predict", str(image), "--model", str(student / "last.pth"), "--detector", "full-frame",
                 "--device", "cpu", "--json", str(out)]) == 0
    people = json.loads(out.read_text())
    assert people and len(people[0]["keypoints"]) == 17 * 3


@pytest.mark.parametrize("argv, flag", [
    (["--teacher", "t.pth", "--no-such-flag"], "--no-such-flag"),
    (["--teacher", "t.pth", "--init", "best"], "--init"),
])
def test_bad_flags_are_refused_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as info:
        main(["distill", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and flag in err[-1] and "error:" in err[-1], err


@pytest.mark.parametrize("argv, flag", [
    ([], "--teacher"),
    (["--teacher", "t.pth", "--no-labels"], "--no-labels"),
    (["--teacher", "t.pth", "--unlabeled-boxes", "full-frame"], "--unlabeled-boxes"),
    (["--teacher", "t.pth", "--student", "vitpose-t", "--config", "demo"], "--student"),
    (["--teacher", "t.pth", "--epochs", "0"], "--epochs"),
    (["--teacher", "t.pth", "--batch-size", "0"], "--batch-size"),
    (["--teacher", "t.pth", "--workers", "-1"], "--workers"),
])
def test_inconsistent_flags_are_one_line(argv, flag, capsys):
    assert main(["distill", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err


def test_a_student_that_is_neither_a_size_nor_a_config_is_one_line(teacher, tmp_path, capsys):
    assert main(distill_argv(teacher, tmp_path, "--student", "vitpose-xs")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--student vitpose-xs" in err[0], err


def test_unlabelled_crops_weigh_nothing_in_the_ground_truth_loss(teacher):
    from vitpose.builders import build_train_set
    from vitpose.config import load_config
    from vitpose.data.mixed import MixedSet

    cfg = load_config("demo", [*TINY, f"data.root={teacher[1]}"])
    labelled, again = build_train_set(cfg), build_train_set(cfg)
    mixed = MixedSet([labelled, again], [True, False])
    assert len(mixed) == 2 * len(labelled)
    first, copy = mixed[(0, 0)], mixed[(len(labelled), 0)]
    assert first["keypoint_weights"].sum() > 0 and copy["keypoint_weights"].sum() == 0
    assert np.array_equal(np.asarray(first["image"]), np.asarray(copy["image"]))  # the same crop, unweighted


def test_the_teachers_keypoints_make_the_box_or_drop_it():
    from vitpose.distill.unlabelled import refined_instance

    keypoints = np.array([[10.0, 20.0], [30.0, 60.0], [20.0, 40.0], [0.0, 0.0]])
    box, flat = refined_instance(keypoints, np.array([0.9, 0.8, 0.7, 0.1]), (100, 100))
    assert box[0] < 10 and box[1] < 20 and box[0] + box[2] > 30 and box[1] + box[3] > 60
    assert flat[2::3] == [2, 2, 2, 0] and flat[9:11] == [0, 0]
    assert refined_instance(keypoints, np.array([0.9, 0.1, 0.1, 0.1]), (100, 100)) is None  # too few: not a person


def test_unlabelled_frames_alone_train_the_student(teacher, tmp_path, monkeypatch):
    """--no-labels --unlabeled DIR: the teacher finds the people (here: boxes from a detection file,
    refined by the teacher), and the student trains on them with no ground truth."""
    import vitpose.distill.unlabelled as U

    monkeypatch.setattr(U, "KEYPOINT_THRESHOLD", 0.0)  # a 2-epoch teacher is sure of nothing
    path, data = teacher
    boxes = data / "person_detection_results" / "train_detections.json"
    argv = distill_argv(teacher, tmp_path, "--no-labels", "--unlabeled", str(data / "train2017"),
                        "--unlabeled-boxes", str(boxes), "--epochs", "1")
    assert main(argv) == 0
    manifest = json.loads((tmp_path / "unlabeled" / "sets.json").read_text())
    coco = json.loads(Path(manifest[0]["annotations"]).read_text())
    assert len(coco["images"]) == 5 and coco["annotations"]
    record = load_checkpoint(tmp_path / "last.pth")["distill"]
    assert record["labelled"] is False and record["losses"]["gt"] == 0.0


@pytest.mark.slow  # two subprocess runs and a signal: ~30 s on 2 cores
def test_a_distillation_stopped_by_sigterm_and_resumed_equals_an_uninterrupted_one(teacher, student, tmp_path):
    from test_train_resume import assert_bitwise_equal

    argv = distill_argv(teacher, tmp_path, "--set", "model.drop_path_rate=0.2")
    command = [sys.executable, "-m", "vitpose", *argv]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    metrics = tmp_path / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.is_file() and sum('"train"' in line for line in metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    if code == 0:
        pytest.skip("the run finished before the signal came")
    assert code == 143
    assert main(["distill", *argv[3:], "--resume", "auto"]) == 0
    a, b = load_checkpoint(student / "last.pth"), load_checkpoint(tmp_path / "last.pth")
    for key in ("model", "optimizer", "iteration", "rng"):
        assert_bitwise_equal(a[key], b[key], key)


@pytest.mark.slow  # ONNX export with its gate, then int8 with its AP gate: ~20 s
def test_the_student_passes_the_export_and_int8_gates(student, teacher, tmp_path, monkeypatch):
    from vitpose.data.synthetic import make_coco
    from vitpose.inference import quantize as Q

    monkeypatch.setattr(Q, "GATE_BOOTSTRAP", 50)
    make_coco(tmp_path / "gate", 16, seed=5, split="val")  # the AP gate holds out at least 10 images
    assert main(["export", "--model", str(student / "last.pth"), "--out", str(tmp_path / "s.onnx")]) == 0
    assert main(["export", "--model", str(student / "last.pth"), "--out", str(tmp_path / "s.int8.onnx"),
                 "--precision", "int8", "--gate-data", str(tmp_path / "gate")]) == 0
    assert main(["predict", str(next((teacher[1] / "val2017").glob("*.jpg"))), "--model", str(tmp_path / "s.int8.onnx"),
                 "--detector", "full-frame", "--json", str(tmp_path / "p.json")]) == 0


@pytest.mark.slow  # the full vitpose-t (192 wide, 12 blocks, 256x192) through both export gates: ~1 min
def test_vitpose_t_passes_the_export_and_int8_gates(tmp_path, monkeypatch):
    import vitpose
    from vitpose.data.synthetic import make_coco
    from vitpose.inference import quantize as Q

    monkeypatch.setattr(Q, "GATE_BOOTSTRAP", 50)
    torch.manual_seed(0)
    weights = vitpose.save_weights(vitpose.build_model("vitpose-t", "simple").eval(), tmp_path / "t.safetensors")
    make_coco(tmp_path / "gate", 16, seed=5, split="val", image_size=(256, 320))
    assert main(["export", "--model", str(weights), "--out", str(tmp_path / "t.onnx")]) == 0
    assert main(["export", "--model", str(weights), "--out", str(tmp_path / "t.int8.onnx"), "--precision", "int8",
                 "--gate-data", str(tmp_path / "gate")]) == 0


def test_the_student_inherits_the_teachers_sizes_whatever_its_config(teacher):
    from vitpose.config import ConfigError
    from vitpose.distill.run import DistillOptions, distill_config

    path, data = teacher
    cfg = distill_config(DistillOptions(teacher=str(path), student="demo", data=str(data)))
    assert cfg.model.extra["embed_dim"] == 128 and cfg.model.decoder == "classic"  # the student config's model
    assert tuple(cfg.model.input_size) == (48, 64) and tuple(cfg.model.heatmap_size) == (12, 16)  # the teacher's
    assert cfg.model.sigma == 1.0 and cfg.data.root == str(data) and cfg.data.synthetic_train_images == 0
    size = distill_config(DistillOptions(teacher=str(path), student="t", data=str(data)))
    assert size.model.name == "vitpose-t" and size.model.decoder == "simple" and size.model.extra == {}
    assert size.optim.lr == cfg.optim.lr and size.train.work_dir == "work_dirs/distill"  # the teacher's recipe
    with pytest.raises(ConfigError, match="model.input_size: the student inherits the teacher's"):
        distill_config(DistillOptions(teacher=str(path), data=str(data), overrides=("model.input_size=[96, 128]",)))


def test_a_videos_frames_become_unlabelled_instances(teacher, tmp_path, monkeypatch):
    """Every `frame_step`-th frame of a video is saved under the work dir and gets its people (here
    the whole frame, refined by the teacher); the same sources and teacher reuse the files."""
    import cv2

    import vitpose.distill.unlabelled as U
    from vitpose.distill.run import DistillOptions, distill_config

    monkeypatch.setattr(U, "KEYPOINT_THRESHOLD", 0.0)  # a 2-epoch teacher is sure of nothing
    video = tmp_path / "walk.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (96, 128))
    for i in range(5):
        writer.write(np.full((128, 96, 3), 40 * i, np.uint8))
    writer.release()
    cfg = distill_config(DistillOptions(teacher=str(teacher[0]), data=str(teacher[1]), unlabeled=(str(video),),
                                        work_dir=str(tmp_path / "run"), overrides=("distill.frame_step=2",)))
    manifest = U.prepare_unlabelled(cfg)
    entry = json.loads(manifest.read_text())[0]
    coco = json.loads(Path(entry["annotations"]).read_text())
    assert [im["file_name"] for im in coco["images"]] == [f"walk_{i:06d}.jpg" for i in (0, 2, 4)]
    assert all((Path(entry["images"]) / im["file_name"]).is_file() for im in coco["images"])
    assert len(coco["annotations"]) == 3  # one person a frame: full-frame boxes
    monkeypatch.setattr(U, "pseudo_coco", lambda *a: pytest.fail("the prepared files were not reused"))
    assert U.prepare_unlabelled(cfg) == manifest


def test_a_distillation_with_amp_learns_with_finite_losses(teacher, tmp_path):
    """--amp (bf16 autocast on a CPU) through the teacher, the projector and the three losses: every
    logged loss finite, the student's weights kept in float32, its file scored."""
    assert main(distill_argv(teacher, tmp_path, "--amp")) == 0
    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert losses and all(np.isfinite(losses)), losses
    saved = load_checkpoint(tmp_path / "last.pth")
    assert saved["distill"]["student_ap"] is not None
    assert all(t.dtype == torch.float32 for t in saved["model"].values() if t.is_floating_point())
