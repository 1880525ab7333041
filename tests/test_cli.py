"""The one `vitpose` command: every subcommand on one parent parser and one error handler.

- every subcommand takes the shared options; `python train.py` / `python evaluate.py` take exactly
  the flags of `vitpose train` / `vitpose evaluate`;
- a user error (any `vitpose.errors.UserError`) is one line naming the problem and exit status 2,
  `--debug` raises it with its traceback; Ctrl-C is exit status 130;
- configs are found by the name of a shipped config, and an unknown name lists the closest ones.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from test_evaluate import tiny_model, write_config

import evaluate
import train
import vitpose
from vitpose import cli
from vitpose.config import ConfigError, find_config, load_config, shipped_configs
from vitpose.errors import UserError

COMMANDS = ["train", "evaluate", "predict", "export", "tune", "check-data", "build-crop-cache", "plot",
            "import-annotations", "merge"]


def subparsers_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_every_command_is_a_subcommand_with_the_shared_options():
    commands = subparsers_of(cli.build_parser())
    assert list(commands)[: len(COMMANDS)] == COMMANDS
    for name, parser in commands.items():
        options = option_strings(parser)
        assert "--debug" in options, name  # every command reports errors the same way
        if name not in ("plot", "import-annotations", "merge"):  # they read a work dir / an export / shards, no config
            assert {"--config", "--debug"} <= options, name
    for name in ("train", "evaluate", "tune"):
        assert set(cli.SHARED) <= option_strings(commands[name]), name
    # a command that has no config fields to set does not take --set (it would silently do nothing)
    for name in ("predict", "export", "plot", "import-annotations", "merge"):
        assert "--set" not in option_strings(commands[name]), name


@pytest.mark.parametrize("script, argv", [
    (train, ["--demo", "--epochs", "3", "--set", "optim.lr=1e-3", "--device", "cpu", "--resume", "auto", "--debug"]),
    (evaluate, ["--checkpoint", "w.pth", "--gt-boxes", "--no-flip-test", "--set", "eval.nms_thr=0.5", "--precision", "fp32", "--device",
                "cpu", "--config", "demo"]),
])
def test_the_scripts_take_the_commands_flags(script, argv):
    name = script.__name__
    as_script = script.parse_args(argv)
    as_command = cli.build_parser().parse_args([name, *argv])
    del as_command.command
    assert vars(as_script) == vars(as_command)  # every flag, default and value alike
    with pytest.raises(SystemExit):  # abbreviations are refused in both
        script.parse_args(["--check" if name == "evaluate" else "--epoch", "1"])


def test_a_malformed_annotation_file_is_one_line_in_evaluate(tmp_path, coco_mini_dir, capsys):
    """GroundTruthError (the evaluator's refusal of a ground-truth file) is a user error too."""
    data = json.loads((coco_mini_dir / "test_coco.json").read_text())
    del data["annotations"][1]["area"]
    ann_id = data["annotations"][1]["id"]
    for image in data["images"]:
        (tmp_path / image["file_name"]).symlink_to(coco_mini_dir / image["file_name"])
    (tmp_path / "test_coco.json").write_text(json.dumps(data))
    weights = tmp_path / "tiny.safetensors"
    vitpose.save_weights(tiny_model(seed=3), weights)
    config = write_config(tmp_path, tmp_path, bbox_file=None)
    argv = ["evaluate", "--config", str(config), "--checkpoint", str(weights), "--workers", "0"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitpose evaluate: error: ")
    assert "test_coco.json" in err[0] and f"id {ann_id}" in err[0] and "'area'" in err[0]
    # --debug: the same error with its traceback
    with pytest.raises(UserError, match="missing field 'area'"):
        cli.main([*argv, "--debug"])


def test_user_errors_exit_2_and_ctrl_c_exits_130(capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    args = argparse.Namespace(run=interrupted, debug=False)
    assert cli.run_command(args, "vitpose x") == cli.EXIT_INTERRUPTED == 130
    assert "vitpose x: interrupted" in capsys.readouterr().err
    # a user error from deep inside a command: the plot of a work dir without metrics
    assert cli.main(["plot", "/nonexistent/run"]) == 2
    assert capsys.readouterr().err.startswith("vitpose plot: error: ")


def test_every_error_class_of_the_package_is_a_user_error():
    from vitpose.cli.predict import UsageError
    from vitpose.config import ConfigError
    from vitpose.data.errors import DataError
    from vitpose.engine.checkpoint import CheckpointSaveError
    from vitpose.engine.workdir import WorkDirError
    from vitpose.evaluation.coco_evaluator import GroundTruthError, PredictionError
    from vitpose.evaluation.matfile import MatFileError
    from vitpose.hub import DownloadError, UnknownModelError
    from vitpose.inference.export import GateError, MissingDependencyError
    from vitpose.models.checkpoint import CheckpointError

    classes = [ConfigError, DataError, CheckpointError, CheckpointSaveError, WorkDirError, GroundTruthError,
               PredictionError, UnknownModelError, DownloadError, UsageError, GateError, MissingDependencyError,
               MatFileError]
    assert all(issubclass(c, UserError) for c in classes)
    # the old bases stay, for code that catches them
    assert issubclass(ConfigError, ValueError) and issubclass(CheckpointSaveError, OSError)
    assert GateError.exit_status == 1 and ConfigError.exit_status == 2


def test_configs_are_found_by_name_or_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # away from the repository's configs/
    names = shipped_configs()
    assert {"demo", "demo_k5", "vitpose-s_coco_256x192", "vitpose-b-simple_coco_256x192"} <= set(names)
    assert find_config("vitpose-b_coco_256x192") == find_config("configs/vitpose-b_coco_256x192.yaml")
    assert load_config("vitpose-b_coco_256x192").model.name == "vitpose-b"
    with pytest.raises(ConfigError, match="closest shipped configs: vitpose-s_coco_256x192"):
        load_config("vitpose-s_coco")
    mine = tmp_path / "mine.yaml"  # a user's config on a shipped base, by name
    mine.write_text("base: vitpose-l_coco_256x192\nmodel: {num_keypoints: 5}\n")
    cfg = load_config(mine)
    assert (cfg.model.name, cfg.model.num_keypoints, cfg.optim.layer_decay) == ("vitpose-l", 5, 0.8)


def test_the_console_script_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "vitpose", "--help"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0 and all(name in done.stdout for name in COMMANDS)
