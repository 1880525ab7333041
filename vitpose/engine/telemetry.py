"""Training telemetry: what the run is doing, in the terminal, in files and in TensorBoard.

`Telemetry.log_step` is called once per iteration and only accumulates; every `log_every`
iterations (and at the end of each epoch) it reports, over the window since the last report:
loss, learning rate, samples/s, step time, data-wait time and its share of the step, the ETA of
the whole run, peak memory, and on CUDA with nvidia-ml-py the GPU's utilisation, power, temperature,
SM clock and the reasons its clocks are held back. When the numbers point at a problem (the loader
starving the GPU, a hot GPU) it says what to change.

Where it goes:
- the terminal: a tqdm bar when stdout is a terminal, plain one-line records when it is not, so a
  `nohup ... > log` file stays readable;
- `work_dir/train.log`: the plain lines, always;
- `work_dir/metrics.jsonl`: one JSON object per report, with a `kind` field ("train", "eval",
  "warning"); `python -m vitpose.plot WORKDIR` draws it;
- TensorBoard event files under `work_dir/tb` when `tensorboard` is installed and enabled.

A terminal that goes away (ssh dropped: writes fail with EIO, or a closed pipe: EPIPE) must not
stop a week-long run, so terminal writes that fail are dropped and the files carry on.
Only the main process (rank 0) writes anything; the other ranks only run the thermal guard on
their own GPU.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

try:  # nvidia-ml-py: optional, GPU statistics only
    import pynvml
except ImportError:  # pragma: no cover - depends on the install
    pynvml = None

LOADER_BOUND_SHARE = 0.20  # data wait above this share of the step: the loader is the bottleneck
WARNING_COOLDOWN_S = 600.0  # the same warning at most once per 10 minutes
THERMAL_HYSTERESIS_C = 5  # the guard resumes below limit - 5 C
THERMAL_POLL_S = 10.0
THERMAL_MAX_PAUSE_S = 300.0  # stay well inside NCCL's default 10 min collective timeout

# NVML clock event ("throttle") reason bits, as in nvml.h. A set bit means the clocks are held
# below their maximum for that reason; "idle" during training means the GPU had nothing to do.
CLOCK_REASONS = {
    0x0001: "idle",
    0x0002: "application clock setting",
    0x0004: "software power cap",
    0x0008: "hardware slowdown",
    0x0010: "sync boost",
    0x0020: "software thermal slowdown",
    0x0040: "hardware thermal slowdown",
    0x0080: "power brake",
    0x0100: "display clock setting",
    0x0200: "board limit",
    0x0400: "reliability",
}


def decode_clock_reasons(mask: int) -> list[str]:
    """NVML clock event reason bit mask -> reasons in words, lowest bit first."""
    words = [word for bit, word in CLOCK_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_REASONS)
    if unknown:
        words.append(f"unknown reason 0x{unknown:x}")
    return words


def read_gpu_stats(handle, nvml=None) -> dict[str, Any]:
    """One reading of the GPU behind an NVML `handle`.

    `nvml` is the pynvml module (tests pass a stand-in). A quantity the GPU does not report
    (power on some boards, say) is left out rather than failing the reading.
    Keys: gpu_util (%), power_w, power_limit_w, temp_c, sm_clock_mhz, clock_reasons (list of words).
    """
    nvml = nvml or pynvml
    stats: dict[str, Any] = {}
    errors = getattr(nvml, "NVMLError", Exception)  # NVMLError_NotSupported and friends

    def read(key, fn):
        with contextlib.suppress(errors):  # a quantity this GPU does not report is left out
            stats[key] = fn()

    read("gpu_util", lambda: int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
    read("power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
    read("power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)
    read("temp_c", lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)))
    read("sm_clock_mhz", lambda: int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
    # Newer bindings call them "clock event reasons"; older ones only have the "throttle" name.
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    if reasons is not None:
        read("clock_reasons", lambda: decode_clock_reasons(int(reasons(handle))))
    return stats


def nvml_handle(device: torch.device):
    """The NVML handle of a CUDA device, or None (no pynvml, no driver, not CUDA).

    CUDA and NVML number GPUs differently when CUDA_VISIBLE_DEVICES reorders them, so the
    device is found by its UUID, then by its PCI bus id, and only last by index.
    """
    if pynvml is None or device is None or device.type != "cuda":
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver library, or no permission
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    lookups = []
    if getattr(props, "uuid", None) is not None:
        lookups.append(lambda: pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{props.uuid}"))
    if hasattr(props, "pci_bus_id"):
        bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        lookups.append(lambda: pynvml.nvmlDeviceGetHandleByPciBusId(bus))
    lookups.append(lambda: pynvml.nvmlDeviceGetHandleByIndex(index))
    for lookup in lookups:
        with contextlib.suppress(pynvml.NVMLError, AttributeError, TypeError):
            return lookup()
    return None


def loader_advice(data_share: float, num_workers: int | None, cpu_count: int, world_size: int = 1,
                  config_path: str | None = None) -> str:
    """The loader-bound warning, with a concrete change to make."""
    cores = max(cpu_count // max(world_size, 1), 1)  # cores each process's workers can use
    per = f"{cpu_count} cores" + (f", {cores} per process" if world_size > 1 else "")
    tune = f"`python -m vitpose.tune --config {config_path or 'CONFIG'}`"
    head = f"loader-bound: data wait {data_share:.0%} of step; "
    if num_workers is None:
        return head + f"set loader.num_workers explicitly (up to {cores}, {per}), or run {tune}"
    if num_workers < cores:
        target = min(max(2 * num_workers, num_workers + 1), cores)
        return head + f"raise loader.num_workers from {num_workers} to {target} ({per}), or run {tune}"
    return (head + f"loader.num_workers={num_workers} already uses all {per}, so JPEG decoding is "
            f"CPU-bound: keep data.reduced_decode true, move the images to a local SSD, or run {tune}")


def _format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    return str(datetime.timedelta(seconds=round(seconds)))


def _peak_memory_gib(device: torch.device | None) -> float:
    """Peak CUDA memory allocated by tensors, or the peak resident size of this process on CPU."""
    if device is not None and device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return peak_kib / 2**20


def _json_safe(value):
    # NaN/inf are not JSON; a diverged loss is written as null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _scalar(value) -> float:
    return float(value.item() if torch.is_tensor(value) else value)


class _Window:
    """Sums since the last report. Tensor losses are summed on their device (no sync per step)."""

    def __init__(self):
        self.steps = 0
        self.samples = 0
        self.step_time = 0.0
        self.data_time = 0.0
        self.loss = 0.0
        self.extra: dict[str, list] = {}  # name -> [sum, count]

    def add(self, loss, samples, step_time, data_time, extra):
        self.steps += 1
        self.samples += int(samples)
        self.step_time += float(step_time)
        self.data_time += float(data_time)
        self.loss = self.loss + (loss.detach().float() if torch.is_tensor(loss) else float(loss))
        for name, value in (extra or {}).items():
            value = value.detach().float() if torch.is_tensor(value) else float(value)
            total = self.extra.setdefault(name, [0.0, 0])
            total[0] = total[0] + value
            total[1] += 1


class Telemetry:
    """Reports training progress; see the module docstring.

    Args:
        work_dir: where train.log, metrics.jsonl and tb/ go.
        total_iters: iterations of the whole run (for the ETA and the bar).
        iters_per_epoch: iterations per epoch (a report is also made at each epoch's last one).
        is_main: rank 0; the other ranks write nothing.
        log_every: report every this many iterations.
        tensorboard: also write TensorBoard events (when torch.utils.tensorboard imports).
        device: the training device; CUDA devices get memory and NVML statistics.
        thermal_limit_c, thermal_guard: warn above the limit; with the guard, pause until the GPU
            is back below limit - 5 C (at most THERMAL_MAX_PAUSE_S per report).
        stream: the terminal (default sys.stdout).
        num_workers, world_size, config_path: only used to make the loader-bound advice concrete.
    """

    def __init__(self, work_dir, total_iters: int, iters_per_epoch: int, is_main: bool = True,
                 log_every: int = 50, tensorboard: bool = True, device=None, thermal_limit_c: float = 85,
                 thermal_guard: bool = False, stream=None, *, num_workers: int | None = None,
                 world_size: int = 1, config_path: str | None = None):
        self.work_dir = Path(work_dir)
        self.total_iters = int(total_iters)
        self.iters_per_epoch = max(int(iters_per_epoch), 1)
        self.is_main = is_main
        self.log_every = max(int(log_every), 1)
        self.device = torch.device(device) if device is not None else None
        self.thermal_limit_c = thermal_limit_c
        self.thermal_guard = thermal_guard
        self.num_workers = num_workers
        self.world_size = world_size
        self.config_path = config_path
        self.sleep = time.sleep  # replaced in tests
        self._window = _Window()
        self._last_warned: dict[str, float] = {}
        self._bar = None
        self._log_file = self._jsonl = self._tb = None
        self._nvml = nvml_handle(self.device) if self.device is not None else None
        self._stream = (stream if stream is not None else sys.stdout) if is_main else None
        self._interactive = bool(self._stream is not None and _isatty(self._stream))
        if not is_main:
            return
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # Open for the whole run (closed by close()); line buffered, so `tail -f` follows it.
        self._log_file = open(self.work_dir / "train.log", "a", buffering=1)  # noqa: SIM115
        self._jsonl = open(self.work_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.work_dir / "tb"))
            except ImportError:
                self.message("TensorBoard is not installed (pip install tensorboard); "
                             "metrics.jsonl and train.log are still written. "
                             "Set train.tensorboard: false to silence this.")

    # ----------------------------------------------------------------- public API

    def log_step(self, iteration: int, epoch: int, loss, lr: float, samples: int, step_time: float,
                 data_time: float, extra: dict | None = None) -> dict | None:
        """Record one finished iteration; report every `log_every` iterations.

        iteration: 0-based global index of the iteration just finished (it continues across a
            resume). samples: samples this step processed over all ranks together. step_time: wall
            seconds of the whole iteration, data wait included; data_time: the part spent waiting
            for the batch. loss and the `extra` scalars (e.g. grad_norm, loss_scale) may be tensors:
            they are averaged over the window and read from the device only when reporting.
        Returns the reported record (the metrics.jsonl object) on reporting iterations of the main
        process, otherwise None. The ETA counts training steps only (validation time is extra).
        """
        done = iteration + 1
        report = done % self.log_every == 0 or done % self.iters_per_epoch == 0 or done == self.total_iters
        if not self.is_main:
            if report and self.thermal_guard:
                self._thermal_check(read_gpu_stats(self._nvml) if self._nvml is not None else {})
            return None
        self._window.add(loss, samples, step_time, data_time, extra)
        self._advance_bar(iteration, epoch)
        if not report:
            return None
        record = self._summarise(iteration, epoch, lr)
        self._window = _Window()
        self._emit_train(record)
        self._check_loader(record)
        self._thermal_check(record)
        return record

    def log_eval(self, epoch: int, iteration: int, stats: dict) -> None:
        """Report validation results (e.g. the COCO stats dict with "AP", "AP .5", ...)."""
        if not self.is_main:
            return
        stats = {k: _scalar(v) if isinstance(v, (int, float)) or torch.is_tensor(v) else v
                 for k, v in stats.items()}
        numbers = "  ".join(f"{k} {v:.4f}" for k, v in stats.items() if isinstance(v, float))
        self._line(f"Eval epoch {epoch} iter {iteration + 1}: {numbers}")
        self._write_json({"kind": "eval", "epoch": epoch, "iter": iteration + 1, "time": time.time(), **stats})
        if self._tb is not None:
            for k, v in stats.items():
                if isinstance(v, float):
                    self._tb.add_scalar(f"val/{k}", v, iteration + 1)
            self._tb.flush()

    def message(self, text: str) -> None:
        """A free-form line (run start, checkpoint saved, resume, ...) to the terminal and train.log."""
        if self.is_main:
            self._line(text)

    def close(self) -> None:
        if self._bar is not None:
            self._guarded(self._bar.close)
            self._bar = None
        for f in (self._log_file, self._jsonl):
            if f is not None:
                f.close()
        self._log_file = self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ----------------------------------------------------------------- reporting

    def _summarise(self, iteration: int, epoch: int, lr: float) -> dict:
        w = self._window
        done = iteration + 1
        mean_step = w.step_time / max(w.steps, 1)
        record = {
            "kind": "train",
            "epoch": epoch,
            "iter": done,
            "epoch_iter": (iteration % self.iters_per_epoch) + 1,
            "loss": _scalar(w.loss) / max(w.steps, 1),
            "lr": float(lr),
            "samples_per_s": w.samples / w.step_time if w.step_time > 0 else float("nan"),
            "step_time": mean_step,
            "data_time": w.data_time / max(w.steps, 1),
            "data_share": w.data_time / w.step_time if w.step_time > 0 else 0.0,
            "eta_s": mean_step * max(self.total_iters - done, 0),
            "mem_gib": _peak_memory_gib(self.device),
            "time": time.time(),
        }
        for name, (total, count) in w.extra.items():
            record[name] = _scalar(total) / count
        if self._nvml is not None:
            record.update(read_gpu_stats(self._nvml))
        return record

    def _emit_train(self, r: dict) -> None:
        line = self._format_train(r)
        if self._interactive and self._bar is not None:
            postfix = {"loss": f"{r['loss']:.4g}", "lr": f"{r['lr']:.2e}",
                       "smp/s": f"{r['samples_per_s']:.0f}", "data": f"{r['data_share']:.0%}"}
            if "temp_c" in r:
                postfix["gpu"] = f"{r.get('gpu_util', '?')}% {r['temp_c']}C"
            self._guarded(lambda: self._bar.set_postfix(postfix, refresh=False))
            self._file_line(line)
        else:
            self._line(line)
        self._write_json(r)
        if self._tb is not None:
            step = r["iter"]
            for key in ("loss", "lr", "samples_per_s", "step_time", "data_share", "mem_gib"):
                self._tb.add_scalar(f"train/{key}", r[key], step)
            for key in ("gpu_util", "power_w", "temp_c", "sm_clock_mhz"):
                if key in r:
                    self._tb.add_scalar(f"gpu/{key}", r[key], step)

    def _format_train(self, r: dict) -> str:
        ipe = self.iters_per_epoch
        parts = [
            f"Epoch {r['epoch']} [{r['epoch_iter']:>{len(str(ipe))}}/{ipe}]",
            f"iter {r['iter']}/{self.total_iters}",
            f"eta {_format_duration(r['eta_s'])}",
            f"loss {r['loss']:.6g}",
            f"lr {r['lr']:.3e}",
            f"{r['samples_per_s']:.1f} samples/s",
            f"step {r['step_time']:.4f}s",
            f"data {r['data_time']:.4f}s ({r['data_share']:.0%})",
            f"mem {r['mem_gib']:.2f} GiB",
        ]
        parts += [f"{k} {v:.4g}" for k, v in r.items() if k not in _KNOWN_KEYS and isinstance(v, float)]
        if "temp_c" in r:
            gpu = [f"gpu {r.get('gpu_util', '?')}%"]
            if "power_w" in r:
                gpu.append(f"{r['power_w']:.0f}/{r.get('power_limit_w', float('nan')):.0f} W")
            gpu.append(f"{r['temp_c']} C")
            if "sm_clock_mhz" in r:
                gpu.append(f"{r['sm_clock_mhz']} MHz")
            if r.get("clock_reasons"):
                gpu.append("[" + ", ".join(r["clock_reasons"]) + "]")
            parts.append(" ".join(gpu))
        return "  ".join(parts)

    # ----------------------------------------------------------------- warnings and the guard

    def _warn(self, code: str, text: str, **fields) -> None:
        now = time.monotonic()
        last = self._last_warned.get(code)
        if last is not None and now - last < WARNING_COOLDOWN_S:
            return
        self._last_warned[code] = now
        if self.is_main:
            self._line(f"WARNING {text}")
            self._write_json({"kind": "warning", "code": code, "text": text, "time": time.time(), **fields})

    def _check_loader(self, r: dict) -> None:
        if r["data_share"] > LOADER_BOUND_SHARE:
            advice = loader_advice(r["data_share"], self.num_workers, os.cpu_count() or 1,
                                   self.world_size, self.config_path)
            self._warn("loader_bound", advice, iter=r["iter"], data_share=r["data_share"])

    def _thermal_check(self, r: dict) -> None:
        temp = r.get("temp_c")
        if temp is None or temp <= self.thermal_limit_c:
            return
        resume_c = self.thermal_limit_c - THERMAL_HYSTERESIS_C
        reasons = r.get("clock_reasons") or []
        held = f" (clocks held back by: {', '.join(reasons)})" if reasons else ""
        if self.thermal_guard:
            action = f"the thermal guard pauses training until it cools below {resume_c} C"
        else:
            action = f"set train.thermal_guard: true to pause until it cools below {resume_c} C"
        power = ""
        if r.get("power_limit_w"):
            power = f", or lower the power limit (e.g. `sudo nvidia-smi -pl {0.8 * r['power_limit_w']:.0f}`)"
        self._warn("thermal", f"GPU at {temp} C, above train.thermal_limit_c {self.thermal_limit_c} C"
                   f"{held}; check airflow and fans{power}; {action}", temp_c=temp)
        if self.thermal_guard:
            self._pause_until_cool(temp, resume_c)

    def _pause_until_cool(self, temp: float, resume_c: float) -> None:
        paused = 0.0
        while temp >= resume_c and paused < THERMAL_MAX_PAUSE_S:
            if self.is_main:
                self._line(f"thermal guard: GPU at {temp} C, paused {paused:.0f}s, waiting for < {resume_c} C")
            self.sleep(THERMAL_POLL_S)
            paused += THERMAL_POLL_S
            temp = self._read_temp()
            if temp is None:
                break
        if self.is_main:
            state = f"GPU at {temp} C" if temp is not None else "temperature unreadable"
            self._line(f"thermal guard: resuming after {paused:.0f}s ({state})")

    def _read_temp(self):
        return read_gpu_stats(self._nvml).get("temp_c") if self._nvml is not None else None

    # ----------------------------------------------------------------- output plumbing

    def _advance_bar(self, iteration: int, epoch: int) -> None:
        if not self._interactive:
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = self._guarded(lambda: tqdm(total=self.total_iters, initial=iteration,
                                                   file=self._stream, dynamic_ncols=True, unit="it"))
            if self._bar is None:
                return
        self._guarded(lambda: (self._bar.set_description(f"epoch {epoch}", refresh=False),
                               self._bar.update(1)))

    def _line(self, text: str) -> None:
        self._file_line(text)
        if self._stream is None:
            return
        if self._bar is not None:
            self._guarded(lambda: self._bar.write(text, file=self._stream))
        else:
            self._guarded(lambda: (self._stream.write(text + "\n"), self._stream.flush()))

    def _file_line(self, text: str) -> None:
        if self._log_file is not None:
            stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
            self._log_file.write(f"{stamp}  {text}\n")

    def _write_json(self, record: dict) -> None:
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(_json_safe(record), allow_nan=False) + "\n")

    def _guarded(self, fn):
        """Run a terminal write; if the terminal is gone, stop using it and keep the files going."""
        if self._stream is None:
            return None
        try:
            return fn()
        except (OSError, ValueError) as e:  # EIO (ssh gone), EPIPE (pipe closed), closed file
            self._stream = None
            self._interactive = False
            self._bar = None
            self._file_line(f"terminal output stopped ({type(e).__name__}: {e}); logging to files only")
            return None


_KNOWN_KEYS = {"kind", "epoch", "iter", "epoch_iter", "loss", "lr", "samples_per_s", "step_time", "data_time",
               "data_share", "eta_s", "mem_gib", "time", "gpu_util", "power_w", "power_limit_w", "temp_c",
               "sm_clock_mhz", "clock_reasons"}


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False
