"""Training telemetry: what the run is doing, in the terminal, in files and in TensorBoard.

`Telemetry` is passive: it keeps statistics over a window of steps and writes them out; it never
reads the GPU and never waits. The loop calls

    if telemetry.step(iteration, epoch, loss, lr, samples, step_time, data_time, extra):
        reading = gpu.read()            # GpuMonitor: memory, and NVML figures on CUDA
        telemetry.report(reading)       # the window's statistics + the reading, out to the sinks
        thermal.check(reading)          # ThermalGuard: warn, and pause while the GPU is too hot

`step` only accumulates and says whether this iteration is a report point (every `log_every`
iterations and each epoch's last). A report covers the window since the previous one: loss,
learning rate, samples/s, step time, data-wait time and its share of the step, the ETA of the
whole run, peak memory, and the GPU figures the loop passed in. When the data wait dominates it
says what to change (`loader_advice`: a pure function of the window's data share).

Where it goes:
- the terminal: a tqdm bar when stdout is a terminal, plain one-line records when it is not, so a
  `nohup ... > log` file stays readable;
- train.log: the plain lines, through the run's output (`runtime.RunOutput`, which owns that
  file and the handling of a terminal that went away);
- `work_dir/metrics.jsonl`: one JSON object per report, with a `kind` field ("train", "eval",
  "warning"); `vitpose plot WORKDIR` draws it;
- TensorBoard event files under `work_dir/tb` when `tensorboard` is installed and enabled.

metrics.jsonl and tb/ are written by Telemetry alone, and only in the main process (rank 0).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import resource
import time
from pathlib import Path

import torch

from vitpose.engine.runtime import RunOutput, current_output
from vitpose.errors import missing_extra

LOADER_BOUND_SHARE = 0.20  # data wait above this share of the step: the loader is the bottleneck
WARNING_COOLDOWN_S = 600.0  # the same warning at most once per 10 minutes


def loader_advice(data_share: float, num_workers: int | None, cpu_count: int, world_size: int = 1,
                  config_path: str | None = None) -> str:
    """The loader-bound warning, with a concrete change to make."""
    cores = max(cpu_count // max(world_size, 1), 1)  # cores each process's workers can use
    per = f"{cpu_count} cores" + (f", {cores} per process" if world_size > 1 else "")
    tune = f"`vitpose tune --config {config_path or 'CONFIG'}`"
    head = f"loader-bound: data wait {data_share:.0%} of step; "
    if num_workers is None:
        return head + f"set loader.num_workers explicitly (up to {cores}, {per}), or run {tune}"
    if num_workers < cores:
        target = min(max(2 * num_workers, num_workers + 1), cores)
        return head + f"raise loader.num_workers from {num_workers} to {target} ({per}), or run {tune}"
    return (head + f"loader.num_workers={num_workers} already uses all {per}, so JPEG decoding is "
            f"CPU-bound: build a crop cache (vitpose build-crop-cache), move the images to a "
            f"local SSD, or run {tune}")


def _format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    return str(datetime.timedelta(seconds=round(seconds)))


def _process_peak_memory_gib() -> float:
    """Peak resident size of this process (what "memory" means when training on the CPU)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


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
        work_dir: where metrics.jsonl and tb/ go.
        total_iters: iterations of the whole run (for the ETA and the bar).
        iters_per_epoch: iterations per epoch (a report is also made at each epoch's last one).
        is_main: rank 0; the other ranks write nothing (their `step` still says when to report).
        log_every: report every this many iterations.
        tensorboard: also write TensorBoard events (when torch.utils.tensorboard imports).
        output: the terminal and train.log (default: the one `runtime.run_guard` installed, or
            sys.stdout without a log outside a run).
        num_workers, world_size, config_path: only used to make the loader-bound advice concrete.
    """

    def __init__(self, work_dir, total_iters: int, iters_per_epoch: int, is_main: bool = True,
                 log_every: int = 50, tensorboard: bool = True, *, output: RunOutput | None = None,
                 num_workers: int | None = None, world_size: int = 1, config_path: str | None = None):
        self.work_dir = Path(work_dir)
        self.total_iters = int(total_iters)
        self.iters_per_epoch = max(int(iters_per_epoch), 1)
        self.is_main = is_main
        self.log_every = max(int(log_every), 1)
        self.num_workers = num_workers
        self.world_size = world_size
        self.config_path = config_path
        self._window = _Window()
        self._position = (0, 0, 0.0)  # iteration, epoch, lr of the last step
        self._last_warned: dict[str, float] = {}
        self._bar = None
        self._jsonl = self._tb = None
        self._output = None
        if not is_main:
            return
        self._output = output if output is not None else current_output()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.work_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 (closed in close())
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.work_dir / "tb"))
            except ImportError:
                self.message(f"{missing_extra('train.tensorboard', 'tensorboard', 'tb')}; metrics.jsonl and "
                             "train.log are still written. Set train.tensorboard: false to silence this.")

    # ----------------------------------------------------------------- public API

    def step(self, iteration: int, epoch: int, loss, lr: float, samples: int, step_time: float,
             data_time: float, extra: dict | None = None) -> bool:
        """Record one finished iteration; True when it is a report point (on every rank).

        Args:
            iteration: 0-based global index of the iteration just finished (it continues across
                a resume).
            epoch: the epoch it belongs to.
            loss: its loss; may be a tensor (summed on its device, read only when reporting).
            lr: the learning rate it used.
            samples: samples it processed over all ranks together.
            step_time: wall seconds of the whole iteration, data wait included.
            data_time: the part of step_time spent waiting for the batch.
            extra: more scalars to average over the window (e.g. grad_norm); tensors allowed.
        """
        done = iteration + 1
        due = done % self.log_every == 0 or done % self.iters_per_epoch == 0 or done == self.total_iters
        if not self.is_main:
            return due
        self._window.add(loss, samples, step_time, data_time, extra)
        self._position = (iteration, epoch, float(lr))
        self._advance_bar(iteration, epoch)
        return due

    def report(self, gpu: dict | None = None) -> dict | None:
        """Write out the window since the last report and start a new one.

        Args:
            gpu: a reading of the training device (`GpuMonitor.read()`); its figures join the
                record (mem_gib, gpu_util, power_w, power_limit_w, temp_c, sm_clock_mhz,
                clock_reasons). Without mem_gib, the process's peak resident memory is reported.
        Returns the record (the metrics.jsonl object) in the main process, else None. The ETA
        counts training steps only (validation time is extra).
        """
        if not self.is_main or self._window.steps == 0:
            return None
        record = self._summarise(dict(gpu or {}))
        self._window = _Window()
        self._emit_train(record)
        if record["data_share"] > LOADER_BOUND_SHARE:
            advice = loader_advice(record["data_share"], self.num_workers, os.cpu_count() or 1,
                                   self.world_size, self.config_path)
            self.warn("loader_bound", advice, iter=record["iter"], data_share=record["data_share"])
        return record

    def log_eval(self, epoch: int, iteration: int, stats: dict) -> None:
        """Report validation results (e.g. the COCO stats dict with "AP", "AP .5", ...)."""
        if not self.is_main:
            return
        stats = {k: _scalar(v) if isinstance(v, (int, float)) or torch.is_tensor(v) else v
                 for k, v in stats.items()}
        numbers = "  ".join(f"{k} {v:.4f}" for k, v in stats.items() if isinstance(v, float))
        self._say(f"Eval epoch {epoch} iter {iteration + 1}: {numbers}")
        self._write_json({"kind": "eval", "epoch": epoch, "iter": iteration + 1, "time": time.time(), **stats})
        if self._tb is not None:
            for k, v in stats.items():
                if isinstance(v, float):
                    self._tb.add_scalar(f"val/{k}", v, iteration + 1)
            self._tb.flush()

    def message(self, text: str) -> None:
        """A free-form line (run start, checkpoint saved, resume, ...) to the terminal and train.log."""
        if self.is_main:
            self._say(text)

    def warn(self, code: str, text: str, **fields) -> None:
        """A warning line and a "warning" record, at most once per WARNING_COOLDOWN_S per code."""
        now = time.monotonic()
        last = self._last_warned.get(code)
        if last is not None and now - last < WARNING_COOLDOWN_S:
            return
        self._last_warned[code] = now
        if self.is_main:
            self._say(f"WARNING {text}")
            self._write_json({"kind": "warning", "code": code, "text": text, "time": time.time(), **fields})

    def close(self) -> None:
        self._close_bar()
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ----------------------------------------------------------------- reporting

    def _summarise(self, gpu: dict) -> dict:
        w = self._window
        iteration, epoch, lr = self._position
        done = iteration + 1
        mean_step = w.step_time / max(w.steps, 1)
        record = {
            "kind": "train",
            "epoch": epoch,
            "iter": done,
            "epoch_iter": (iteration % self.iters_per_epoch) + 1,
            "loss": _scalar(w.loss) / max(w.steps, 1),
            "lr": lr,
            "samples_per_s": w.samples / w.step_time if w.step_time > 0 else float("nan"),
            "step_time": mean_step,
            "data_time": w.data_time / max(w.steps, 1),
            "data_share": w.data_time / w.step_time if w.step_time > 0 else 0.0,
            "eta_s": mean_step * max(self.total_iters - done, 0),
            "mem_gib": gpu.pop("mem_gib") if "mem_gib" in gpu else _process_peak_memory_gib(),
            "time": time.time(),
        }
        for name, (total, count) in w.extra.items():
            record[name] = _scalar(total) / count
        record.update(gpu)
        return record

    def _emit_train(self, r: dict) -> None:
        line = self._format_train(r)
        if self._bar is not None:
            postfix = {"loss": f"{r['loss']:.4g}", "lr": f"{r['lr']:.2e}",
                       "smp/s": f"{r['samples_per_s']:.0f}", "data": f"{r['data_share']:.0%}"}
            if "temp_c" in r:
                postfix["gpu"] = f"{r.get('gpu_util', '?')}% {r['temp_c']}C"
            self._bar.set_postfix(postfix, refresh=False)
            self._output.note(line)  # the bar shows the numbers; the full line goes to train.log
        else:
            self._say(line)
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

    # ----------------------------------------------------------------- output plumbing

    def _advance_bar(self, iteration: int, epoch: int) -> None:
        if self._bar is None and self._output.interactive:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total_iters, initial=iteration, file=self._output.terminal,
                             dynamic_ncols=True, unit="it")
        if self._bar is not None and self._bar_alive():
            self._bar.set_description(f"epoch {epoch}", refresh=False)
            self._bar.update(1)

    def _bar_alive(self) -> bool:
        """False once the terminal under the bar went away (the bar is then closed)."""
        if self._output.terminal.alive:
            return True
        self._close_bar()
        return False

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()  # on a terminal that went away, its last writes are dropped
            self._bar = None

    def _say(self, text: str) -> None:
        if self._bar is not None and self._bar_alive():
            self._bar.clear()  # the line goes above the bar
            self._output.say(text)
            self._bar.refresh()
        else:
            self._output.say(text)

    def _write_json(self, record: dict) -> None:
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(_json_safe(record), allow_nan=False) + "\n")


_KNOWN_KEYS = {"kind", "epoch", "iter", "epoch_iter", "loss", "lr", "samples_per_s", "step_time", "data_time",
               "data_share", "eta_s", "mem_gib", "time", "gpu_util", "power_w", "power_limit_w", "temp_c",
               "sm_clock_mhz", "clock_reasons"}
