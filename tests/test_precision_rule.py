"""The precision rule on every kind of machine, whatever CPU runs the tests (vitpose/device.py,
vitpose/engine/precision.py, `vitpose evaluate --precision`).

`cpu_has_native_bf16` decides from what torch reports of the CPU (the AVX512-BF16 and AMX probes,
ATen's CPU capability, which `ATEN_CPU_CAPABILITY` lowers) and from `ONEDNN_MAX_CPU_ISA`; the
inference rule (`auto`) and training's `--amp` both follow it, and CUDA has rules of its own
(compute capability, GradScaler for fp16). Tested only on the test machine's own CPU, a branch
that machine does not take (an AVX2-only CPU on an AMX box, or the reverse) could break unseen;
here the flag readers are faked, so every branch runs on any machine. One subprocess checks the
real `ATEN_CPU_CAPABILITY` variable reaches the reader the rule consults.
"""

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import pytest
import torch
from conftest import REPO
from test_evaluate import load_cli, tiny_model, write_config
from test_train_loop import tiny_args

import vitpose
from vitpose import device as device_module
from vitpose.cli.evaluate import evaluate_checkpoint
from vitpose.device import cpu_has_native_bf16
from vitpose.device import resolve_precision as inference_precision
from vitpose.engine import trainer
from vitpose.engine.precision import resolve_precision as training_precision
from vitpose.errors import UserError
from vitpose.models.vitpose import ViTPose

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@dataclass(frozen=True)
class FakeCpu:
    """What torch and the environment report of a CPU."""

    machine: str = "x86_64"
    avx512_bf16: bool = False
    amx: bool = False
    aten: str = "AVX512"  # torch.backends.cpu.get_cpu_capability(): ATen's kernels (ATEN_CPU_CAPABILITY caps it)
    onednn_isa: str | None = None  # $ONEDNN_MAX_CPU_ISA


def fake_speed(monkeypatch, speedup: float, cache=None) -> list:
    """bf16's measured speed-up on this (faked) CPU is `speedup`; returns the list of measured steps."""
    calls = []

    def measure(step, rounds=device_module.SPEED_ROUNDS):
        calls.append(step)
        return {"speedup": speedup, "rounds": [speedup] * rounds, "load": 1.0}

    monkeypatch.setattr(device_module, "_measure_bf16_speedup", measure)
    monkeypatch.setattr(device_module, "_speed_memo", {})
    monkeypatch.setattr(device_module, "_said", set())
    monkeypatch.setattr(device_module, "_reason", None)
    monkeypatch.setenv("VITPOSE_CACHE_DIR", str(cache or tempfile.mkdtemp(prefix="vitpose-speed-")))
    monkeypatch.delenv("VITPOSE_CPU_BF16", raising=False)
    return calls


def fake(monkeypatch, cpu: FakeCpu, speedup: float = 2.0) -> None:
    fake_speed(monkeypatch, speedup)  # where bf16 is native, it is measured faster unless a test says not
    monkeypatch.setattr(platform, "machine", lambda: cpu.machine)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: cpu.avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: cpu.amx)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: cpu.aten)
    if cpu.onednn_isa is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cpu.onednn_isa)


SAPPHIRE_RAPIDS = FakeCpu(avx512_bf16=True, amx=True)
# (CPU, whether it computes bf16 natively)
CPUS = {
    "avx2-only": (FakeCpu(aten="AVX2"), False),
    "avx512-without-bf16": (FakeCpu(), False),  # Skylake / Cascade Lake: AVX-512, no bf16 dot products
    "avx512-bf16": (FakeCpu(avx512_bf16=True), True),  # Cooper Lake, Zen 4
    "amx": (SAPPHIRE_RAPIDS, True),
    "amx-tiles-only": (FakeCpu(amx=True), True),
    "amx-as-avx2 (ATEN_CPU_CAPABILITY=avx2)": (FakeCpu(avx512_bf16=True, amx=True, aten="AVX2"), False),
    "amx-as-default (ATEN_CPU_CAPABILITY=default)": (FakeCpu(avx512_bf16=True, amx=True, aten="DEFAULT"), False),
    "amx-as-avx2 (ONEDNN_MAX_CPU_ISA=AVX2)": (FakeCpu(avx512_bf16=True, amx=True, onednn_isa="AVX2"), False),
    "amx, onednn avx512_core_vnni (any case)": (FakeCpu(avx512_bf16=True, amx=True, onednn_isa=" avx512_core_vnni"),
                                                False),
    "amx, onednn allows AMX": (FakeCpu(avx512_bf16=True, amx=True, onednn_isa="AVX512_CORE_AMX"), True),
    "amd64 name, no bf16": (FakeCpu(machine="AMD64", aten="AVX2"), False),
    "aarch64": (FakeCpu(machine="aarch64", aten="DEFAULT"), True),  # not x86: assumed native
}


