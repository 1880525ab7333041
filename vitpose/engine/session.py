"""A training session: its setup and the end of each epoch, the two halves `vitpose train` calls.

`set_up` opens everything a run needs, in order (process group, work-dir lock, data files,
datasets and their checks, one worker pool, model and optimizer, precision, resume, the resolved
config, telemetry, the validation scorer) and registers each resource with the caller's
`contextlib.ExitStack`, so every exit releases them. `finish_epoch` is the epoch end: validation,
then `best.pth` / `epoch_N.pth`, then the `last.pth` that records them (a kill in between repeats
the end on resume, never skips it). `save` checkpoints the run as it stands.

The functions tests replace (`checkpoint.save_checkpoint`, `evaluate.predict`) are looked up
on their modules at call time.
"""

from __future__ import annotations

import json
import os
import random
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from vitpose.builders import (
    build_codec,
    build_dataset_info,
    build_evaluator,
    build_model_from_config,
    build_train_set,
    build_val_set,
)
from vitpose.config import Config
from vitpose.data.loaders import Loaders, build_loaders
from vitpose.data.metainfo import DatasetInfo
from vitpose.data.synthetic import claim_synthetic_root, make_coco
from vitpose.engine import checkpoint, distill, evaluate
from vitpose.engine import distributed as D
from vitpose.engine.finetune import apply_backbone_freeze, init_from_source
from vitpose.engine.gpu_monitor import GpuMonitor
from vitpose.engine.optim import build_optimizer
from vitpose.engine.precision import resolve_precision
from vitpose.engine.preflight import check_val_images, describe_dataset, preflight
from vitpose.engine.runtime import StopFlag
from vitpose.engine.telemetry import Telemetry
from vitpose.engine.thermal import ThermalGuard
from vitpose.engine.trainer import RunWatch, TrainRun, TrainState, checkpoint_payload, restore_checkpoint
from vitpose.engine.workdir import claim_work_dir, write_text_atomic
from vitpose.errors import UserError
from vitpose.files import write_atomic
from vitpose.models import load_weights


@dataclass
class Session:
    """What a set-up run holds: the config, the run (model, optimizer, position), the data and
    the reporting. `state` is the run's position (`train_run.state`)."""

    cfg: Config
    work_dir: Path
    train_run: TrainRun
    loaders: Loaders
    batches_per_epoch: int
    skeleton: object  # the data's DatasetInfo: flip indices for validation
    codec: object
    evaluator: object | None  # the main process scores; None elsewhere
    telemetry: Telemetry
    watch: RunWatch

    @property
    def state(self) -> TrainState:
        return self.train_run.state

    @property
    def ctx(self) -> D.DistContext:
        return self.train_run.ctx


def set_up(cfg: Config, config_path, resume: str | None, overwrite: bool, stop: StopFlag,
           closing: ExitStack) -> Session:
    """Everything a run needs, each resource registered with `closing`; the config is resolved."""
    work_dir = Path(cfg.train.work_dir)
    # torchrun's environment, or a single process; the ranks' wait for each other hears a SIGTERM
    ctx = D.init_distributed(cfg.train.device, rendezvous_timeout=cfg.train.rendezvous_timeout, stop=stop)
    closing.callback(D.cleanup, ctx)
    if ctx.is_main:  # one run per work dir; stale temp files of interrupted saves go
        closing.enter_context(claim_work_dir(work_dir, resume, overwrite))
    train_set, val_set, loaders = set_up_data(cfg, config_path, ctx, closing)
    skeleton = train_set.dataset_info  # K, flip pairs and OKS sigmas of the data
    run = set_up_model(cfg, ctx, resume, loaders.train_batches_per_epoch, skeleton)
    if ctx.is_main:  # the config in force, next to the checkpoints (and in every checkpoint)
        text = yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=None)
        write_text_atomic(work_dir / "config.yaml", text)
        print(f"config {config_path} (resolved copy: {work_dir / 'config.yaml'}):\n{text}", end="")
    telemetry, watch = set_up_reporting(cfg, config_path, run, loaders, len(train_set), stop, closing)
    evaluator = build_evaluator(cfg, skeleton) if ctx.is_main else None  # as MMPose scores data.dataset_info
    job = Session(cfg, work_dir, run, loaders, loaders.train_batches_per_epoch, skeleton, build_codec(cfg.model),
                  evaluator, telemetry, watch)
    if run.objective is not None and run.objective.record.get("teacher_ap") is None:
        # The teacher's score on the same validation set, once: every student file records both.
        run.objective.record["teacher_ap"] = validate(job, run.objective.teacher, log=False)
        telemetry.message(f"teacher: AP {run.objective.record['teacher_ap']:.4f} on the validation set")
    return job


