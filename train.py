"""Train ViTPose on COCO keypoints (top-down, 256x192) -- or on a small synthetic set with --demo.

    python train.py --amp                                   # ViTPose-S, classic decoder, COCO
    python train.py --config configs/vitpose-b_coco_256x192.yaml --amp --data-root /data/coco
    python train.py --demo                                  # synthetic set, small ViT, CPU-friendly
    python train.py --resume auto                           # continue from the newest valid checkpoint
    torchrun --nproc_per_node 8 train.py --amp              # several GPUs (NCCL) or processes (gloo)
    python train.py --detach --nproc-per-node 8 --amp       # the same, surviving a closed terminal

The recipe is MMPose's ViTPose recipe (docs/recipe.md): AdamW with layer-wise LR decay, linear warmup
over 500 iterations, x0.1 after epochs 170 and 200, gradient clipping at 1.0, MSE heatmap loss on
UDP targets. Everything a run does is in this file, top to bottom; the pieces live in
vitpose/engine (config, schedule, trainer, checkpoint, runtime, telemetry) and vitpose/data.

Stopping: SIGTERM or Ctrl-C finishes the current step, saves WORK_DIR/last.pth and exits with
status 0; `--resume auto` then continues exactly (bit-identical on CPU) where it stopped. SIGHUP is
ignored. A non-finite loss skips its step; `train.max_nonfinite` in a row save and exit with status 3.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import sys
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
                   help="auto: the valid checkpoint in the work dir that records the most progress (fresh "
                        "start if none); or a file")
    p.add_argument("--overwrite", action="store_true",
                   help="start from scratch in a work dir that holds an earlier run's checkpoints (overwriting them)")
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error instead of one line")
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
        print(f"train.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    work_dir = Path(cfg.train.work_dir)
    from vitpose.engine.workdir import WorkDirError, check_fresh_start

    try:  # before detaching, so the refusal reaches the terminal
        check_fresh_start(work_dir, args.resume, args.overwrite)
    except WorkDirError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE

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
        try:
            return train(cfg, config_path, args.resume, stop, overwrite=args.overwrite)
        except user_errors() as e:
            if args.debug:
                raise
            print(f"train.py: error: {e}", file=sys.stderr)
            print("(--debug shows the traceback)", file=sys.stderr)
            return EXIT_USAGE


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors about the user's files, settings or disk: one line each (evaluate.py does the same)."""
    from vitpose.config import ConfigError
    from vitpose.data.errors import DataError
    from vitpose.engine.checkpoint import CheckpointSaveError
    from vitpose.engine.workdir import WorkDirError
    from vitpose.models.checkpoint import CheckpointError

    return ConfigError, DataError, CheckpointError, CheckpointSaveError, WorkDirError


