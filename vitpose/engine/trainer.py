"""One epoch of training, the pieces of one iteration, and the run's resumable state.

`vitpose.cli.train.train` keeps the run (the epoch loop and the checkpoint decisions; setup and
validation are `vitpose.engine.session`) and calls `train_one_epoch`, which reads top to bottom:
for each batch `prepare_batch` (uint8 crops -> normalised float on the device, heatmap targets
encoded on the device), `forward_backward`
(autocast forward, fp32 loss, scaled backward), and after the last micro-batch of an optimizer
step `optimizer_step` (unscale, clip, step, with non-finite handling), telemetry, and the checks
for a stop request. `TrainState` / `checkpoint_payload` / `restore_checkpoint` make resume exact.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

import torch

from vitpose.codecs.udp_torch import udp_encode_torch
from vitpose.data.loaders import to_device
from vitpose.engine import distributed as D
from vitpose.engine.checkpoint import model_state_dict, rng_state, set_rng_state
from vitpose.engine.gpu_monitor import GpuMonitor
from vitpose.engine.losses import KeypointMSELoss
from vitpose.engine.precision import Precision
from vitpose.engine.runtime import StopFlag
from vitpose.engine.schedule import BASE_LR_KEY, LRSchedule
from vitpose.engine.telemetry import Telemetry
from vitpose.engine.thermal import ThermalGuard
from vitpose.models.checkpoint import CheckpointError
from vitpose.models.spec import METADATA_KEY, spec_of_model
from vitpose.models.wrappers import unwrap_model

keypoint_mse_loss = KeypointMSELoss(use_target_weight=True)


@dataclass
class TrainState:
    """Where the run is. `batch` counts batches of `epoch` already trained (0 at a boundary)."""

    epoch: int = 0
    batch: int = 0
    iteration: int = 0
    best_ap: float | None = None
    best_epoch: int | None = None
    nonfinite_in_row: int = 0  # survives a resume: a run that keeps diverging stops after N in all
    # The batches of `epoch - 1` are all trained but its end (validation, best.pth, epoch_N.pth)
    # has not run yet: a resume runs it first, so a stop on an epoch's last step skips nothing.
    epoch_end_pending: bool = False


class EpochEnd(enum.Enum):
    """How `train_one_epoch` returned."""

    COMPLETED = "completed"  # every batch of the epoch was trained
    STOPPED = "stopped"  # a signal or train.stop_at_iteration: the caller saves; exits 128 + the signal, or 0
    DIVERGED = "diverged"  # train.max_nonfinite non-finite losses in a row


@dataclass
class RunWatch:
    """What watches a run from outside the step: telemetry (reports, passive), the GPU monitor
    (readings), the thermal guard (may pause this rank) and the stop flag (signals)."""

    telemetry: Telemetry
    gpu: GpuMonitor
    thermal: ThermalGuard
    stop: StopFlag


@dataclass
class TrainRun:
    """What one training run steps: the plain model (checkpoints, clipping), the model the
    batches go through (torch.compile / DDP around the same parameters), the optimizer and its
    schedule, the precision, the process group and the position in the run."""

    model: torch.nn.Module
    train_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    precision: Precision
    ctx: D.DistContext
    state: TrainState
    # A distillation's loss (`vitpose.engine.distill.DistillObjective`): the teacher's targets and
    # the projector it trains; None: the ground-truth heatmap loss alone.
    objective: object | None = None

    @property
    def trained(self) -> torch.nn.Module:
        """What the optimizer steps (and the gradients are clipped over): the model, or a
        distillation's student with its projector."""
        return self.model if self.objective is None else self.objective.trained


# ---------------------------------------------------------------------------------------------
# One iteration


