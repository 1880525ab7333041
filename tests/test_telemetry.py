"""Telemetry, GpuMonitor and ThermalGuard: the numbers reported, where they go, the advice,
the pause, and surviving a dead terminal."""

import errno
import io
import json
import re
import sys
from types import SimpleNamespace

import pytest
import torch

from vitpose.engine import telemetry as tm
from vitpose.engine import thermal as th
from vitpose.engine.gpu_monitor import GpuMonitor, decode_clock_reasons, read_nvml
from vitpose.engine.runtime import RunOutput
from vitpose.engine.telemetry import Telemetry, loader_advice
from vitpose.engine.thermal import ThermalGuard

STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  ")


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def log_lines(path):
    """train.log without the timestamps (checking that every non-blank line has one)."""
    lines = path.read_text().splitlines()
    assert all(STAMP.match(line) or not line for line in lines), lines  # blank lines stay blank
    return [STAMP.sub("", line) for line in lines]


def make(tmp_path, stream=None, **kw):
    """A Telemetry writing to `stream` (the terminal) and tmp_path/train.log; returns it and its output."""
    kw.setdefault("tensorboard", False)
    output = RunOutput(stream if stream is not None else io.StringIO(), tmp_path / "train.log")
    t = Telemetry(tmp_path, total_iters=kw.pop("total_iters", 100), iters_per_epoch=kw.pop("ipe", 10),
                  log_every=kw.pop("log_every", 4), output=output, **kw)
    return t, output


