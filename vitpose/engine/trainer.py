"""The pieces of one training iteration and of the run's resumable state.

`train.py` reads top to bottom and calls these: `prepare_batch` (uint8 crops -> normalised
float on the device, heatmap targets encoded on the device), `forward_backward` (autocast
forward, fp32 loss, scaled backward), `optimizer_step` (unscale, clip, step, with non-finite
handling), and `TrainState` / `checkpoint_payload` / `restore_checkpoint` for exact resume.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from vitpose.codecs.udp_torch import udp_encode_torch
from vitpose.data.loaders import to_device
from vitpose.engine.checkpoint import model_state_dict, rng_state, set_rng_state
from vitpose.engine.distributed import unwrap
from vitpose.engine.losses import KeypointMSELoss
from vitpose.engine.precision import Precision
from vitpose.engine.schedule import BASE_LR_KEY

keypoint_mse_loss = KeypointMSELoss(use_target_weight=True)


@dataclass
class TrainState:
    """Where the run is. `batch` counts batches of `epoch` already trained (0 at a boundary)."""

    epoch: int = 0
    batch: int = 0
    iteration: int = 0
    best_ap: float | None = None
    best_epoch: int | None = None
    nonfinite_in_row: int = 0


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
                     loss_fn=None) -> torch.Tensor:
    """Forward under autocast, loss in fp32, backward (scaled for fp16). Returns the detached loss."""
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
# Checkpoint payload and restore


def checkpoint_payload(model, optimizer, schedule, precision: Precision, state: TrainState,
                       config: dict) -> dict:
    return {
        "model": model_state_dict(model),
        "optimizer": optimizer.state_dict(),
        "scheduler": schedule.state_dict(),
        "scaler": precision.scaler.state_dict() if precision.scaler is not None else None,
        "epoch": state.epoch,
        "batch": state.batch,
        "iteration": state.iteration,
        "best_ap": state.best_ap,
        "best_epoch": state.best_epoch,
        "rng": rng_state(),
        "config": config,
        "train_state": asdict(state),
    }


def restore_checkpoint(checkpoint: dict, model, optimizer, precision: Precision,
                       restore_rng: bool = True) -> TrainState:
    """Load everything a checkpoint holds back into the run; returns the run's position.

    The optimizer groups keep the base LRs of the config in force (a resumed run may change
    the LR on purpose); their moments and step counts come from the checkpoint.
    """
    unwrap(model).load_state_dict(checkpoint["model"])
    base_lrs = [g[BASE_LR_KEY] for g in optimizer.param_groups]
    optimizer.load_state_dict(checkpoint["optimizer"])
    for group, lr in zip(optimizer.param_groups, base_lrs):
        group[BASE_LR_KEY] = lr
    if precision.scaler is not None and checkpoint.get("scaler"):
        precision.scaler.load_state_dict(checkpoint["scaler"])
    if restore_rng and checkpoint.get("rng") is not None:
        set_rng_state(checkpoint["rng"])
    return TrainState(
        epoch=int(checkpoint["epoch"]),
        batch=int(checkpoint["batch"]),
        iteration=int(checkpoint["iteration"]),
        best_ap=checkpoint.get("best_ap"),
        best_epoch=checkpoint.get("best_epoch"),
    )
