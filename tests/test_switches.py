"""Switches that change numbers only a little, each pinned by a test that fails when it is ignored.

A switch that is silently ignored leaves a run that still trains, predicts and scores: the usual
end-to-end tests pass. Each test here sets up a case where the switch's effect is known exactly
(analytically, or against the path with the switch the other way) and large enough to see:
drop-path's rescale, gradient clipping (a known gradient, and the configured clip in a real run),
the periodic save (on a fake clock), --amp, val_every and keep_every in a tiny in-process run,
evaluate.py's --no-flip-test, autocast at inference, and the tracker's velocity over a gap.
"""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_evaluate import TINY, load_cli, tiny_model, write_config
from test_train_resume import tiny_args

import vitpose
from vitpose.codecs.udp import UDPHeatmap
from vitpose.data.coco import CocoKeypoints
from vitpose.engine import trainer
from vitpose.engine.evaluate import predict
from vitpose.engine.precision import Precision
from vitpose.evaluation.coco_evaluator import load_predictions
from vitpose.inference.predictor import Predictor
from vitpose.inference.tracking import Tracker
from vitpose.models.vit import DropPath

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


# ---- drop path -----------------------------------------------------------------------------------

def test_drop_path_zeroes_whole_samples_and_rescales_the_survivors():
    """Each sample is kept with p = 1 - drop_prob and then divided by p, so E[out] = x."""
    torch.manual_seed(0)
    n, drop = 20000, 0.3
    x = torch.rand(n, 5, 3) + 0.5
    out = DropPath(drop).train()(x)
    kept = out.flatten(1).ne(0).all(1)
    assert torch.equal(out[~kept], torch.zeros_like(out[~kept]))  # dropped: the whole sample
    np.testing.assert_allclose(out[kept].numpy(), (x[kept] / (1 - drop)).numpy(), rtol=1e-6)
    # The kept fraction is Binomial(n, 0.7) / n: within 5 sigma (sigma = 0.0032).
    sigma = math.sqrt(drop * (1 - drop) / n)
    assert abs(kept.float().mean().item() - (1 - drop)) < 5 * sigma
    # The expectation: sum(out) / sum(x) = sum_i m_i s_i / (p sum_i s_i) with s_i a sample's sum and
    # m_i ~ Bernoulli(p): mean 1, standard deviation sqrt((1 - p) / p * sum s_i^2) / sum s_i.
    sample_sums = x.flatten(1).sum(1).double()
    spread = math.sqrt(drop / (1 - drop) * sample_sums.square().sum().item()) / sample_sums.sum().item()
    ratio = (out.sum() / x.sum()).item()
    assert abs(ratio - 1) < 5 * spread, (ratio, spread)  # without the rescale: 0.7
    assert torch.equal(DropPath(drop).eval()(x), x)  # identity at inference


# ---- gradient clipping ---------------------------------------------------------------------------

def test_optimizer_step_clips_a_known_gradient_to_max_norm():
    """Gradient (3, 4) has norm 5: clipped to norm 1 it is (0.6, 0.8); SGD lr=1 steps by exactly that."""
    for clip, expected_step in ((1.0, [0.6, 0.8]), (None, [3.0, 4.0]), (10.0, [3.0, 4.0])):
        weight = torch.nn.Parameter(torch.zeros(2))
        model = torch.nn.Module()
        model.weight = weight
        optimizer = torch.optim.SGD([weight], lr=1.0)
        weight.grad = torch.tensor([3.0, 4.0])
        grad_norm, stepped = trainer.optimizer_step(model, optimizer, Precision("cpu", None, None), clip, True)
        assert stepped and grad_norm.item() == pytest.approx(5.0)  # the norm before clipping
        np.testing.assert_allclose(-weight.detach().numpy(), expected_step, rtol=1e-6)


# ---- a tiny in-process run: the configured clip reaches clipping, the periodic save fires -------

@pytest.fixture(scope="module")
def spied_run(tmp_path_factory):
    """3 epochs of 3 steps with optim.clip_grad=0.5, train.checkpoint_minutes=1 on a fake clock
    that advances 40 s per optimizer step, val_every=2, keep_every=2 and --amp --amp-dtype bfloat16.
    Records every max_norm given to clip_grad_norm_, the iteration at every periodic save and the
    dtype of the first Linear's output in every training forward; returns them and the work dir."""
    import train

    tmp = tmp_path_factory.mktemp("spied")
    clock = [0.0]
    max_norms, saves, dtypes = [], [], []

    class FakeTime:  # the trainer's `time`: monotonic() is the fake clock, the rest is real
        def __getattr__(self, name):
            return getattr(__import__("time"), name)

        @staticmethod
        def monotonic():
            return clock[0]

    real_clip, real_step, real_epoch, real_forward = (torch.nn.utils.clip_grad_norm_, trainer.optimizer_step,
                                                      trainer.train_one_epoch, trainer.forward_backward)

    def clip(params, max_norm, *args, **kwargs):
        max_norms.append(max_norm)
        return real_clip(params, max_norm, *args, **kwargs)

    def step(*args, **kwargs):
        clock[0] += 40.0  # each optimizer step takes 40 s of the fake clock
        return real_step(*args, **kwargs)

    def forward(model, *args, **kwargs):
        first_linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        hook = first_linear.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
        try:
            return real_forward(model, *args, **kwargs)
        finally:
            hook.remove()

    def epoch(run, batches, epoch_index, cfg, batches_per_epoch, watch, save_last):
        def periodic_save():
            saves.append(run.state.iteration)
            return save_last()
        return real_epoch(run, batches, epoch_index, cfg, batches_per_epoch, watch, periodic_save)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.utils, "clip_grad_norm_", clip)
        mp.setattr(trainer, "optimizer_step", step)
        mp.setattr(trainer, "train_one_epoch", epoch)
        mp.setattr(trainer, "forward_backward", forward)
        mp.setattr(trainer, "time", FakeTime())
        args = tiny_args(tmp / "data", tmp / "work", "--workers", "0", "--epochs", "3", "--amp",
                         "--amp-dtype", "bfloat16", "--set", "optim.clip_grad=0.5",
                         "--set", "train.checkpoint_minutes=1", "--set", "train.val_every=2",
                         "--set", "train.keep_every=2")
        assert train.main(args) == 0
    return max_norms, saves, dtypes, tmp / "work"