def train(cfg, config_path: Path, resume: str | None, stop, overwrite: bool = False) -> int:
    """One training run with a resolved config; returns the exit status.

    Every resource the run opens (work-dir lock, process group, worker pool, telemetry files) is
    registered with one ExitStack, so it is released on every exit: a normal end, a stop,
    divergence or an exception.
    """
    import torch

    from vitpose.builders import build_codec, build_evaluator, build_model_from_config, build_train_set, build_val_set
    from vitpose.cli.check_data import preflight
    from vitpose.data.loaders import build_loaders
    from vitpose.engine import distributed as D
    from vitpose.engine.checkpoint import prune_epoch_checkpoints, save_checkpoint
    from vitpose.engine.evaluate import predict
    from vitpose.engine.gpu_monitor import GpuMonitor
    from vitpose.engine.optim import build_optimizer
    from vitpose.engine.precision import resolve_precision
    from vitpose.engine.preflight import check_val_images, describe_dataset
    from vitpose.engine.telemetry import Telemetry
    from vitpose.engine.thermal import ThermalGuard
    from vitpose.engine.trainer import EpochEnd, RunWatch, TrainRun, TrainState, checkpoint_payload, train_one_epoch
    from vitpose.engine.workdir import claim_work_dir, write_text_atomic

    work_dir = Path(cfg.train.work_dir)
    with contextlib.ExitStack() as closing:
        ctx = D.init_distributed(cfg.train.device)  # torchrun's environment, or a single process
        closing.callback(D.cleanup, ctx)
        is_main = ctx.is_main
        if is_main:  # one run per work dir; stale temp files of interrupted saves go
            closing.enter_context(claim_work_dir(work_dir, resume, overwrite))

        # ---- data: the files, the datasets (every box checked), the validation images, ONE worker pool
        if cfg.data.synthetic_train_images > 0:
            if is_main:
                ensure_synthetic_data(cfg)
            D.barrier(ctx)
        missing = missing_data_files(cfg)
        if missing:
            if is_main:
                print(missing_data_message(cfg, missing, config_path), file=sys.stderr)
            return EXIT_USAGE
        seed_everything(cfg.train.seed + ctx.rank)
        train_set = build_train_set(cfg)  # GT boxes, ViTPose augmentation; UDP targets drawn on the device
        val_set = build_val_set(cfg, info=train_set.dataset_info)  # the configured detection boxes, or GT boxes
        skeleton = train_set.dataset_info  # K, flip pairs, half-body sets and OKS sigmas of the data
        report = preflight(cfg, train_set)  # K, flip table, labels, all-zero targets: seconds, every rank
        if is_main:
            print(describe_dataset("training", train_set))
            print(describe_dataset("validation", val_set))
            print(report.format(blocks=False), end="")  # the full report: vitpose check-data
            check_val_images(val_set, cfg.data.check_val_images)  # a corrupt image fails now, not after epoch 10
        report.raise_on_error()
        loaders = closing.enter_context(build_loaders(train_set, val_set, cfg.loader, seed=cfg.train.seed,
                                                      rank=ctx.rank, world_size=ctx.world_size))
        batches_per_epoch = loaders.train_batches_per_epoch

        # ---- model, optimizer (layer decay + warmup/step schedule), precision
        model = build_model_from_config(cfg.model, skeleton)  # carries its ModelSpec into every checkpoint
        if cfg.model.pretrained:
            load_pretrained(model, cfg.model.pretrained, is_main)
        model.to(ctx.device)
        accum = cfg.optim.accum_steps
        global_batch = cfg.loader.batch_size * ctx.world_size * accum
        optimizer, schedule = build_optimizer(model, cfg.optim, cfg.schedule, global_batch)
        if cfg.optim.scale_lr and is_main:
            print(f"linear LR scaling: lr {cfg.optim.lr:g} x global batch {global_batch} / "
                  f"{cfg.optim.base_batch_size} = {optimizer.param_groups[-1]['lr']:g}")
        precision = resolve_precision(ctx.device, cfg.train.amp, cfg.train.amp_dtype)
        if precision.note and is_main:
            print(precision.note)

        # ---- resume (the checkpoint must fit this config), then record the config in force
        state = TrainState()
        if resume:
            state = resume_from(resume, work_dir, cfg, model, optimizer, precision, ctx, batches_per_epoch)
        if is_main:
            text = yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=None)
            write_text_atomic(work_dir / "config.yaml", text)
            print(f"config {config_path} (resolved copy: {work_dir / 'config.yaml'}):\n{text}", end="")
        run = TrainRun(model, D.wrap_model(torch.compile(model) if cfg.train.compile else model, ctx),
                       optimizer, schedule, precision, ctx, state)

        # ---- reporting and scoring
        steps_per_epoch = math.ceil(batches_per_epoch / accum)
        telemetry = closing.enter_context(Telemetry(
            work_dir, total_iters=steps_per_epoch * cfg.schedule.epochs, iters_per_epoch=steps_per_epoch,
            is_main=is_main, log_every=cfg.train.log_every, tensorboard=cfg.train.tensorboard,
            num_workers=loaders.num_workers, world_size=ctx.world_size, config_path=str(config_path)))
        gpu = GpuMonitor(ctx.device)
        thermal = ThermalGuard(cfg.train.thermal_limit_c, cfg.train.thermal_guard, gpu.temperature,
                               say=telemetry.message, warn=telemetry.warn)
        watch = RunWatch(telemetry, gpu, thermal, stop)
        telemetry.message(
            f"{cfg.model.name}-{cfg.model.decoder}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M "
            f"parameters, {precision.name} on {ctx.device}, {ctx.world_size} process(es) x batch "
            f"{cfg.loader.batch_size} x accum {accum}, {len(train_set)} training instances, "
            f"{steps_per_epoch} steps/epoch, {loaders.num_workers} workers")
        codec = build_codec(cfg.model)
        evaluator = build_evaluator(cfg, skeleton) if is_main else None  # as MMPose scores data.dataset_info

        def save(name: str) -> Path | None:
            """Checkpoint the run as it stands now (main process only)."""
            if not is_main:
                return None
            payload = checkpoint_payload(model, optimizer, schedule, precision, state, cfg.to_dict())
            return save_checkpoint(payload, work_dir / name)

        def finish_epoch() -> None:
            """The end of epoch `state.epoch`: validation, then best/epoch_N, then the last.pth
            that records them (a kill in between repeats this on resume, never skips it)."""
            done, improved = state.epoch, False
            if done % cfg.train.val_every == 0 or done == cfg.schedule.epochs:
                predictions = predict(model, loaders.val(), codec, flip_test=cfg.eval.flip_test,
                                      device=ctx.device, amp_dtype=precision.dtype,
                                      flip_indices=skeleton.flip_indices)
                predictions = D.gather_objects(predictions, ctx)  # all ranks predict, rank 0 scores
                ap = None
                if is_main:
                    stats = evaluator.evaluate(predictions)
                    if evaluator.last_nonfinite:  # a diverged model: scored as misses, the run goes on
                        telemetry.message(f"epoch {done}: {evaluator.last_nonfinite} of {len(predictions)} validation "
                                          f"predictions have non-finite keypoints or scores; scored as misses")
                    telemetry.log_eval(done - 1, max(state.iteration - 1, 0), stats)
                    ap = float(stats[evaluator.primary_stat])  # AP, or PCKh for MPII
                ap = D.broadcast_object(ap, ctx)
                if state.best_ap is None or ap > state.best_ap:
                    state.best_ap, state.best_epoch, improved = ap, done, True
                telemetry.message(f"epoch {done}: AP {ap:.4f} (best {state.best_ap:.4f} at epoch {state.best_epoch})")
            state.epoch_end_pending = False
            if improved:
                save("best.pth")
            if cfg.train.keep_every > 0 and done % cfg.train.keep_every == 0:
                save(f"epoch_{done}.pth")
                if is_main:
                    prune_epoch_checkpoints(work_dir, cfg.train.keep_last)
            save("last.pth")

        # ---- the loop: an epoch of training, its resume point, then its end
        while True:
            if state.epoch_end_pending:  # just trained, or resumed from a stop on an epoch's last step
                finish_epoch()
                if D.any_rank([stop.requested], ctx)[0] and state.epoch < cfg.schedule.epochs:
                    telemetry.message(f"stopped by {stop.signal_name or 'a signal on another rank'} after epoch "
                                      f"{state.epoch}; saved {work_dir / 'last.pth'}. Continue with --resume auto.")
                    return EXIT_OK
            if state.epoch >= cfg.schedule.epochs:
                break
            end = train_one_epoch(run, loaders.train(state.epoch, start_batch=state.batch), state.epoch, cfg,
                                  batches_per_epoch, watch, save_last=lambda: save("last.pth"))
            if end is EpochEnd.DIVERGED:
                save("last.pth")
                telemetry.message(
                    f"stopping: {state.nonfinite_in_row} non-finite losses in a row (train.max_nonfinite). "
                    f"The weights are unchanged since the last finite step and saved in {work_dir / 'last.pth'}. "
                    f"Lower optim.lr, keep optim.clip_grad, or try --amp-dtype bfloat16 / no --amp.")
                return EXIT_NONFINITE
            if state.epoch_end_pending:
                D.sync_buffers(model, ctx)  # BN statistics agree across ranks before anything is saved
            save("last.pth")  # the resume point, before validation can take long or fail
            if end is EpochEnd.STOPPED:
                reason = stop.signal_name or ("train.stop_at_iteration" if not stop.requested else "a signal")
                telemetry.message(f"stopped by {reason} at epoch {state.epoch}, batch {state.batch}, iteration "
                                  f"{state.iteration}; saved {work_dir / 'last.pth'}. Continue with --resume auto.")
                return EXIT_OK

        telemetry.message(f"done: {state.iteration} iterations; best AP {state.best_ap} at epoch {state.best_epoch}; "
                          f"checkpoints in {work_dir}")
        return EXIT_OK


