"""Crops per forward pass: the pose model's time per crop at several batch sizes.

    python benchmarks/bench_batch.py [--model vitpose-s] [--sizes 8 16 32 64 128] [--rounds 5]
                                     [--precision fp32|bf16] [--threads 2] [--baseline 64]

Why: `Predictor` cuts the boxes into batches of `batch_size` and the flip test doubles each one,
so the forward batch is 2 x batch_size crops. This measures which forward batch is cheapest per
crop on this machine (the default, `vitpose.device.default_batch_size`, rests on it).

Protocol (benchmarks/rounds.py): the model (random weights: speed only), inputs of 256x192, each
batch size warmed up until three consecutive passes agree within 10%, then `--rounds` rounds of
one timed stretch per size (at least `--crops` crops, whole batches), the order reversed every
other round. Printed: ms per crop, median [min-max] over rounds, and the time ratio per crop
against `--baseline` taken round by round (below 1: cheaper per crop than the baseline).
"""

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rounds import alternate, load_note, ratios, spread, warm_up  # noqa: E402

from vitpose.device import resolve_precision  # noqa: E402
from vitpose.models.vitpose import build_model  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vitpose-s")
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32, 64, 128], help="crops per forward pass")
    p.add_argument("--baseline", type=int, default=64, help="the size the ratios are taken against "
                   "(64 = the old default of 32 boxes with the flip test)")
    p.add_argument("--crops", type=int, default=128, help="crops per timed stretch")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    args = p.parse_args(argv)
    if args.baseline not in args.sizes:
        raise SystemExit(f"--baseline {args.baseline} must be one of --sizes {args.sizes}")
    torch.set_num_threads(args.threads)
    dtype = resolve_precision(args.precision, torch.device("cpu"))
    model = build_model(args.model).eval()
    print(f"{args.model}, 256x192, cpu, {args.threads} threads, {args.precision}, torch {torch.__version__}; "
          f"{load_note()}")

    def stretch(size):
        x = torch.randn(size, 3, 256, 192)
        passes = max(1, -(-args.crops // size))

        def run():
            with torch.inference_mode(), torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                for _ in range(passes):
                    model(x)
        return run, passes * size

    runners, crops = {}, {}
    for size in args.sizes:
        runners[str(size)], crops[str(size)] = stretch(size)
    warmed = {name: warm_up(run, max_steps=10) for name, run in runners.items()}
    print("warm-up passes until steady: " + ", ".join(f"{k} {v}" for k, v in warmed.items()), flush=True)
    seconds = alternate(runners, args.rounds)
    per_crop = {name: [s / crops[name] for s in times] for name, times in seconds.items()}
    base = str(args.baseline)
    print("| crops per forward pass | ms per crop | time per crop vs " + base + " (per round) |")
    print("| ---: | ---: | ---: |")
    for name, times in per_crop.items():
        print(f"| {name} | {spread([t * 1e3 for t in times])} | {spread(ratios(per_crop, name, base))} |")
    print(f"after: {load_note()}")


if __name__ == "__main__":
    main()
