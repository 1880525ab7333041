"""Telemetry: the numbers it reports, where they go, its advice, and surviving a dead terminal."""

import errno
import io
import json
from types import SimpleNamespace

import pytest
import torch

from vitpose.engine import telemetry as tm
from vitpose.engine.telemetry import Telemetry, decode_clock_reasons, loader_advice, read_gpu_stats


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def make(tmp_path, stream=None, **kw):
    kw.setdefault("tensorboard", False)
    return Telemetry(tmp_path, total_iters=kw.pop("total_iters", 100), iters_per_epoch=kw.pop("ipe", 10),
                     log_every=kw.pop("log_every", 4), stream=stream if stream is not None else io.StringIO(),
                     **kw)


def test_window_averages_and_eta(tmp_path):
    t = make(tmp_path)
    losses = [1.0, 2.0, torch.tensor(3.0), torch.tensor(6.0)]
    for i, loss in enumerate(losses):
        out = t.log_step(i, epoch=0, loss=loss, lr=1e-3 * (i + 1), samples=32, step_time=0.5, data_time=0.1,
                         extra={"grad_norm": float(i)})
    t.close()
    assert out is not None
    assert out["iter"] == 4 and out["epoch_iter"] == 4
    assert out["loss"] == pytest.approx(3.0)  # mean over the window, tensors included
    assert out["lr"] == pytest.approx(4e-3)  # the logged step's value
    assert out["samples_per_s"] == pytest.approx(4 * 32 / 2.0)
    assert out["step_time"] == pytest.approx(0.5) and out["data_time"] == pytest.approx(0.1)
    assert out["data_share"] == pytest.approx(0.2)
    assert out["eta_s"] == pytest.approx(0.5 * 96)
    assert out["grad_norm"] == pytest.approx(1.5)
    assert out["mem_gib"] > 0  # peak RSS on CPU
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["kind"] for r in records] == ["train"]
    assert records[0]["loss"] == pytest.approx(3.0)