def prepare_batch(batch: dict, device: torch.device, input_size, heatmap_size, sigma: float):
    """(images, target heatmaps, keypoint weights) on `device`.

    When the batch carries keypoints (the loader left encoding to us), the UDP targets are made
    here on the device: one small kernel instead of K Gaussians per sample on the CPU workers.
    """
    batch = to_device(batch, device, normalize=True, non_blocking=device.type == "cuda")
    if "heatmaps" in batch:
        heatmaps, weights = batch["heatmaps"].float(), batch["keypoint_weights"].float()
    else:
        keypoints, visible = batch["keypoints"].float(), batch["keypoints_visible"].float()
        heatmaps, weights = udp_encode_torch(keypoints, visible, tuple(input_size), tuple(heatmap_size), sigma)
    return batch["image"], heatmaps, weights


def forward_backward(model, images, heatmaps, weights, precision: Precision, loss_divisor: int = 1,
                     loss_fn=None, objective=None, iteration: int = 0) -> torch.Tensor:
    """Forward under autocast, loss in fp32, backward (scaled for fp16). Returns the detached loss.

    objective: a distillation's (`DistillObjective.loss(model, images, heatmaps, weights, precision,
    iteration)`: the teacher's targets added to the ground truth's); None: `loss_fn` (the MSE)."""
    if objective is not None:
        loss = objective.loss(model, images, heatmaps, weights, precision, iteration)
    else:
        with precision.autocast():
            pred = model(images)
        loss = (loss_fn or keypoint_mse_loss)(pred.float(), heatmaps, weights)
    scaled = loss / loss_divisor
    if precision.scaler is not None:
        scaled = precision.scaler.scale(scaled)
    scaled.backward()
    return loss.detach()


def optimizer_step(model, optimizer, precision: Precision, clip_grad: float | None, loss_finite: bool):
    """Unscale, clip to global L2 norm `clip_grad`, step. Returns (grad_norm tensor, stepped bool).

    A non-finite loss skips the step. With a GradScaler an overflow in the fp16 gradients is the
    scaler's business (it skips and lowers the scale); without one, non-finite gradients skip too.
    """
    scaler = precision.scaler
    params = [p for p in model.parameters() if p.grad is not None]
    if scaler is not None:
        scaler.unscale_(optimizer)
    # With no clipping, max_norm=inf only measures the norm (the gradients are multiplied by 1).
    max_norm = clip_grad if clip_grad is not None and clip_grad > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    stepped = loss_finite
    if scaler is not None:
        if loss_finite:
            scaler.step(optimizer)  # skips by itself on inf/NaN gradients
        scaler.update()
    elif loss_finite and bool(torch.isfinite(grad_norm)):
        optimizer.step()
    else:
        stepped = False
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, stepped


def is_finite(value: torch.Tensor) -> bool:
    return math.isfinite(float(value))


# ---------------------------------------------------------------------------------------------
# One epoch


