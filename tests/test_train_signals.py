"""A run stopped by SIGTERM (after ignoring SIGHUP) saves a loadable checkpoint and exits 0."""

import json
import signal
import subprocess
import sys
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


def test_sigterm_saves_a_loadable_checkpoint_and_exits_zero(tmp_path):
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
    assert code == 0, out[-3000:]
    assert "SIGTERM received" in out and "stopped by SIGTERM" in out
    state = load_checkpoint(tmp_path / "last.pth")  # weights_only=True
    assert state["iteration"] >= 2
    assert state["epoch"] * 3 + state["batch"] == state["iteration"]  # 3 batches per epoch, no accumulation
    assert not list(tmp_path.glob(".last.pth.*.tmp")), "a temporary checkpoint file was left behind"