def test_report_points_and_window_reset(tmp_path):
    # log_every 4, 10 iterations per epoch, 12 in all: reports after 4, 8, 10 (epoch end) and 12.
    t = make(tmp_path, total_iters=12)
    reported = []
    for i in range(12):
        r = t.log_step(i, epoch=i // 10, loss=float(i), lr=0.1, samples=1, step_time=1.0, data_time=0.0)
        if r is not None:
            reported.append((r["iter"], r["loss"]))
    t.close()
    assert reported == [(4, 1.5), (8, 5.5), (10, 8.5), (12, 10.5)]
    assert [r["iter"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [4, 8, 10, 12]


def test_plain_lines_when_not_a_terminal(tmp_path):
    stream = io.StringIO()
    t = make(tmp_path, stream)
    for i in range(4):
        t.log_step(i, 3, 0.25, 5e-4, 64, 0.1, 0.0)
    t.message("checkpoint saved")
    t.log_eval(3, 3, {"AP": 0.71, "AP .5": 0.9})
    t.close()
    out = stream.getvalue().splitlines()
    assert out[0].startswith("Epoch 3 [ 4/10]  iter 4/100")
    assert "loss 0.25" in out[0] and "640.0 samples/s" in out[0] and "data 0.0000s (0%)" in out[0]
    assert out[1] == "checkpoint saved"
    assert out[2] == "Eval epoch 3 iter 4: AP 0.7100  AP .5 0.9000"
    log = (tmp_path / "train.log").read_text().splitlines()
    assert len(log) == 3 and log[1].endswith("checkpoint saved")
    ev = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    assert ev == {**ev, "kind": "eval", "epoch": 3, "iter": 4, "AP": 0.71, "AP .5": 0.9}


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_on_a_terminal(tmp_path):
    stream = FakeTTY()
    t = make(tmp_path, stream)
    for i in range(8):
        t.log_step(i, 0, 0.5, 1e-3, 8, 0.01, 0.0)
    t.message("hello")
    t.close()
    text = stream.getvalue()
    assert "8/100" in text and "hello" in text  # tqdm bar and a message above it
    assert "Epoch 0 [" not in text  # the per-report lines go to train.log only
    assert sum("Epoch 0 [" in line for line in (tmp_path / "train.log").read_text().splitlines()) == 2


class DeadTerminal:
    """A stream whose terminal went away: every write fails with EIO, as after an ssh drop."""

    def __init__(self, tty, err=errno.EIO):
        self.tty, self.err, self.writes = tty, err, 0

    def isatty(self):
        return self.tty

    def write(self, text):
        self.writes += 1
        raise OSError(self.err, "Input/output error")

    def flush(self):
        raise OSError(self.err, "Input/output error")


@pytest.mark.parametrize("tty,err", [(False, errno.EIO), (True, errno.EIO), (False, errno.EPIPE)])
def test_survives_vanished_terminal(tmp_path, tty, err):
    stream = DeadTerminal(tty, err)
    t = make(tmp_path, stream)
    for i in range(12):
        t.log_step(i, i // 10, 1.0, 1e-3, 8, 0.01, 0.0)
    t.message("still here")
    t.log_eval(0, 11, {"AP": 0.5})
    t.close()
    assert stream.writes >= 1
    log = (tmp_path / "train.log").read_text()
    assert "terminal output stopped" in log and "still here" in log and "Eval epoch 0 iter 12" in log
    assert log.count("Epoch 0 [") == 3 and log.count("Epoch 1 [ 2/10]") == 1  # reports at 4, 8, 10, 12
    assert [r["kind"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == ["train"] * 4 + ["eval"]


def test_non_main_rank_writes_nothing(tmp_path):
    stream = io.StringIO()
    t = make(tmp_path / "run", stream, is_main=False)
    for i in range(8):
        t.log_step(i, 0, 1.0, 1e-3, 8, 0.01, 0.0)
    t.message("x")
    t.log_eval(0, 7, {"AP": 0.1})
    t.close()
    assert stream.getvalue() == "" and not (tmp_path / "run").exists()


def test_loader_bound_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(tm.os, "cpu_count", lambda: 16)
    stream = io.StringIO()
    t = make(tmp_path, stream, num_workers=4, config_path="configs/vitpose-s.yaml")
    for i in range(8):  # two reports: the warning only once (cooldown)
        t.log_step(i, 0, 1.0, 1e-3, 8, step_time=0.2, data_time=0.07)
    t.close()
    warnings = [line for line in stream.getvalue().splitlines() if line.startswith("WARNING")]
    assert warnings == [("WARNING loader-bound: data wait 35% of step; raise loader.num_workers from 4 to 8 "
                         "(16 cores), or run `python -m vitpose.tune --config configs/vitpose-s.yaml`")]
    w = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "warning"]
    assert len(w) == 1 and w[0]["code"] == "loader_bound" and w[0]["data_share"] == pytest.approx(0.35)


def test_no_loader_warning_below_threshold(tmp_path):
    stream = io.StringIO()
    t = make(tmp_path, stream, num_workers=4)
    for i in range(4):
        t.log_step(i, 0, 1.0, 1e-3, 8, step_time=0.2, data_time=0.03)
    t.close()
    assert "WARNING" not in stream.getvalue()


def test_loader_advice_cases():
    assert "from 6 to 8 (16 cores, 8 per process)" in loader_advice(0.5, 6, 16, world_size=2)
    full = loader_advice(0.3, 8, 16, world_size=2)
    assert "already uses all 16 cores, 8 per process" in full and "reduced_decode" in full
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
    """Stands in for pynvml over a fake handle; the handle holds the readings."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    @staticmethod
    def nvmlDeviceGetUtilizationRates(h):
        return SimpleNamespace(gpu=h["util"], memory=10)

    @staticmethod
    def nvmlDeviceGetPowerUsage(h):
        if h.get("no_power"):
            raise FakeNVML.NVMLError("Not Supported")
        return h["mw"]

    @staticmethod
    def nvmlDeviceGetEnforcedPowerLimit(h):
        return 700_000

    @staticmethod
    def nvmlDeviceGetTemperature(h, sensor):
        assert sensor == 0
        return h["temps"].pop(0) if len(h["temps"]) > 1 else h["temps"][0]

    @staticmethod
    def nvmlDeviceGetClockInfo(h, kind):
        assert kind == 1
        return 1980

    @staticmethod
    def nvmlDeviceGetCurrentClocksEventReasons(h):
        return 0x20 | 0x4


def test_read_gpu_stats_with_fake_handle():
    handle = {"util": 97, "mw": 612_345, "temps": [71]}
    stats = read_gpu_stats(handle, FakeNVML)
    assert stats == {"gpu_util": 97, "power_w": pytest.approx(612.345), "power_limit_w": 700.0, "temp_c": 71,
                     "sm_clock_mhz": 1980, "clock_reasons": ["software power cap", "software thermal slowdown"]}
    handle["no_power"] = True
    assert "power_w" not in read_gpu_stats(handle, FakeNVML)


def gpu_telemetry(tmp_path, monkeypatch, temps, guard, stream):
    monkeypatch.setattr(tm, "pynvml", FakeNVML)
    t = make(tmp_path, stream, thermal_limit_c=85, thermal_guard=guard)
    t._nvml = {"util": 99, "mw": 650_000, "temps": temps}  # what nvml_handle returns on a GPU
    sleeps = []
    t.sleep = sleeps.append
    return t, sleeps


def test_gpu_fields_and_thermal_warning(tmp_path, monkeypatch):
    stream = io.StringIO()
    t, sleeps = gpu_telemetry(tmp_path, monkeypatch, [88], guard=False, stream=stream)
    for i in range(4):
        r = t.log_step(i, 0, 1.0, 1e-3, 8, 0.1, 0.0)
    t.close()
    assert r["temp_c"] == 88 and r["gpu_util"] == 99 and r["power_w"] == pytest.approx(650.0)
    text = stream.getvalue()
    assert "gpu 99% 650/700 W 88 C 1980 MHz [software power cap, software thermal slowdown]" in text
    assert "WARNING GPU at 88 C, above train.thermal_limit_c 85 C" in text
    assert "nvidia-smi -pl 560" in text and "thermal_guard: true" in text
    assert sleeps == []


def test_thermal_guard_pauses_until_cool(tmp_path, monkeypatch):
    stream = io.StringIO()
    # Reading at the report: 90 C; then while paused 86, 81, 79 (below 85 - 5 = 80: resume).
    t, sleeps = gpu_telemetry(tmp_path, monkeypatch, [90, 86, 81, 79], guard=True, stream=stream)
    for i in range(4):
        t.log_step(i, 0, 1.0, 1e-3, 8, 0.1, 0.0)
    t.close()
    assert sleeps == [tm.THERMAL_POLL_S] * 3
    text = stream.getvalue()
    assert "thermal guard: GPU at 90 C, paused 0s, waiting for < 80 C" in text
    assert "thermal guard: resuming after 30s (GPU at 79 C)" in text


def test_non_finite_loss_is_null_in_json(tmp_path):
    t = make(tmp_path)
    for i in range(4):
        t.log_step(i, 0, float("nan"), 1e-3, 8, 0.1, 0.0)
    t.close()
    assert read_jsonl(tmp_path / "metrics.jsonl")[0]["loss"] is None


def test_tensorboard_events(tmp_path):
    pytest.importorskip("tensorboard")
    t = make(tmp_path, tensorboard=True)
    for i in range(4):
        t.log_step(i, 0, 1.0, 1e-3, 8, 0.1, 0.0)
    t.log_eval(0, 3, {"AP": 0.5})
    t.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(4, 1.0)]
    assert [(e.step, e.value) for e in acc.Scalars("val/AP")] == [(4, 0.5)]
