"""Configs: every shipped file loads with the published per-size values; typos fail with a hint."""

import sys
from pathlib import Path

import pytest

from vitpose.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import train

CONFIGS = REPO / "configs"

# docs/model.md §1.1: layer decay and drop path per size.
SIZES = {"s": (0.8, 0.1), "b": (0.75, 0.3), "l": (0.8, 0.5), "h": (0.85, 0.55)}


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("decoder", ["classic", "simple"])
def test_size_configs_carry_the_published_recipe(size, decoder):
    name = f"vitpose-{size}{'-simple' if decoder == 'simple' else ''}_coco_256x192.yaml"
    cfg = load_config(CONFIGS / name)
    layer_decay, drop_path = SIZES[size]
    assert cfg.model.name == f"vitpose-{size}" and cfg.model.decoder == decoder
    assert cfg.optim.layer_decay == layer_decay and cfg.model.drop_path_rate == drop_path
    assert (cfg.optim.lr, cfg.optim.betas, cfg.optim.weight_decay, cfg.optim.clip_grad) == (5e-4, (0.9, 0.999), 0.1, 1.0)
    assert (cfg.schedule.epochs, cfg.schedule.warmup_iters, cfg.schedule.warmup_ratio) == (210, 500, 0.001)
    assert cfg.schedule.milestones == (170, 200) and cfg.schedule.gamma == 0.1
    assert cfg.loader.batch_size == 64 and cfg.model.input_size == (192, 256) and cfg.model.heatmap_size == (48, 64)
    assert cfg.train.work_dir.endswith(name[: -len(".yaml")])


def test_demo_config_loads():
    cfg = load_config(CONFIGS / "demo.yaml")
    assert cfg.data.synthetic_train_images > 0 and cfg.data.val_bbox_file is None
    assert cfg.train.val_every == 1


def test_typo_in_file_names_file_key_and_suggestion(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: " + str(CONFIGS / "vitpose-s_coco_256x192.yaml") + "\noptim:\n  layer_decey: 0.7\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    msg = str(e.value)
    assert str(bad) in msg and "'optim.layer_decey'" in msg and "did you mean 'layer_decay'" in msg


def test_typo_in_set_and_section():
    with pytest.raises(ConfigError, match=r"--set optim.lrr=1.*did you mean 'lr'"):
        load_config(CONFIGS / "demo.yaml", ["optim.lrr=1"])
    with pytest.raises(ConfigError, match=r"unknown config section 'optm'.*did you mean 'optim'"):
        load_config(None, ["optm.lr=1"])
    with pytest.raises(ConfigError, match=r"expected an integer"):
        load_config(None, ["loader.batch_size=big"])


def test_train_rejects_typos_before_any_work(tmp_path, capsys):
    work = tmp_path / "work"
    code = train.main(["--work-dir", str(work), "--set", "train.val_evry=2"])
    assert code == 2
    assert "did you mean 'val_every'" in capsys.readouterr().err
    assert not work.exists()


@pytest.mark.parametrize("flag", ["--epoch", "--batch", "--work", "--res"])
def test_abbreviated_flags_are_rejected(flag, capsys):
    with pytest.raises(SystemExit) as e:
        train.parse_args([flag, "3"])
    assert e.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_flags_override_file_and_set():
    args = train.parse_args(["--amp", "--batch-size", "8", "--epochs", "3", "--workers", "1", "--seed", "7",
                             "--set", "loader.batch_size=16", "--set", "optim.lr=1e-3"])
    cfg = load_config(train.DEFAULT_CONFIG, args.overrides + train.flag_overrides(args))
    assert cfg.train.amp is True and cfg.loader.batch_size == 8 and cfg.schedule.epochs == 3
    assert cfg.loader.num_workers == 1 and cfg.train.seed == 7 and cfg.optim.lr == 1e-3


def test_missing_coco_stops_at_once_naming_paths_and_the_demo(tmp_path, capsys):
    root = tmp_path / "no-coco"
    code = train.main(["--data-root", str(root), "--work-dir", str(tmp_path / "w")])
    assert code == 2
    err = capsys.readouterr().err
    assert str((root / "annotations" / "person_keypoints_train2017.json").resolve()) in err
    assert str((root / "val2017").resolve()) in err
    assert "python train.py --demo" in err
    assert not (tmp_path / "w" / "last.pth").exists()


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(CONFIGS / "vitpose-b-simple_coco_256x192.yaml", ["optim.lr=1e-3"])
    cfg.dump(tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg
