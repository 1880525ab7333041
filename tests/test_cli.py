"""The one `vitpose` command: every subcommand on one parent parser and one error handler.

- every subcommand takes the shared options; `python train.py` / `python evaluate.py` take exactly
  the flags of `vitpose train` / `vitpose evaluate`;
- a user error (any `vitpose.errors.UserError`) is one line naming the problem and exit status 2,
  `--debug` raises it with its traceback; Ctrl-C is exit status 130;
- any other exception is a bug, in every command (no command keeps its own handler that widens
  ValueError / RuntimeError into a user error): its traceback and exit status 70;
- one table of exit statuses (vitpose.errors.EXIT_STATUSES) is what `vitpose --help` and README.md show;
- `--config` means the run config (FILE|NAME) in every command that takes it;
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
        # they read a work dir / an export / shards / cameras' JSON Lines, no config
        if name not in ("plot", "import-annotations", "merge", "triangulate"):
            assert {"--config", "--debug"} <= options, name
    for name in ("train", "evaluate", "tune"):
        assert set(cli.SHARED) <= option_strings(commands[name]), name
    # a command that has no config fields to set does not take --set (it would silently do nothing)
    for name in ("predict", "export", "plot", "import-annotations", "merge", "triangulate"):
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


# ----------------------------------------------------------------------------------------------
# One error handler: a bug is a bug in every command


def a_bug(*args, **kwargs):
    raise ValueError("a bug deep inside (not the user's input)")


@pytest.fixture
def tiny_weights(tmp_path):
    import cv2
    import numpy as np

    weights = vitpose.save_weights(tiny_model(seed=3), tmp_path / "tiny.safetensors")
    image = tmp_path / "a.png"
    cv2.imwrite(str(image), np.random.default_rng(0).integers(0, 255, (64, 48, 3), dtype=np.uint8))
    return weights, image


@pytest.mark.parametrize("command", ["predict", "export", "import-annotations", "evaluate", "plot", "check-data"])
def test_a_valueerror_from_a_bug_is_a_traceback_and_status_70_in_every_command(command, tiny_weights, tmp_path,
                                                                                 monkeypatch, capsys):
    """Before: predict and export widened ValueError / RuntimeError into "error: ..." and status 2,
    so a bug looked like the user's mistake. Now the one handler shows it whole (and --debug raises)."""
    import vitpose.builders
    import vitpose.cli.plot
    import vitpose.data.annotation_formats

    weights, image = tiny_weights
    # the first function of each command's work that an ordinary ValueError can come from
    monkeypatch.setattr(vitpose.builders, "load_model", a_bug)
    monkeypatch.setattr(vitpose.data.annotation_formats, "read_export", a_bug)
    monkeypatch.setattr(vitpose.cli.plot, "load_curves", a_bug)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    export_file = tmp_path / "ls.json"
    export_file.write_text("[]")
    argv = {"predict": ["predict", str(image), "--model", str(weights), "--detector", "full-frame", "--device", "cpu"],
            "export": ["export", "--model", str(weights), "--out", str(tmp_path / "m.onnx")],
            "import-annotations": ["import-annotations", str(export_file), "--format", "labelstudio",
                                   "--out", str(tmp_path / "coco.json")],
            "evaluate": ["evaluate", "--checkpoint", str(weights), "--config", str(write_config(tmp_path, tmp_path)),
                         "--gt-boxes"],
            "plot": ["plot", str(tmp_path / "run")],
            "check-data": ["check-data", "--config", "demo"]}[command]
    monkeypatch.setattr("vitpose.cli.evaluate.load_run_config", a_bug)
    monkeypatch.setattr("vitpose.cli.check_data.build_train_set", a_bug)  # was a "finding", exit 1
    # the demo's synthetic set is not written here: that check's one line comes first otherwise
    monkeypatch.setattr("vitpose.cli.check_data.check_synthetic_set_written", lambda *a: None)
    assert cli.main(argv) == cli.EXIT_INTERNAL == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ValueError: a bug deep inside" in err, err
    assert err.strip().splitlines()[-1].startswith(f"vitpose {command}: internal error (the traceback is above)")
    with pytest.raises(ValueError, match="a bug deep inside"):  # --debug: as Python would
        cli.main([*argv, "--debug"])


