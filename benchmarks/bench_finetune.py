"""Fine-tuning from a COCO-trained model against random init, on a skeleton of one's own.

    python train.py --demo                                            # the COCO-17 source model
    python benchmarks/bench_finetune.py --source work_dirs/demo/best.pth

The 7-keypoint synthetic set of configs/demo_k7.yaml (5 keypoints named as COCO's, `neck` and
`mid_hip` new; 200 training images) is trained for `--epochs` epochs with validation after each:

- `scratch`: random init, the demo recipe;
- `init`: `--init SOURCE` (backbone and the 5 shared head channels from the COCO model);
- `frozen`: as `init` with `train.freeze_backbone_epochs` = `--freeze-epochs` (only the head trains first);
- `init-lr/4`: as `init` with a quarter of the learning rate (the LR measurement of configs/finetune.yaml).

Same seed, data and schedule for all. A run whose work dir already holds `--epochs` validations is
not trained again (delete the dir to redo it). Prints the AP table (Markdown) and writes the plot.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "demo_k7.yaml"


def runs(source: str, freeze_epochs: int, lr: float) -> dict[str, list[str]]:
    init = ["--init", source]
    return {
        "scratch": [],
        "init": init,
        "frozen": init + ["--set", f"train.freeze_backbone_epochs={freeze_epochs}"],
        "init-lr/4": init + ["--set", f"optim.lr={lr / 4}"],
    }


LABELS = {"scratch": "random init", "init": "--init COCO model", "frozen": "--init, backbone frozen 2 epochs",
          "init-lr/4": "--init, LR / 4"}


def eval_aps(work_dir: Path) -> list[float]:
    path = work_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["AP"] for r in records if r.get("kind") == "eval"]


def train_missing(commands: dict[str, list[str]], work_root: Path, epochs: int) -> None:
    """Start every run that has not finished, all at once (the machine's cores are shared)."""
    started = {}
    for name, extra in commands.items():
        work_dir = work_root / name.replace("/", "_")
        if len(eval_aps(work_dir)) >= epochs:
            continue
        command = [sys.executable, str(REPO / "train.py"), "--config", str(CONFIG), "--work-dir", str(work_dir),
                   "--epochs", str(epochs), "--overwrite", *extra]
        work_dir.mkdir(parents=True, exist_ok=True)
        log = open(work_dir / "bench.log", "w")
        print("running:", " ".join(command), flush=True)
        started[name] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO), log)
    for name, (process, log) in started.items():
        if process.wait() != 0:
            raise SystemExit(f"{name}: train.py exited with {process.returncode}; see {log.name}")
        log.close()


def table(results: dict[str, list[float]], report_epochs: list[int]) -> str:
    lines = ["| init | " + " | ".join(f"AP after {e}" for e in report_epochs) + " |",
             "|---|" + "---|" * len(report_epochs)]
    for name, aps in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{aps[e - 1]:.3f}" if e <= len(aps) else "-" for e in report_epochs)
                     + " |")
    return "\n".join(lines)


def plot(results: dict[str, list[float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for name, aps in results.items():
        ax.plot(range(1, len(aps) + 1), aps, marker="o", label=LABELS.get(name, name))
    ax.set_xlabel("epoch")
    ax.set_ylabel("AP (100 validation images, GT boxes, flip test)")
    ax.set_title(title, fontsize=9)
    ax.set_xticks(range(1, max(len(a) for a in results.values()) + 1))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True, help="the COCO-17 model to fine-tune from (e.g. work_dirs/demo/best.pth)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--freeze-epochs", type=int, default=2)
    p.add_argument("--runs", default="scratch,init,frozen,init-lr/4", help="comma-separated subset of the runs")
    p.add_argument("--work-root", type=Path, default=REPO / "work_dirs" / "bench_finetune")
    p.add_argument("--plot", type=Path, default=REPO / "docs" / "images" / "finetune_k7.png")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from vitpose.config import load_config

    lr = load_config(CONFIG).optim.lr
    commands = {n: c for n, c in runs(args.source, args.freeze_epochs, lr).items() if n in args.runs.split(",")}
    t0 = time.time()
    train_missing(commands, args.work_root, args.epochs)
    results = {n: eval_aps(args.work_root / n.replace("/", "_"))[:args.epochs] for n in commands}
    print(f"trained in {time.time() - t0:.0f} s ({os.cpu_count()} CPUs)")
    print(table(results, sorted({1, 2, args.epochs})))
    plot(results, args.plot, "7 keypoints (5 named as COCO's), 200 synthetic training images")
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