@pytest.mark.parametrize("name", list(CPUS))
def test_native_bf16_and_every_rule_that_follows_it(monkeypatch, name):
    cpu, native = CPUS[name]
    fake(monkeypatch, cpu)
    assert cpu_has_native_bf16() is native
    # inference: auto picks bf16 only where it is native; an explicit bf16 is taken either way
    assert inference_precision("auto", "cpu") is (torch.bfloat16 if native else None)
    assert inference_precision("bf16", "cpu") is torch.bfloat16
    assert inference_precision("fp32", "cpu") is None
    # training: --amp is bf16 where native, else fp32 with a note saying why and how to force it
    amp = training_precision(CPU, amp=True)
    assert amp.scaler is None
    if native:
        assert amp.dtype is torch.bfloat16 and amp.name == "bf16" and "bfloat16 autocast" in amp.note
    else:
        assert amp.dtype is None and amp.name == "fp32"
        assert "no native bf16" in amp.note and "--amp-dtype bfloat16 forces bf16" in amp.note
    forced = training_precision(CPU, amp=True, amp_dtype="bfloat16")
    assert forced.dtype is torch.bfloat16 and forced.scaler is None and forced.note == ""
    assert training_precision(CPU, amp=False).dtype is None


def test_the_real_aten_cpu_capability_variable_reaches_the_rule():
    """ATen reads ATEN_CPU_CAPABILITY once, at start-up: a fresh interpreter, its bf16 probes faked
    to say yes (so the capability alone decides, on any CPU)."""
    code = ("import torch; torch.cpu._is_avx512_bf16_supported = lambda: True; "
            "from vitpose.device import cpu_has_native_bf16; "
            "print(torch.backends.cpu.get_cpu_capability(), cpu_has_native_bf16())")
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    env.update(ATEN_CPU_CAPABILITY="avx2", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout.split()
    assert out == ["AVX2", "False"]


# ---- CUDA, faked: the device is only named, never used ----------------------------------------

@pytest.mark.parametrize("capability", [(7, 0), (8, 0), (9, 0)])
def test_the_cuda_rule(monkeypatch, capability):
    ampere = capability[0] >= 8
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: ampere)
    # inference: auto is fp16 (gated, tensor cores since Volta); bf16 needs Ampere
    assert inference_precision("auto", CUDA) is torch.float16
    assert inference_precision("fp16", CUDA) is torch.float16
    assert inference_precision("fp32", CUDA) is None
    if ampere:
        assert inference_precision("bf16", CUDA) is torch.bfloat16
    else:
        with pytest.raises(ValueError, match=r"bf16 needs a GPU of compute capability 8\.0 or newer"):
            inference_precision("bf16", CUDA)
    # training: --amp is fp16 with a GradScaler (dynamic loss scale); bf16 needs none, and Ampere
    with pytest.warns(UserWarning, match="CUDA is not available"):  # this machine's GradScaler disables itself
        fp16 = training_precision(CUDA, amp=True)
    assert fp16.dtype is torch.float16 and fp16.scaler is not None and fp16.name == "fp16 + GradScaler"
    if ampere:
        bf16 = training_precision(CUDA, amp=True, amp_dtype="bfloat16")
        assert bf16.dtype is torch.bfloat16 and bf16.scaler is None and bf16.device_type == "cuda"
    else:
        with pytest.raises(ValueError, match="Ampere or newer"):
            training_precision(CUDA, amp=True, amp_dtype="bfloat16")
    assert training_precision(CUDA, amp=False).dtype is None


# ---- training's --amp on a faked CPU: what the training forwards run in ----------------------