def test_predict_counts_a_failing_image_but_shows_a_bugs_traceback_once(tiny_weights, tmp_path, monkeypatch, capsys):
    """predict's one per-image catch (an image that fails costs that image, exit 1) must not make a
    bug look like bad input: the first failure that is no UserError prints its traceback."""
    import shutil

    from vitpose.inference.pipeline import TopDown

    weights, image = tiny_weights
    shutil.copy(image, tmp_path / "b.png")
    monkeypatch.setattr(TopDown, "__call__", a_bug)
    argv = ["predict", str(image), str(tmp_path / "b.png"), "--model", str(weights), "--detector", "full-frame",
            "--device", "cpu", "--json", str(tmp_path / "poses.json")]
    assert cli.main(argv) == 1  # counted and skipped, as before
    err = capsys.readouterr().err
    assert err.count("failed with an error that is not about the input") == 1, err  # once, not per image
    assert "Traceback (most recent call last)" in err and "in a_bug" in err, err
    assert "a.png: ValueError: a bug deep inside" in err and "b.png: ValueError: a bug deep inside" in err


def test_commands_keep_no_error_handler_of_their_own():
    """The one handler is vitpose.cli.run_command: no command module prints "error: ..." from an
    except clause and returns a status itself, and none catches ValueError and RuntimeError together
    (the widening that turned bugs into "user errors"); converting one library error where it
    arises (`except ValueError: raise UsageError("--device: ...")`) is how user errors are made."""
    import ast

    modules = sorted((REPO / "vitpose" / "cli").glob("*.py")) + [REPO / "vitpose" / "inference" / "export.py"]
    offenders = []
    for path in modules:
        if path.name == "__init__.py":  # the handler itself
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ExceptHandler) or node.type is None:
                continue
            types = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            caught = {t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", "?") for t in types}
            body = "\n".join(ast.get_source_segment(text, statement) for statement in node.body)
            prints_an_error = "print(" in body and "error:" in body
            if prints_an_error or caught >= {"ValueError", "RuntimeError"}:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: except {ast.unparse(node.type)}")
    assert not offenders, "command modules with their own error handler:\n" + "\n".join(offenders)


def test_an_opset_the_exporter_cannot_write_is_the_users_error(tiny_weights, tmp_path, capsys):
    """--opset 99: onnx's version converter only warns and the file fails onnx's checker; once the
    command stopped widening every ValueError / RuntimeError, this must be named where it arises."""
    pytest.importorskip("onnxruntime")
    weights, _ = tiny_weights
    out = tmp_path / "m.onnx"
    assert cli.main(["export", "--model", str(weights), "--out", str(out), "--opset", "99"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitpose export: error: --opset 99: ") and "lower" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "tiny.safetensors"]  # nothing written or staged


# ----------------------------------------------------------------------------------------------
# One exit-status table; one meaning of --config


def test_the_exit_status_table_is_one_and_help_and_readme_show_it():
    from vitpose.errors import EXIT_STATUSES

    statuses = [status for status, _ in EXIT_STATUSES]
    assert len(set(statuses)) == len(statuses) and {0, 1, 2, 70, 130} <= set(statuses)
    assert cli.EXIT_INTERRUPTED == 130 and train.EXIT_NONFINITE in statuses
    done = subprocess.run([sys.executable, "-m", "vitpose", "--help"], capture_output=True, text=True, timeout=120,
                          check=False)
    for status, meaning in EXIT_STATUSES:
        assert f"{status:>3}  {meaning[:40]}" in " ".join(done.stdout.split("\n")), (status, done.stdout)
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Exit statuses\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    shown = {int(number.strip(" `")) for number, _ in rows[1:]}  # rows[0] is the header
    assert shown == set(statuses), f"README's exit statuses {sorted(shown)} != vitpose.errors' {sorted(statuses)}"


def test_config_means_the_run_config_in_every_command(tmp_path, monkeypatch):
    """One meaning: a run config (YAML file or shipped name), the file `vitpose train --config`
    takes; predict / export read its model section and skeleton. Same metavar, and a shipped
    config's name works where a path does."""
    import vitpose.builders

    commands = subparsers_of(cli.build_parser())
    taking = {name: next(a for a in parser._actions if "--config" in a.option_strings)
              for name, parser in commands.items() if "--config" in option_strings(parser)}
    assert {"train", "evaluate", "predict", "export", "tune", "check-data", "build-crop-cache"} <= set(taking)
    for name, action in taking.items():
        assert action.metavar == "FILE|NAME", name
        assert "run config" in action.help and "shipped" in action.help, (name, action.help)
    # predict and export hand the name to load_model, which resolves it as every command does
    seen = []
    monkeypatch.setattr(vitpose.builders, "load_model", lambda source, **kw: seen.append(kw["config"]) or a_bug())
    image = tmp_path / "a.png"
    image.write_bytes(b"")
    cli.main(["export", "--model", "w.pth", "--config", "demo", "--out", str(tmp_path / "m.pt2")])
    assert seen == ["demo"] and load_config(seen[0]).model == load_config(find_config("demo")).model