def run_steps(t, n, epoch=0, gpu=None, start=0, **step):
    """Iterations start..start+n-1 as the loop runs them: step, and at report points report.

    Returns the reported records. epoch=None: the epoch that the iteration falls in.
    """
    args = {"loss": 1.0, "lr": 1e-3, "samples": 8, "step_time": 0.01, "data_time": 0.0, **step}
    records = []
    for i in range(start, start + n):
        if t.step(i, epoch if epoch is not None else i // t.iters_per_epoch, **args):
            records.append(t.report(gpu))
    return records


def test_window_averages_and_eta(tmp_path):
    t, out = make(tmp_path)
    losses = [1.0, 2.0, torch.tensor(3.0), torch.tensor(6.0)]
    due = [t.step(i, epoch=0, loss=loss, lr=1e-3 * (i + 1), samples=32, step_time=0.5, data_time=0.1,
                  extra={"grad_norm": float(i)}) for i, loss in enumerate(losses)]
    r = t.report()
    t.close(), out.close()
    assert due == [False, False, False, True]
    assert r["iter"] == 4 and r["epoch_iter"] == 4
    assert r["loss"] == pytest.approx(3.0)  # mean over the window, tensors included
    assert r["lr"] == pytest.approx(4e-3)  # the logged step's value
    assert r["samples_per_s"] == pytest.approx(4 * 32 / 2.0)
    assert r["step_time"] == pytest.approx(0.5) and r["data_time"] == pytest.approx(0.1)
    assert r["data_share"] == pytest.approx(0.2)
    assert r["eta_s"] == pytest.approx(0.5 * 96)
    assert r["grad_norm"] == pytest.approx(1.5)
    assert r["mem_gib"] > 0  # no reading passed: the process's peak RSS
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [x["kind"] for x in records] == ["train"]
    assert records[0]["loss"] == pytest.approx(3.0)


def test_report_points_and_window_reset(tmp_path):
    # log_every 4, 10 iterations per epoch, 12 in all: reports after 4, 8, 10 (epoch end) and 12.
    t, out = make(tmp_path, total_iters=12)
    reported = []
    for i in range(12):
        if t.step(i, epoch=i // 10, loss=float(i), lr=0.1, samples=1, step_time=1.0, data_time=0.0):
            r = t.report()
            reported.append((r["iter"], r["loss"]))
    assert t.report() is None  # nothing since the last report
    t.close(), out.close()
    assert reported == [(4, 1.5), (8, 5.5), (10, 8.5), (12, 10.5)]
    assert [r["iter"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [4, 8, 10, 12]


def test_the_reading_joins_the_record(tmp_path):
    t, out = make(tmp_path)
    reading = {"mem_gib": 1.5, "gpu_util": 99, "power_w": 650.0, "power_limit_w": 700.0, "temp_c": 71,
               "sm_clock_mhz": 1980, "clock_reasons": ["software power cap"]}
    (r,) = run_steps(t, 4, gpu=reading)
    t.close(), out.close()
    assert {k: r[k] for k in reading} == reading
    assert "mem 1.50 GiB  gpu 99% 650/700 W 71 C 1980 MHz [software power cap]" in log_lines(tmp_path / "train.log")[0]


def test_plain_lines_when_not_a_terminal(tmp_path):
    stream = io.StringIO()
    t, out = make(tmp_path, stream)
    run_steps(t, 4, epoch=3, loss=0.25, lr=5e-4, samples=64, step_time=0.1)
    t.message("checkpoint saved")
    t.log_eval(3, 3, {"AP": 0.71, "AP .5": 0.9})
    t.close(), out.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("Epoch 3 [ 4/10]  iter 4/100")
    assert "loss 0.25" in lines[0] and "640.0 samples/s" in lines[0] and "data 0.0000s (0%)" in lines[0]
    assert lines[1] == "checkpoint saved"
    assert lines[2] == "Eval epoch 3 iter 4: AP 0.7100  AP .5 0.9000"
    assert log_lines(tmp_path / "train.log") == lines  # each line once, with its time
    ev = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    assert ev == {**ev, "kind": "eval", "epoch": 3, "iter": 4, "AP": 0.71, "AP .5": 0.9}


def test_records_load_in_plot(tmp_path):
    from vitpose.cli.plot import load_curves

    t, out = make(tmp_path, total_iters=8)
    run_steps(t, 8, loss=0.5)
    t.log_eval(0, 7, {"AP": 0.25})
    t.close(), out.close()
    curves = load_curves(tmp_path / "metrics.jsonl")
    assert curves["train_iter"].tolist() == [4, 8] and curves["loss"].tolist() == [0.5, 0.5]
    assert curves["AP"].tolist() == [0.25]


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_on_a_terminal(tmp_path):
    stream = FakeTTY()
    t, out = make(tmp_path, stream)
    run_steps(t, 8, loss=0.5)
    t.message("hello")
    t.close(), out.close()
    text = stream.getvalue()
    assert "8/100" in text and "hello" in text  # tqdm bar and a message above it
    assert "Epoch 0 [" not in text  # the per-report lines go to train.log only
    log = log_lines(tmp_path / "train.log")
    assert sum(line.startswith("Epoch 0 [") for line in log) == 2 and log[-1] == "hello"
    assert "\r" not in (tmp_path / "train.log").read_text()  # the bar never reaches the log


class DeadTerminal:
    """A stream whose terminal went away (or goes away on `kill()`): writes fail with EIO, as after
    an ssh drop."""

    def __init__(self, tty, err=errno.EIO, dead=True):
        self.tty, self.err, self.dead = tty, err, dead
        self.failed = 0
        self.text = io.StringIO()

    def kill(self):
        self.dead = True

    def isatty(self):
        return self.tty

    def write(self, text):
        if self.dead:
            self.failed += 1
            raise OSError(self.err, "Input/output error")
        return self.text.write(text)

    def flush(self):
        if self.dead:
            raise OSError(self.err, "Input/output error")


@pytest.mark.parametrize("tty,err", [(False, errno.EIO), (True, errno.EIO), (False, errno.EPIPE)])
def test_survives_vanished_terminal(tmp_path, tty, err):
    stream = DeadTerminal(tty, err)
    t, out = make(tmp_path, stream)
    run_steps(t, 12, epoch=None)
    t.message("still here")
    t.log_eval(0, 11, {"AP": 0.5})
    t.close(), out.close()
    assert stream.failed == 1  # one failed write, then the terminal is left alone
    log = log_lines(tmp_path / "train.log")
    assert sum(line.startswith("terminal output stopped (stdout: ") for line in log) == 1
    assert log.count("still here") == 1 and sum(line.startswith("Eval epoch 0 iter 12") for line in log) == 1
    epochs = [line.split("]")[0] for line in log if line.startswith("Epoch")]
    assert epochs == ["Epoch 0 [ 4/10", "Epoch 0 [ 8/10", "Epoch 0 [10/10", "Epoch 1 [ 2/10"]
    assert [r["kind"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == ["train"] * 4 + ["eval"]


def test_terminal_dies_under_the_bar(tmp_path):
    from tqdm import tqdm

    stream = DeadTerminal(tty=True, dead=False)
    t, out = make(tmp_path, stream, total_iters=40)
    run_steps(t, 20, epoch=None)
    t.message("before")
    stream.kill()  # ssh dropped
    t.message("after")
    run_steps(t, 20, epoch=None, start=20)
    assert t._bar is None and not [bar for bar in tqdm._instances if bar.fp is out.terminal]  # closed
    t.close(), out.close()
    assert stream.failed == 1 and "20/40" in stream.text.getvalue() and "before" in stream.text.getvalue()
    log = log_lines(tmp_path / "train.log")
    reports = [line.split("  ")[1] for line in log if line.startswith("Epoch")]
    assert reports == [f"iter {n}/40" for n in (4, 8, 10, 12, 16, 20, 24, 28, 30, 32, 36, 40)]
    assert [line for line in log if not line.startswith("Epoch")] == [
        "before", "terminal output stopped (stdout: OSError: [Errno 5] Input/output error); "
        "the run continues, writing to train.log", "after"]
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 12


def test_non_main_rank_writes_nothing(tmp_path):
    stream = io.StringIO()
    t = Telemetry(tmp_path / "run", 100, 10, is_main=False, log_every=4, tensorboard=False,
                  output=RunOutput(stream))
    due = [t.step(i, 0, 1.0, 1e-3, 8, 0.01, 0.0) for i in range(8)]
    assert t.report() is None
    t.message("x")
    t.warn("loader_bound", "x")
    t.log_eval(0, 7, {"AP": 0.1})
    t.close()
    assert due == [False, False, False, True] * 2  # every rank knows the report points
    assert stream.getvalue() == "" and not (tmp_path / "run").exists()


def test_telemetry_never_sleeps(tmp_path, monkeypatch):
    def no_sleep(seconds):
        raise AssertionError("Telemetry slept")

    monkeypatch.setattr("time.sleep", no_sleep)
    stream = io.StringIO()
    t, out = make(tmp_path, stream)
    hot = {"temp_c": 99, "power_limit_w": 700.0, "clock_reasons": ["hardware thermal slowdown"]}
    records = run_steps(t, 8, gpu=hot, step_time=0.2, data_time=0.1)  # hot and loader-bound
    t.close(), out.close()
    assert [r["temp_c"] for r in records] == [99, 99]
    assert "WARNING loader-bound" in stream.getvalue() and "WARNING GPU" not in stream.getvalue()


def test_loader_bound_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(tm.os, "cpu_count", lambda: 16)
    stream = io.StringIO()
    t, out = make(tmp_path, stream, num_workers=4, config_path="configs/vitpose-s.yaml")
    run_steps(t, 8, step_time=0.2, data_time=0.07)  # two reports: the warning only once (cooldown)
    t.close(), out.close()
    warnings = [line for line in stream.getvalue().splitlines() if line.startswith("WARNING")]
    assert warnings == [("WARNING loader-bound: data wait 35% of step; raise loader.num_workers from 4 to 8 "
                         "(16 cores), or run `vitpose tune --config configs/vitpose-s.yaml`")]
    w = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "warning"]
    assert len(w) == 1 and w[0]["code"] == "loader_bound" and w[0]["data_share"] == pytest.approx(0.35)


def test_no_loader_warning_below_threshold(tmp_path):
    stream = io.StringIO()
    t, out = make(tmp_path, stream, num_workers=4)
    run_steps(t, 4, step_time=0.2, data_time=0.03)
    t.close(), out.close()
    assert "WARNING" not in stream.getvalue()


def test_loader_advice_cases():
    assert "from 6 to 8 (16 cores, 8 per process)" in loader_advice(0.5, 6, 16, world_size=2)
    full = loader_advice(0.3, 8, 16, world_size=2)
    assert "already uses all 16 cores, 8 per process" in full and "vitpose build-crop-cache" in full
    assert "set loader.num_workers explicitly (up to 16" in loader_advice(0.3, None, 16)
    assert "from 0 to 1" in loader_advice(0.9, 0, 4)


def test_decode_clock_reasons():
    assert decode_clock_reasons(0) == []
    assert decode_clock_reasons(0x4 | 0x40) == ["software power cap", "hardware thermal slowdown"]
    assert decode_clock_reasons(0x1 | 0x10000) == ["idle", "unknown reason 0x10000"]


def test_decode_matches_pynvml_constants():
    pynvml = pytest.importorskip("pynvml")
    expected = {
        "GpuIdle": "idle", "ApplicationsClocksSetting": "application clock setting",
        "UserDefinedClocks": "application clock setting", "SwPowerCap": "software power cap",
        "HwSlowdown": "hardware slowdown", "SyncBoost": "sync boost",
        "SwThermalSlowdown": "software thermal slowdown", "HwThermalSlowdown": "hardware thermal slowdown",
        "HwPowerBrakeSlowdown": "power brake", "DisplayClockSetting": "display clock setting",
        "BoardLimit": "board limit", "Reliability": "reliability",
    }
    checked = 0
    for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
        for name in dir(pynvml):
            suffix = name[len(prefix):]
            if not name.startswith(prefix) or suffix in ("None", "All"):
                continue
            assert decode_clock_reasons(getattr(pynvml, name)) == [expected[suffix]], name
            checked += 1
        all_mask = getattr(pynvml, prefix + "All", None)
        if all_mask is not None:
            assert not any(w.startswith("unknown") for w in decode_clock_reasons(all_mask))
    assert checked >= 9


class FakeNVML:
    """Stands in for the pynvml module. Handles are dicts holding the readings; `calls` logs lookups."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    def __init__(self, devices=None, init_fails=False):
        self.devices = devices or {}  # lookup key ("uuid:...", "pci:...", "index:N") -> handle
        self.init_fails = init_fails
        self.calls = []

    def nvmlInit(self):
        self.calls.append("init")
        if self.init_fails:
            raise self.NVMLError("Driver Not Loaded")

    def _lookup(self, key):
        self.calls.append(key)
        if key not in self.devices:
            raise self.NVMLError("Not Found")
        return self.devices[key]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return self._lookup(f"uuid:{uuid}")

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        return self._lookup(f"pci:{bus}")

    def nvmlDeviceGetHandleByIndex(self, index):
        return self._lookup(f"index:{index}")

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=h["util"], memory=10)

    def nvmlDeviceGetPowerUsage(self, h):
        if h.get("no_power"):
            raise self.NVMLError("Not Supported")
        return h["mw"]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == 0
        return h["temps"].pop(0) if len(h["temps"]) > 1 else h["temps"][0]

    def nvmlDeviceGetClockInfo(self, h, kind):
        assert kind == 1
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x20 | 0x4


def test_read_nvml_with_a_stand_in():
    handle = {"util": 97, "mw": 612_345, "temps": [71]}
    stats = read_nvml(FakeNVML(), handle)
    assert stats == {"gpu_util": 97, "power_w": pytest.approx(612.345), "power_limit_w": 700.0, "temp_c": 71,
                     "sm_clock_mhz": 1980, "clock_reasons": ["software power cap", "software thermal slowdown"]}
    handle["no_power"] = True
    assert "power_w" not in read_nvml(FakeNVML(), handle)


# CUDA properties of a GPU at PCI 0000:3b:00.0 (what torch.cuda.get_device_properties gives).
PROPS = SimpleNamespace(uuid="58e9a0e5-0000-1111-2222-333344445555", pci_domain_id=0, pci_bus_id=0x3B,
                        pci_device_id=0)


def monitor(temps, devices_key="uuid:GPU-58e9a0e5-0000-1111-2222-333344445555", **fake):
    handle = {"util": 99, "mw": 650_000, "temps": temps}
    nvml = FakeNVML({devices_key: handle}, **fake)
    return GpuMonitor("cuda:1", nvml=nvml, properties=PROPS), nvml


def test_gpu_monitor_finds_the_device_by_uuid_then_pci_then_index():
    gpu, nvml = monitor([70])
    assert gpu.read()["temp_c"] == 70 and nvml.calls == ["init", "uuid:GPU-58e9a0e5-0000-1111-2222-333344445555"]
    gpu, nvml = monitor([70], devices_key="pci:00000000:3b:00.0")  # e.g. an older driver without UUID lookup
    assert gpu.temperature() == 70 and nvml.calls[-1] == "pci:00000000:3b:00.0"
    gpu, nvml = monitor([70], devices_key="index:1")
    assert gpu.has_nvml and nvml.calls[1:] == ["uuid:GPU-58e9a0e5-0000-1111-2222-333344445555",
                                               "pci:00000000:3b:00.0", "index:1"]


def test_gpu_monitor_without_nvml_reads_nothing():
    gpu, nvml = monitor([70], init_fails=True)  # no driver
    assert not gpu.has_nvml and gpu.read() == {} and gpu.temperature() is None and nvml.calls == ["init"]
    cpu_nvml = FakeNVML()
    cpu = GpuMonitor("cpu", nvml=cpu_nvml)
    assert cpu.read() == {} and cpu.temperature() is None and cpu_nvml.calls == []


def test_gpu_fields_and_thermal_warning(tmp_path):
    stream = io.StringIO()
    t, out = make(tmp_path, stream)
    gpu, _ = monitor([88])
    sleeps = []
    guard = ThermalGuard(85, False, gpu.temperature, sleep=sleeps.append, say=t.message, warn=t.warn)
    for _ in range(2):  # two reports: the warning once (cooldown)
        (r,) = run_steps(t, 4, gpu=(reading := gpu.read()))
        assert guard.check(reading) == 0.0
    t.close(), out.close()
    assert r["temp_c"] == 88 and r["gpu_util"] == 99 and r["power_w"] == pytest.approx(650.0)
    text = stream.getvalue()
    assert "gpu 99% 650/700 W 88 C 1980 MHz [software power cap, software thermal slowdown]" in text
    assert text.count("WARNING GPU at 88 C, above train.thermal_limit_c 85 C "
                      "(clocks held back by: software power cap, software thermal slowdown); check airflow "
                      "and fans, or lower the power limit (e.g. `sudo nvidia-smi -pl 560`); "
                      "set train.thermal_guard: true to pause until it cools below 80 C") == 1
    assert sleeps == []
    w = [x for x in read_jsonl(tmp_path / "metrics.jsonl") if x["kind"] == "warning"]
    assert [(x["code"], x["temp_c"]) for x in w] == [("thermal", 88)]


def test_thermal_guard_pauses_until_cool():
    # Reading at the report: 90 C; then while paused 86, 81, 79 (below 85 - 5 = 80: resume).
    gpu, _ = monitor([90, 86, 81, 79])
    said, sleeps = [], []
    guard = ThermalGuard(85, True, gpu.temperature, sleep=sleeps.append, say=said.append)
    assert guard.check(gpu.read()) == 30.0
    assert sleeps == [th.THERMAL_POLL_S] * 3
    assert said[0].startswith("WARNING GPU at 90 C") and "the thermal guard pauses training until it cools below 80 C" in said[0]
    assert said[1] == "thermal guard: GPU at 90 C, paused 0s, waiting for < 80 C"
    assert said[-1] == "thermal guard: resuming after 30s (GPU at 79 C)"


def test_thermal_guard_limits_and_edges():
    said, sleeps = [], []
    stays_hot = ThermalGuard(85, True, lambda: 95, sleep=sleeps.append, say=said.append)
    assert stays_hot.check({"temp_c": 95}) == th.THERMAL_MAX_PAUSE_S  # never longer than the cap
    assert len(sleeps) == th.THERMAL_MAX_PAUSE_S / th.THERMAL_POLL_S and said[-1].endswith("(GPU at 95 C)")
    unreadable = ThermalGuard(85, True, lambda: None, sleep=sleeps.append, say=said.append)
    assert unreadable.check({"temp_c": 90}) == th.THERMAL_POLL_S
    assert said[-1] == "thermal guard: resuming after 10s (temperature unreadable)"
    sleeps.clear(), said.clear()
    for reading in ({"temp_c": 85}, {}, {"gpu_util": 50}):  # at the limit, or no temperature: nothing
        assert stays_hot.check(reading) == 0.0
    assert sleeps == [] and said == []


def test_non_finite_loss_is_null_in_json(tmp_path):
    t, out = make(tmp_path)
    run_steps(t, 4, loss=float("nan"))
    t.close(), out.close()
    assert read_jsonl(tmp_path / "metrics.jsonl")[0]["loss"] is None


def test_tensorboard_events(tmp_path):
    pytest.importorskip("tensorboard")
    t, out = make(tmp_path, tensorboard=True)
    run_steps(t, 4, gpu={"temp_c": 70, "gpu_util": 90})
    t.log_eval(0, 3, {"AP": 0.5})
    t.close(), out.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(4, 1.0)]
    assert [(e.step, e.value) for e in acc.Scalars("gpu/temp_c")] == [(4, 70.0)]
    assert [(e.step, e.value) for e in acc.Scalars("val/AP")] == [(4, 0.5)]


def test_missing_tensorboard_is_one_note_naming_the_extra(tmp_path, monkeypatch):
    """Without tensorboard the run goes on; the note says it as every missing extra is said."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # `from torch.utils.tensorboard import ...` fails
    stream = io.StringIO()
    t, out = make(tmp_path, stream=stream, tensorboard=True)
    t.close(), out.close()
    text = (tmp_path / "train.log").read_text()
    assert 'train.tensorboard needs tensorboard, which is not installed: pip install "vitpose[tb]"' in text
    assert "metrics.jsonl and train.log are still written" in text