def train_one_epoch(run: TrainRun, batches: Iterable[dict], epoch: int, cfg, batches_per_epoch: int,
                    watch: RunWatch, save_last: Callable[[], object]) -> EpochEnd:
    """Train on `batches` (the rest of epoch `epoch`) and advance `run.state`.

    Args:
        run: the run's model, optimizer, schedule, precision, process group and position.
        batches: the epoch's batches from `run.state.batch` on (`Loaders.train(epoch, start)`).
        cfg: the resolved `Config` (model sizes, optim, train sections are read).
        batches_per_epoch: all batches of a full epoch on this rank (the last one ends a step).
        watch: telemetry (one `step` per optimizer step; at its report points a GPU reading is
            reported and the thermal guard checks it), and the stop flag, polled after every
            optimizer step (on all ranks together).
        save_last: writes the resume checkpoint (`last.pth`) on the main process; called for the
            periodic save (`train.checkpoint_minutes`). Stopping saves are the caller's.
    Returns how the epoch ended; `run.state` says where. Once the epoch's last batch is trained
    (also when a stop comes on that step) the state is `epoch + 1, batch 0, epoch_end_pending`.
    """
    state, ctx, world_size = run.state, run.ctx, run.ctx.world_size
    telemetry, stop = watch.telemetry, watch.stop
    accum = cfg.optim.accum_steps
    model_cfg = cfg.model
    last_save = time.monotonic()
    micro, loss_sum, samples, data_time = 0, 0.0, 0, 0.0
    skipped_images = 0  # unreadable images this rank's workers replaced (they log each one)
    t0 = time.perf_counter()
    for batch in batches:
        # ---- micro-batch: targets on the device, forward, backward (no all-reduce until the last)
        data_time += time.perf_counter() - t0
        if "skipped_images" in batch:
            skipped_images += int(batch["skipped_images"].sum())
        images, heatmaps, weights = prepare_batch(batch, ctx.device, model_cfg.input_size,
                                                  model_cfg.heatmap_size, model_cfg.sigma)
        if micro == 0:
            run.schedule.step(state.iteration, epoch)
        last_micro = micro + 1 == accum or state.batch + 1 == batches_per_epoch
        with D.no_sync(run.train_model, enabled=not last_micro):
            loss = forward_backward(run.train_model, images, heatmaps, weights, run.precision, accum,
                                    objective=run.objective, iteration=state.iteration)
        loss_sum = loss_sum + loss
        samples += images.shape[0] * world_size
        state.batch += 1
        micro += 1
        if not last_micro:
            t0 = time.perf_counter()
            continue

        # ---- optimizer step; all ranks agree on a non-finite loss and on a stop request
        loss_mean = loss_sum / micro
        nonfinite, stop_now = D.any_rank([not is_finite(loss_mean), stop.requested], ctx)
        grad_norm, _ = optimizer_step(run.trained, run.optimizer, run.precision, cfg.optim.clip_grad,
                                      loss_finite=not nonfinite)
        report_step(watch, state.iteration, epoch, loss_mean, run.optimizer.param_groups[-1]["lr"], samples,
                    time.perf_counter() - t0, data_time, grad_norm)
        state.iteration += 1
        micro, loss_sum, samples, data_time = 0, 0.0, 0, 0.0

        # ---- non-finite losses: skip the step; too many in a row end the run
        if count_nonfinite(state, nonfinite, epoch, telemetry) >= cfg.train.max_nonfinite:
            return EpochEnd.DIVERGED

        # ---- a stop request, or the configured last iteration
        stop_at = cfg.train.stop_at_iteration
        if stop_now or (stop_at is not None and state.iteration >= stop_at):
            if state.batch == batches_per_epoch:  # stopped on the epoch's last step
                state.epoch, state.batch, state.epoch_end_pending = epoch + 1, 0, True
            return EpochEnd.STOPPED

        # ---- the periodic resume point
        if cfg.train.checkpoint_minutes > 0 and time.monotonic() - last_save > 60 * cfg.train.checkpoint_minutes:
            save_last()
            last_save = time.monotonic()
        t0 = time.perf_counter()

    if skipped_images:
        telemetry.message(f"epoch {epoch}: {skipped_images} unreadable training image(s) skipped on this process "
                          f"and replaced by other instances (data.max_bad_images={cfg.data.max_bad_images} per "
                          f"worker); the files are named in the warnings above")
    state.epoch, state.batch, state.epoch_end_pending = epoch + 1, 0, True
    return EpochEnd.COMPLETED


def report_step(watch: RunWatch, iteration: int, epoch: int, loss, lr: float, samples: int, seconds: float,
                data_time: float, grad_norm) -> None:
    """One optimizer step to telemetry; at its report points also a GPU reading, which the thermal
    guard checks (every rank, its own GPU; it pauses while the GPU is too hot)."""
    if watch.telemetry.step(iteration, epoch, loss, lr, samples, seconds, data_time, extra={"grad_norm": grad_norm}):
        reading = watch.gpu.read()  # {} on CPU
        watch.telemetry.report(reading)
        watch.thermal.check(reading)


