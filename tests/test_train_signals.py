"""A run stopped by SIGTERM (after ignoring SIGHUP) saves a loadable checkpoint and exits 143; a terminal
that goes away does not stop it."""

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from vitpose.engine.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[1]

TINY = [
    "model.input_size=[48, 64]", "model.heatmap_size=[12, 16]", "model.sigma=1.0",
    "model.extra={embed_dim: 32, depth: 2, num_heads: 2, deconv_channels: [16, 16]}",
    "data.synthetic_train_images=5", "data.synthetic_val_images=2", "loader.batch_size=3",
    "train.val_every=1000", "train.log_every=1", "train.checkpoint_minutes=0", "train.tensorboard=false",
]


def tiny_command(work_dir, epochs=1000):
    cmd = [sys.executable, str(REPO / "train.py"), "--demo", "--data-root", str(work_dir / "data"),
           "--work-dir", str(work_dir), "--epochs", str(epochs), "--workers", "0"]
    for s in TINY:
        cmd += ["--set", s]
    return cmd


def wait_for_training_steps(work_dir, proc, steps=2, timeout=300):
    metrics = work_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended early with status {proc.returncode}"
        if metrics.is_file():
            records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
            if sum(r.get("kind") == "train" for r in records) >= steps:
                return
        time.sleep(0.2)
    pytest.fail(f"no training steps logged in {timeout} s")


