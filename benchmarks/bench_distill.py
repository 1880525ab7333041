"""Distillation against training alone: a student of a quarter of the demo model's compute, paired seeds.

    vitpose train --demo                                    # the teacher (work_dirs/demo/best.pth)
    python benchmarks/bench_distill.py --teacher work_dirs/demo/best.pth --data work_dirs/demo/synthetic_coco

Runs (each `--epochs` epochs of the teacher's recipe, validated on the demo's 100 validation images,
GT boxes, flip test; the AP reported is the last epoch's):

- `alone-S`: the student (`--student-extra`, the simple decoder) trained alone, `vitpose train`, seed S;
- `distilled-S`: the same student, `vitpose distill --teacher` on the same labelled images, seed S;
- `unlabelled`: `vitpose distill --no-labels` on `--unlabelled-images` fresh synthetic images (another
  seed than the labelled set, written under the work root) whose person boxes come from the set's
  detector-like detection file and are refined by the teacher: no keypoint label is read;
  `unlabelled-half`: the same with a student of the teacher's width and half its blocks (started
  from the teacher's blocks);
- `unlabelled-long` / `unlabelled-half-long`: both unlabelled runs for `--long-epochs` epochs (the
  step decay moved to 80% and 90% of them);
- `init-teacher` / `init-random`: a student of the teacher's width and a quarter of its blocks,
  distilled from the teacher's blocks or from random weights (which initialisation wins).

Prints each pair's distilled - alone AP, the unlabelled run's share of the teacher's AP, the
initialisation table, and the compute of teacher and students (GFLOPs per crop, forward). A run
whose work dir already holds `--epochs` validations is not run again (delete the dir to redo it).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from bench_finetune import eval_aps  # the AP of each validation in a run's metrics.jsonl

REPO = Path(__file__).resolve().parents[1]
STUDENT_EXTRA = "{embed_dim: 64, depth: 4, num_heads: 2}"


def run_all(runs: dict[str, list[str]], root: Path, epochs: dict[str, int], jobs: int) -> dict[str, list[float]]:
    """Every run not yet done (`epochs[name]` epochs), `jobs` at a time (a shared machine's cores go
    further with several single-threaded runs); each run's APs per epoch."""
    waiting = [name for name in runs if len(eval_aps(root / name)) < epochs[name]]
    active: dict[str, tuple[subprocess.Popen, object, float]] = {}
    while waiting or active:
        while waiting and len(active) < jobs:
            name = waiting.pop(0)
            work_dir = root / name
            work_dir.mkdir(parents=True, exist_ok=True)
            full = [sys.executable, "-m", "vitpose", *runs[name], "--work-dir", str(work_dir), "--epochs",
                    str(epochs[name]), "--overwrite", "--workers", "0"]
            print(f"{name}: {' '.join(full[1:])}", flush=True)
            log = open(work_dir / "bench.log", "w")
            active[name] = (subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT, cwd=REPO), log, time.time())
        time.sleep(2)
        for name, (process, log, start) in list(active.items()):
            if process.poll() is None:
                continue
            log.close()
            del active[name]
            if process.returncode != 0:
                raise SystemExit(f"{name}: exited with {process.returncode}; see {root / name / 'bench.log'}")
            print(f"{name}: {time.time() - start:.0f} s", flush=True)
    return {name: eval_aps(root / name)[:epochs[name]] for name in runs}


def student_sets(extra: str) -> list[str]:
    return ["--set", f"model.extra={extra}"]


def alone_command(teacher_cfg: Path, data: Path, extra: str, seed: int) -> list[str]:
    """`vitpose train` of the student with the teacher's recorded recipe (what distill inherits)."""
    return ["train", "--config", str(teacher_cfg), "--data-root", str(data), "--seed", str(seed),
            "--set", "model.name=vitpose-t", "--set", "model.decoder=simple", "--set", "model.drop_path_rate=null",
            "--set", "data.synthetic_train_images=0", "--set", "data.synthetic_val_images=0", *student_sets(extra)]


def distill_command(teacher: Path, data: Path, extra: str, seed: int, *more: str) -> list[str]:
    return ["distill", "--teacher", str(teacher), "--student", "vitpose-t", "--data", str(data),
            "--seed", str(seed), *student_sets(extra), *more]


