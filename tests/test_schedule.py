"""The LR schedule: linear warmup by iteration x step decay by epoch, per layer-decayed group."""

from pathlib import Path

import numpy as np
import pytest
import torch

from vitpose.engine.schedule import BASE_LR_KEY, LRSchedule, lr_factor, step_factor, warmup_factor

ITERS_PER_EPOCH = 293  # ceil(149813 / 512): COCO train at batch 512


def optimizer_with_layer_decay(base=5e-4, rate=0.8, layers=4):
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(layers)]
    groups = [{"params": [p], "lr": base * rate ** (layers - 1 - i)} for i, p in enumerate(params)]
    return torch.optim.AdamW(groups, lr=base)


def first_iteration_of(epoch_1based):
    return (epoch_1based - 1) * ITERS_PER_EPOCH


def expected_factor(iteration, epoch_1based):
    # docs/recipe.md §3 written out (MMPose 1.x, see docs/mmpose-edge-cases.md): warmup 0.001 -> 1
    # over 500 - 1 = 499 iterations (mmengine's LinearLR(begin=0, end=500)); epochs 1-170 x1,
    # 171-200 x0.1, 201-210 x0.01.
    warm = 0.001 + 0.999 * iteration / 499 if iteration < 499 else 1.0
    decay = 1.0 if epoch_1based <= 170 else 0.1 if epoch_1based <= 200 else 0.01
    return warm * decay


@pytest.mark.parametrize("iteration", [0, 1, 250, 498, 499, 500])
def test_warmup_iterations(iteration):
    assert warmup_factor(iteration) == pytest.approx(expected_factor(iteration, 1), rel=1e-12)


@pytest.fixture(scope="module")
def mmengine_warmup():
    """tests/fixtures/numeric_cases.npz (tools/reference/make_numeric_cases.py): the LR factor that
    mmengine's LinearLR(start_factor=0.001, begin=0, end=T, by_epoch=False) gives at iteration t,
    stepped after every iteration as MMPose does; index t of `warmup/end_T`."""
    with np.load(Path(__file__).parent / "fixtures" / "numeric_cases.npz") as data:
        return {int(k.rsplit("_", 1)[1]): data[k] for k in data.files if k.startswith("warmup/end_")}


def test_warmup_equals_mmengine_linear_lr(mmengine_warmup):
    assert sorted(mmengine_warmup) == [2, 4, 50, 500]
    for end, factors in mmengine_warmup.items():
        for t, factor in enumerate(factors):
            # mmengine multiplies step by step; the closed form agrees to rounding.
            assert warmup_factor(t, end, 0.001) == pytest.approx(factor, rel=1e-12, abs=0), (end, t)
    at = mmengine_warmup[500]
    # The ramp ends one iteration before `end`: MMPose 1.x's end - begin - 1 = 499 steps, where
    # the original mmcv release's t / 500 would still be below 1 at t = 499.
    assert at[0] == pytest.approx(0.001, rel=1e-12)
    assert at[250] == pytest.approx(0.001 + 0.999 * 250 / 499, rel=1e-12)
    assert at[498] == pytest.approx(0.001 + 0.999 * 498 / 499, rel=1e-12)
    assert at[499] == pytest.approx(1.0, rel=1e-12) and at[500] == at[499]
    assert abs(at[250] - (0.001 + 0.999 * 250 / 500)) > 1e-4


def test_no_warmup_below_two_iterations():
    for warmup_iters in (0, 1):
        assert warmup_factor(0, warmup_iters) == warmup_factor(7, warmup_iters) == 1.0


@pytest.mark.parametrize("epoch_1based", [1, 170, 171, 200, 201, 210])
def test_step_decay_epochs(epoch_1based):
    # Convention: functions take the 0-BASED epoch index (MMPose's MultiStepLR stepped at epoch end).
    it = first_iteration_of(epoch_1based)
    assert lr_factor(it, epoch_1based - 1) == pytest.approx(expected_factor(it, epoch_1based), rel=1e-12)
    assert step_factor(epoch_1based - 1) == pytest.approx(expected_factor(10**6, epoch_1based), rel=1e-12)


def test_every_group_keeps_its_layer_scale():
    opt = optimizer_with_layer_decay()
    base = [g["lr"] for g in opt.param_groups]
    sched = LRSchedule(opt)
    points = [(0, 1), (1, 1), (250, 1), (499, 1), (500, 1)]
    points += [(first_iteration_of(e), e) for e in (170, 171, 200, 201)]
    for it, e in points:
        sched.step(it, e - 1)
        for g, b in zip(opt.param_groups, base):
            assert g[BASE_LR_KEY] == b
            assert g["lr"] == pytest.approx(b * expected_factor(it, e), rel=1e-12)


def test_matches_torch_linear_and_multistep_chained():
    """Independent reference: torch's LinearLR stepped per iteration and MultiStepLR per epoch on
    one optimizer (they chain multiplicatively, as MMPose's two schedulers do)."""
    ipe, epochs = 37, 12
    ref_opt = optimizer_with_layer_decay(base=1e-3, rate=0.75, layers=3)
    # torch's LinearLR ramps over total_iters steps; MMPose's end = 50 is total_iters = 49.
    warm = torch.optim.lr_scheduler.LinearLR(ref_opt, start_factor=0.01, end_factor=1.0, total_iters=49)
    decay = torch.optim.lr_scheduler.MultiStepLR(ref_opt, milestones=[8, 10], gamma=0.5)
    opt = optimizer_with_layer_decay(base=1e-3, rate=0.75, layers=3)
    ours = LRSchedule(opt, warmup_iters=50, warmup_ratio=0.01, milestones=(8, 10), gamma=0.5)
    it = 0
    for epoch in range(epochs):
        for _ in range(ipe):
            ours.step(it, epoch)
            for g_ref, g in zip(ref_opt.param_groups, opt.param_groups):
                assert g["lr"] == pytest.approx(g_ref["lr"], rel=1e-9), (it, epoch)
            ref_opt.step()
            warm.step()
            it += 1
        decay.step()


def test_resumed_optimizer_keeps_config_base_lr():
    # The schedule has no state: a fresh schedule at (iteration, epoch) gives the same LR.
    opt_a, opt_b = optimizer_with_layer_decay(), optimizer_with_layer_decay()
    a, b = LRSchedule(opt_a), LRSchedule(opt_b)
    for it in range(600):
        a.step(it, 0)
    b.step(599, 0)
    assert [g["lr"] for g in opt_a.param_groups] == [g["lr"] for g in opt_b.param_groups]
