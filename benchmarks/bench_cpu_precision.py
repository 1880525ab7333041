"""The figure behind `precision="auto"` on a CPU: bf16 against fp32 on ViTPose's own forward.

    python benchmarks/bench_cpu_precision.py [--model vitpose-s] [--batch 4 16] [--threads 1 2] [--rounds 8]

For each crop count and thread count: ViTPose (random weights: speed only) forward under
inference_mode at fp32 and under bf16 autocast, each warmed up until steady, then `--rounds`
alternating rounds (benchmarks/rounds.py: the order reversed every other round, each ratio taken
within one round). Prints fp32 s, bf16 s and the speed-up fp32 time / bf16 time as median [min-max]
over rounds, with the load average, and then what `vitpose.device.cpu_bf16_speedup` measures for a
`Predictor` of the same model (5 rounds at 4 crops: the figure `auto` decides with, without its cache)
and the choice it makes (bf16 from `BF16_MIN_SPEEDUP` up).
"""

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rounds import alternate, load_note, ratios, spread, warm_up

from vitpose import device as device_module
from vitpose.models.vitpose import build_model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vitpose-s")
    p.add_argument("--decoder", default="classic")
    p.add_argument("--batch", type=int, nargs="+", default=[4, 16])
    p.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()])
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = build_model(args.model, args.decoder).eval()
    print(f"{args.model} {args.decoder}, CPU {device_module.cpu_model_name()}, native bf16 "
          f"{device_module.cpu_has_native_bf16()}, torch {torch.__version__}; {load_note()}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for batch in args.batch:
            x = torch.randn(batch, 3, 256, 192)

            def step(bf16, x=x):
                with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    model(x)

            contestants = {"fp32": lambda: step(False), "bf16": lambda: step(True)}
            for run in contestants.values():
                warm_up(run, max_steps=10)
            seconds = alternate(contestants, args.rounds)
            speedup = ratios(seconds, "fp32", "bf16")
            print(f"{threads} thread(s), {batch} crops: fp32 {spread(seconds['fp32'])} s, bf16 "
                  f"{spread(seconds['bf16'])} s, bf16 speed-up per round {spread(speedup)} ({load_note()})")
        from vitpose.inference.predictor import _speed_step

        figure = device_module._measure_bf16_speedup(_speed_step(model)[0])
        choice = "bf16" if figure["speedup"] >= device_module.BF16_MIN_SPEEDUP else "fp32"
        print(f"{threads} thread(s): auto's own measurement (4 crops, {device_module.SPEED_ROUNDS} rounds): "
              f"{figure['speedup']:.2f}x, rounds {figure['rounds']} -> auto picks {choice} ({load_note()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
