"""Find the loader settings that keep the accelerator fed: `vitpose tune --config CFG`.

Sweeps num_workers x batch size x pin_memory x prefetch_factor over the configured training set
(or a synthetic one, `--synthetic N`), through the same `build_loaders` the trainer uses, and
measures for each combination:

- loader samples/s: batches taken from the loader and moved to the device (`to_device`), nothing
  else: the most the input pipeline can deliver;
- step samples/s and data-wait share (with `--steps`, the default on a GPU): the same batches
  fed to the configured model's real training step (`prepare_batch`, `forward_backward`,
  `optimizer_step` from vitpose.engine.trainer); the share is the time spent blocked on the
  loader;
- peak memory: total PSS of this process and its workers.

It prints a table and a verdict (loader-bound: raise workers to N / GPU-bound / RAM-bound),
writes tune.csv, tune.txt and tune.png (throughput vs workers per batch size) into `--out`.

    vitpose tune --config configs/vitpose-s_coco_256x192.yaml --workers 0,4,8,16 \
        --batch-sizes 32,64 --pin-memory both --prefetch 2,4
    vitpose tune --config CFG --synthetic 64 --workers 0,2 --batch-sizes 8 --batches 10
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import psutil

from vitpose.config import load_config
from vitpose.device import resolve_device
from vitpose.errors import UserError

# A training step that waits for data more than this share of its time is loader-bound.
WAIT_THRESHOLD = 0.10
# Worker counts suggested for a loader-bound run get this much headroom over the estimate.
WORKER_HEADROOM = 1.2


@dataclass
class Row:
    workers_requested: int
    workers: int  # after the RAM cap
    batch_size: int
    pin_memory: bool
    prefetch: int
    samples: int = 0
    loader_sps: float | None = None
    step_sps: float | None = None
    data_wait: float | None = None
    peak_pss_mib: float | None = None
    note: str = ""


# ----------------------------------------------------------------------------------------------
# Measuring


def total_pss_bytes(proc: psutil.Process | None = None) -> int:
    """PSS of a process and all its children (RSS where PSS is not available)."""
    proc = proc or psutil.Process()
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            info = p.memory_full_info()
            total += getattr(info, "pss", info.rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def _endless(loaders):
    """Training batches over as many epochs as needed."""
    for epoch in itertools.count():
        yield from loaders.train(epoch)


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(loaders, device, batches: int, warmup: int, step=None, progress=None) -> dict:
    """Time `batches` batches after `warmup` (pool start, pipeline fill, kernel autotuning).

    Without `step`: loader + `to_device` only. With it: each batch goes through `step(batch)`,
    and the time blocked on the loader is the data wait.
    """
    from vitpose.data.loaders import to_device

    def consume(batch):
        if step is None:
            to_device(batch, device)
        else:
            step(batch)
        _sync(device)

    stream = _endless(loaders)
    for _ in range(warmup):
        consume(next(stream))
        if progress is not None:
            progress.update(1)
    every = max(1, batches // 10)  # PSS reads walk page tables: sample a few times, not per batch
    peak = total_pss_bytes()
    samples, wait = 0, 0.0
    start = time.perf_counter()
    for i in range(batches):
        t = time.perf_counter()
        batch = next(stream)
        wait += time.perf_counter() - t
        consume(batch)
        samples += len(batch["image"])
        if i % every == every - 1:
            peak = max(peak, total_pss_bytes())
        if progress is not None:
            progress.update(1)
    elapsed = time.perf_counter() - start
    stream.close()
    return {"samples": samples, "sps": samples / elapsed, "data_wait": wait / elapsed, "peak_pss": peak}


def make_train_step(cfg, device, batch_size: int | None = None):
    """One real training iteration of the configured model, as train.py runs it: the same
    optimizer builder (layer-decay groups, warmup + step schedule), precision and step pieces.

    batch_size: the per-process batch the sweep measures (the global batch for LR scaling).
    """
    from vitpose.builders import build_model_from_config
    from vitpose.engine.optim import build_optimizer
    from vitpose.engine.precision import resolve_precision
    from vitpose.engine.trainer import forward_backward, is_finite, optimizer_step, prepare_batch

    model = build_model_from_config(cfg.model).to(device).train()
    global_batch = (batch_size or cfg.loader.batch_size) * cfg.optim.accum_steps
    optimizer, schedule = build_optimizer(model, cfg.optim, cfg.schedule, global_batch)
    precision = resolve_precision(device, cfg.train.amp, cfg.train.amp_dtype)
    iteration = 0

    def step(batch):
        nonlocal iteration
        schedule.step(iteration, epoch=0)
        images, heatmaps, weights = prepare_batch(batch, device, cfg.model.input_size, cfg.model.heatmap_size,
                                                  cfg.model.sigma)
        loss = forward_backward(model, images, heatmaps, weights, precision)
        # is_finite reads the loss on the host each step, as train.py does.
        optimizer_step(model, optimizer, precision, cfg.optim.clip_grad, loss_finite=is_finite(loss))
        iteration += 1

    step.optimizer, step.schedule = optimizer, schedule  # what a test (or a curious user) inspects
    return step


def sweep(train_set, base_loader_cfg, device, workers, batch_sizes, pins, prefetches, batches: int,
          warmup: int | None = None, step=None, seed: int = 0, show_progress: bool = True,
          available_ram: int | None = None) -> list[Row]:
    """Measure every combination; one Row each (loader-only, plus the step when `step` is given)."""
    from tqdm import tqdm

    from vitpose.data.loaders import build_loaders

    combos = list(itertools.product(batch_sizes, pins, prefetches, workers))
    per_combo = [(warmup if warmup is not None else w + 2) + batches for _, _, _, w in combos]
    total = sum(per_combo) * (2 if step is not None else 1)
    rows = []
    with tqdm(total=total, desc="tune", unit="batch", file=sys.stderr, disable=not show_progress) as bar:
        for bs, pin, prefetch, w in combos:
            bar.set_postfix_str(f"workers={w} batch={bs} pin={pin} prefetch={prefetch}")
            loader_cfg = replace(base_loader_cfg, batch_size=bs, num_workers=w, pin_memory=pin,
                                 prefetch_factor=prefetch)
            n_warm = warmup if warmup is not None else w + 2
            with build_loaders(train_set, None, loader_cfg, seed=seed, available_ram=available_ram) as loaders:
                row = Row(w, loaders.num_workers, bs, pin, prefetch)
                if pin and not loaders.pin_memory:
                    row.note = "no CUDA: not pinned"
                loader = measure(loaders, device, batches, n_warm, progress=bar)
                row.samples, row.loader_sps = loader["samples"], loader["sps"]
                row.peak_pss_mib = loader["peak_pss"] / 2**20
                if step is not None:
                    try:
                        trained = measure(loaders, device, batches, n_warm, step=step, progress=bar)
                    except RuntimeError as e:  # CUDA out of memory at this batch size
                        if "out of memory" not in str(e):
                            raise
                        row.note = "GPU out of memory"
                        _empty_cache(device)
                    else:
                        row.step_sps, row.data_wait = trained["sps"], trained["data_wait"]
                        row.peak_pss_mib = max(row.peak_pss_mib, trained["peak_pss"] / 2**20)
            rows.append(row)
    return rows


def _empty_cache(device):
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# Reading the results


def _same_setting(a: Row, b: Row) -> bool:
    return (a.batch_size, a.pin_memory, a.prefetch) == (b.batch_size, b.pin_memory, b.prefetch)


def verdict(rows: list[Row], cores: int | None = None) -> list[str]:
    """What limits throughput and what to change, one line each (most important first)."""
    cores = cores or os.cpu_count() or 1
    lines = []
    capped = [r for r in rows if r.workers < r.workers_requested]
    if capped:
        worst = max(capped, key=lambda r: r.workers_requested - r.workers)
        lines.append(f"RAM-bound: only {worst.workers} of {worst.workers_requested} workers fit in RAM at batch "
                     f"{worst.batch_size}, prefetch {worst.prefetch}; lower loader.batch_size or "
                     f"loader.prefetch_factor, or add RAM, to run more")
    stepped = [r for r in rows if r.step_sps is not None]
    if stepped:
        best = max(stepped, key=lambda r: r.step_sps)
        setting = (f"batch {best.batch_size}, pin_memory {best.pin_memory}, prefetch {best.prefetch}")
        if best.data_wait > WAIT_THRESHOLD:
            # What the step would do if it never waited, over what one worker delivers.
            compute_sps = best.step_sps / max(1e-9, 1.0 - best.data_wait)
            per_worker = max((r.loader_sps / r.workers for r in rows
                              if r.workers > 0 and r.loader_sps and _same_setting(r, best)), default=None)
            if per_worker is None:
                needed = max(2, 2 * best.workers)
            else:
                needed = max(best.workers + 1, math.ceil(WORKER_HEADROOM * compute_sps / per_worker))
            line = (f"loader-bound: raise workers to {needed} (best {best.step_sps:.0f} samples/s at "
                    f"{best.workers} workers, {setting}, waits for data {best.data_wait:.0%} of the time; "
                    f"the step alone could do ~{compute_sps:.0f} samples/s)")
            if needed > cores:
                line += (f"; that is more than the {cores} logical cores here: the CPU is the limit "
                         f"(targets_on_device, reduced_decode, or a machine with more cores)")
            lines.append(line)
        else:
            enough = min((r.workers for r in stepped
                          if _same_setting(r, best) and r.step_sps >= 0.95 * best.step_sps), default=best.workers)
            lines.append(f"GPU-bound: the loader keeps up (data wait {best.data_wait:.0%}); {enough} workers "
                         f"suffice ({best.step_sps:.0f} samples/s at {setting})")
    else:
        measured = [r for r in rows if r.loader_sps is not None]
        best = max(measured, key=lambda r: r.loader_sps)
        same = sorted((r for r in measured if _same_setting(r, best)), key=lambda r: r.workers)
        line = (f"loader only: best {best.loader_sps:.0f} samples/s at {best.workers} workers, batch "
                f"{best.batch_size}, pin_memory {best.pin_memory}, prefetch {best.prefetch}")
        if len(same) > 1 and best is same[-1] and best.loader_sps > 1.1 * same[-2].loader_sps:
            line += f"; still rising at the most workers tried: try more than {best.workers}"
        lines.append(line + "; run with --steps to compare with the training step")
    return lines


def format_table(rows: list[Row]) -> str:
    header = ("workers", "batch", "pin", "prefetch", "loader s/s", "step s/s", "data wait", "PSS MiB", "note")
    body = []
    for r in rows:
        workers = str(r.workers) if r.workers == r.workers_requested else f"{r.workers_requested}->{r.workers}"
        body.append((workers, str(r.batch_size), "yes" if r.pin_memory else "no", str(r.prefetch),
                     _num(r.loader_sps), _num(r.step_sps),
                     "-" if r.data_wait is None else f"{r.data_wait:.0%}", _num(r.peak_pss_mib), r.note))
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths)).rstrip() for b in body]
    return "\n".join(lines)


def _num(x):
    return "-" if x is None else f"{x:.1f}"


def plot(rows: list[Row], path: Path) -> None:
    """Throughput vs workers, one line per batch size (best over pin/prefetch at each count)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, bs in enumerate(sorted({r.batch_size for r in rows})):
        for key, style, label in (("loader_sps", "-o", "loader"), ("step_sps", "--s", "train step")):
            best = {}
            for r in rows:
                if r.batch_size == bs and getattr(r, key) is not None:
                    best[r.workers] = max(best.get(r.workers, 0.0), getattr(r, key))
            if best:
                xs = sorted(best)
                ax.plot(xs, [best[x] for x in xs], style, color=f"C{i}", label=f"batch {bs}: {label}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("num_workers (effective)")
    ax.set_ylabel("samples / s")
    ax.set_title("vitpose.cli.tune: throughput vs workers")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_results(rows: list[Row], lines: list[str], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / "tune.csv", "txt": out / "tune.txt", "png": out / "tune.png"}
    with open(paths["csv"], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    paths["txt"].write_text(format_table(rows) + "\n\n" + "\n".join(lines) + "\n")
    plot(rows, paths["png"])
    return paths


# ----------------------------------------------------------------------------------------------
# Command line


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def _pins(text: str) -> list[bool]:
    choices = {"both": [False, True], "true": [True], "on": [True], "false": [False], "off": [False]}
    if text.lower() not in choices:
        raise argparse.ArgumentTypeError(f"--pin-memory: choose both, true or false, got {text!r}")
    return choices[text.lower()]


def default_workers() -> list[int]:
    """0, 1, 2, 4, ... up to the logical core count."""
    cores = os.cpu_count() or 1
    counts = [0] + [2**i for i in range(int(math.log2(cores)) + 1)]
    return sorted(set(counts + [cores]))


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("tune", help="sweep loader workers, batch size, pin_memory and prefetch",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, metavar="FILE|NAME", help="run config: a YAML file or a shipped config's name (its model, data and loader sections)")
    p.add_argument("--data-root", help="dataset root (default: data.root of the config)")
    p.add_argument("--synthetic", type=int, default=0, metavar="N",
                   help="sweep on N synthetic 640x480 images generated into a temporary folder")
    p.add_argument("--workers", type=_ints, default=None, help="num_workers values (default: 0,1,2,4,.. cores)")
    p.add_argument("--batch-sizes", type=_ints, default=None, help="default: loader.batch_size")
    p.add_argument("--pin-memory", type=_pins, default=None, help="both | true | false (default: config)")
    p.add_argument("--prefetch", type=_ints, default=None, help="prefetch_factor values (default: config)")
    p.add_argument("--batches", type=int, default=30, help="timed batches per combination")
    p.add_argument("--warmup", type=int, default=None, help="untimed batches first (default: workers + 2)")
    p.add_argument("--steps", action=argparse.BooleanOptionalAction, default=None,
                   help="also time the training step (default: on when CUDA is available)")
    p.add_argument("--out", default=None, help="output folder (default: WORK_DIR/tune)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    cfg = load_config(args.config, args.overrides)
    try:
        device = resolve_device(args.device or cfg.train.device)
    except ValueError as e:
        raise UserError(f"--device: {e}") from None
    if min(args.prefetch or [cfg.loader.prefetch_factor]) < 1:
        raise UserError("--prefetch: values must be >= 1")
    if args.batches < 1:
        raise UserError("--batches must be >= 1")
    use_steps = args.steps if args.steps is not None else device.type == "cuda"
    workers = args.workers or default_workers()
    batch_sizes = args.batch_sizes or [cfg.loader.batch_size]
    pins = args.pin_memory or [cfg.loader.pin_memory]
    prefetches = args.prefetch or [cfg.loader.prefetch_factor]
    out = Path(args.out or Path(cfg.train.work_dir) / "tune")

    with tempfile.TemporaryDirectory(prefix="vitpose-tune-") as tmp:
        if args.synthetic > 0:
            from vitpose.data.synthetic import make_coco

            print(f"generating {args.synthetic} synthetic images in {tmp} ...", file=sys.stderr)
            syn = make_coco(tmp, args.synthetic, seed=cfg.train.seed, split="train", image_size=(640, 480))
            cfg.data.train_ann = str(syn.ann_file.relative_to(tmp))
            cfg.data.train_images = str(syn.img_dir.relative_to(tmp))
            cfg.data.crop_cache = None  # a cache belongs to its own annotation file
            root = Path(tmp)
        else:
            root = Path(args.data_root or cfg.data.root)
        from vitpose.builders import build_train_set

        train_set = build_train_set(cfg, root)
        print(f"{len(train_set)} training instances; device {device}; sweeping workers {workers} x batch "
              f"{batch_sizes} x pin_memory {pins} x prefetch {prefetches}, {args.batches} batches each"
              + (" (loader, then loader + training step)" if use_steps else " (loader only)"), file=sys.stderr)
        step = make_train_step(cfg, device) if use_steps else None
        rows = sweep(train_set, cfg.loader, device, workers, batch_sizes, pins, prefetches, args.batches,
                     warmup=args.warmup, step=step, seed=cfg.train.seed, show_progress=not args.no_progress)

    lines = verdict(rows)
    paths = write_results(rows, lines, out)
    print(format_table(rows))
    print()
    print("\n".join(lines))
    print(f"\nwrote {paths['txt']}, {paths['csv']}, {paths['png']}")
    return 0