@pytest.fixture(scope="module")
def synthetic_root(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic")


def forward_dtypes(monkeypatch):
    """The dtype of the first Linear's output in every training forward."""
    dtypes, real = [], trainer.forward_backward

    def forward(model, *args, **kwargs):
        first_linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        hook = first_linear.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
        try:
            return real(model, *args, **kwargs)
        finally:
            hook.remove()

    monkeypatch.setattr(trainer, "forward_backward", forward)
    return dtypes


@pytest.mark.parametrize("native", [False, True], ids=["no-native-bf16", "native-bf16"])
def test_training_amp_follows_the_cpu(monkeypatch, tmp_path, synthetic_root, capsys, native):
    import train

    fake(monkeypatch, SAPPHIRE_RAPIDS if native else FakeCpu(aten="AVX2"))
    dtypes = forward_dtypes(monkeypatch)
    args = tiny_args(synthetic_root, tmp_path / "work", "--epochs", "1", "--workers", "0", "--device", "cpu",
                     "--amp", "--set", "data.synthetic_train_images=4")
    assert train.main(args) == 0
    printed = capsys.readouterr().out
    assert dtypes and set(dtypes) == {torch.bfloat16 if native else torch.float32}
    assert ("using bfloat16 autocast" if native else "no native bf16") in printed
    assert f"parameters, {'bf16' if native else 'fp32'} on cpu" in printed  # the run's first line


# ---- vitpose evaluate --precision: what the evaluation's forwards run in ---------------------

@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("weights") / "tiny.safetensors"
    vitpose.save_weights(tiny_model(seed=5), path)
    return path


def evaluation_forwards(monkeypatch, tmp_path, coco_mini_dir, tiny_weights, *flags):
    """Runs `evaluate.py --gt-boxes FLAGS` on coco-mini; the autocast dtype of every model forward
    (None: fp32) and the stats."""
    seen, real = [], ViTPose.forward

    def forward(self, x):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return real(self, x)

    monkeypatch.setattr(ViTPose, "forward", forward)
    argv = ["--config", str(write_config(tmp_path, coco_mini_dir)), "--checkpoint", str(tiny_weights),
            "--workers", "0", "--device", "cpu", "--gt-boxes", "--out", str(tmp_path / "preds.json"), *flags]
    stats = evaluate_checkpoint(load_cli().parse_args(argv))
    return seen, stats


@pytest.mark.parametrize(("flags", "native", "expected"), [
    (["--precision", "bf16"], False, torch.bfloat16),  # asked for: taken, native or not
    (["--precision", "fp32"], True, None),
    (["--precision", "auto"], True, torch.bfloat16),
    (["--precision", "auto"], False, None),
    ([], True, None),  # no flag: fp32
], ids=["bf16", "fp32", "auto-native", "auto-emulated", "default"])
def test_evaluate_precision_sets_every_forward(monkeypatch, tmp_path, coco_mini_dir, tiny_weights, capsys,
                                               flags, native, expected):
    fake(monkeypatch, SAPPHIRE_RAPIDS if native else FakeCpu(aten="AVX2"))
    seen, stats = evaluation_forwards(monkeypatch, tmp_path, coco_mini_dir, tiny_weights, *flags)
    assert seen and set(seen) == {expected}
    printed = capsys.readouterr().out
    device_line = next(line for line in printed.splitlines() if line.startswith("device    :"))
    assert device_line.endswith("cpu autocast bfloat16" if expected is torch.bfloat16 else "cpu")
    assert 0.0 <= stats["AP"] <= 1.0


def test_evaluate_refuses_precision_and_amp_together(monkeypatch, tmp_path, coco_mini_dir, tiny_weights):
    with pytest.raises(UserError, match="--precision and --amp both choose the precision"):
        evaluation_forwards(monkeypatch, tmp_path, coco_mini_dir, tiny_weights, "--precision", "bf16", "--amp")


# ---- auto follows measured speed (issue 31): native bf16 is taken only where it is faster --------

ZEN4 = FakeCpu(avx512_bf16=True)  # AVX512-BF16 without AMX: this project's test machine kind


@pytest.mark.parametrize(("speedup", "expected"), [(0.8, None), (1.05, None), (1.6, torch.bfloat16)],
                         ids=["bf16-slow", "bf16-barely-faster", "bf16-fast"])
def test_auto_takes_bf16_only_where_it_is_measured_faster(monkeypatch, capsys, caplog, speedup, expected):
    caplog.set_level("INFO", logger="vitpose.device")
    fake(monkeypatch, ZEN4, speedup)
    calls = fake_speed(monkeypatch, speedup)
    assert inference_precision("auto", "cpu") is expected
    assert inference_precision("auto", "cpu") is expected  # the figure is kept: measured once
    assert len(calls) == 1
    said = [r.getMessage() for r in caplog.records if r.name == "vitpose.device"]
    assert len(said) == 1, said  # the reason, once
    assert said[0].startswith(f"precision auto: {'bf16' if expected else 'fp32'} on this CPU")
    assert f"bf16 runs {speedup:.2f}x fp32's speed here" in said[0]
    assert device_module.auto_precision_reason() == said[0]
    assert capsys.readouterr().err == ""  # stderr is for one-line errors
    assert inference_precision("bf16", "cpu") is torch.bfloat16  # asked for: taken, slow or not
    # the training rule still follows the instructions only (its step is a backward pass too)
    assert training_precision(CPU, amp=True).dtype is torch.bfloat16


def test_a_median_from_a_few_lucky_rounds_is_not_enough(monkeypatch, capsys):
    fake(monkeypatch, ZEN4)
    calls = []

    def measure(step, rounds=5):
        calls.append(step)
        return {"speedup": 1.55, "rounds": [2.07, 1.55, 1.33, 0.65, 0.9], "load": 11.0}  # two rounds slower

    monkeypatch.setattr(device_module, "_measure_bf16_speedup", measure)
    assert inference_precision("auto", "cpu") is None and len(calls) == 1
    assert device_module.auto_precision_reason().startswith("precision auto: fp32")


def test_auto_never_times_emulated_bf16(monkeypatch, capsys):
    fake(monkeypatch, FakeCpu(avx512_bf16=True, amx=True, aten="AVX2"))
    calls = fake_speed(monkeypatch, 5.0)  # even a figure saying bf16 is fast would not be asked for
    assert inference_precision("auto", "cpu") is None
    assert calls == [] and capsys.readouterr().err == "" and device_module.auto_precision_reason() is None


def test_the_figure_is_cached_per_cpu_model_and_torch_version(monkeypatch, tmp_path):
    fake(monkeypatch, ZEN4)
    calls = fake_speed(monkeypatch, 0.7, cache=tmp_path)
    monkeypatch.setattr(device_module, "cpu_model_name", lambda: "AMD EPYC 9654")
    assert inference_precision("auto", "cpu") is None and len(calls) == 1
    cached = json.loads((tmp_path / device_module.CACHE_FILE).read_text())
    (key, figure), = cached.items()
    assert "AMD EPYC 9654" in key and f"torch {torch.__version__}" in key and figure["speedup"] == 0.7
    monkeypatch.setattr(device_module, "_speed_memo", {})  # a new process: read from the cache folder
    assert inference_precision("auto", "cpu") is None and len(calls) == 1
    monkeypatch.setattr(device_module, "cpu_model_name", lambda: "Intel Xeon Platinum 8480+")
    assert inference_precision("auto", "cpu") is None and len(calls) == 2  # another CPU: measured
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert inference_precision("auto", "cpu") is None and len(calls) == 3  # another torch: measured
    assert len(json.loads((tmp_path / device_module.CACHE_FILE).read_text())) == 3


def test_the_environment_decides_without_a_measurement(monkeypatch):
    fake(monkeypatch, ZEN4)
    calls = fake_speed(monkeypatch, 3.0)
    monkeypatch.setenv("VITPOSE_CPU_BF16", "slower")
    assert inference_precision("auto", "cpu") is None
    monkeypatch.setenv("VITPOSE_CPU_BF16", "faster")
    assert inference_precision("auto", "cpu") is torch.bfloat16
    monkeypatch.setenv("VITPOSE_CPU_BF16", "quick")
    with pytest.raises(ValueError, match="VITPOSE_CPU_BF16='quick': use faster or slower"):
        inference_precision("auto", "cpu")
    assert calls == []


@pytest.mark.parametrize(("fp32_s", "bf16_s"), [(0.02, 0.01), (0.01, 0.03)])
def test_the_measurement_is_fp32_time_over_bf16_time(fp32_s, bf16_s):
    """The real timing loop on a step whose duration depends on autocast: the ratio's direction."""
    def step():
        time.sleep(bf16_s if torch.is_autocast_enabled("cpu") else fp32_s)

    figure = device_module._measure_bf16_speedup(step)
    assert len(figure["rounds"]) == device_module.SPEED_ROUNDS
    assert figure["speedup"] == pytest.approx(fp32_s / bf16_s, rel=0.35)


def test_predictor_times_its_own_model(monkeypatch):
    fake(monkeypatch, ZEN4)
    steps = []

    def measure(step, rounds=3):
        step()  # the model's forward runs
        steps.append(step)
        return {"speedup": 0.5, "rounds": [0.5], "load": 1.0}

    monkeypatch.setattr(device_module, "_measure_bf16_speedup", measure)
    from vitpose.inference.predictor import Predictor

    model = tiny_model(seed=2)
    assert Predictor(model, device="cpu", precision="auto").amp_dtype is None
    (key,) = device_module._speed_memo
    assert "ViTPose" in key and "4 crops" in key and f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M" in key


def test_predict_prints_the_reason_with_its_summary(monkeypatch, tmp_path, capsys, coco_mini_dir):
    """`vitpose predict` (auto by default) says once, in its summary, what auto chose and the figure."""
    from vitpose.cli import main

    fake(monkeypatch, ZEN4, 0.8)
    weights = tmp_path / "w.safetensors"
    vitpose.save_weights(tiny_model(seed=3), weights)
    image = next(coco_mini_dir.glob("*.jpg"))
    assert main(["predict", str(image), "--model", str(weights), "--detector", "full-frame", "--device", "cpu",
                 "--json", str(tmp_path / "p.json")]) == 0
    out, err = capsys.readouterr()
    said = [line for line in out.splitlines() if line.startswith("precision auto:")]
    assert len(said) == 1 and said[0].startswith("precision auto: fp32") and "0.80x" in said[0], out
    assert "precision auto" not in err
