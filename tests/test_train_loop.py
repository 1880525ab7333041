"""train.py's run structure: resources released on every exit, position fields that survive a resume."""

import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import train
from vitpose.engine import trainer
from vitpose.engine.checkpoint import load_checkpoint

TINY = [
    "model.input_size=[48, 64]", "model.heatmap_size=[12, 16]", "model.sigma=1.0",
    "model.extra={embed_dim: 32, depth: 2, num_heads: 2, deconv_channels: [16, 16]}",
    "data.synthetic_train_images=6", "data.synthetic_val_images=2", "loader.batch_size=2",
    "train.val_every=1000", "train.log_every=1", "train.checkpoint_minutes=0", "train.tensorboard=true",
]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic")


def tiny_args(data_root, work_dir, *extra):
    args = ["--demo", "--data-root", str(data_root), "--work-dir", str(work_dir)]
    for s in TINY:
        args += ["--set", s]
    return args + list(extra)


class Boom(RuntimeError):
    pass


class LossThatFails:
    """The real loss for the first `after` calls, then an exception (a bug, an OOM, a bad batch)."""

    def __init__(self, after):
        self.after, self.calls = after, 0

    def __call__(self, pred, target, weights):
        self.calls += 1
        if self.calls > self.after:
            raise Boom("raised inside a training step")
        return trainer.KeypointMSELoss()(pred, target, weights)


def open_files_under(directory: Path) -> list[str]:
    return [f.path for f in psutil.Process().open_files() if Path(f.path).is_relative_to(directory)]


def live_children(ignore=frozenset()) -> list[psutil.Process]:
    """Child processes still running, except the pids in `ignore` (children of earlier tests,
    e.g. multiprocessing's resource tracker)."""
    deadline = time.monotonic() + 10  # workers get a moment to exit after the pool is shut down
    while time.monotonic() < deadline:
        children = [p for p in psutil.Process().children(recursive=True) if p.pid not in ignore
                    and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not children:
            return []
        time.sleep(0.1)
    return children


def test_an_exception_inside_a_step_releases_workers_and_files(data_root, tmp_path, monkeypatch):
    work_dir = tmp_path / "run"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    monkeypatch.setattr(trainer, "keypoint_mse_loss", LossThatFails(after=2))
    stdout, stderr = sys.stdout, sys.stderr
    # The traceback is kept alive (as a notebook's sys.last_traceback or a logging handler would):
    # the frames it holds must not be what keeps the pool and the files open or closes them.
    with pytest.raises(Boom) as failure:  # --debug: the command lets a bug propagate (else: traceback, exit 70)
        train.main(tiny_args(data_root, work_dir, "--workers", "2", "--epochs", "2", "--debug"))
    # The run got as far as the pool, the log, metrics.jsonl and (if installed) TensorBoard ...
    assert (work_dir / "metrics.jsonl").is_file() and (work_dir / "train.log").is_file()
    # ... and nothing of it is left: no worker process, no open file in the work dir, streams restored.
    assert not live_children(before), "loader workers outlived the failed run"
    assert not open_files_under(work_dir), open_files_under(work_dir)
    assert sys.stdout is stdout and sys.stderr is stderr
    assert failure.traceback  # still referenced up to here


def test_a_failed_run_can_be_followed_by_another_in_the_same_process(data_root, tmp_path, monkeypatch):
    """Nothing global (process group, signal handlers, output streams) stays behind after an exception."""
    monkeypatch.setattr(trainer, "keypoint_mse_loss", LossThatFails(after=0))
    assert train.main(tiny_args(data_root, tmp_path / "a", "--workers", "0", "--epochs", "1")) == 70  # a bug's status
    monkeypatch.undo()
    assert train.main(tiny_args(data_root, tmp_path / "b", "--workers", "0", "--epochs", "1")) == 0
    assert load_checkpoint(tmp_path / "b" / "last.pth")["epoch"] == 1


def test_nonfinite_count_survives_a_resume(data_root, tmp_path, monkeypatch):
    """max_nonfinite counts non-finite losses in a row across a stop and resume, not per process."""

    class NaNAlways:
        def __call__(self, pred, target, weights):
            return trainer.KeypointMSELoss()(pred, target, weights) * float("nan")

    monkeypatch.setattr(trainer, "keypoint_mse_loss", NaNAlways())
    args = tiny_args(data_root, tmp_path, "--workers", "0", "--epochs", "3", "--set", "train.max_nonfinite=4")
    assert train.main([*args, "--set", "train.stop_at_iteration=2"]) == train.EXIT_OK
    saved = load_checkpoint(tmp_path / "last.pth")
    assert saved["nonfinite_in_row"] == 2 and saved["iteration"] == 2
    # Two more non-finite steps make four in a row: the resumed run stops there, not after four more.
    assert train.main([*args, "--resume", "auto"]) == train.EXIT_NONFINITE
    assert load_checkpoint(tmp_path / "last.pth")["iteration"] == 4


def test_checkpoint_stores_each_position_field_once(data_root, tmp_path):
    assert train.main(tiny_args(data_root, tmp_path, "--workers", "0", "--epochs", "1")) == 0
    saved = load_checkpoint(tmp_path / "last.pth")
    assert "train_state" not in saved
    assert {"epoch", "batch", "iteration", "best_ap", "best_epoch", "nonfinite_in_row"} <= saved.keys()
