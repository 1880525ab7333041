"""Fault injection: a run killed at any moment, then `--resume auto`, ends bit-identical to one never killed.

Each case runs train.py in a subprocess through tests/fault_wrapper.py, which signals the process
(SIGKILL, or SIGTERM for a graceful stop) at one moment: between steps, on an epoch's or the run's
last step, inside each kind of save (half-written temp file, before and after the rename), around
validation, inside the atomic config.yaml write. Some cases kill the resumed run again. Then a plain
`train.py --resume auto` must exit 0 and leave:
- every checkpoint file of the uninterrupted run (last.pth, best.pth, epoch_N.pth) and no other,
  each bitwise equal to the reference's (weights, optimizer, RNG states, counters, best_ap/best_epoch);
- the same validation record for each epoch in metrics.jsonl (a validation interrupted before its
  epoch's last.pth is repeated on resume, so a record may appear twice, never with other numbers);
- no temp file of an interrupted write.
After every kill, each checkpoint file present must still load (no torn checkpoint).

The tiny run: 3 epochs of 3 steps, validation after every epoch, epoch_N.pth every 2nd epoch
(configs/demo.yaml shrunk as in test_train_resume.py). Everything runs in subprocesses, the
reference too, so the comparison never depends on what earlier tests did to this interpreter.
The whole matrix is `slow`; three cases run in CI, among them each of the two ways a SIGTERM leaves
training with 143 (inside a step: the stop after it; during validation: the stop at the epoch's end).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from test_train_resume import assert_bitwise_equal, tiny_args

from vitpose.engine.checkpoint import checkpoint_files, load_checkpoint

WRAPPER = Path(__file__).with_name("fault_wrapper.py")
EPOCHS, STEPS_PER_EPOCH = 3, 3  # tiny_args: 5 synthetic images, 8 people, batch 3
FAULT_SETS = ["train.val_every=1", "train.keep_every=2"]
PERIODIC_SAVES = ("--set", "train.checkpoint_minutes=1e-9")  # last.pth after every step
RUN_TIMEOUT_S = 600


def run_args(data_root: Path, work_dir: Path, *extra: str) -> list[str]:
    """train.py arguments of the tiny run; `extra` (e.g. --resume auto) comes last and wins."""
    sets = [arg for s in FAULT_SETS for arg in ("--set", s)]
    return tiny_args(data_root, work_dir, "--workers", "0", *sets, *extra)


# Every run is a fresh process whose float results must equal the reference's bit for bit, so the
# runs pin what makes one process's sums differ from another's with the same code and data:
# - one intra-op thread: how OpenMP/MKL/oneDNN split a reduction among threads, and MKL's dynamic
#   choice of thread count per call (MKL_VERBOSE shows `Dyn:1` by default), are then out of play;
#   with 2 cores shared by many processes one thread is also the faster choice (no spin-waits);
# - MKL's conditional numerical reproducibility (MKL_CBWR=AUTO,STRICT: the same kernels whatever
#   the alignment of the arrays; AUTO keeps this CPU's best code path, AVX-512/AMX included).
# Differences of 3e-7 in the weights between two fresh processes were seen with the defaults on an
# AVX-512/AMX machine (2 of about 18 runs of a resume case).
DETERMINISTIC_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MKL_DYNAMIC": "FALSE",
                     "MKL_CBWR": "AUTO,STRICT"}


def run_train(args: list[str], fault: dict | None = None) -> subprocess.CompletedProcess:
    """train.py in a fresh interpreter; with `fault`, through the wrapper that injects it."""
    script = [str(WRAPPER), json.dumps(fault)] if fault else [str(REPO / "train.py")]
    return subprocess.run([sys.executable, *script, *args], cwd=REPO, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env={**os.environ, **DETERMINISTIC_ENV})


def describe(proc: subprocess.CompletedProcess) -> str:
    """The exit status and the ends of both streams, for a failure message."""
    return f"exit {proc.returncode}\n--- stdout (tail)\n{proc.stdout[-2500:]}\n--- stderr (tail)\n{proc.stderr[-2500:]}"


def eval_records(work_dir: Path) -> list[dict]:
    """metrics.jsonl's validation records without their wall-clock time."""
    lines = (work_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [{k: v for k, v in r.items() if k != "time"} for r in records if r.get("kind") == "eval"]


# Recorded config fields that legitimately differ from the reference's: the work dir, and what
# some cases change on purpose (saving after every step, loader workers in the killed run).
RUN_SPECIFIC = [("train", "work_dir"), ("train", "checkpoint_minutes"), ("loader", "num_workers")]


def comparable(checkpoint: dict) -> dict:
    """A checkpoint without the recorded config fields that differ between runs on purpose."""
    config = json.loads(json.dumps(checkpoint["config"]))
    for section, key in RUN_SPECIFIC:
        config[section].pop(key)
    return {**checkpoint, "config": config}


def checkpoint_names(work_dir: Path) -> list[str]:
    return sorted(p.name for p in checkpoint_files(work_dir))


def temp_files(work_dir: Path) -> list[str]:
    """Names of temp files of interrupted writes (`.last.pth.XXXX.tmp`, `.config.yaml.XXXX.tmp`)."""
    return sorted(p.name for p in work_dir.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic")


@pytest.fixture(scope="module")
def reference(data_root, tmp_path_factory) -> Path:
    """The uninterrupted run (its first start also writes the synthetic set the cases share)."""
    work = tmp_path_factory.mktemp("uninterrupted")
    proc = run_train(run_args(data_root, work))
    assert proc.returncode == 0, describe(proc)
    names = checkpoint_names(work)
    assert names == ["best.pth", "epoch_2.pth", "last.pth"], names
    last = load_checkpoint(work / "last.pth")
    assert (last["epoch"], last["batch"], last["iteration"]) == (EPOCHS, 0, EPOCHS * STEPS_PER_EPOCH)
    assert not last.get("epoch_end_pending") and last["best_epoch"] is not None
    assert [r["epoch"] for r in eval_records(work)] == list(range(EPOCHS))
    return work


def kill_then_resume(data_root: Path, work_dir: Path, faults: list[dict], extra: tuple[str, ...] = ()) -> None:
    """Start the run with faults[0]; `--resume auto` with each later fault; then resume plainly to the end."""
    for i, fault in enumerate(faults):
        resume = ("--resume", "auto") if i else ()
        proc = run_train(run_args(data_root, work_dir, *extra, *resume), fault)
        assert f"FAULT {fault['event']}" in proc.stderr, f"fault {fault} never fired\n{describe(proc)}"
        graceful = fault.get("signal") == "SIGTERM"
        assert proc.returncode == (128 + signal.SIGTERM if graceful else -signal.SIGKILL), describe(proc)
        if fault["event"] == "during_step" and graceful:  # stopped after the step it came in, not later
            assert load_checkpoint(work_dir / "last.pth")["iteration"] == fault["steps"], describe(proc)
        if fault["event"] in ("save_write", "before_rename"):  # the interrupted write left its temp file
            assert any(name.startswith(f".{fault['file']}.") for name in temp_files(work_dir)), temp_files(work_dir)
        for path in checkpoint_files(work_dir):  # a kill never leaves a torn checkpoint under its name
            load_checkpoint(path)
    proc = run_train(run_args(data_root, work_dir, *extra, "--resume", "auto"))
    assert proc.returncode == 0, describe(proc)
    assert f"done: {EPOCHS * STEPS_PER_EPOCH} iterations" in proc.stdout, describe(proc)


def assert_same_as_reference(work_dir: Path, reference: Path) -> None:
    names = checkpoint_names(work_dir)
    assert names == checkpoint_names(reference), f"checkpoint files differ: {names}"
    for name in names:
        ours, theirs = load_checkpoint(work_dir / name), load_checkpoint(reference / name)
        assert (ours["iteration"], ours["best_ap"], ours["best_epoch"]) == (
            theirs["iteration"], theirs["best_ap"], theirs["best_epoch"]), name
        assert_bitwise_equal(comparable(ours), comparable(theirs), name)
    assert temp_files(work_dir) == [], "temp files of interrupted writes were left behind"
    expected = {r["epoch"]: r for r in eval_records(reference)}
    seen: dict[int, list[dict]] = {}
    for record in eval_records(work_dir):
        seen.setdefault(record["epoch"], []).append(record)
    assert sorted(seen) == sorted(expected), f"validated epochs {sorted(seen)}, expected {sorted(expected)}"
    for epoch, records in seen.items():
        assert all(r == expected[epoch] for r in records), f"epoch {epoch}: {records} != {expected[epoch]}"


def save_fault(event: str, file: str, iteration: int, pending: bool | None = None, **more) -> dict:
    """A fault inside the save of `file` recording `iteration` (and `epoch_end_pending`)."""
    fault = {"event": event, "file": file, "iteration": iteration, **more}
    if pending is not None:
        fault["pending"] = pending
    return fault


def step_fault(steps: int) -> dict:
    """SIGKILL right after the update of step `steps` (nothing saved since the last checkpoint)."""
    return {"event": "step", "steps": steps}


def sigterm_in_step(steps: int) -> dict:
    """SIGTERM while step `steps` computes: the run finishes that step, saves and exits 143."""
    return {"event": "during_step", "steps": steps, "signal": "SIGTERM"}


LAST_STEP = EPOCHS * STEPS_PER_EPOCH


def case(name: str, faults: list[dict], extra: tuple[str, ...] = (), fast: bool = False):
    """One row of the matrix: the faults in order (the fresh start's, then each killed resume's)."""
    return pytest.param(faults, extra, id=name, marks=() if fast else pytest.mark.slow)


CASES = [
    # -- the CI subset: a torn last.pth after validation (the epoch's end is redone from the
    #    last.pth written before it, epoch_2.pth included), a graceful stop on an epoch's last step
    #    (and, below, one during validation)
    case("inside_final_last_pth_write", [save_fault("save_write", "last.pth", 6, pending=False)], fast=True),
    case("sigterm_on_epoch1_last_step", [sigterm_in_step(3)], fast=True),
    # -- between and on steps
    case("mid_epoch_between_steps", [step_fault(4)]),
    case("mid_epoch_with_loader_workers", [step_fault(5)], ("--workers", "2")),
    case("on_epoch1_last_step", [step_fault(3)]),
    case("on_run_last_step", [step_fault(LAST_STEP)]),
    case("sigterm_on_run_last_step", [sigterm_in_step(LAST_STEP)]),
    case("sigterm_mid_epoch", [sigterm_in_step(5)]),
    # -- inside each kind of save
    case("inside_last_pth_write_pending_epoch1", [save_fault("save_write", "last.pth", 3, pending=True)]),
    case("inside_last_pth_write_pending_epoch2", [save_fault("save_write", "last.pth", 6, pending=True)]),
    case("before_last_pth_rename_pending", [save_fault("before_rename", "last.pth", 6, pending=True)]),
    case("after_last_pth_rename_pending", [save_fault("after_rename", "last.pth", 6, pending=True)]),
    case("before_final_last_pth_rename_run_end", [save_fault("before_rename", "last.pth", LAST_STEP, pending=False)]),
    case("inside_best_pth_write", [save_fault("save_write", "best.pth", 3)]),
    case("before_best_pth_rename", [save_fault("before_rename", "best.pth", 3)]),
    case("between_best_pth_and_last_pth", [save_fault("after_rename", "best.pth", 3)]),
    case("inside_epoch_n_pth_write", [save_fault("save_write", "epoch_2.pth", 6)]),
    case("between_epoch_n_pth_and_last_pth", [save_fault("after_rename", "epoch_2.pth", 6)]),
    case("inside_periodic_last_pth_write", [save_fault("save_write", "last.pth", 4)], PERIODIC_SAVES),
    # the periodic save after an epoch's last step records batch 3 of 3: the resume starts there
    case("after_periodic_save_on_epoch_last_step", [save_fault("before_rename", "last.pth", 3, pending=True)],
         PERIODIC_SAVES),
    # -- around validation
    case("validation_start_epoch2", [{"event": "validation_start", "nth": 2}]),
    case("during_validation_scoring_epoch2", [{"event": "validation_scoring", "nth": 2}]),
    case("after_eval_record_before_best_pth", [{"event": "after_eval_log", "nth": 1}]),
    # a stop noticed at an epoch's end (the branch a signal during validation takes) exits 143 too
    case("sigterm_during_validation", [{"event": "validation_start", "nth": 2, "signal": "SIGTERM"}], fast=True),
    # -- the atomic config.yaml write
    case("inside_config_yaml_write_fresh_start", [{"event": "before_rename", "file": "config.yaml"}]),
    case("inside_config_yaml_write_of_a_resume", [step_fault(4), {"event": "before_rename", "file": "config.yaml"}]),
    # -- killed again while resuming
    case("sigterm_epoch_end_then_kill_in_pending_validation",
         [sigterm_in_step(6), {"event": "validation_start", "nth": 1}]),
    case("three_kills_in_a_row",
         [step_fault(2), save_fault("after_rename", "best.pth", 3), save_fault("save_write", "epoch_2.pth", 6)]),
]


@pytest.mark.parametrize("faults, extra", CASES)
def test_killed_and_resumed_run_is_bit_identical(data_root, reference, tmp_path, faults, extra):
    kill_then_resume(data_root, tmp_path, faults, extra)
    assert_same_as_reference(tmp_path, reference)


def test_the_comparison_sees_a_skipped_epoch_end(data_root, reference, tmp_path):
    """The checks above can fail: a copy of the reference whose last.pth forgot epoch 1's best."""
    last = load_checkpoint(reference / "last.pth")
    for name in checkpoint_names(reference) + ["metrics.jsonl"]:
        (tmp_path / name).write_bytes((reference / name).read_bytes())
    torch.save({**last, "best_epoch": last["best_epoch"] + 1}, tmp_path / "last.pth")
    with pytest.raises(AssertionError, match="last.pth"):
        assert_same_as_reference(tmp_path, reference)