def gflops(teacher: Path, extras: list[str]) -> dict[str, float]:
    """Forward GFLOPs per crop of the teacher and of students built with each `model.extra`."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from vitpose.builders import build_model_from_config, load_model
    from vitpose.config import load_config

    loaded = load_model(str(teacher), device="cpu")
    w, h = loaded.spec.input_size
    x = torch.zeros(1, 3, h, w)
    models = {"teacher": loaded.model}
    for extra in extras:
        cfg = load_config(None, [f"model.input_size={[w, h]}", f"model.heatmap_size={list(loaded.spec.heatmap_size)}",
                                 "model.name=vitpose-t", "model.decoder=simple", f"model.extra={extra}"])
        models[extra] = build_model_from_config(cfg.model)
    out = {}
    for name, model in models.items():
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model.eval()(x)
        out[name] = counter.get_total_flops() / 1e9
    return out


def unlabelled_set(root: Path, images: int, seed: int) -> Path:
    """Fresh synthetic images (another seed than the labelled set) and their detector-like boxes."""
    from vitpose.data.synthetic import make_coco

    if not (root / "train2017").is_dir():
        make_coco(root, images, seed=seed, split="train")
        (root / "annotations" / "person_keypoints_train2017.json").unlink()  # no label is kept
    return root


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--teacher", type=Path, required=True, help="the demo model (vitpose train --demo: best.pth)")
    p.add_argument("--data", type=Path, required=True, help="its synthetic COCO set (work_dirs/demo/synthetic_coco)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--student-extra", default=STUDENT_EXTRA, help="model.extra of the paired student")
    p.add_argument("--unlabelled-images", type=int, default=500)
    p.add_argument("--runs", default="pairs,unlabelled,init,long", help="comma-separated subset")
    p.add_argument("--long-epochs", type=int, default=30, help="epochs of the long unlabelled runs")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (each with OMP_NUM_THREADS threads)")
    p.add_argument("--work-root", type=Path, default=REPO / "work_dirs" / "bench_distill")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import torch

    from vitpose.config import load_config

    root, teacher, data = args.work_root.resolve(), args.teacher.resolve(), args.data.resolve()
    recorded = torch.load(teacher, map_location="cpu", weights_only=True).get("config")
    teacher_cfg = root / "teacher_config.yaml"
    root.mkdir(parents=True, exist_ok=True)
    load_config(None, recorded=recorded).dump(teacher_cfg)
    vit = recorded["model"]["extra"]
    wide_extra = f"{{embed_dim: {vit['embed_dim']}, depth: {max(vit['depth'] // 4, 1)}, num_heads: {vit['num_heads']}}}"
    half_extra = f"{{embed_dim: {vit['embed_dim']}, depth: {max(vit['depth'] // 2, 1)}, num_heads: {vit['num_heads']}}}"
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}")
    flops = gflops(teacher, [args.student_extra, wide_extra, half_extra])
    print("forward GFLOPs per crop: " + ", ".join(f"{k} {v:.3f}" for k, v in flops.items()))
    t0, wanted, seeds = time.time(), args.runs.split(","), [int(x) for x in args.seeds.split(",")]
    runs: dict[str, list[str]] = {}
    if "pairs" in wanted:
        for seed in seeds:
            runs[f"alone-{seed}"] = alone_command(teacher_cfg, data, args.student_extra, seed)
            runs[f"distilled-{seed}"] = distill_command(teacher, data, args.student_extra, seed)
    if "unlabelled" in wanted:
        images = unlabelled_set(root / "unlabelled_images", args.unlabelled_images, seed=1234)
        boxes = images / "person_detection_results" / "train_detections.json"
        unlabelled = ["--no-labels", "--unlabeled", str(images / "train2017"), "--unlabeled-boxes", str(boxes)]
        runs["unlabelled"] = distill_command(teacher, data, args.student_extra, 0, *unlabelled)
        # the teacher's width and half its blocks, started from them: what no labels at all can reach
        runs["unlabelled-half"] = distill_command(teacher, data, half_extra, 0, *unlabelled)
    if "long" in wanted:  # the unlabelled runs for --long-epochs, the step decay at the same fractions
        n = args.long_epochs
        later = ["--set", f"schedule.milestones=[{round(n * 0.8)}, {round(n * 0.9)}]"]
        images = unlabelled_set(root / "unlabelled_images", args.unlabelled_images, seed=1234)
        boxes = images / "person_detection_results" / "train_detections.json"
        unlabelled = ["--no-labels", "--unlabeled", str(images / "train2017"), "--unlabeled-boxes", str(boxes), *later]
        runs["unlabelled-long"] = distill_command(teacher, data, args.student_extra, 0, *unlabelled)
        runs["unlabelled-half-long"] = distill_command(teacher, data, half_extra, 0, *unlabelled)
    if "init" in wanted:
        for init in ("teacher", "random"):
            runs[f"init-{init}"] = distill_command(teacher, data, wide_extra, 0, "--init", init)
    epochs = {name: args.long_epochs if name.endswith("-long") else args.epochs for name in runs}
    aps = run_all(runs, root, epochs, args.jobs)
    teacher_ap = next(record(root / name)["teacher_ap"] for name in runs if not name.startswith("alone"))
    print(f"teacher AP {teacher_ap:.4f}; every AP below: the last of {args.epochs} epochs")
    if "pairs" in wanted:
        lines = ["| seed | alone AP | distilled AP | distilled - alone |", "|---|---|---|---|"]
        for seed in seeds:
            alone, distilled = aps[f"alone-{seed}"][-1], aps[f"distilled-{seed}"][-1]
            lines.append(f"| {seed} | {alone:.4f} | {distilled:.4f} | {distilled - alone:+.4f} |")
        print("\n".join(lines))
    if "unlabelled" in wanted:
        for name, extra in (("unlabelled", args.student_extra), ("unlabelled-half", half_extra)):
            ap = aps[name][-1]
            print(f"unlabelled only (no labels at all), student {extra}: AP {ap:.4f} = {ap / teacher_ap:.1%} of the "
                  f"teacher's")
    if "long" in wanted:
        for name, extra in (("unlabelled-long", args.student_extra), ("unlabelled-half-long", half_extra)):
            ap = aps[name][-1]
            print(f"unlabelled only, {args.long_epochs} epochs, student {extra}: AP {ap:.4f} = "
                  f"{ap / teacher_ap:.1%} of the teacher's")
    if "init" in wanted:
        lines = ["| student | init | AP |", "|---|---|---|"]
        lines += [f"| {wide_extra} | {init} | {aps[f'init-{init}'][-1]:.4f} |" for init in ("teacher", "random")]
        print("\n".join(lines))
    print(f"done in {time.time() - t0:.0f} s")
    return 0


def record(work_dir: Path) -> dict:
    import torch

    return torch.load(work_dir / "last.pth", map_location="cpu", weights_only=True)["distill"]


if __name__ == "__main__":
    sys.exit(main())
