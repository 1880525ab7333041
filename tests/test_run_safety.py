"""Issue #10 regressions: a run is never lost, never silently rewound, and never misreported.

Each test names the failure it guards against; each fails on the code before the fix.
"""

import errno
import fcntl
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import train
from vitpose.config import ConfigError, load_config
from vitpose.engine import checkpoint as ckpt
from vitpose.engine.checkpoint import CheckpointSaveError, find_resume_checkpoint, load_checkpoint, save_checkpoint
from vitpose.engine.workdir import WorkDirError, claim_work_dir

TINY = [
    "model.input_size=[48, 64]", "model.heatmap_size=[12, 16]", "model.sigma=1.0",
    "model.extra={embed_dim: 32, depth: 2, num_heads: 2, deconv_channels: [16, 16]}",
    "data.synthetic_train_images=5", "data.synthetic_val_images=2",
    "loader.batch_size=3", "loader.val_batch_size=8",
    "schedule.warmup_iters=4", "schedule.milestones=[1]",
    "train.log_every=1", "train.checkpoint_minutes=0", "train.tensorboard=false",
]


def tiny_args(data_root, work_dir, *extra, epochs=2):
    args = ["--demo", "--data-root", str(data_root), "--work-dir", str(work_dir), "--epochs", str(epochs),
            "--workers", "0"]
    for s in TINY:
        args += ["--set", s]
    return args + list(extra)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic")


@pytest.fixture(scope="module")
def finished(data_root, tmp_path_factory):
    """An uninterrupted 2-epoch run (3 steps per epoch), validating after each epoch."""
    work = tmp_path_factory.mktemp("finished")
    assert train.main(tiny_args(data_root, work, "--set", "train.val_every=1", "--set", "train.keep_every=1")) == 0
    return work


