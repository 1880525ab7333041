"""benchmarks/bench_gemm_bound.py's recorder: it must see every matrix product of a ViTPose pass
once, with the MACs the architecture implies, and replay what the pass computed.

The bound the benchmark prints (issue #20) is only as good as this: a product it missed would be
counted as "the rest" and make the bound look larger, one counted twice smaller.
"""

import sys
from pathlib import Path

import pytest
import torch

import vitpose

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_gemm_bound import record_products, replay  # noqa: E402


def analytic_macs(n, embed_dim, depth, num_keypoints=17, grid=(16, 12), deconv=256):
    """MACs of a ViTPose classic pass on n 256x192 crops, from the architecture (docs/model.md)."""
    tokens = grid[0] * grid[1]
    patch = tokens * embed_dim * 3 * 16 * 16
    # qkv (3C) + proj (C) + fc1 (4C) + fc2 (4C): 12 C^2 per token; q k^T and attn @ v: 2 tokens^2 C
    blocks = depth * (12 * tokens * embed_dim**2 + 2 * tokens**2 * embed_dim)
    # Transposed 4x4 convolutions: every input position meets every weight once.
    head = tokens * embed_dim * deconv * 16 + 4 * tokens * deconv * deconv * 16 + 16 * tokens * deconv * num_keypoints
    return n * (patch + blocks + head)


@pytest.mark.parametrize("context", [torch.inference_mode, torch.no_grad])
def test_recorder_counts_every_product_once(context):
    torch.manual_seed(0)
    model = vitpose.build_model("vitpose-s").eval()
    x = torch.randn(2, 3, 256, 192)
    with context():
        recorder = record_products(model, x)
    # Under no_grad linear reaches the dispatch mode as t + addmm; under inference_mode as linear:
    # the same MACs either way, so nothing is missed or counted twice.
    assert recorder.macs == analytic_macs(2, embed_dim=384, depth=12)
    # 12 blocks x 4 linears + the final 1x1 (a matmul), 12 attention cores, 1 patch conv, 2 deconvs
    assert sum(recorder.counts.values()) == 48 + 1 + 12 + 1 + 2


def test_replay_runs_the_recorded_inputs_not_later_in_place_changes():
    torch.manual_seed(0)
    weight = torch.randn(3, 4)
    x = torch.randn(5, 4)
    expected = x @ weight.t()

    def step():
        y = torch.nn.functional.linear(x, weight)
        x.add_(1.0)  # the pass changes the product's input afterwards
        return y

    with torch.inference_mode():
        recorder = record_products(lambda _: step(), None)
        ((func, args, kwargs),) = recorder.calls.values()
        replayed = func(*args, **kwargs)
        replay(recorder)  # runs every recorded call without error
    torch.testing.assert_close(replayed, expected, rtol=0, atol=0)
    assert recorder.macs == 5 * 4 * 3