def set_up_data(cfg: Config, config_path, ctx: D.DistContext, closing: ExitStack):
    """(training set, validation set, worker pool): files present, every box and the skeleton checked."""
    if cfg.data.synthetic_train_images > 0:
        if ctx.is_main:
            ensure_synthetic_data(cfg)
        D.barrier(ctx)
    missing = missing_data_files(cfg)
    if missing:
        raise UserError(missing_data_message(cfg, missing, config_path))
    seed_everything(cfg.train.seed + ctx.rank)
    train_set = build_train_set(cfg) if cfg.distill.labelled else None  # GT boxes, ViTPose augmentation
    if cfg.distill.teacher:  # a distillation: the unlabelled frames too, as one set
        train_set = distill.distill_train_set(cfg, train_set)
    val_set = build_val_set(cfg, info=train_set.dataset_info)  # the configured detection boxes, or GT boxes
    # K, flip table, labels, all-zero targets: seconds, every rank
    report = preflight(cfg, getattr(train_set, "checked", train_set))
    if ctx.is_main:
        print(describe_dataset("training", train_set))
        print(describe_dataset("validation", val_set))
        print(report.format(blocks=False), end="")  # the full report: vitpose check-data
        check_val_images(val_set, cfg.data.check_val_images)  # a corrupt image fails now, not after epoch 10
    report.raise_on_error()
    loaders = closing.enter_context(build_loaders(train_set, val_set, cfg.loader, seed=cfg.train.seed,
                                                  rank=ctx.rank, world_size=ctx.world_size))
    return train_set, val_set, loaders