def eval_epochs(work_dir):
    import json

    return [r["epoch"] for r in map(json.loads, (Path(work_dir) / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "eval"]


# ---- work dir safety -------------------------------------------------------------------------

def test_fresh_start_in_a_used_work_dir_is_refused(data_root, finished, tmp_path, capsys):
    shutil.copytree(finished, tmp_path, dirs_exist_ok=True)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.pth")}
    config = (tmp_path / "config.yaml").read_bytes()
    assert train.main(tiny_args(data_root, tmp_path)) == train.EXIT_USAGE
    err = capsys.readouterr().err
    assert "already holds a run's checkpoints" in err and "--resume auto" in err and "--overwrite" in err
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.pth")} == before
    assert (tmp_path / "config.yaml").read_bytes() == config
    # --detach is refused in the foreground too, before anything starts in the background
    assert train.main(tiny_args(data_root, tmp_path, "--detach")) == train.EXIT_USAGE
    # --overwrite is the explicit way to start over
    assert train.main(tiny_args(data_root, tmp_path, "--overwrite", epochs=1)) == 0
    assert load_checkpoint(tmp_path / "last.pth")["iteration"] == 3


def test_two_runs_cannot_share_a_work_dir(tmp_path):
    """A second process is refused while the first holds the lock; a dead owner's lock is taken over."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[1])\n"
        "from vitpose.engine.workdir import claim_work_dir\n"
        "with claim_work_dir(sys.argv[2], None):\n"
        "    print('locked', flush=True); time.sleep(60)\n"), str(REPO), str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(WorkDirError, match=f"in use by another run \\(pid {holder.pid} "):
            with claim_work_dir(tmp_path, None):
                pass
    finally:
        holder.kill()
        holder.wait()
    said = []
    with claim_work_dir(tmp_path, None, say=said.append):  # kill -9 left the file, but not the flock
        pass
    assert said and f"pid {holder.pid}" in said[0] and "gone" in said[0]


def test_temp_files_of_interrupted_saves_are_removed_at_start(tmp_path):
    stale = [tmp_path / ".last.pth.abc123.tmp", tmp_path / ".config.yaml.x1.tmp"]
    for p in stale:
        p.write_bytes(b"\0" * 1000)
    keep = tmp_path / "notes.tmp"
    keep.write_text("not ours")
    said = []
    with claim_work_dir(tmp_path, "auto", say=said.append):
        pass
    assert not any(p.exists() for p in stale) and keep.exists()
    assert "removed 2 temp file(s)" in said[0]


def test_another_model_size_is_one_line_and_config_yaml_is_kept(data_root, finished, tmp_path, capsys):
    shutil.copytree(finished, tmp_path, dirs_exist_ok=True)
    config = (tmp_path / "config.yaml").read_bytes()
    bigger = tiny_args(data_root, tmp_path, "--resume", "auto", "--set",
                       "model.extra={embed_dim: 64, depth: 2, num_heads: 2, deconv_channels: [16, 16]}", epochs=3)
    assert train.main(bigger) == train.EXIT_USAGE
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err[0].startswith("train.py: error: ") and "holds another model" in err[0] and "size mismatch" not in err[0]
    assert "differ in shape" in err[0] and "last.pth" in err[0]
    assert len(err) == 1  # one line; --debug shows the traceback instead
    assert (tmp_path / "config.yaml").read_bytes() == config


# ---- checkpoint order and choice -------------------------------------------------------------

def test_saves_come_in_resume_safe_order(data_root, tmp_path, monkeypatch):
    """last.pth (the resume point) before validation; best/epoch_N before the last.pth recording them."""
    order = []
    real = ckpt.save_checkpoint

    def recording(state, path):
        order.append((Path(path).name, state["epoch_end_pending"], state["best_epoch"]))
        return real(state, path)

    monkeypatch.setattr(ckpt, "save_checkpoint", recording)
    events = []
    real_predict = __import__("vitpose.engine.evaluate", fromlist=["predict"]).predict

    def predict(*a, **k):
        events.append(len(order))
        return real_predict(*a, **k)

    monkeypatch.setattr("vitpose.engine.evaluate.predict", predict)
    args = tiny_args(data_root, tmp_path, "--set", "train.val_every=1", "--set", "train.keep_every=1", epochs=1)
    assert train.main(args) == 0
    assert order == [("last.pth", True, None), ("best.pth", False, 1), ("epoch_1.pth", False, 1),
                     ("last.pth", False, 1)]
    assert events == [1]  # validation ran after the first last.pth


def test_a_crash_in_validation_keeps_the_epoch_and_resume_validates(data_root, finished, tmp_path, monkeypatch):
    import vitpose.engine.evaluate as ev

    real_predict = ev.predict

    def broken(*a, **k):
        raise OSError(errno.EIO, "validation image unreadable")

    monkeypatch.setattr(ev, "predict", broken)
    args = tiny_args(data_root, tmp_path, "--set", "train.val_every=1", "--set", "train.keep_every=1")
    assert train.main(args) == 70  # not a UserError: its traceback and vitpose.errors.EXIT_INTERNAL
    saved = load_checkpoint(tmp_path / "last.pth")
    assert (saved["epoch"], saved["batch"], saved["iteration"], saved["epoch_end_pending"]) == (1, 0, 3, True)
    monkeypatch.setattr(ev, "predict", real_predict)
    assert train.main([*args, "--resume", "auto"]) == 0
    resumed, reference = load_checkpoint(tmp_path / "last.pth"), load_checkpoint(finished / "last.pth")
    assert resumed["best_ap"] == reference["best_ap"] and resumed["best_epoch"] == reference["best_epoch"]
    assert eval_epochs(tmp_path) == eval_epochs(finished) == [0, 1]
    assert sorted(p.name for p in tmp_path.glob("*.pth")) == sorted(p.name for p in finished.glob("*.pth"))
    for name in ("model",):
        for k, v in reference[name].items():
            assert torch.equal(resumed[name][k], v), k


@pytest.mark.parametrize("stop_at", [3, 6], ids=["epoch-last-step", "run-last-step"])
def test_a_stop_on_an_epochs_last_step_still_runs_its_end(data_root, finished, tmp_path, stop_at):
    args = tiny_args(data_root, tmp_path, "--set", "train.val_every=1", "--set", "train.keep_every=1")
    assert train.main([*args, "--set", f"train.stop_at_iteration={stop_at}"]) == 0
    assert load_checkpoint(tmp_path / "last.pth")["epoch_end_pending"] is True
    assert train.main([*args, "--resume", "auto"]) == 0
    resumed, reference = load_checkpoint(tmp_path / "last.pth"), load_checkpoint(finished / "last.pth")
    assert eval_epochs(tmp_path) == eval_epochs(finished)
    assert resumed["best_ap"] == reference["best_ap"] and resumed["iteration"] == reference["iteration"]
    assert sorted(p.name for p in tmp_path.glob("*.pth")) == sorted(p.name for p in finished.glob("*.pth"))


def test_resume_auto_follows_recorded_progress_not_mtime(data_root, finished, tmp_path):
    shutil.copytree(finished, tmp_path, dirs_exist_ok=True)
    epoch1 = tmp_path / "epoch_1.pth"
    future = time.time() + 3600
    os.utime(epoch1, (future, future))  # `touch`, a restore from backup, rsync without times
    path, state = find_resume_checkpoint(tmp_path)
    assert path.name == "last.pth" and state["iteration"] == 6


def test_resume_ties_go_to_last_pth(tmp_path):
    for name, pending in (("best.pth", False), ("last.pth", True), ("epoch_2.pth", False)):
        save_checkpoint({"model": {}, "optimizer": {}, "epoch": 2, "batch": 0, "iteration": 6,
                         "epoch_end_pending": pending}, tmp_path / name)
    path, state = find_resume_checkpoint(tmp_path)
    assert path.name == "last.pth" and state["epoch_end_pending"] is True


def test_keep_last_bounds_epoch_checkpoints(data_root, tmp_path):
    args = tiny_args(data_root, tmp_path, "--set", "train.val_every=100", "--set", "train.keep_every=1",
                     "--set", "train.keep_last=2", epochs=3)
    assert train.main(args) == 0
    assert sorted(p.name for p in tmp_path.glob("epoch_*.pth")) == ["epoch_2.pth", "epoch_3.pth"]


def test_checkpoints_are_group_readable_like_the_logs(data_root, finished):
    log_mode = (finished / "train.log").stat().st_mode & 0o777
    for p in finished.glob("*.pth"):
        assert p.stat().st_mode & 0o777 == log_mode, p
    assert (finished / "config.yaml").stat().st_mode & 0o777 == log_mode


# ---- fail early ------------------------------------------------------------------------------

@pytest.mark.parametrize("override, key", [
    ("train.val_every=0", "train.val_every"), ("optim.accum_steps=0", "optim.accum_steps"),
    ("schedule.epochs=0", "schedule.epochs"), ("optim.lr=0", "optim.lr"), ("optim.lr=-1e-3", "optim.lr"),
    ("loader.batch_size=0", "loader.batch_size"), ("train.log_every=0", "train.log_every"),
    ("train.keep_last=0", "train.keep_last"), ("data.check_val_images=some", "data.check_val_images"),
])
def test_out_of_range_values_fail_before_any_work(override, key):
    with pytest.raises(ConfigError, match=f"^{key} = "):
        load_config(REPO / "configs" / "demo.yaml", [override])


def test_epochs_zero_on_the_command_line_is_an_error(data_root, tmp_path, capsys):
    assert train.main(tiny_args(data_root, tmp_path, epochs=0)) == train.EXIT_USAGE
    assert "schedule.epochs = 0: must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "last.pth").exists()


def test_yaml_syntax_error_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  name: vitpose-s\n  input_size: [192, 256\ntrain:\n  seed: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert str(bad) in str(e.value) and "line " in str(e.value) and "<unicode string>" not in str(e.value)


def test_a_corrupt_validation_image_stops_the_run_before_training(data_root, finished, tmp_path, capsys):
    root = tmp_path / "data"
    shutil.copytree(data_root, root)
    image = sorted((root / "val2017").glob("*.jpg"))[0]
    image.write_bytes(image.read_bytes()[:500])  # truncated JPEG
    args = tiny_args(root, tmp_path / "run")
    assert train.main(args) == train.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("train.py: error: ") and image.name in err
    assert not (tmp_path / "run" / "last.pth").exists()  # no step was trained
    with pytest.raises(Exception, match=image.name):
        train.main([*args, "--overwrite", "--debug"])


def test_mid_epoch_resume_with_a_larger_batch_converts_by_samples(data_root, tmp_path, capsys):
    # 8 people: batch 2 -> 4 batches per epoch; stop after 3 batches (6 samples).
    small = tiny_args(data_root, tmp_path, "--set", "loader.batch_size=2", "--set", "train.stop_at_iteration=3",
                      "--set", "train.val_every=100")
    assert train.main(small) == 0
    assert load_checkpoint(tmp_path / "last.pth")["batch"] == 3
    larger = tiny_args(data_root, tmp_path, "--set", "loader.batch_size=4", "--set", "train.val_every=100",
                       "--resume", "auto")
    assert train.main(larger) == 0
    assert "6 samples, so the epoch continues at batch 1" in capsys.readouterr().out
    final = load_checkpoint(tmp_path / "last.pth")
    assert (final["epoch"], final["batch"], final["iteration"]) == (2, 0, 3 + 1 + 2)


# ---- one-line errors -------------------------------------------------------------------------

def test_disk_full_while_saving_is_one_line_and_keeps_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "last.pth"
    save_checkpoint({"model": {}, "optimizer": {}, "epoch": 0, "batch": 1, "iteration": 1}, target)
    good = target.read_bytes()

    def full(obj, f, *a, **k):
        f.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:783] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed; unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointSaveError) as e:
        save_checkpoint({"model": {}, "optimizer": {}, "epoch": 0, "batch": 2, "iteration": 2}, target)
    text = str(e.value)
    assert str(target) in text and "disk full" in text and "GiB free" in text and "intact" in text
    assert "--resume auto" in text and "\n" not in text
    assert target.read_bytes() == good and not list(tmp_path.glob(".*.tmp"))


def test_enospc_is_recognised_too(tmp_path, monkeypatch):
    def full(obj, f, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointSaveError, match="disk full"):
        save_checkpoint({"x": 1}, tmp_path / "best.pth")


@pytest.mark.parametrize("content, looks", [
    (b"", "empty file"), (random.Random(7).randbytes(4096), "unrecognised bytes"),
    (b"<!DOCTYPE html><html><body>404</body></html>", "HTML page"),
], ids=["empty", "random", "html"])
def test_evaluate_on_a_corrupt_checkpoint_names_the_file(data_root, finished, tmp_path, capsys, content, looks):
    import evaluate

    bad = tmp_path / "model.pth"
    bad.write_bytes(content)
    code = evaluate.main(["--config", str(REPO / "configs" / "demo.yaml"), "--checkpoint", str(bad),
                          "--data-root", str(data_root)])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and looks in err[0]


def test_a_truncated_training_checkpoint_is_described(data_root, finished, tmp_path):
    data = (finished / "last.pth").read_bytes()
    cut = tmp_path / "last.pth"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ckpt.CheckpointError, match="truncated"):
        load_checkpoint(cut)


def test_resume_of_a_path_that_does_not_exist_is_one_line(data_root, tmp_path, capsys):
    assert train.main(tiny_args(data_root, tmp_path, "--resume", str(tmp_path / "nope.pth"))) == train.EXIT_USAGE
    assert "checkpoint not found" in capsys.readouterr().err


def test_lock_is_released_after_the_run(data_root, finished):
    fd = os.open(finished / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # would raise if a run still held it
    finally:
        os.close(fd)


# ---- evaluation of a broken model ------------------------------------------------------------

def test_a_model_that_decodes_nan_validates_to_zero_without_stopping(data_root, tmp_path, monkeypatch, capsys):
    """Constant heatmaps decode to NaN keypoints: AP 0 (not the 0.39 plain pycocotools gives), said, run goes on."""
    import warnings

    import vitpose.engine.evaluate as ev

    real = ev.forward_heatmaps
    monkeypatch.setattr(ev, "forward_heatmaps", lambda *a, **k: torch.zeros_like(real(*a, **k)))
    args = tiny_args(data_root, tmp_path, "--set", "train.val_every=1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert train.main(args) == 0
    out = capsys.readouterr().out
    assert "validation predictions have non-finite keypoints or scores; scored as misses" in out
    assert load_checkpoint(tmp_path / "last.pth")["best_ap"] == 0.0


# ---- workers, skip warnings, dropped records -------------------------------------------------

def test_skipped_training_images_are_summed_per_epoch_into_train_log(data_root, finished, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_root, root)
    bad = sorted((root / "train2017").glob("*.jpg"))[0]
    bad.write_bytes(b"not a jpeg")
    assert train.main(tiny_args(root, tmp_path / "run", epochs=1)) == 0
    log = (tmp_path / "run" / "train.log").read_text()
    assert "unreadable training image(s) skipped" in log and "epoch 0: " in log
    assert "skipping unreadable image" in log and bad.name in log  # the warning itself names the file


def test_dropped_record_counts_are_printed_at_start(data_root, tmp_path, capsys):
    assert train.main(tiny_args(data_root, tmp_path, epochs=1)) == 0
    out = capsys.readouterr().out
    assert "training set: 8 instances from" in out and "records dropped:" in out
    assert "validation set: " in out


def test_ctrl_c_to_the_process_group_saves_and_exits_cleanly(data_root, tmp_path):
    """SIGINT reaches the loader workers too (same process group): they ignore it, main saves."""
    import signal

    # Accumulating over 3 batches, the step in flight when Ctrl-C comes still needs batches from
    # the workers; a worker that died of the SIGINT would break it (and so the save).
    args = tiny_args(data_root, tmp_path, "--set", "optim.accum_steps=3", "--set", "loader.batch_size=1",
                     epochs=50)
    args[args.index("--workers") + 1] = "2"
    proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("Epoch 0 [2/"):  # training is under way, workers are up
            break
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    text = "".join(lines) + rest
    assert proc.returncode == 130, text[-3000:]  # saved, then 128 + SIGINT
    assert "stopped by SIGINT" in text and "Traceback" not in text
    # Only the main process acts on it: one announcement, not one per worker process.
    assert text.count("SIGINT received") == 1, text[-3000:]
    saved = load_checkpoint(tmp_path / "last.pth")
    assert saved["iteration"] >= 2


def test_a_resume_with_another_world_size_says_it_is_not_exact(data_root, tmp_path, capsys):
    """Checkpoints record the processes that wrote them; a mid-epoch resume with another world size
    says which samples it cannot place, and an epoch-boundary resume (exact with any) says nothing."""
    assert train.main(tiny_args(data_root, tmp_path, "--set", "train.stop_at_iteration=1")) == 0
    saved = load_checkpoint(tmp_path / "last.pth")
    assert saved["world_size"] == 1 and saved["batch"] == 1  # one process, stopped inside epoch 0
    capsys.readouterr()
    assert train.main(tiny_args(data_root, tmp_path, "--resume", "auto", "--set", "train.stop_at_iteration=2")) == 0
    assert "saved by" not in capsys.readouterr().out  # the same world size: exact, no note
    saved = load_checkpoint(tmp_path / "last.pth")
    saved["world_size"] = 4  # as if four ranks had written it
    torch.save(saved, tmp_path / "last.pth")
    train.main(tiny_args(data_root, tmp_path, "--resume", "auto", "--set", "train.stop_at_iteration=3"))
    out = capsys.readouterr().out
    assert "saved by 4 process(es), this run has 1" in out and "an exact resume needs 4 processes" in out, out
