"""Exact resume: an interrupted and resumed CPU run ends with the same bits as an uninterrupted one."""

import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import train
from vitpose.engine.checkpoint import find_resume_checkpoint, load_checkpoint


def tiny_args(data_root, work_dir, *extra):
    """configs/demo.yaml shrunk to seconds: a 2-block 32-d ViT on 64x48 crops, 3 batches per epoch."""
    sets = [
        "model.input_size=[48, 64]", "model.heatmap_size=[12, 16]", "model.sigma=1.0",
        "model.extra={embed_dim: 32, depth: 2, num_heads: 2, deconv_channels: [16, 16]}",
        "model.drop_path_rate=0.2",  # the resumed run must continue the drop-path random stream
        "data.synthetic_train_images=5", "data.synthetic_val_images=2",
        "loader.batch_size=3", "loader.val_batch_size=8",
        "schedule.warmup_iters=4", "schedule.milestones=[1]",
        "train.val_every=100", "train.log_every=1", "train.checkpoint_minutes=0",
        "train.tensorboard=false",
    ]
    args = ["--demo", "--data-root", str(data_root), "--work-dir", str(work_dir), "--epochs", "3"]
    for s in sets:
        args += ["--set", s]
    return args + list(extra)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic")


def final_state(work_dir):
    return load_checkpoint(Path(work_dir) / "last.pth")


def assert_bitwise_equal(a, b, what=""):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, what
        assert torch.equal(a, b), f"{what}: max |diff| {(a.double() - b.double()).abs().max().item()}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for k in a:
            assert_bitwise_equal(a[k], b[k], f"{what}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bitwise_equal(x, y, f"{what}[{i}]")
    else:
        assert a == b, what


@pytest.fixture(scope="module")
def uninterrupted(data_root, tmp_path_factory):
    work = tmp_path_factory.mktemp("uninterrupted")
    assert train.main(tiny_args(data_root, work, "--workers", "0")) == 0
    return work


@pytest.mark.parametrize("resume_workers", ["0", "2"])
def test_interrupted_and_resumed_is_bit_identical(data_root, uninterrupted, tmp_path, resume_workers):
    uninterrupted = final_state(uninterrupted)
    # 5 images hold 8 people -> 3 batches of 3 per epoch; stop after 4 steps: mid-epoch 1.
    assert train.main(tiny_args(data_root, tmp_path, "--workers", "0", "--set", "train.stop_at_iteration=4")) == 0
    stopped = final_state(tmp_path)
    assert (stopped["epoch"], stopped["batch"], stopped["iteration"]) == (1, 1, 4)
    code = train.main(tiny_args(data_root, tmp_path, "--workers", resume_workers, "--resume", "auto"))
    assert code == 0
    resumed = final_state(tmp_path)
    assert resumed["iteration"] == uninterrupted["iteration"] == 9
    assert_bitwise_equal(resumed["model"], uninterrupted["model"], "model")
    assert_bitwise_equal(resumed["optimizer"]["state"], uninterrupted["optimizer"]["state"], "optimizer")
    assert resumed["best_ap"] == uninterrupted["best_ap"]


def test_resume_auto_skips_a_truncated_newest_checkpoint(data_root, uninterrupted, tmp_path):
    shutil.copytree(uninterrupted, tmp_path, dirs_exist_ok=True)
    good = (tmp_path / "last.pth").read_bytes()
    (tmp_path / "epoch_3.pth").write_bytes(good[: len(good) // 2])  # the newest file, cut short
    with pytest.warns(UserWarning, match="skipping unusable checkpoint.*epoch_3.pth"):
        path, state = find_resume_checkpoint(tmp_path)
    assert path.name in ("last.pth", "best.pth") and state["epoch"] == 3
    # train.py continues from the valid one instead of failing on the truncated file
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = train.main(tiny_args(data_root, tmp_path, "--workers", "0", "--epochs", "4", "--resume", "auto"))
    assert code == 0
    assert final_state(tmp_path)["epoch"] == 4 and final_state(tmp_path)["iteration"] == 12


def test_checkpoint_loads_weights_only_without_wrapper_prefixes(uninterrupted):
    uninterrupted = final_state(uninterrupted)  # load_checkpoint reads with weights_only=True
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in uninterrupted["model"])
    assert {"torch", "numpy", "python"} <= set(uninterrupted["rng"])
    assert uninterrupted["config"]["model"]["extra"]["depth"] == 2


def test_a_fine_tuning_run_resumes_without_reading_its_init_source_again(data_root, tmp_path, capsys, monkeypatch):
    # The checkpoint holds every weight, so `--resume` must not need the `--init` source (a file
    # since deleted, a name not in an offline cache) nor rewrite init_keypoints.txt, the run's
    # record of what it started from, with whatever --init the resumed command names.
    from vitpose.engine import finetune

    source = tmp_path / "source.pth"
    assert train.main(tiny_args(data_root, tmp_path / "src", "--set", "train.stop_at_iteration=1")) == 0
    shutil.copy(tmp_path / "src" / "last.pth", source)
    work = tmp_path / "ft"
    assert train.main(tiny_args(data_root, work, "--init", str(source), "--set", "train.stop_at_iteration=1")) == 0
    table = (work / finetune.TABLE_FILE).read_text()
    assert str(source) in table
    capsys.readouterr()

    source.unlink()  # N15: the init source is gone
    assert train.main(tiny_args(data_root, work, "--init", str(source), "--resume", "auto",
                                "--set", "train.stop_at_iteration=2")) == 0
    out = capsys.readouterr().out
    assert f"resuming: model.init = {str(source)!r} is not read again" in out
    assert "resumed from" in out and load_checkpoint(work / "last.pth")["iteration"] == 2

    # N14: another, existing source named on resume is not read, and the record stays the first run's.
    def must_not_read(*args, **kwargs):
        raise AssertionError("the init source was read on resume")

    monkeypatch.setattr(finetune, "read_init_source", must_not_read)
    other = tmp_path / "other.pth"
    shutil.copy(tmp_path / "src" / "last.pth", other)
    assert train.main(tiny_args(data_root, work, "--init", str(other), "--resume", "auto",
                                "--set", "train.stop_at_iteration=3")) == 0
    assert (work / finetune.TABLE_FILE).read_text() == table
    assert load_checkpoint(work / "last.pth")["iteration"] == 3