def set_up_model(cfg: Config, ctx: D.DistContext, resume: str | None, batches_per_epoch: int,
                 skeleton: DatasetInfo) -> TrainRun:
    """The model (with `model.pretrained` loaded), optimizer with its schedule, precision, and the
    position: resumed (the checkpoint must fit this config) before the model is wrapped for DDP."""
    model = build_model_from_config(cfg.model, skeleton)  # carries its ModelSpec into every checkpoint
    found = find_resume_point(resume, Path(cfg.train.work_dir), ctx.is_main) if resume else None
    if found is None:
        if cfg.model.pretrained:
            load_pretrained(model, cfg.model.pretrained, ctx.is_main)
        if cfg.model.init:  # fine-tuning: backbone from the source, head channels by keypoint name
            init_from_source(model, cfg, skeleton, Path(cfg.train.work_dir), ctx.is_main)
    elif ctx.is_main:
        # The checkpoint holds every weight (loaded strictly below), so the sources are not read
        # again: a resume needs neither the init file nor the network, and init_keypoints.txt
        # keeps recording what the run really started from.
        for field, source in (("model.pretrained", cfg.model.pretrained), ("model.init", cfg.model.init)):
            if source:
                print(f"resuming: {field} = {source!r} is not read again (the checkpoint holds every weight)")
    if ctx.is_main:
        for warning in freeze_warnings(cfg):
            print(f"warning: {warning}", file=sys.stderr)
    objective = None
    if cfg.distill.teacher:  # the teacher (its hash checked on a resume), the student started from it, the projector
        recorded = found[1].get(distill.RECORD_KEY) if found is not None else None
        steps_per_epoch = -(-batches_per_epoch // cfg.optim.accum_steps)
        objective = distill.set_up_distillation(cfg, model, ctx.device, steps_per_epoch, recorded, ctx.is_main)
    model.to(ctx.device)
    global_batch = cfg.loader.batch_size * ctx.world_size * cfg.optim.accum_steps
    optimizer, schedule = build_optimizer(model, cfg.optim, cfg.schedule, global_batch)
    if objective is not None:
        objective.add_to(optimizer, optimizer.param_groups[-1]["lr"], cfg.optim.weight_decay)
    if cfg.optim.scale_lr and ctx.is_main:
        print(f"linear LR scaling: lr {cfg.optim.lr:g} x global batch {global_batch} / "
              f"{cfg.optim.base_batch_size} = {optimizer.param_groups[-1]['lr']:g}")
    precision = resolve_precision(ctx.device, cfg.train.amp, cfg.train.amp_dtype)
    if precision.note and ctx.is_main:
        print(precision.note)
    state = TrainState()
    if found is not None:
        state = resume_from(found, cfg, model, optimizer, precision, ctx, batches_per_epoch)
    trained = model if objective is None else objective.trained
    return TrainRun(model, wrap_for_training(trained, cfg, ctx), optimizer, schedule, precision, ctx, state, objective)


def freeze_warnings(cfg: Config) -> list[str]:
    """`train.freeze_backbone_epochs` settings that cannot help: a backbone frozen for the whole
    run, or a randomly initialised one frozen (its random features would stay fixed)."""
    frozen, epochs = cfg.train.freeze_backbone_epochs, cfg.schedule.epochs
    warnings = []
    if frozen and frozen >= epochs:
        warnings.append(f"train.freeze_backbone_epochs={frozen} with schedule.epochs={epochs}: the backbone "
                        f"never trains in this run, only the head does; set it below {epochs} to fine-tune "
                        f"the backbone too")
    if frozen and not (cfg.model.init or cfg.model.pretrained):
        warnings.append(f"train.freeze_backbone_epochs={frozen} freezes a randomly initialised backbone "
                        f"(neither model.init nor model.pretrained is set); give --init SOURCE or set it to 0")
    return warnings


def wrap_for_training(model, cfg: Config, ctx: D.DistContext):
    """The model the batches go through: torch.compile (train.compile) inside DDP (several processes)."""
    return D.wrap_model(torch.compile(model) if cfg.train.compile else model, ctx)


def begin_epoch(session: Session) -> None:
    """Before epoch `state.epoch`: freeze or unfreeze the backbone (`train.freeze_backbone_epochs`;
    the epoch alone decides, so a resumed run does the same), wrapping the model again on a change."""
    run, epoch = session.train_run, session.state.epoch
    if apply_backbone_freeze(run.model, epoch, session.cfg, session.telemetry.message,
                             head_only=distill.head_only(session.cfg, epoch)):
        run.train_model = wrap_for_training(run.trained, session.cfg, session.ctx)


def set_up_reporting(cfg: Config, config_path, run: TrainRun, loaders: Loaders, instances: int, stop: StopFlag,
                     closing: ExitStack) -> tuple[Telemetry, RunWatch]:
    """Telemetry (metrics.jsonl, TensorBoard), the GPU monitor and thermal guard, and the run's first line."""
    ctx, accum = run.ctx, cfg.optim.accum_steps
    steps_per_epoch = -(-loaders.train_batches_per_epoch // accum)
    telemetry = closing.enter_context(Telemetry(
        cfg.train.work_dir, total_iters=steps_per_epoch * cfg.schedule.epochs, iters_per_epoch=steps_per_epoch,
        is_main=ctx.is_main, log_every=cfg.train.log_every, tensorboard=cfg.train.tensorboard,
        num_workers=loaders.num_workers, world_size=ctx.world_size, config_path=str(config_path)))
    gpu = GpuMonitor(ctx.device)
    thermal = ThermalGuard(cfg.train.thermal_limit_c, cfg.train.thermal_guard, gpu.temperature,
                           say=telemetry.message, warn=telemetry.warn)
    telemetry.message(
        f"{cfg.model.name}-{cfg.model.decoder}: {sum(p.numel() for p in run.model.parameters()) / 1e6:.2f} M "
        f"parameters, {run.precision.name} on {ctx.device}, {ctx.world_size} process(es) x batch "
        f"{cfg.loader.batch_size} x accum {accum}, {instances} training instances, "
        f"{steps_per_epoch} steps/epoch, {loaders.num_workers} workers")
    return telemetry, RunWatch(telemetry, gpu, thermal, stop)


def save(session: Session, name: str) -> Path | None:
    """Checkpoint the run as it stands to WORK_DIR/name (main process only; None elsewhere)."""
    if not session.ctx.is_main:
        return None
    run = session.train_run
    payload = checkpoint_payload(run.model, run.optimizer, run.schedule, run.precision, run.state,
                                 session.cfg.to_dict())
    payload["world_size"] = session.ctx.world_size  # resume says when another world size makes it inexact
    if run.objective is not None:  # the teacher (path, hash), the losses, both scores, the projector
        payload[distill.RECORD_KEY] = run.objective.state(run.state.best_ap)
    return checkpoint.save_checkpoint(payload, session.work_dir / name)


def finish_epoch(session: Session) -> None:
    """The end of epoch `state.epoch`: validation (when due), then best/epoch_N, then last.pth."""
    cfg, state = session.cfg, session.state
    done, improved = state.epoch, False
    if done % cfg.train.val_every == 0 or done == cfg.schedule.epochs:
        ap = validate(session)
        if state.best_ap is None or ap > state.best_ap:
            state.best_ap, state.best_epoch, improved = ap, done, True
        session.telemetry.message(f"epoch {done}: AP {ap:.4f} (best {state.best_ap:.4f} at epoch {state.best_epoch})")
    state.epoch_end_pending = False
    if improved:
        save(session, "best.pth")
    if cfg.train.keep_every > 0 and done % cfg.train.keep_every == 0:
        save(session, f"epoch_{done}.pth")
        if session.ctx.is_main:
            checkpoint.prune_epoch_checkpoints(session.work_dir, cfg.train.keep_last)
    save(session, "last.pth")


def validate(session: Session, model=None, log: bool = True) -> float:
    """The validation score of the model as it stands (AP, or PCKh for MPII), on every rank.

    model: another model of the same input (a distillation's teacher), scored without logging."""
    cfg, ctx, state, run = session.cfg, session.ctx, session.state, session.train_run
    predictions = evaluate.predict(run.model if model is None else model, session.loaders.val(), session.codec,
                                   flip_test=cfg.eval.flip_test, device=ctx.device, amp_dtype=run.precision.dtype,
                                   flip_indices=session.skeleton.flip_indices)
    predictions = D.gather_objects(predictions, ctx)  # all ranks predict, rank 0 scores
    ap = None
    if ctx.is_main:
        evaluator = session.evaluator
        stats = evaluator.evaluate(predictions)
        if evaluator.last_nonfinite:  # a diverged model: scored as misses, the run goes on
            session.telemetry.message(f"epoch {state.epoch}: {evaluator.last_nonfinite} of {len(predictions)} "
                                      f"validation predictions have non-finite keypoints or scores; scored as misses")
        if log:
            session.telemetry.log_eval(state.epoch - 1, max(state.iteration - 1, 0), stats)
        ap = float(stats[evaluator.primary_stat])
    return D.broadcast_object(ap, ctx)


# ---------------------------------------------------------------------------------------------
# The pieces of setup


def seed_everything(seed: int) -> None:
    """Seed torch, numpy's and Python's global generators (drop path; augmentation has its own)."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def load_pretrained(model, source: str, is_main: bool) -> None:
    """Initialise from `model.pretrained` (any layout load_weights reads; a missing head is fine)."""
    report = load_weights(model, source, strict=False)
    if is_main:
        print(f"initialised from {source} ({report.layout} layout); "
              f"not in the file: {len(report.missing)} tensors (e.g. the head when it is an MAE backbone)")


def find_resume_point(resume: str, work_dir: Path, is_main: bool = True) -> tuple[Path, dict] | None:
    """The checkpoint named by `--resume` (auto: the one in the work dir that records the most
    progress; None when there is none) and its contents."""
    if resume != "auto":
        return Path(resume), checkpoint.load_checkpoint(resume)
    found = checkpoint.find_resume_checkpoint(work_dir)
    if found is None and is_main:
        print(f"--resume auto: no valid checkpoint in {work_dir}, starting from scratch")
    return found


def resume_from(found: tuple[Path, dict], cfg: Config, model, optimizer, precision, ctx: D.DistContext,
                batches_per_epoch: int) -> TrainState:
    """The TrainState of the checkpoint `found` (`find_resume_point`), with everything else loaded
    into the run. A mid-epoch position saved with another batch size is converted by samples."""
    path, saved = found
    # With several processes each rank draws its own drop-path masks, so the saved (rank 0)
    # random state is not restored; each rank reseeds from the position instead.
    state = restore_checkpoint(saved, model, optimizer, precision, restore_rng=ctx.world_size == 1,
                               source=path)
    if ctx.world_size > 1:
        torch.manual_seed(cfg.train.seed + ctx.rank + 1000 * state.iteration)
    old_batch = ((saved.get("config") or {}).get("loader") or {}).get("batch_size")
    if state.batch and old_batch and old_batch != cfg.loader.batch_size:
        converted = min(state.batch * old_batch // cfg.loader.batch_size, batches_per_epoch)
        if ctx.is_main:
            print(f"resume: the checkpoint was trained with batch size {old_batch}, this run uses "
                  f"{cfg.loader.batch_size}: {state.batch} batches of epoch {state.epoch} are "
                  f"{state.batch * old_batch} samples, so the epoch continues at batch {converted}")
        state.batch = converted
        if converted == batches_per_epoch:  # the converted position is the epoch's end
            state.epoch, state.batch, state.epoch_end_pending = state.epoch + 1, 0, True
    old_world = saved.get("world_size")  # absent in checkpoints from before it was recorded
    if state.batch and old_world and old_world != ctx.world_size and ctx.is_main:
        print(f"resume: the checkpoint was saved by {old_world} process(es), this run has {ctx.world_size}: "
              f"epoch {state.epoch} continues at batch {state.batch} with this run's sampler, so some of its "
              f"samples are seen twice or not at all (an exact resume needs {old_world} processes)")
    if ctx.is_main:
        print(f"resumed from {path}: epoch {state.epoch}, batch {state.batch}, iteration {state.iteration}")
    return state


# ---------------------------------------------------------------------------------------------
# The data files


def data_files(cfg: Config) -> dict[str, Path]:
    """The files and folders a run reads, by what they are."""
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


def missing_data_files(cfg: Config) -> dict[str, Path]:
    return {what: path for what, path in data_files(cfg).items() if not path.exists()}


def missing_data_message(cfg: Config, missing: dict[str, Path], config_path) -> str:
    lines = [f"COCO data not found (data.root = {cfg.data.root!r}, from {config_path} or --data-root). Looked for:"]
    for what, path in data_files(cfg).items():
        state = "MISSING" if what in missing else "ok"
        lines.append(f"  {state:7s} {path.resolve()}  ({what})")
    lines += [
        "Get COCO 2017 (train2017, val2017, annotations_trainval2017) and the detection results",
        "COCO_val2017_detections_AP_H_56_person.json, then pass --data-root DIR;",
        "or validate on GT boxes with --set data.val_bbox_file=null.",
        "To see training work without COCO, run the synthetic demo:  vitpose train --demo  (python train.py --demo)",
    ]
    return "\n".join(lines)


def ensure_synthetic_data(cfg: Config) -> None:
    """Write the demo's synthetic COCO-layout set under data.root unless it is already there."""
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
    claim_synthetic_root(root, want["train"])  # never into a folder of the user's: one line instead
    print(f"writing the synthetic set ({want['train']} training and {want['val']} validation images) to {root}")
    make_coco(root, want["train"], seed=want["seed"], split="train", dataset_info=info)
    make_coco(root, max(want["val"], 1), seed=want["seed"], split="val", dataset_info=info)
    write_atomic(stamp, json.dumps(want))



def is_main_process() -> bool:
    """Rank 0 of a torchrun job, or a single process (before the process group exists)."""
    return int(os.environ.get("RANK", "0")) == 0
