"""Train ViTPose on COCO keypoints (top-down, 256x192) -- or on a small synthetic set with --demo.

    python train.py --amp                                   # ViTPose-S, classic decoder, COCO
    python train.py --config configs/vitpose-b_coco_256x192.yaml --amp --data-root /data/coco
    python train.py --demo                                  # synthetic set, small ViT, CPU-friendly
    python train.py --resume auto                           # continue from the newest valid checkpoint
    torchrun --nproc_per_node 8 train.py --amp              # several GPUs (NCCL) or processes (gloo)
    python train.py --detach --nproc-per-node 8 --amp       # the same, surviving a closed terminal

The recipe is MMPose's ViTPose recipe (SPEC.md §6): AdamW with layer-wise LR decay, linear warmup
over 500 iterations, x0.1 after epochs 170 and 200, gradient clipping at 1.0, MSE heatmap loss on
UDP targets. Everything a run does is in this file, top to bottom; the pieces live in
vitpose/engine (config, schedule, trainer, checkpoint, runtime, telemetry) and vitpose/data.

Stopping: SIGTERM or Ctrl-C finishes the current step, saves WORK_DIR/last.pth and exits with
status 0; `--resume auto` then continues exactly (bit-identical on CPU) where it stopped. SIGHUP is
ignored. A non-finite loss skips its step; `train.max_nonfinite` in a row save and exit with status 3.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent
DEFAULT_CONFIG = REPO / "configs" / "vitpose-s_coco_256x192.yaml"
DEMO_CONFIG = REPO / "configs" / "demo.yaml"

EXIT_OK, EXIT_USAGE, EXIT_NONFINITE = 0, 2, 3


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `--lr` must not silently mean something else
        epilog=(
            "The flags above override the config file; --set overrides any config field, e.g.\n"
            "  --set optim.lr=1e-3 --set train.val_every=5 --set model.drop_path_rate=0.2\n"
            "Unknown keys fail before any work starts, naming the closest valid key.\n\n"
            "Detaching: --detach restarts this command in its own session (setsid), stdin closed,\n"
            "output appended to WORK_DIR/train.log, and prints the PID. With --nproc-per-node N it\n"
            "starts torchrun the same way. Use this rather than `nohup torchrun ...`: torchrun\n"
            "installs its own SIGHUP handler that stops the workers, so nohup does not protect it\n"
            "from an ssh drop, while a new session never receives that SIGHUP."
        ),
    )
    p.add_argument("--config", default=None,
                   help=f"YAML config (default {DEFAULT_CONFIG.relative_to(REPO)}; {DEMO_CONFIG.relative_to(REPO)} with --demo)")
    p.add_argument("--demo", action="store_true",
                   help="train a small ViT on a synthetic COCO-layout set (written once to work_dirs/demo/synthetic_coco); minutes on a CPU")
    p.add_argument("--amp", action="store_true",
                   help="mixed precision: fp16 autocast + GradScaler on CUDA, bf16 autocast on CPU")
    p.add_argument("--amp-dtype", choices=["float16", "bfloat16"], default=None,
                   help="autocast dtype with --amp (bfloat16 needs no scaler)")
    p.add_argument("--batch-size", type=int, default=None, help="per-process batch size (loader.batch_size)")
    p.add_argument("--workers", type=int, default=None, help="loader worker processes (loader.num_workers)")
    p.add_argument("--epochs", type=int, default=None, help="schedule.epochs")
    p.add_argument("--data-root", default=None, help="COCO root holding annotations/, train2017/, val2017/")
    p.add_argument("--work-dir", default=None, help="checkpoints, logs and the resolved config go here")
    p.add_argument("--resume", default=None, metavar="auto|PATH",
                   help="auto: the newest valid checkpoint in the work dir (fresh start if none); or a file")
    p.add_argument("--seed", type=int, default=None, help="train.seed")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config field (repeatable)")
    p.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--detach", action="store_true",
                   help="run in the background in a new session; output to WORK_DIR/train.log")
    p.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                   help="start N processes through torchrun (with --detach: detached torchrun)")
    return p.parse_args(argv)


def flag_overrides(args) -> list[str]:
    """The command-line flags as `--set` entries, applied after the config file and --set."""
    pairs = [("train.amp", True if args.amp else None), ("train.amp_dtype", args.amp_dtype),
             ("loader.batch_size", args.batch_size), ("loader.num_workers", args.workers),
             ("schedule.epochs", args.epochs), ("data.root", args.data_root),
             ("train.work_dir", args.work_dir), ("train.seed", args.seed), ("train.device", args.device),
             ("train.compile", True if args.compile else None)]
    return [f"{key}={json.dumps(value)}" for key, value in pairs if value is not None]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)

    # ---- config: file, then --set, then flags; any unknown key stops here -------------------
    from vitpose.config import ConfigError, load_config

    config_path = Path(args.config) if args.config else (DEMO_CONFIG if args.demo else DEFAULT_CONFIG)
    try:
        cfg = load_config(config_path, args.overrides + flag_overrides(args))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    work_dir = Path(cfg.train.work_dir)

    # ---- detaching and multi-process launch: re-run this command elsewhere ------------------
    from vitpose.engine import runtime

    if args.detach or args.nproc_per_node:
        rest = runtime.strip_flags(argv, {"--detach": 0, "--nproc-per-node": 1})
        if args.nproc_per_node:
            command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                       str(args.nproc_per_node), str(Path(__file__).resolve()), *rest]
        else:
            command = [sys.executable, str(Path(__file__).resolve()), *rest]
        if not args.detach:
            return _run_foreground(command)
        log_path = work_dir / "train.log"
        pid = runtime.detach(command, log_path)
        print(f"detached: PID {pid}; log {log_path.resolve()}\n  follow: tail -f {shlex.quote(str(log_path))}"
              f"\n  stop (saves a checkpoint first): kill -TERM {pid}")
        return EXIT_OK

    # Missing COCO is the most common first failure: say so before importing torch.
    missing = missing_data_files(cfg) if cfg.data.synthetic_train_images == 0 else {}
    if missing and int(os.environ.get("RANK", "0")) == 0:
        print(missing_data_message(cfg, missing, config_path), file=sys.stderr)
    if missing:
        return EXIT_USAGE

    with runtime.run_guard(work_dir / "train.log") as stop:
        return train(cfg, config_path, args.resume, stop)


def train(cfg, config_path: Path, resume: str | None, stop) -> int:
    """One training run with a resolved config; returns the exit status."""
    import torch

    from vitpose.engine import distributed as D

    work_dir = Path(cfg.train.work_dir)
    ctx = D.init_distributed(cfg.train.device)  # torchrun's environment, or a single process
    rank, world_size, device, is_main = ctx.rank, ctx.world_size, ctx.device, ctx.is_main

    # ---- data: check the files before anything heavy --------------------------------------
    if cfg.data.synthetic_train_images > 0:
        if is_main:
            ensure_synthetic_data(cfg)
        D.barrier(ctx)
    missing = missing_data_files(cfg)
    if missing:
        if is_main:
            print(missing_data_message(cfg, missing, config_path), file=sys.stderr)
        return EXIT_USAGE

    work_dir.mkdir(parents=True, exist_ok=True)
    if is_main:
        cfg.dump(work_dir / "config.yaml")
        print(f"config {config_path} (resolved copy: {work_dir / 'config.yaml'}):")
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=None), end="")

    torch.manual_seed(cfg.train.seed + rank)
    import random

    import numpy as np

    np.random.seed(cfg.train.seed + rank)
    random.seed(cfg.train.seed + rank)

    from vitpose.builders import build_codec, build_model_from_config, build_train_set, build_val_set

    root = Path(cfg.data.root)
    train_set = build_train_set(cfg)  # GT boxes, ViTPose augmentation; UDP targets drawn on the device
    val_set = build_val_set(cfg)  # the configured detection boxes, or GT boxes
    from vitpose.data.loaders import build_loaders

    loaders = build_loaders(train_set, val_set, cfg.loader, seed=cfg.train.seed, rank=rank, world_size=world_size)

    # ---- model ----------------------------------------------------------------------------
    from vitpose.models import load_weights

    model = build_model_from_config(cfg.model)
    if cfg.model.pretrained:
        report = load_weights(model, cfg.model.pretrained, strict=False)
        if is_main:
            print(f"initialised from {cfg.model.pretrained} ({report.layout} layout); "
                  f"not in the file: {len(report.missing)} tensors (e.g. the head when it is an MAE backbone)")
    model.to(device)
    num_params = sum(p.numel() for p in model.parameters())

    # ---- optimizer, schedule, precision -------------------------------------------------
    from vitpose.engine.optim import param_groups
    from vitpose.engine.precision import resolve_precision
    from vitpose.engine.schedule import LRSchedule

    lr = cfg.optim.lr
    global_batch = cfg.loader.batch_size * world_size * cfg.optim.accum_steps
    if cfg.optim.scale_lr:
        lr = cfg.optim.lr * global_batch / cfg.optim.base_batch_size
        if is_main:
            print(f"linear LR scaling: lr {cfg.optim.lr:g} x global batch {global_batch} / "
                  f"{cfg.optim.base_batch_size} = {lr:g}")
    groups = param_groups(model, lr=lr, weight_decay=cfg.optim.weight_decay, layer_decay=cfg.optim.layer_decay)
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=cfg.optim.betas, weight_decay=cfg.optim.weight_decay)
    schedule = LRSchedule.from_config(optimizer, cfg.schedule)
    precision = resolve_precision(device, cfg.train.amp, cfg.train.amp_dtype)
    if precision.note and is_main:
        print(precision.note)

    # ---- resume -----------------------------------------------------------------------------
    from vitpose.engine.checkpoint import find_resume_checkpoint, load_checkpoint, save_checkpoint
    from vitpose.engine.trainer import (
        TrainState,
        checkpoint_payload,
        forward_backward,
        is_finite,
        optimizer_step,
        prepare_batch,
        restore_checkpoint,
    )

    state = TrainState()
    if resume:
        found = find_resume_checkpoint(work_dir) if resume == "auto" else (Path(resume), load_checkpoint(resume))
        if found is None:
            print(f"--resume auto: no valid checkpoint in {work_dir}, starting from scratch")
        else:
            path, checkpoint = found
            state = restore_checkpoint(checkpoint, model, optimizer, precision, restore_rng=world_size == 1)
            if world_size > 1:  # each rank draws its own drop-path masks
                torch.manual_seed(cfg.train.seed + rank + 1000 * state.iteration)
            warn_if_layout_changed(checkpoint.get("config") or {}, cfg, world_size, is_main)
            if is_main:
                print(f"resumed from {path}: epoch {state.epoch}, batch {state.batch}, iteration {state.iteration}")

    # ---- wrappers: compile, DDP ---------------------------------------------------------
    train_model = D.wrap_model(torch.compile(model) if cfg.train.compile else model, ctx)

    batches_per_epoch = loaders.train_batches_per_epoch
    accum = cfg.optim.accum_steps
    steps_per_epoch = math.ceil(batches_per_epoch / accum)
    total_steps = steps_per_epoch * cfg.schedule.epochs

    from vitpose.engine.evaluate import predict
    from vitpose.engine.gpu_monitor import GpuMonitor
    from vitpose.engine.telemetry import Telemetry
    from vitpose.engine.thermal import ThermalGuard
    from vitpose.evaluation import CocoEvaluator

    codec = build_codec(cfg.model)
    evaluator = CocoEvaluator(root / cfg.data.val_ann, score_mode=cfg.eval.score_mode,
                              keypoint_score_thr=cfg.eval.keypoint_score_thr, nms_mode=cfg.eval.nms_mode,
                              nms_thr=cfg.eval.nms_thr) if is_main else None

    telemetry = Telemetry(
        work_dir, total_iters=total_steps, iters_per_epoch=steps_per_epoch, is_main=is_main,
        log_every=cfg.train.log_every, tensorboard=cfg.train.tensorboard,
        num_workers=loaders.num_workers, world_size=world_size, config_path=str(config_path),
    )
    gpu = GpuMonitor(device)
    thermal = ThermalGuard(cfg.train.thermal_limit_c, cfg.train.thermal_guard, gpu.temperature,
                           say=telemetry.message, warn=telemetry.warn)
    telemetry.message(
        f"{cfg.model.name}-{cfg.model.decoder}: {num_params / 1e6:.2f} M parameters, {precision.name} on {device}, "
        f"{world_size} process(es) x batch {cfg.loader.batch_size} x accum {accum}, "
        f"{len(train_set)} training instances, {steps_per_epoch} steps/epoch, {loaders.num_workers} workers")

    def save(name: str) -> Path:
        payload = checkpoint_payload(model, optimizer, schedule, precision, state, cfg.to_dict())
        return save_checkpoint(payload, work_dir / name)

    def validate() -> float:
        """COCO AP of the plain model on the validation set (all ranks predict, rank 0 scores)."""
        predictions = predict(model, loaders.val(), codec, flip_test=cfg.eval.flip_test, device=device,
                              amp_dtype=precision.dtype)
        predictions = D.gather_objects(predictions, ctx)
        ap = None
        if is_main:
            stats = evaluator.evaluate(predictions)
            telemetry.log_eval(state.epoch - 1, max(state.iteration - 1, 0), stats)
            ap = float(stats["AP"])
        return D.broadcast_object(ap, ctx)

    def finish(code: int) -> int:
        telemetry.close()
        loaders.close()
        D.cleanup(ctx)
        return code

    # ---- the loop -----------------------------------------------------------------------
    last_save = time.monotonic()
    model.train()
    for epoch in range(state.epoch, cfg.schedule.epochs):
        state.epoch = epoch
        micro, loss_sum, samples = 0, 0.0, 0
        t0 = time.perf_counter()
        data_time = 0.0
        for batch in loaders.train(epoch, start_batch=state.batch):
            data_time += time.perf_counter() - t0
            images, heatmaps, weights = prepare_batch(batch, device, cfg.model.input_size,
                                                      cfg.model.heatmap_size, cfg.model.sigma)
            if micro == 0:
                schedule.step(state.iteration, epoch)
            last_micro = micro + 1 == accum or state.batch + 1 == batches_per_epoch
            with D.no_sync(train_model, enabled=not last_micro):
                loss = forward_backward(train_model, images, heatmaps, weights, precision, accum)
            loss_sum = loss_sum + loss
            samples += images.shape[0] * world_size
            state.batch += 1
            micro += 1
            if not last_micro:
                t0 = time.perf_counter()
                continue

            # One optimizer step; agree across ranks on a non-finite loss and on a stop request.
            loss_mean = loss_sum / micro
            nonfinite, stop_now = D.any_rank([not is_finite(loss_mean), stop.requested], ctx)
            grad_norm, _ = optimizer_step(model, optimizer, precision, cfg.optim.clip_grad,
                                                loss_finite=not nonfinite)
            lr_now = optimizer.param_groups[-1]["lr"]
            if telemetry.step(state.iteration, epoch, loss_mean, lr_now, samples,
                              time.perf_counter() - t0, data_time, extra={"grad_norm": grad_norm}):
                reading = gpu.read()
                telemetry.report(reading)
                thermal.check(reading)
            state.iteration += 1
            micro, loss_sum, samples, data_time = 0, 0.0, 0, 0.0

            if nonfinite:
                state.nonfinite_in_row += 1
                telemetry.message(f"non-finite loss at iteration {state.iteration - 1} (epoch {epoch}, "
                                  f"batch {state.batch - 1}): step skipped ({state.nonfinite_in_row} in a row)")
                if state.nonfinite_in_row >= cfg.train.max_nonfinite:
                    if is_main:
                        path = save("last.pth")
                    telemetry.message(
                        f"stopping: {state.nonfinite_in_row} non-finite losses in a row (train.max_nonfinite). "
                        f"The weights are unchanged since the last finite step and saved in {work_dir / 'last.pth'}. "
                        f"Lower optim.lr, keep optim.clip_grad, or try --amp-dtype bfloat16 / no --amp.")
                    return finish(EXIT_NONFINITE)
            else:
                state.nonfinite_in_row = 0

            stop_at = cfg.train.stop_at_iteration
            if stop_now or (stop_at is not None and state.iteration >= stop_at):
                reason = stop.signal_name or ("a signal on another rank" if stop_now else "train.stop_at_iteration")
                if state.batch == batches_per_epoch:  # stopped on an epoch's last step
                    state.epoch, state.batch = epoch + 1, 0
                if is_main:
                    path = save("last.pth")
                    telemetry.message(f"stopped by {reason} at epoch {state.epoch}, batch {state.batch}, "
                                      f"iteration {state.iteration}; saved {path}. Continue with --resume auto.")
                return finish(EXIT_OK)
            if cfg.train.checkpoint_minutes > 0 and time.monotonic() - last_save > 60 * cfg.train.checkpoint_minutes:
                if is_main:
                    save("last.pth")
                last_save = time.monotonic()
            t0 = time.perf_counter()

        # ---- end of epoch: buffers, validation, checkpoints -----------------------------
        state.epoch, state.batch = epoch + 1, 0
        D.sync_buffers(model, ctx)
        done = state.epoch
        improved = False
        if done % cfg.train.val_every == 0 or done == cfg.schedule.epochs:
            ap = validate()
            if state.best_ap is None or ap > state.best_ap:
                state.best_ap, state.best_epoch, improved = ap, done, True
            telemetry.message(f"epoch {done}: AP {ap:.4f} (best {state.best_ap:.4f} at epoch {state.best_epoch})")
        if is_main:
            save("last.pth")
            if improved:
                save("best.pth")
            if cfg.train.keep_every > 0 and done % cfg.train.keep_every == 0:
                save(f"epoch_{done}.pth")
        last_save = time.monotonic()
        if D.any_rank([stop.requested], ctx)[0] and done < cfg.schedule.epochs:  # e.g. during validation
            telemetry.message(f"stopped by {stop.signal_name or 'a signal on another rank'} after epoch {done}; "
                              f"saved {work_dir / 'last.pth'}. Continue with --resume auto.")
            return finish(EXIT_OK)

    telemetry.message(f"done: {state.iteration} iterations; best AP {state.best_ap} at epoch {state.best_epoch}; "
                      f"checkpoints in {work_dir}")
    return finish(EXIT_OK)


# ---------------------------------------------------------------------------------------------
# Helpers kept out of the way of the main story


def _run_foreground(command: list[str]) -> int:
    import subprocess

    return subprocess.call(command)


def data_files(cfg) -> dict[str, Path]:
    root = Path(cfg.data.root)
    files = {
        "training annotations": root / cfg.data.train_ann,
        "training images": root / cfg.data.train_images,
        "validation annotations": root / cfg.data.val_ann,
        "validation images": root / cfg.data.val_images,
    }
    if cfg.data.val_bbox_file:
        files["validation person detections"] = root / cfg.data.val_bbox_file
    return files


def missing_data_files(cfg) -> dict[str, Path]:
    return {what: path for what, path in data_files(cfg).items() if not path.exists()}


def missing_data_message(cfg, missing: dict[str, Path], config_path: Path) -> str:
    lines = [f"COCO data not found (data.root = {cfg.data.root!r}, from {config_path} or --data-root). Looked for:"]
    for what, path in data_files(cfg).items():
        state = "MISSING" if what in missing else "ok"
        lines.append(f"  {state:7s} {path.resolve()}  ({what})")
    lines += [
        "Get COCO 2017 (train2017, val2017, annotations_trainval2017) and the detection results",
        "COCO_val2017_detections_AP_H_56_person.json, then pass --data-root DIR;",
        "or validate on GT boxes with --set data.val_bbox_file=null.",
        "To see training work without COCO, run the synthetic demo:  python train.py --demo",
    ]
    return "\n".join(lines)


def ensure_synthetic_data(cfg) -> None:
    """Write the demo's synthetic COCO-layout set under data.root unless it is already there."""
    from vitpose.data.synthetic import make_coco

    root = Path(cfg.data.root)
    want = {"train": cfg.data.synthetic_train_images, "val": cfg.data.synthetic_val_images,
            "seed": cfg.data.synthetic_seed}
    stamp = root / "synthetic.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == want and not missing_data_files(cfg):
        return
    print(f"writing the synthetic set ({want['train']} training and {want['val']} validation images) to {root}")
    make_coco(root, want["train"], seed=want["seed"], split="train")
    make_coco(root, max(want["val"], 1), seed=want["seed"], split="val")
    stamp.write_text(json.dumps(want))


def warn_if_layout_changed(old: dict, cfg, world_size: int, is_main: bool) -> None:
    """A resumed position means 'this many batches of this epoch': it needs the same batching."""
    old_loader = old.get("loader", {})
    if is_main and old_loader and old_loader.get("batch_size") != cfg.loader.batch_size:
        print(f"warning: the checkpoint was trained with batch size {old_loader.get('batch_size')}, "
              f"this run uses {cfg.loader.batch_size}: the mid-epoch position is approximate")


if __name__ == "__main__":
    sys.exit(main())
