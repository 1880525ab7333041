"""A wheel install works without the repository: `pip install` the built wheel into a fresh venv,
then in an empty directory outside the repository train the demo, evaluate its checkpoint with the
config the checkpoint records, and predict on an image with it.

Nothing is downloaded: the wheel is built with `--no-build-isolation`, installed with `--no-deps
--no-index`, and the fresh venv sees this interpreter's packages (torch, ...) but not this
repository (PYTHONPATH is dropped, the working directory is empty) and not an editable install
of it (the parent environment's `.pth` hooks are not run there).
"""

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import vitpose

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("pyproject.toml", "README.md", "vitpose", "configs")


def run(command, cwd, env, timeout=600):
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"{command} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from a copy of the sources (the build leaves build/ and *.egg-info behind)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    source.mkdir()
    for name in SHIPPED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist", source],
        cwd=tmp, env=os.environ)
    return next((tmp / "dist").glob("vitpose-*.whl"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """(bin folder of a fresh venv with the wheel installed, its environment)."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], cwd=venv.parent, env=os.environ)
    if sys.prefix != sys.base_prefix:  # running in a venv: --system-site-packages does not reach its packages
        inner = next((venv / "lib").glob("python3*/site-packages"))
        (inner / "parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
        cwd=venv.parent, env=os.environ)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return venv / "bin", env


def test_the_wheel_holds_every_module_and_config(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "vitpose").rglob("*.py") if "__pycache__" not in p.parts}
    assert modules - names == set(), "modules missing from the wheel (pyproject's [tool.setuptools] packages)"
    configs = {f"vitpose/configs/{p.name}" for p in (REPO / "configs").glob("*.yaml")}
    assert configs and configs <= names
    assert {f"vitpose/data/skeletons/{p.name}" for p in (REPO / "vitpose/data/skeletons").glob("*.yaml")} <= names
    assert "vitpose/serve/page/index.html" in names  # the page `vitpose serve` shows at /


# A tiny model on a tiny synthetic set: the point is the installed package, not the learning.
TINY = ["--workers", "0", "--set", "data.synthetic_train_images=6", "--set", "data.synthetic_val_images=2",
        "--set", "loader.batch_size=3", "--set", "model.input_size=[48, 64]", "--set", "model.heatmap_size=[12, 16]",
        "--set", "model.extra={embed_dim: 32, depth: 2, num_heads: 2, deconv_channels: [16, 16]}"]
# `vitpose predict --model FILE` of a non-published size needs weights that describe themselves
# (issue 17, Build 1: vitpose.load_model); until then that step fails, and is expected to.
SELF_DESCRIBING = pytest.mark.xfail(not hasattr(vitpose, "load_model"), strict=True,
                                    reason="a checkpoint of the demo's small ViT does not yet record its model spec")


def train_and_evaluate(bin_dir, env, work, extra=()):
    """`vitpose train --demo --epochs 1 --work-dir W` then `vitpose evaluate --checkpoint W/best.pth`
    in `work`; checks both and returns the training run's AP."""
    work.mkdir()
    found = run([bin_dir / "python", "-c", "import vitpose; print(vitpose.__file__)"], cwd=work, env=env)
    assert str(bin_dir.parent) in found and str(REPO) not in found  # the installed copy, not the checkout
    vitpose_command = bin_dir / "vitpose"
    trained = run([vitpose_command, "train", "--demo", "--epochs", "1", "--work-dir", "W", *extra], cwd=work, env=env)
    assert "done:" in trained
    records = [json.loads(line) for line in (work / "W" / "metrics.jsonl").read_text().splitlines()]
    train_ap = [r["AP"] for r in records if r.get("kind") == "eval"]
    assert len(train_ap) == 1 and (work / "W" / "best.pth").is_file()

    evaluated = run([vitpose_command, "evaluate", "--checkpoint", "W/best.pth"], cwd=work, env=env)
    assert "W/best.pth (recorded config)" in evaluated  # no --config: the checkpoint's own
    names, _, values = evaluated.strip().splitlines()[-3:]  # the stats table: names, rule, values
    stats = dict(zip((n.strip() for n in names.split("|")), (float(v) for v in values.split("|"))))
    # The same model, crops and batches as the training run's validation: the same AP, printed to
    # 4 decimals (matmul order may differ by ~1e-6 relative between processes, far below an OKS step).
    assert stats["AP"] == pytest.approx(train_ap[0], abs=1e-4)
    return train_ap[0]


def predict_one_image(bin_dir, env, work):
    image = sorted((work / "work_dirs" / "demo" / "synthetic_coco" / "val2017").glob("*.jpg"))[0]
    run([bin_dir / "vitpose", "predict", image, "--model", "W/best.pth", "--detector", "full-frame", "--out", "D",
         "--json", "J.json"], cwd=work, env=env)
    results = json.loads((work / "J.json").read_text())
    assert len(results) == 1 and len(results[0]["keypoints"]) == 17 * 3  # one box: the whole frame, COCO's 17
    assert (work / "D" / image.name).is_file()


@pytest.fixture(scope="module")
def tiny_run(installed, tmp_path_factory):
    bin_dir, env = installed
    work = tmp_path_factory.mktemp("anywhere") / "empty"  # outside the repository, nothing in it
    train_and_evaluate(bin_dir, env, work, TINY)
    return work


def test_installed_command_trains_and_evaluates_anywhere(tiny_run):
    assert (tiny_run / "W" / "config.yaml").is_file()  # the checks are in train_and_evaluate


@SELF_DESCRIBING
def test_installed_command_predicts_with_its_checkpoint_alone(installed, tiny_run):
    predict_one_image(*installed, tiny_run)


@pytest.mark.slow  # the demo's full set and model: minutes on a 2-core CPU
def test_acceptance_commands_from_a_wheel(installed, tmp_path):
    """Issue 17's acceptance commands exactly as written."""
    train_and_evaluate(*installed, tmp_path / "empty")
    if hasattr(vitpose, "load_model"):
        predict_one_image(*installed, tmp_path / "empty")
