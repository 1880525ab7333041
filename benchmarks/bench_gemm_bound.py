"""How much of an fp32 CPU forward pass is matrix products, and so the most any faster code for
the rest could gain.

    python benchmarks/bench_gemm_bound.py [--model vitpose-s] [--batch 16] [--rounds 7] [--threads 2]

Why: the aim is >= 1.2x the faster peer at fp32. MMPose runs the same matrix products as
this project (same torch, same shapes: the linears, the attention core, the patch and deconv
convolutions), so whatever separates the two must come from the rest of the pass (GELU,
LayerNorm, softmax outside the fused kernel, copies, adds, BN, ReLU) or from fewer products.
This measures the rest's share: if it were free, the forward would take only its products' time.

Protocol: one forward pass runs under a TorchDispatchMode that records every aten matrix-product
op (linear, addmm / mm / bmm, convolutions, attention) with its inputs, cloned
with their strides, and counts multiply-accumulates (MACs) from the shapes. The "products" contestant then
replays exactly those ops, each distinct call as many times as the pass made it, on the
recorded inputs (the same kernels as the pass picks); the "forward" contestant runs the whole
model. Both warm up until steady, then `--rounds` alternating rounds (benchmarks/rounds.py). The
allocator is tuned as `vitpose predict` tunes it on a CPU. Printed: seconds per pass, MAC rates,
the products' share of the forward and its inverse (the bound), per round as median [min-max].

The replay is a lower bound on the products' own time within the pass (no other op evicts their
inputs from cache between calls), so the bound it gives is generous to "the rest".
"""

import argparse
import statistics
import sys
from collections import Counter
from math import prod
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rounds import alternate, load_note, ratios, spread, warm_up  # noqa: E402

aten = torch.ops.aten


def _gemm_macs(a, b):
    # (..., M, K) @ (..., K, N): batch x M x K x N
    return prod(a.shape[:-1]) * a.shape[-1] * b.shape[-1]


def _conv_macs(x, w, transposed, groups, out_shape):
    # Each output (forward conv) or input (transposed conv) position meets every weight of its group once.
    positions = prod(x.shape[2:]) if transposed else prod(out_shape[2:])
    return x.shape[0] * positions * w.numel() // groups


def _attention_macs(q, k):
    # q @ k^T and softmax(.) @ v: 2 x batch x heads x L x S x head_dim (equal head dims for q, k, v)
    return 2 * prod(q.shape[:-1]) * k.shape[-2] * q.shape[-1]


# aten op -> MACs from (args, output). Everything else in the pass is "the rest". A Python
# dispatch mode sees an op before its decomposition (under inference_mode: linear, conv2d,
# scaled_dot_product_attention), and the ops it runs inside are not seen again, so nothing is
# counted twice; the lower-level forms are here for passes that reach them directly.
PRODUCT_OPS = {
    aten.linear.default: lambda a, out: _gemm_macs(a[0], a[1].t()),
    aten.conv2d.default: lambda a, out: _conv_macs(a[0], a[1], False, a[6] if len(a) > 6 else 1, out.shape),
    aten.conv_transpose2d.input: lambda a, out: _conv_macs(a[0], a[1], True, a[6] if len(a) > 6 else 1, out.shape),
    aten.scaled_dot_product_attention.default: lambda a, out: _attention_macs(a[0], a[1]),
    aten.addmm.default: lambda a, out: _gemm_macs(a[1], a[2]),
    aten.mm.default: lambda a, out: _gemm_macs(a[0], a[1]),
    aten.bmm.default: lambda a, out: _gemm_macs(a[0], a[1]),
    aten.baddbmm.default: lambda a, out: _gemm_macs(a[1], a[2]),
    aten.convolution.default: lambda a, out: _conv_macs(a[0], a[1], a[6], a[8], out.shape),
    aten._scaled_dot_product_flash_attention_for_cpu.default: lambda a, out: _attention_macs(a[0], a[1]),
    aten._scaled_dot_product_attention_math.default: lambda a, out: _attention_macs(a[0], a[1]),
}


def _signature(value):
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), value.stride(), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    return value


def _keep(value):
    # A copy with the same strides: later in-place ops of the pass must not change what is replayed.
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype).copy_(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_keep(v) for v in value)
    return value


class ProductRecorder(TorchDispatchMode):
    """Records the matrix-product calls of whatever runs inside it: distinct calls with their
    inputs, how often each ran, and the MACs of all of them."""

    def __init__(self):
        super().__init__()
        self.calls = {}  # signature -> (op, args, kwargs)
        self.counts = Counter()
        self.macs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in PRODUCT_OPS:
            first = out[0] if isinstance(out, (list, tuple)) else out
            self.macs += PRODUCT_OPS[func](args, first)
            key = (func, _signature(args), _signature(tuple(sorted(kwargs.items()))))
            if key not in self.calls:
                self.calls[key] = (func, _keep(args), dict(kwargs))
            self.counts[key] += 1
        return out


def record_products(model, x):
    """One forward pass of `model` on `x` under the recorder (call inside inference_mode)."""
    recorder = ProductRecorder()
    with recorder:
        model(x)
    return recorder


def replay(recorder):
    """Every recorded matrix product, as often as the pass ran it."""
    for key, (func, args, kwargs) in recorder.calls.items():
        for _ in range(recorder.counts[key]):
            func(*args, **kwargs)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vitpose-s")
    p.add_argument("--decoder", default="classic", choices=["classic", "simple"])
    p.add_argument("--batch", type=int, default=16, help="crops per pass (16 = the CPU default: 8 boxes with the flip test)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    from vitpose.device import tune_cpu_allocator
    from vitpose.models.vitpose import build_model

    tuned = tune_cpu_allocator("cpu")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build_model(args.model, decoder=args.decoder).eval()
    x = torch.randn(args.batch, 3, 256, 192)
    print(f"{args.model} {args.decoder} fp32, {args.batch} crops of 256x192, {args.threads} torch threads, "
          f"allocator {'tuned' if tuned else 'as it comes'}, torch {torch.__version__}; {load_note()}")
    with torch.inference_mode():
        recorder = record_products(model, x)
        kinds = Counter()
        for (func, *_), n in recorder.counts.items():
            kinds[func.__name__] += n
        print(f"products per pass: {recorder.macs / 1e9:.2f} GMACs in {sum(recorder.counts.values())} calls "
              f"({', '.join(f'{k} x{n}' for k, n in sorted(kinds.items()))}); {len(recorder.calls)} distinct")
        contestants = {"forward": lambda: model(x), "products": lambda: replay(recorder)}
        warmed = {name: warm_up(step, max_steps=15) for name, step in contestants.items()}
        print("warm-up passes until steady: " + ", ".join(f"{k} {n}" for k, n in warmed.items()))
        seconds = alternate(contestants, args.rounds, report=print)
    share = ratios(seconds, "products", "forward")
    for name in contestants:
        rate = [recorder.macs / s / 1e9 for s in seconds[name]]
        print(f"{name:9s} {spread(seconds[name])} s/pass, {spread(rate)} GMAC/s")
    print(f"products' share of the forward, per round: {spread(share)}")
    print(f"bound: with everything but the products free, the forward would be at most "
          f"{statistics.median(1 / s for s in share):.3g}x [{min(1 / s for s in share):.3g}-{max(1 / s for s in share):.3g}] faster")
    print(f"after: {load_note()}")


if __name__ == "__main__":
    main()