# ---------------------------------------------------------------------------------------------
# Helpers kept out of the way of the main story


def seed_everything(seed: int) -> None:
    """Seed torch, numpy's and Python's global generators (drop path; augmentation has its own)."""
    import random

    import numpy as np
    import torch

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def load_pretrained(model, source: str, is_main: bool) -> None:
    """Initialise from `model.pretrained` (any layout load_weights reads; a missing head is fine)."""
    from vitpose.models import load_weights

    report = load_weights(model, source, strict=False)
    if is_main:
        print(f"initialised from {source} ({report.layout} layout); "
              f"not in the file: {len(report.missing)} tensors (e.g. the head when it is an MAE backbone)")


def resume_from(resume: str, work_dir: Path, cfg, model, optimizer, precision, ctx, batches_per_epoch: int):
    """The TrainState of the checkpoint named by `--resume` (auto: the one in the work dir that
    records the most progress; a fresh TrainState when there is none), with everything else loaded
    into the run. A mid-epoch position saved with another batch size is converted by samples."""
    import torch

    from vitpose.engine.checkpoint import find_resume_checkpoint, load_checkpoint
    from vitpose.engine.trainer import TrainState, restore_checkpoint

    found = find_resume_checkpoint(work_dir) if resume == "auto" else (Path(resume), load_checkpoint(resume))
    if found is None:
        print(f"--resume auto: no valid checkpoint in {work_dir}, starting from scratch")
        return TrainState()
    path, checkpoint = found
    # With several processes each rank draws its own drop-path masks, so the saved (rank 0)
    # random state is not restored; each rank reseeds from the position instead.
    state = restore_checkpoint(checkpoint, model, optimizer, precision, restore_rng=ctx.world_size == 1,
                               source=path)
    if ctx.world_size > 1:
        torch.manual_seed(cfg.train.seed + ctx.rank + 1000 * state.iteration)
    old_batch = ((checkpoint.get("config") or {}).get("loader") or {}).get("batch_size")
    if state.batch and old_batch and old_batch != cfg.loader.batch_size:
        converted = min(state.batch * old_batch // cfg.loader.batch_size, batches_per_epoch)
        if ctx.is_main:
            print(f"resume: the checkpoint was trained with batch size {old_batch}, this run uses "
                  f"{cfg.loader.batch_size}: {state.batch} batches of epoch {state.epoch} are "
                  f"{state.batch * old_batch} samples, so the epoch continues at batch {converted}")
        state.batch = converted
        if converted == batches_per_epoch:  # the converted position is the epoch's end
            state.epoch, state.batch, state.epoch_end_pending = state.epoch + 1, 0, True
    if ctx.is_main:
        print(f"resumed from {path}: epoch {state.epoch}, batch {state.batch}, iteration {state.iteration}")
    return state


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
    from vitpose.builders import build_dataset_info
    from vitpose.data.synthetic import claim_synthetic_root, make_coco
    from vitpose.files import write_atomic

    root = Path(cfg.data.root)
    want = {"train": cfg.data.synthetic_train_images, "val": cfg.data.synthetic_val_images,
            "seed": cfg.data.synthetic_seed}
    # Another skeleton (a YAML of COCO-named keypoints, e.g. configs/demo_k5.yaml) labels the same people.
    info = None if cfg.data.dataset_info == "coco" else build_dataset_info(cfg)
    if info is not None:
        want["keypoints"] = list(info.keypoint_names)
    stamp = root / "synthetic.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == want and not missing_data_files(cfg):
        return
    claim_synthetic_root(root, want["train"])  # never into a folder of the user's (#18 item 1): one line instead
    print(f"writing the synthetic set ({want['train']} training and {want['val']} validation images) to {root}")
    make_coco(root, want["train"], seed=want["seed"], split="train", dataset_info=info)
    make_coco(root, max(want["val"], 1), seed=want["seed"], split="val", dataset_info=info)
    write_atomic(stamp, json.dumps(want))


if __name__ == "__main__":
    sys.exit(main())
