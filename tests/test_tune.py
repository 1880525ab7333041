"""vitpose.cli.tune: the verdict logic on known figures, and one tiny end-to-end sweep."""

import csv

import pytest

from vitpose import cli
from vitpose.cli.tune import Row, format_table, verdict


def main(argv):
    return cli.main(["tune", *argv])


def row(workers, loader_sps, step_sps=None, data_wait=None, batch_size=32, requested=None):
    return Row(workers if requested is None else requested, workers, batch_size, True, 2,
               samples=10 * batch_size, loader_sps=loader_sps, step_sps=step_sps, data_wait=data_wait)


def test_loader_bound_suggests_enough_workers_for_the_step():
    rows = [row(0, 30, 25, 0.8), row(2, 100, 80, 0.5), row(4, 180, 150, 0.2)]
    # Best step: 150 samples/s waiting 20% -> the step alone does 150 / 0.8 = 187.5 samples/s.
    # One worker delivers at most 100 / 2 = 50 samples/s -> ceil(1.2 * 187.5 / 50) = 5 workers.
    lines = verdict(rows, cores=16)
    assert lines == [lines[0]] and lines[0].startswith("loader-bound: raise workers to 5 ")
    assert "at 4 workers" in lines[0] and "~188 samples/s" in lines[0]
    assert "logical cores" not in lines[0]
    assert "more than the 4 logical cores" in verdict(rows, cores=4)[0]


def test_gpu_bound_names_the_fewest_workers_that_keep_up():
    rows = [row(0, 60, 50, 0.6), row(2, 150, 192, 0.05), row(4, 300, 200, 0.02)]
    (line,) = verdict(rows, cores=16)
    # 192 >= 0.95 * 200: two workers suffice.
    assert line.startswith("GPU-bound") and "2 workers suffice" in line and "2%" in line


def test_ram_cap_comes_first_and_shows_in_the_table():
    rows = [row(2, 100, 190, 0.05), row(3, 120, 200, 0.02, requested=8)]
    lines = verdict(rows, cores=16)
    assert lines[0].startswith("RAM-bound: only 3 of 8 workers fit")
    assert lines[1].startswith("GPU-bound")
    table = format_table(rows).splitlines()
    assert len(table) == 3 and table[2].split()[0] == "8->3"


def test_loader_only_reports_rising_throughput():
    (line,) = verdict([row(0, 20), row(2, 50), row(4, 80)], cores=16)
    assert line.startswith("loader only: best 80 samples/s at 4 workers") and "more than 4" in line
    (flat,) = verdict([row(0, 20), row(2, 80), row(4, 82)], cores=16)
    assert "still rising" not in flat


def run_tiny_sweep(tmp_path, steps):
    config = tmp_path / "tiny.yaml"
    config.write_text(f"train:\n  work_dir: {tmp_path / 'work'}\n  device: cpu\n")
    out = tmp_path / "tune"
    tiny_model = "model.extra={depth: 1, embed_dim: 32, num_heads: 2, deconv_channels: [16, 16]}"
    rc = main(["--config", str(config), "--set", tiny_model, "--set", "loader.drop_last=true",
               "--synthetic", "3", "--workers", "0,2", "--batch-sizes", "2", "--batches", "2", "--warmup", "1",
               "--steps" if steps else "--no-steps", "--out", str(out), "--no-progress"])
    assert rc == 0
    with open(out / "tune.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["workers"]) for r in rows] == [0, 2]
    assert all(int(r["samples"]) == 2 * 2 for r in rows)  # timed batches x batch size
    for r in rows:
        assert float(r["loader_sps"]) > 0 and float(r["peak_pss_mib"]) > 0
    assert (out / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "tune.txt").read_text()
    assert text.splitlines()[0].split()[:2] == ["workers", "batch"]
    return rows, text.splitlines()[-1]


def test_tiny_sweep_on_a_synthetic_set_writes_table_and_png(tmp_path, capsys):
    rows, last = run_tiny_sweep(tmp_path, steps=False)
    assert all(r["step_sps"] == "" for r in rows)
    assert last.startswith("loader only: best")
    printed = capsys.readouterr().out
    assert "wrote" in printed and "loader only" in printed


@pytest.mark.slow
def test_tiny_sweep_with_training_steps(tmp_path):
    rows, last = run_tiny_sweep(tmp_path, steps=True)
    for r in rows:
        assert float(r["step_sps"]) > 0 and 0.0 <= float(r["data_wait"]) <= 1.0
    assert last.startswith(("loader-bound", "GPU-bound"))


def test_tune_train_step_uses_the_training_optimizer_and_schedule():
    """The tuning step is train.py's step: layer-decay groups and the warmup schedule, not plain AdamW."""
    import torch
    from conftest import REPO

    from vitpose.builders import build_model_from_config
    from vitpose.cli.tune import make_train_step
    from vitpose.config import load_config
    from vitpose.engine.optim import param_groups
    from vitpose.engine.schedule import lr_factor

    cfg = load_config(REPO / "configs" / "demo.yaml", ["model.extra={embed_dim: 32, depth: 2, num_heads: 2, "
                                                       "deconv_channels: [16, 16]}"])
    step = make_train_step(cfg, torch.device("cpu"))
    expected = param_groups(build_model_from_config(cfg.model), lr=cfg.optim.lr,
                            weight_decay=cfg.optim.weight_decay, layer_decay=cfg.optim.layer_decay)
    got = step.optimizer.param_groups
    assert len(got) == len(expected) > 2
    w, h = cfg.model.input_size
    batch = {"image": torch.randint(0, 255, (2, 3, h, w), dtype=torch.uint8),
             "keypoints": torch.rand(2, 17, 2) * torch.tensor([w, h]), "keypoints_visible": torch.ones(2, 17)}
    step(batch)
    factor = lr_factor(0, 0, cfg.schedule.warmup_iters, cfg.schedule.warmup_ratio, cfg.schedule.milestones,
                       cfg.schedule.gamma)
    for g, e in zip(got, expected):
        assert g["weight_decay"] == e["weight_decay"]
        assert g["lr"] == pytest.approx(e["lr"] * factor, rel=1e-12)