def count_nonfinite(state: TrainState, nonfinite: bool, epoch: int, telemetry: Telemetry) -> int:
    """The non-finite losses in a row after this step (whose update was skipped when non-finite)."""
    if not nonfinite:
        state.nonfinite_in_row = 0
        return 0
    state.nonfinite_in_row += 1
    telemetry.message(f"non-finite loss at iteration {state.iteration - 1} (epoch {epoch}, "
                      f"batch {state.batch - 1}): step skipped ({state.nonfinite_in_row} in a row)")
    return state.nonfinite_in_row


# ---------------------------------------------------------------------------------------------
# Checkpoint payload and restore


def checkpoint_payload(model, optimizer, schedule, precision: Precision, state: TrainState,
                       config: dict) -> dict:
    """Everything a resume needs, as tensors and plain values (see vitpose/engine/checkpoint.py).

    The position fields of `TrainState` (epoch, batch, iteration, best_ap, best_epoch,
    nonfinite_in_row) are stored once, at the top level.
    """
    return {
        "model": model_state_dict(model),
        "optimizer": optimizer.state_dict(),
        "scheduler": schedule.state_dict(),
        "scaler": precision.scaler.state_dict() if precision.scaler is not None else None,
        **{f.name: getattr(state, f.name) for f in fields(TrainState)},
        "rng": rng_state(),
        "config": config,
        METADATA_KEY: spec_of_model(model).to_dict(),  # what the file is: loaders rebuild it from this
    }


def check_same_model(checkpoint: dict, model: torch.nn.Module, source) -> None:
    """CheckpointError (one line) unless the checkpoint's weights have this model's names and shapes."""
    saved = checkpoint["model"]
    own = model.state_dict()
    differ = [k for k in own if k in saved and tuple(saved[k].shape) != tuple(own[k].shape)]
    missing = [k for k in own if k not in saved]
    extra = [k for k in saved if k not in own]
    if not (differ or missing or extra):
        return
    old = (checkpoint.get("config") or {}).get("model") or {}
    what = f"{old.get('name', '?')}-{old.get('decoder', '?')}, {old.get('num_keypoints', '?')} keypoints"
    example = (f"e.g. {differ[0]} is {tuple(saved[differ[0]].shape)} there, {tuple(own[differ[0]].shape)} here"
               if differ else f"e.g. {(missing or extra)[0]} is only {'here' if missing else 'there'}")
    raise CheckpointError(f"{source} holds another model ({what}) than this config builds: {len(differ)} tensors "
                          f"differ in shape, {len(missing)} missing, {len(extra)} unexpected ({example}). "
                          f"Resume with the config it was trained with, or start a new --work-dir")


def restore_checkpoint(checkpoint: dict, model, optimizer, precision: Precision,
                       restore_rng: bool = True, source="the checkpoint") -> TrainState:
    """Load everything a checkpoint holds back into the run; returns the run's position.

    The optimizer groups keep the base LRs of the config in force (a resumed run may change
    the LR on purpose); their moments and step counts come from the checkpoint. A checkpoint of
    another model (size, decoder, keypoints) raises CheckpointError in one line, before anything
    of the run is changed.
    """
    check_same_model(checkpoint, unwrap_model(model), source)
    unwrap_model(model).load_state_dict(checkpoint["model"])
    base_lrs = [g[BASE_LR_KEY] for g in optimizer.param_groups]
    optimizer.load_state_dict(checkpoint["optimizer"])
    for group, lr in zip(optimizer.param_groups, base_lrs):
        group[BASE_LR_KEY] = lr
    if precision.scaler is not None and checkpoint.get("scaler"):
        precision.scaler.load_state_dict(checkpoint["scaler"])
    if restore_rng and checkpoint.get("rng") is not None:
        set_rng_state(checkpoint["rng"])
    defaults = TrainState()
    return TrainState(**{f.name: checkpoint.get(f.name, getattr(defaults, f.name)) for f in fields(TrainState)})
