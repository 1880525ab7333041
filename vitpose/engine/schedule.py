"""The ViTPose learning-rate schedule: linear warmup by iteration times a step decay by epoch.

MMPose composes two schedulers multiplicatively:
`LinearLR(start_factor=0.001, begin=0, end=500, by_epoch=False)` and
`MultiStepLR(milestones=[170, 200], gamma=0.1, by_epoch=True)` (docs/recipe.md §3). Here both are one
closed-form function of (iteration, epoch), so the schedule has no state of its own: resuming
only needs the iteration and epoch counters, which the checkpoint holds.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import torch

# The key under which each optimizer group keeps its un-scheduled learning rate (the layer-decayed
# base LR from `param_groups`, after any linear batch-size scaling). The same name that
# torch.optim.lr_scheduler uses, so the optimizer state dict stays familiar.
BASE_LR_KEY = "initial_lr"


def warmup_factor(iteration: int, warmup_iters: int = 500, warmup_ratio: float = 0.001) -> float:
    """Linear warmup as MMPose 1.x runs it: `r + (1 - r) * t / (T - 1)` for 0-based iteration
    t < T - 1, then 1 (T = warmup_iters).

    MMPose's `LinearLR(start_factor=r, begin=0, end=T, by_epoch=False)` (mmengine) starts at r and
    is stepped after each iteration while the step count is below `end`, so the ramp spans
    end - begin - 1 = T - 1 steps: for T = 500, `r + (1 - r) * t / 499` and 1 from t = 499. The
    original ViTPose release (mmcv's `warmup='linear'`) ramped over T (t / 500); this project
    follows MMPose 1.x (docs/mmpose-edge-cases.md §7). T <= 1 means no warmup (mmengine would
    keep the LR at r for good with end = 1, and refuses end = 0).
    """
    ramp = warmup_iters - 1
    if ramp <= 0 or iteration >= ramp:
        return 1.0
    return warmup_ratio + (1.0 - warmup_ratio) * iteration / ramp


def step_factor(epoch: int, milestones: Sequence[int] = (170, 200), gamma: float = 0.1) -> float:
    """Step decay: `gamma ** (number of milestones <= epoch)` for the 0-BASED epoch index.

    Convention (MMPose's MultiStepLR by epoch, stepped at the end of each epoch): with milestones
    (170, 200), 0-based epochs 0..169 (the 1st to 170th epoch) train at full LR, 0-based 170..199
    (the 171st to 200th) at x0.1 and 200..209 (the 201st to 210th) at x0.01.
    """
    return gamma ** bisect_right(sorted(milestones), epoch)


def lr_factor(
    iteration: int,
    epoch: int,
    warmup_iters: int = 500,
    warmup_ratio: float = 0.001,
    milestones: Sequence[int] = (170, 200),
    gamma: float = 0.1,
) -> float:
    """The multiplier on every group's base LR at global 0-based `iteration` in 0-based `epoch`."""
    return warmup_factor(iteration, warmup_iters, warmup_ratio) * step_factor(epoch, milestones, gamma)


class LRSchedule:
    """Sets `group["lr"] = group[BASE_LR_KEY] * lr_factor(iteration, epoch)` for every group.

    The optimizer groups carry their own base LR (layer decay), so one factor serves them all.
    There is nothing to load on resume: the factor is a function of (iteration, epoch), the base
    LRs come back with the optimizer state, and the config in force decides the schedule.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_iters: int = 500,
        warmup_ratio: float = 0.001,
        milestones: Sequence[int] = (170, 200),
        gamma: float = 0.1,
    ):
        self.optimizer = optimizer
        self.warmup_iters = warmup_iters
        self.warmup_ratio = warmup_ratio
        self.milestones = tuple(milestones)
        self.gamma = gamma
        for group in optimizer.param_groups:
            group.setdefault(BASE_LR_KEY, group["lr"])

    @classmethod
    def from_config(cls, optimizer, schedule_cfg) -> LRSchedule:
        return cls(
            optimizer,
            warmup_iters=schedule_cfg.warmup_iters,
            warmup_ratio=schedule_cfg.warmup_ratio,
            milestones=schedule_cfg.milestones,
            gamma=schedule_cfg.gamma,
        )

    def factor(self, iteration: int, epoch: int) -> float:
        return lr_factor(iteration, epoch, self.warmup_iters, self.warmup_ratio, self.milestones, self.gamma)

    def step(self, iteration: int, epoch: int) -> float:
        """Set every group's LR for the optimizer step at `iteration`; returns the factor."""
        factor = self.factor(iteration, epoch)
        for group in self.optimizer.param_groups:
            group["lr"] = group[BASE_LR_KEY] * factor
        return factor

    def state_dict(self) -> dict:
        # The schedule is a pure function of the counters; its settings are saved so that a
        # resume with a changed schedule is visible in the checkpoint.
        return {
            "warmup_iters": self.warmup_iters,
            "warmup_ratio": self.warmup_ratio,
            "milestones": list(self.milestones),
            "gamma": self.gamma,
        }