def test_the_configured_clip_reaches_gradient_clipping(spied_run):
    max_norms = spied_run[0]
    assert max_norms == [0.5] * 9  # every optimizer step, the configured optim.clip_grad


def test_the_periodic_save_fires_on_its_interval(spied_run):
    # Saved when more than 60 s passed since the epoch started or the last save: with 40 s per
    # step, after the 2nd step of each epoch (80 s), not after the 3rd (40 s since that save).
    saves = spied_run[1]
    assert saves == [2, 5, 8]


def test_amp_trains_in_bfloat16(spied_run):
    dtypes = spied_run[2]
    assert dtypes == [torch.bfloat16] * 9  # --amp --amp-dtype bfloat16: every training forward


def test_val_every_and_keep_every(spied_run):
    """val_every=2 of 3 epochs: validation after epoch 2 and after the last; keep_every=2: epoch_2.pth."""
    work = spied_run[3]
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["epoch"] for r in records if r.get("kind") == "eval"] == [1, 2]  # 0-based epochs
    assert sorted(p.name for p in work.glob("*.pth")) == ["best.pth", "epoch_2.pth", "last.pth"]


# ---- evaluate.py --no-flip-test ------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.safetensors"
    vitpose.save_weights(tiny_model(seed=3), path)
    return path


def test_evaluate_no_flip_test_gives_the_plain_forward(tmp_path, coco_mini_dir, tiny_weights, capsys):
    """--no-flip-test: the predictions are the model's on the crops alone (docs/evaluation.md), not
    the flip-averaged ones that the default gives."""
    cli = load_cli()
    cfg = write_config(tmp_path, coco_mini_dir)
    model = vitpose.build_model("vitpose-s", **TINY)
    vitpose.load_weights(model, tiny_weights)
    dataset = CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16)  # the config's val_batch_size
    for flag, flip in (["--no-flip-test"], False), ([], True):
        out = tmp_path / f"preds{flip}.json"
        cli.main(["--config", str(cfg), "--checkpoint", str(tiny_weights), "--workers", "0", "--gt-boxes",
                  "--out", str(out), *flag])
        assert f"flip test {'on' if flip else 'off'}" in capsys.readouterr().out
        got = np.stack([p["keypoints"] for p in load_predictions(out)])
        want = np.stack([p["keypoints"] for p in predict(model, loader, UDPHeatmap(), flip_test=flip)])
        other = np.stack([p["keypoints"] for p in predict(model, loader, UDPHeatmap(), flip_test=not flip)])
        np.testing.assert_allclose(got, want, atol=1e-3)  # same batches; 1e-3 px as test_evaluate
        assert np.abs(got - other).max() > 0.5  # the flip test moves this model's keypoints by pixels


# ---- autocast at inference -----------------------------------------------------------------------

@pytest.mark.parametrize("amp_dtype", [None, torch.bfloat16])
def test_predictor_runs_the_model_in_the_autocast_dtype_it_was_given(amp_dtype):
    """The dtype of the first attention projection's output says what the matmuls ran in."""
    model = tiny_model(seed=2)
    seen = []
    model.backbone.blocks[0].attn.qkv.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    predictor = Predictor(model, device="cpu", amp_dtype=amp_dtype, flip_test=False)
    image = np.random.default_rng(0).integers(0, 256, (120, 90, 3), dtype=np.uint8)
    keypoints, scores = predictor.predict(image, [[5, 5, 80, 110]])
    assert seen == [amp_dtype or torch.float32]
    assert keypoints.dtype == np.float64 and scores.dtype == np.float32  # outputs stay full precision


# ---- the tracker over a gap ----------------------------------------------------------------------

def test_a_track_is_moved_by_its_velocity_times_the_gap():
    """A box moving 15 px per frame, missing for 3 frames: predicted at 4 x its velocity it overlaps
    (same id); at 1 x (45 px short on a 40 px wide box) it would not overlap at all (a new id)."""
    tracker = Tracker(max_age=5, min_similarity=0.3, metric="iou")
    ids = [tracker.update([[15.0 * f, 50, 15.0 * f + 40, 150]], frame=f)[0] for f in range(6)]
    after_gap = tracker.update([[15.0 * 9, 50, 15.0 * 9 + 40, 150]], frame=9)[0]
    assert ids == [0] * 6 and after_gap == 0