def test_sigterm_saves_a_loadable_checkpoint_and_exits_143(tmp_path):
    log = open(tmp_path / "console.txt", "w")
    proc = subprocess.Popen(tiny_command(tmp_path), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        wait_for_training_steps(tmp_path, proc)
        proc.send_signal(signal.SIGHUP)  # a closed terminal: ignored
        time.sleep(0.5)
        assert proc.poll() is None, "SIGHUP stopped the run"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = (tmp_path / "console.txt").read_text()
    assert code == 128 + signal.SIGTERM == 143, out[-3000:]  # saved, but not finished: a launcher must see that
    assert "SIGTERM received" in out and "stopped by SIGTERM" in out
    state = load_checkpoint(tmp_path / "last.pth")  # weights_only=True
    assert state["iteration"] >= 2
    assert state["epoch"] * 3 + state["batch"] == state["iteration"]  # 3 batches per epoch, no accumulation
    assert not list(tmp_path.glob(".last.pth.*.tmp")), "a temporary checkpoint file was left behind"


def train_records(work_dir):
    path = work_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [r for r in (json.loads(x) for x in path.read_text().splitlines() if x.strip()) if r.get("kind") == "train"]


@pytest.mark.parametrize("terminal", ["pipe", "pty"])
def test_a_terminal_that_goes_away_mid_run_does_not_stop_it(tmp_path, terminal):
    # pipe: a closed pipe (EPIPE), plain report lines; pty: an ssh session that dropped (EIO),
    # with the tqdm bar on. Either way the run goes on, and train.log and metrics.jsonl with it.
    if terminal == "pty":
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 24 x 120, as a terminal
        proc = subprocess.Popen(tiny_command(tmp_path), cwd=REPO, stdout=slave, stderr=slave,
                                stdin=subprocess.DEVNULL)
        os.close(slave)
        read_end = master
    else:
        proc = subprocess.Popen(tiny_command(tmp_path), cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        read_end = proc.stdout.fileno()
    seen = b""
    try:
        deadline = time.monotonic() + 300
        while len(train_records(tmp_path)) < 2 and time.monotonic() < deadline:  # drain the terminal
            assert proc.poll() is None, seen.decode(errors="replace")[-3000:]
            if select.select([read_end], [], [], 0.2)[0]:
                seen += os.read(read_end, 65536)
        # What is on its way to the terminal, for at most 1 s: the run prints every few ms, so
        # draining until it goes quiet would read until all its epochs are done.
        drain_until = time.monotonic() + 1.0
        while time.monotonic() < drain_until and select.select([read_end], [], [], 0.1)[0]:
            seen += os.read(read_end, 65536)
        os.close(read_end)  # the terminal goes away
        before = len(train_records(tmp_path))
        while len(train_records(tmp_path)) < before + 3 and time.monotonic() < deadline:
            assert proc.poll() is None, "the run stopped when its terminal went away"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "train.log").read_text()
    assert code == 143, log[-3000:]
    reports = len(train_records(tmp_path))
    assert reports >= before + 3 and log.count("Epoch ") == reports, log[-3000:]  # every report once
    assert log.count("terminal output stopped (stdout: ") == 1
    assert log.count("SIGTERM received") == 1 and log.count("stopped by SIGTERM") == 1
    assert load_checkpoint(tmp_path / "last.pth")["iteration"] == reports  # log_every=1
    if terminal == "pty":
        assert b"it/s" in seen and b"Epoch " not in seen  # the bar was on; the report lines went to the log


def _group_is_gone(pgid, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def run_then_signal(command, work_dir, tmp_path, stop, steps, timeout=300):
    """Start `command` in its own process group, call stop(proc) once `steps` steps are logged, wait:
    (proc, exit status, console output). Nothing of the run outlives the call."""
    log = open(tmp_path / "console.txt", "w")
    proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for_training_steps(work_dir, proc, steps=steps, timeout=timeout)
        stop(proc)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    return proc, code, (tmp_path / "console.txt").read_text()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_to_the_process_group_with_loader_workers_saves_at_the_signal(tmp_path, signum):
    # What `timeout`, `kill -- -PGID`, systemd's stop and Slurm send: the signal reaches the
    # loader workers too. Only the main process may act on it (finish the step, save, shut the
    # workers down); a worker that dies of it breaks the step in flight (a traceback, status 1
    # and last.pth left at the previous epoch end).
    command = tiny_command(tmp_path)
    command[command.index("--workers") + 1] = "1"
    # SIGINT to the group: what Ctrl-C in a terminal sends
    proc, code, out = run_then_signal(command, tmp_path, tmp_path, lambda proc: os.killpg(proc.pid, signum), steps=4)
    assert code == 128 + signum, out[-3000:]  # 143 for SIGTERM, 130 for SIGINT, as a shell reports them
    assert "Traceback" not in out and "killed by signal" not in out, out[-3000:]
    name = signal.Signals(signum).name
    assert out.count(f"{name} received") == 1 and f"stopped by {name}" in out, out[-3000:]
    # The saved iteration is the one the run stopped at (log_every=1: one record per step), not
    # the previous epoch end's.
    state = load_checkpoint(tmp_path / "last.pth")
    assert state["iteration"] == len(train_records(tmp_path)) >= 4
    # The workers were shut down by the main process (they ignore the signal, so none may linger).
    assert _group_is_gone(proc.pid), "a loader worker outlived the run"


# ----------------------------------------------------------------------------------------------
# The demo itself (`vitpose train --demo`, one loader worker, 500 images) stopped by its launcher.

@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
    return tmp_path_factory.mktemp("demo_data")  # the first case's run writes the synthetic set into it


@pytest.mark.slow  # three demo starts (the first writes 600 synthetic images) and three resumes: ~3 minutes
@pytest.mark.parametrize("launcher", ["timeout -s TERM", "kill -TERM -PGID", "Ctrl-C to the group"])
def test_the_demo_stopped_by_its_launcher_saves_the_iteration_and_resumes_from_it(tmp_path, demo_data, launcher):
    work = tmp_path / "run"
    demo = [sys.executable, "-m", "vitpose", "train", "--demo", "--data-root", str(demo_data), "--work-dir", str(work),
            "--set", "train.log_every=1"]  # one metrics record per step: the step count is known
    command = ["timeout", "-s", "TERM", "3600", *demo] if launcher.startswith("timeout") else demo

    def stop(proc):
        if launcher.startswith("timeout"):
            # SIGALRM is how timeout's own timer fires: its expiry, now. It then sends SIGTERM to the
            # command and to its whole process group, the loader worker included.
            proc.send_signal(signal.SIGALRM)
        else:
            os.killpg(proc.pid, signal.SIGTERM if launcher.startswith("kill") else signal.SIGINT)

    proc, code, out = run_then_signal(command, work, tmp_path, stop, steps=3, timeout=600)
    name = "SIGINT" if launcher.startswith("Ctrl-C") else "SIGTERM"
    # timeout reports its expiry as 124 (whatever the command's status); the others see the run's 128 + signal.
    assert code == (124 if launcher.startswith("timeout") else 128 + signal.Signals[name]), out[-3000:]
    assert "Traceback" not in out and "killed by signal" not in out, out[-3000:]
    assert out.count(f"{name} received") == 1 and f"stopped by {name}" in out, out[-3000:]
    assert _group_is_gone(proc.pid), "a loader worker outlived the run"
    stopped_at = load_checkpoint(work / "last.pth")["iteration"]
    assert stopped_at == len(train_records(work)) >= 3  # the interrupted iteration, not the last epoch end

    resumed = subprocess.run([*demo, "--resume", "auto", "--set", f"train.stop_at_iteration={stopped_at + 2}"],
                             cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert f"iteration {stopped_at}\n" in resumed.stdout and "resumed from" in resumed.stdout, resumed.stdout[-3000:]
    assert load_checkpoint(work / "last.pth")["iteration"] == stopped_at + 2
    assert [r["iter"] for r in train_records(work)][-3:] == [stopped_at, stopped_at + 1, stopped_at + 2]
