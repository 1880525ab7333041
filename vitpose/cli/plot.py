"""Training curves from a run's metrics.jsonl: `vitpose plot WORKDIR [--out PNG]`.

Draws loss, learning rate, validation AP and samples/s against the iteration into
WORKDIR/curves.png (1200x800). A run that was resumed from an earlier checkpoint appends records
that go back in iterations; the records it replays replace the ones written before the resume,
so the curves show the run as it finally went.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from vitpose.errors import UserError


class MetricsNotFoundError(UserError, FileNotFoundError):
    """A work dir without metrics.jsonl (not a training run's, or not started)."""


FIGSIZE = (12, 8)  # inches, at DPI: 1200 x 800 pixels
DPI = 100


def load_curves(path: str | Path) -> dict[str, np.ndarray]:
    """Arrays from metrics.jsonl: train_iter, loss, lr, samples_per_s, eval_iter, eval_epoch, AP.

    Lines that are not JSON (the half-written last line of a killed run) are skipped with a note
    on stderr naming the line. A null loss (non-finite at the time) becomes NaN.
    """
    path = Path(path)
    if not path.is_file():
        raise MetricsNotFoundError(f"{path} not found: training writes it to its work_dir (train.work_dir)")
    train: list[dict] = []
    evals: dict[int, dict] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            print(f"{path}:{lineno}: skipped, not JSON ({e.msg})", file=sys.stderr)
            continue
        kind = record.get("kind")
        if kind == "train":
            it = record["iter"]
            if train and it <= train[-1]["iter"]:
                # Resumed from an earlier checkpoint: this history replaces what came after it.
                train = [r for r in train if r["iter"] < it]
                evals = {k: v for k, v in evals.items() if k < it}
            train.append(record)
        elif kind == "eval":
            evals[record["iter"]] = record
    ev = [evals[k] for k in sorted(evals)]

    def column(records, key):
        return np.array([np.nan if r.get(key) is None else r[key] for r in records], dtype=np.float64)

    return {
        "train_iter": column(train, "iter"),
        "loss": column(train, "loss"),
        "lr": column(train, "lr"),
        "samples_per_s": column(train, "samples_per_s"),
        "eval_iter": column(ev, "iter"),
        "eval_epoch": column(ev, "epoch"),
        "AP": column(ev, "AP"),
    }


def plot_metrics(work_dir: str | Path, out: str | Path | None = None) -> tuple[Path, dict[str, np.ndarray]]:
    """Draw the curves of WORKDIR/metrics.jsonl; returns the PNG path and the plotted arrays."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    work_dir = Path(work_dir)
    curves = load_curves(work_dir / "metrics.jsonl")
    out = Path(out) if out is not None else work_dir / "curves.png"
    fig, axes = plt.subplots(2, 2, figsize=FIGSIZE, dpi=DPI)
    panels = [
        (axes[0, 0], "train_iter", "loss", "training loss", True, "-"),
        (axes[0, 1], "train_iter", "lr", "learning rate", True, "-"),
        (axes[1, 0], "eval_iter", "AP", "validation AP", False, "o-"),
        (axes[1, 1], "train_iter", "samples_per_s", "samples/s", False, "-"),
    ]
    for ax, x_key, y_key, title, log_y, style in panels:
        x, y = curves[x_key], curves[y_key]
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.grid(True, alpha=0.3)
        if np.isfinite(y).any():
            ax.plot(x, y, style, markersize=3)
            if log_y and (y[np.isfinite(y)] > 0).all():
                ax.set_yscale("log")
        else:
            ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
    ap = curves["AP"][np.isfinite(curves["AP"])]
    if ap.size:
        fig.suptitle(f"{work_dir.name}: best AP {ap.max():.4f}, last {ap[-1]:.4f}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    plt.close(fig)
    return out, curves


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("plot", help="training curves of a work dir as a PNG", shared=("--debug",),
                              description=__doc__.splitlines()[0])
    p.add_argument("work_dir", help="a training run's work_dir (holds metrics.jsonl)")
    p.add_argument("--out", default=None, help="PNG to write (default WORKDIR/curves.png)")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    out, _ = plot_metrics(args.work_dir, args.out)
    print(out)
    return 0
