"""Non-finite losses, precision choice, checkpoint plumbing, train.log and a terminal that goes away, --detach."""

import errno
import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import train
from vitpose.engine import runtime, trainer
from vitpose.engine.checkpoint import (
    clean_state_dict,
    load_checkpoint,
    model_state_dict,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from vitpose.engine.precision import cpu_has_native_bf16, resolve_precision

TINY = [
    "model.input_size=[48, 64]", "model.heatmap_size=[12, 16]", "model.sigma=1.0",
    "model.extra={embed_dim: 32, depth: 2, num_heads: 2, deconv_channels: [16, 16]}",
    "data.synthetic_train_images=5", "data.synthetic_val_images=2", "loader.batch_size=3",
    "train.val_every=1000", "train.log_every=1", "train.checkpoint_minutes=0", "train.tensorboard=false",
]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic")


def tiny_args(data_root, work_dir, *extra):
    args = ["--demo", "--data-root", str(data_root), "--work-dir", str(work_dir), "--workers", "0"]
    for s in TINY:
        args += ["--set", s]
    return args + list(extra)


class NaNAt:
    """The real loss, except NaN on the listed 0-based calls."""

    def __init__(self, calls):
        self.calls, self.n = set(calls), 0

    def __call__(self, pred, target, weights):
        loss = trainer.KeypointMSELoss()(pred, target, weights)
        self.n += 1
        return loss * float("nan") if self.n - 1 in self.calls else loss


def test_nonfinite_losses_in_a_row_save_and_stop(data_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(trainer, "keypoint_mse_loss", NaNAt(range(10**6)))
    code = train.main(tiny_args(data_root, tmp_path, "--epochs", "5", "--set", "train.max_nonfinite=3"))
    assert code == train.EXIT_NONFINITE == 3
    out = capsys.readouterr().out
    assert "non-finite loss at iteration 0" in out and "stopping: 3 non-finite losses in a row" in out
    state = load_checkpoint(tmp_path / "last.pth")
    assert state["iteration"] == 3
    assert state["optimizer"]["state"] == {}  # no step was taken: the weights are the initial ones
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


def test_a_single_nonfinite_loss_is_skipped(data_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(trainer, "keypoint_mse_loss", NaNAt({1}))
    assert train.main(tiny_args(data_root, tmp_path, "--epochs", "1")) == 0
    assert "non-finite loss at iteration 1" in capsys.readouterr().out
    state = load_checkpoint(tmp_path / "last.pth")
    assert state["iteration"] == 3
    step = {int(s["step"]) for s in state["optimizer"]["state"].values()}
    assert step == {2}  # AdamW stepped on iterations 0 and 2 only
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


def test_precision_choices():
    cpu = torch.device("cpu")
    assert resolve_precision(cpu, amp=False).name == "fp32"
    p = resolve_precision(cpu, amp=True)  # CPU: bf16 autocast where native, else fp32; never a scaler
    assert p.scaler is None
    if cpu_has_native_bf16():
        assert p.dtype is torch.bfloat16 and "bfloat16" in p.note
    else:
        assert p.dtype is None and "no native bf16" in p.note
    forced = resolve_precision(cpu, amp=True, amp_dtype="bfloat16")
    assert forced.dtype is torch.bfloat16 and forced.note == ""
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        resolve_precision(cpu, amp=True, amp_dtype="int8")


def test_state_dicts_never_carry_wrapper_prefixes():
    class Compiled(torch.nn.Module):  # torch.compile's OptimizedModule keeps the model as `_orig_mod`
        def __init__(self, model):
            super().__init__()
            self._orig_mod = model

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    compiled = Compiled(model)
    assert any(k.startswith("_orig_mod.") for k in compiled.state_dict())
    assert list(model_state_dict(compiled)) == ["0.weight", "0.bias"]
    assert list(clean_state_dict({"module._orig_mod.0.weight": 1})) == ["0.weight"]


def test_rng_state_round_trips_through_weights_only(tmp_path):
    import random

    import numpy as np

    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.randn()  # leaves a cached Gaussian in numpy's legacy state
    path = save_checkpoint({"rng": rng_state()}, tmp_path / "r.pth")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(torch.load(path, weights_only=True)["rng"])
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and (expected[1] == again[1]).all() and expected[2] == again[2]


def test_failed_save_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.pth"
    save_checkpoint({"v": torch.ones(2)}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full (simulated)")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint({"v": Unpicklable()}, path)
    assert torch.equal(torch.load(path, weights_only=True)["v"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pth"]  # no temporary file left


class DeadTerminal(io.StringIO):
    def __init__(self, err):
        super().__init__()
        self.err = err
        self.writes = 0

    def write(self, text):
        self.writes += 1
        raise OSError(self.err, os.strerror(self.err))

    def flush(self):
        raise OSError(self.err, os.strerror(self.err))


STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  ")


def log_lines(path):
    """train.log without the timestamps (checking that every non-blank line has one)."""
    lines = path.read_text().splitlines()
    assert all(STAMP.match(line) or not line for line in lines), [x for x in lines if x and not STAMP.match(x)][:3]
    return [STAMP.sub("", line) for line in lines]


@pytest.mark.parametrize("err", [errno.EIO, errno.EPIPE])
def test_output_outlives_a_dead_terminal(tmp_path, err):
    log = tmp_path / "train.log"
    terminal = DeadTerminal(err)
    out = runtime.RunOutput(terminal, log, stderr=DeadTerminal(err))
    out.stdout.write("epoch 1 done\n")
    out.stdout.flush()
    print("still going", file=out.stdout)
    print("a warning", file=out.stderr)
    out.close()
    assert terminal.writes == 1  # after the first failure the terminal is left alone
    lost = f"{type(OSError(err, '')).__name__}: [Errno {err}] {os.strerror(err)}); the run continues, writing to train.log"
    assert log_lines(log) == [  # each line once; the note about stderr waits for the end of its line
        "epoch 1 done", f"terminal output stopped (stdout: {lost}", "still going", "a warning",
        f"terminal output stopped (stderr: {lost}"]


def test_output_does_not_hide_other_errors(tmp_path):
    out = runtime.RunOutput(DeadTerminal(errno.ENOSPC), tmp_path / "train.log")
    with pytest.raises(OSError):
        out.stdout.write("x")
    out.close()


def test_detached_output_writes_each_line_once(tmp_path):
    # Detached, stdout and stderr are train.log itself: RunOutput must not add a second copy.
    log = tmp_path / "train.log"
    with open(log, "a") as stdout:
        out = runtime.RunOutput(stdout, log, stderr=stdout)
        assert out.terminal is None and not out.interactive
        out.say("one")
        print("two", file=out.stdout)
        print("three", file=out.stderr)
        out.note("four")
        out.close()
    assert log_lines(log) == ["one", "two", "three", "four"]


def test_a_crash_lands_in_the_log(tmp_path, capsys):
    log = tmp_path / "train.log"
    with pytest.raises(RuntimeError, match="boom"), runtime.run_guard(log):
        print("working")
        raise RuntimeError("boom")
    text = "\n".join(log_lines(log))
    assert text.startswith("working\nTraceback (most recent call last):") and text.endswith("RuntimeError: boom")
    assert capsys.readouterr().out == "working\n"
    assert not isinstance(sys.stdout, runtime._Tee)  # the streams are back


def test_a_detached_crash_lands_in_the_log_once(tmp_path):
    log = tmp_path / "train.log"
    code = ("import sys; from vitpose.engine import runtime\n"
            f"with runtime.run_guard({str(log)!r}):\n    print('working')\n    raise RuntimeError('boom')\n")
    with open(log, "ab") as out:  # as `detach` starts the run
        proc = subprocess.run([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    assert proc.returncode == 1
    text = log.read_text()
    assert text.count("working") == 1 and text.count("RuntimeError: boom") == 1, text


def test_foreground_run_logs_every_line_once(data_root, tmp_path, capsys):
    assert train.main(tiny_args(data_root, tmp_path, "--epochs", "2", "--set", "train.val_every=1")) == 0
    captured = capsys.readouterr()
    printed = captured.out.splitlines() + captured.err.splitlines()
    logged = log_lines(tmp_path / "train.log")
    assert sorted(logged) == sorted(printed)  # every line of the terminal, once in the log
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(x.startswith("Epoch ") for x in logged) == sum(r["kind"] == "train" for r in records) == 6
    assert sum(x.startswith("Eval epoch") for x in logged) == 2 and sum(x.startswith("config ") for x in logged) == 1


def test_strip_flags():
    argv = ["--detach", "--nproc-per-node", "4", "--amp", "--nproc-per-node=2", "--set", "a.b=1"]
    assert runtime.strip_flags(argv, {"--detach": 0, "--nproc-per-node": 1}) == ["--amp", "--set", "a.b=1"]


def test_detach_runs_in_a_new_session_with_output_in_the_log(tmp_path):
    log = tmp_path / "train.log"
    code = "import os, sys; print('sid', os.getsid(0) == os.getpid(), 'stdin', sys.stdin.read() == '')"
    pid = runtime.detach([sys.executable, "-c", code], log)
    assert os.waitpid(pid, 0)[1] == 0
    first, second = log.read_text().splitlines()
    assert STAMP.match(first) and first.endswith(f"detached start: {sys.executable} -c {shlex.quote(code)}")
    assert second == "sid True stdin True"


def test_train_detach_prints_pid_and_log(data_root, tmp_path, capsys):
    assert train.main(tiny_args(data_root, tmp_path, "--epochs", "1", "--detach")) == 0
    out = capsys.readouterr().out
    pid = int(out.split("PID ")[1].split(";")[0])
    assert str((tmp_path / "train.log").resolve()) in out
    assert os.waitpid(pid, 0)[1] == 0
    deadline = time.monotonic() + 5
    while "done:" not in (tmp_path / "train.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = (tmp_path / "train.log").read_text()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # stdout is train.log: each line once (no second copy from the run's own output)
    assert text.count("done:") == 1 and text.count("\nconfig ") == 0 and text.count("  config ") == 1
    assert text.count("Epoch 0 [") == sum(r["kind"] == "train" for r in records) == 3
    assert load_checkpoint(tmp_path / "last.pth")["epoch"] == 1


def test_gradient_accumulation_matches_the_large_batch(data_root, tmp_path):
    # Simple decoder (no BatchNorm, whose batch statistics would differ) and no drop path: two
    # micro-batches of 2 must give the step of one batch of 4 (same samples, same order).
    common = ["--epochs", "1", "--set", "model.decoder=simple", "--set", "model.drop_path_rate=0.0"]
    big, small = tmp_path / "big", tmp_path / "small"
    assert train.main(tiny_args(data_root, big, *common, "--set", "loader.batch_size=4")) == 0
    assert train.main(tiny_args(data_root, small, *common, "--set", "loader.batch_size=2",
                                "--set", "optim.accum_steps=2")) == 0
    a, b = load_checkpoint(big / "last.pth"), load_checkpoint(small / "last.pth")
    assert a["iteration"] == b["iteration"] == 2
    for name, value in a["model"].items():
        torch.testing.assert_close(b["model"][name], value, rtol=1e-4, atol=1e-6, msg=name)
    # Adam hides a gradient scale error; the logged gradient norm and loss do not.
    logs = [[json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()] for d in (big, small)]
    steps = [[(r["loss"], r["grad_norm"]) for r in log if r["kind"] == "train"] for log in logs]
    assert len(steps[0]) == len(steps[1]) == 2
    for (loss_a, norm_a), (loss_b, norm_b) in zip(*steps):
        assert loss_b == pytest.approx(loss_a, rel=1e-4) and norm_b == pytest.approx(norm_a, rel=1e-4)


def test_freeze_settings_that_cannot_help_are_warned(data_root, tmp_path, capsys):
    # A backbone frozen for the whole run never trains; a frozen random backbone keeps random
    # features. Both pass silently otherwise (N25).
    from vitpose.config import load_config
    from vitpose.engine.session import freeze_warnings

    def warnings(*overrides):
        return freeze_warnings(load_config(REPO / "configs" / "demo.yaml", list(overrides)))

    assert warnings() == []
    assert warnings("train.freeze_backbone_epochs=1", "model.init=vitpose-s", "schedule.epochs=2") == []
    (never,) = warnings("train.freeze_backbone_epochs=5", "model.init=vitpose-s", "schedule.epochs=2")
    assert "train.freeze_backbone_epochs=5" in never and "schedule.epochs=2" in never and "never trains" in never
    (never,) = warnings("train.freeze_backbone_epochs=3", "model.pretrained=mae.pth", "schedule.epochs=3")
    assert "never trains" in never
    (random_backbone,) = warnings("train.freeze_backbone_epochs=1", "schedule.epochs=2")
    assert "randomly initialised backbone" in random_backbone and "--init" in random_backbone
    assert len(warnings("train.freeze_backbone_epochs=2", "schedule.epochs=2")) == 2

    args = ["--demo", "--data-root", str(data_root), "--work-dir", str(tmp_path / "w"), "--epochs", "1",
            "--workers", "0", "--set", "train.freeze_backbone_epochs=1", "--set", "train.stop_at_iteration=1"]
    for s in TINY:
        args += ["--set", s]
    assert train.main(args) == 0
    err = capsys.readouterr().err
    assert err.count("warning: train.freeze_backbone_epochs=1") == 2, err  # both, once each
