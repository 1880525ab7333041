"""`vitpose.device.tune_cpu_allocator`: glibc's malloc keeps the pages a CPU forward pass frees.

The effect is counted, not timed: minor page faults (getrusage) of a process that allocates,
touches and frees the same big buffers again and again, as an eager forward pass does. With
glibc's defaults the freed blocks go back to the system (mmap, heap trimming) and every cycle
faults them in again; tuned, the steady cycles fault nothing. The setting is process-wide and
cannot be undone, so each case runs in a fresh interpreter. The speed this buys is a benchmark
(benchmarks/bench_allocator.py), never a test.
"""

import json
import os
import platform
import subprocess
import sys

import pytest
from conftest import REPO
from test_evaluate import load_cli, write_tiny_model

import vitpose.device
from vitpose.cli import main

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# Two 48 MiB tensors made, touched and freed per cycle (a ViTPose-S head's 16-crop activation is
# 50 MB). Above 32 MiB, the most glibc's moving mmap threshold can reach on 64-bit, so by
# default each one is mmapped fresh and unmapped on free: every cycle faults all its pages,
# deterministically. (Smaller blocks are also given back, by heap trimming, but when depends on
# glibc's history: a test of them would be flaky.) Warm-up cycles first: the tuned heap grows to
# the cycle's size. It may still grow once more in the measured cycles (a small allocation of the
# interpreter landing above the freed buffers moves them up: one buffer's 12,288 faults, seen once
# in ~10 runs after 6 warm-up cycles, never in 20 runs after these 10), so tuned means "at most one cycle's pages in five cycles", against
# every cycle's pages by default: a factor 5 apart.
CYCLES = """
import json, resource, sys, torch
import vitpose.device
tuned = vitpose.device.tune_cpu_allocator() if sys.argv[1] == "tuned" else False

def cycle():
    buffers = [torch.ones(12 << 20) for _ in range(2)]  # 12 Mi float32 = 48 MiB, every page written
    del buffers

for _ in range(10):
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    cycle()
print(json.dumps(dict(tuned=tuned, faults=resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)))
"""
PAGES_PER_CYCLE = 2 * (48 << 20) // 4096  # 24,576


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**env, **extra}


def run_cycles(mode, **env):
    proc = subprocess.run([sys.executable, "-c", CYCLES, mode], capture_output=True, text=True, timeout=300,
                          env=clean_env(**env))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@glibc_only
def test_tuned_malloc_reuses_freed_pages_where_the_default_faults_them_in_again():
    default, tuned = run_cycles("default"), run_cycles("tuned")
    assert tuned["tuned"] is True
    # By default both buffers come back as fresh pages every cycle.
    assert default["faults"] >= 5 * PAGES_PER_CYCLE * 0.9, default
    # Tuned, nothing is given back: at most one late growth of the heap (see CYCLES).
    assert tuned["faults"] <= PAGES_PER_CYCLE, (default, tuned)


@glibc_only
@pytest.mark.parametrize("variable", ["MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES", "LD_PRELOAD"])
def test_an_allocator_the_user_chose_is_left_alone(variable, monkeypatch):
    value = {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000", "LD_PRELOAD": "/usr/lib/libjemalloc.so.2",
             "MALLOC_MMAP_MAX_": "65536"}.get(variable, "131072")
    monkeypatch.setattr(vitpose.device, "_allocator_tuned", False)
    monkeypatch.setenv(variable, value)
    # Returns before mallopt: this test process is not changed.
    assert vitpose.device.tune_cpu_allocator() is False


@glibc_only
def test_the_user_s_own_setting_keeps_its_effect():
    """Their variable is glibc's: with MALLOC_TRIM_THRESHOLD_ set (and mmap left on) the big
    blocks still go back, and tune_cpu_allocator does not override that."""
    chosen = run_cycles("tuned", MALLOC_TRIM_THRESHOLD_="131072")
    assert chosen["tuned"] is False
    assert chosen["faults"] >= 5 * PAGES_PER_CYCLE * 0.9, chosen


@glibc_only
def test_glibc_s_variables_give_the_same_setting():
    """`allocator_environment()` (what bench_predict --tune-peers gives the peers' process) keeps
    the pages as the mallopt calls do, and then tune_cpu_allocator stands aside."""
    started_with = run_cycles("tuned", **vitpose.device.allocator_environment())
    assert started_with["tuned"] is False and started_with["faults"] <= PAGES_PER_CYCLE, started_with


def test_only_a_cpu_run_is_tuned(monkeypatch):
    monkeypatch.setattr(vitpose.device, "_allocator_tuned", False)
    # Returns before mallopt: this test process is not changed.
    assert vitpose.device.tune_cpu_allocator("cuda") is False
    assert vitpose.device.tune_cpu_allocator(vitpose.device.torch.device("cuda", 0)) is False
    # Once tuned, the answer for a CPU comes before any mallopt: every spelling of the CPU counts.
    monkeypatch.setattr(vitpose.device, "_allocator_tuned", True)
    for cpu in ("cpu", "cpu:0", vitpose.device.torch.device("cpu")):
        assert vitpose.device.tune_cpu_allocator(cpu) is True, cpu
    assert vitpose.device.tune_cpu_allocator("cuda:1") is False


def test_vitpose_predict_tunes_the_allocator_for_its_device(tmp_path, coco_mini_dir, monkeypatch, capsys):
    """The command line owns its process: `vitpose predict` hands its device to the tuning (the
    Python API leaves the process to its caller)."""
    devices = []
    monkeypatch.setattr(vitpose.device, "tune_cpu_allocator", lambda device: devices.append(str(device)) or True)
    config, checkpoint = write_tiny_model(tmp_path, coco_mini_dir, seed=2)
    image = next(coco_mini_dir.glob("*.jpg"))
    code = main(["predict", str(image), "--config", str(config), "--model", str(checkpoint), "--device", "cpu",
                 "--detector", "full-frame", "--json", str(tmp_path / "poses.json"), "--precision", "fp32"])
    capsys.readouterr()
    assert code == 0 and devices == ["cpu"]


def test_evaluate_tunes_the_allocator_for_its_device(tmp_path, coco_mini_dir, monkeypatch, capsys):
    import vitpose.cli.evaluate as evaluate_cli

    devices = []
    monkeypatch.setattr(evaluate_cli, "tune_cpu_allocator", lambda device: devices.append(str(device)) or True)
    config, checkpoint = write_tiny_model(tmp_path, coco_mini_dir, seed=2)
    load_cli().main(["--config", str(config), "--checkpoint", str(checkpoint), "--gt-boxes", "--workers", "0",
                     "--device", "cpu", "--out", str(tmp_path / "preds.json")])
    capsys.readouterr()
    assert devices == ["cpu"] and (tmp_path / "preds.json").is_file()
