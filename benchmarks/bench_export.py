"""Inference speed on CPU: PyTorch eager, torch.compile and onnxruntime (a `vitpose export` file).

    python benchmarks/bench_export.py [--models vitpose-s vitpose-b] [--batches 1 16]
                                      [--decoder classic] [--threads 2] [--iters 5] [--warmup 2]

For each model the same weights run three ways on the same random normalised crops (N, 3, 256,
192), model forward only (no flip test, no decode): eager under `torch.inference_mode`,
`torch.compile(model)` (inductor; its compilation happens in the warm-up and is reported
apart), and onnxruntime's CPU provider on the file `vitpose.inference.export.to_onnx` writes (dynamic
batch, fp32, gated as always). Torch and onnxruntime get the same thread count. Figures are
crops per second (batch / median time of `--iters` runs after `--warmup`, the three timed in
turns) and the ratio against eager measured in the same run. Machines are noisy: compare
figures from one run only; the load average is printed with them.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vitpose.inference.export import to_onnx
from vitpose.models.vitpose import build_model


def interleaved_medians(fns: dict, warmup: int, iters: int) -> dict:
    """Median seconds of each function, timed in turns (a, b, c, a, b, c, ...) so that a load
    change on a shared machine hits every contender alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {label: [] for label in fns}
    for _ in range(iters):
        for label, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - t0)
    return {label: statistics.median(t) for label, t in times.items()}


def onnx_session(model, folder: Path, threads: int):
    import onnxruntime as ort

    path = folder / "model.onnx"
    t0 = time.perf_counter()
    to_onnx(model, path, log=None)
    export_s = time.perf_counter() - t0
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]), export_s


def bench_model(name: str, args, folder: Path) -> list[dict]:
    torch.manual_seed(0)
    model = build_model(name, args.decoder).eval()
    session, export_s = onnx_session(model, folder, args.threads)
    compiled = torch.compile(model)
    print(f"{name} {args.decoder}: onnx export + gate {export_s:.1f} s", flush=True)
    rows = []
    for batch in args.batches:
        x = torch.randn(batch, 3, 256, 192, generator=torch.Generator().manual_seed(batch))
        x_np = x.numpy()

        def eager():
            with torch.inference_mode():
                model(x)

        def inductor():
            with torch.inference_mode():
                compiled(x)

        def onnxruntime():
            session.run(None, {"input": x_np})

        t0 = time.perf_counter()
        inductor()  # compile for this shape; timed apart from the warm-up proper
        compile_s = time.perf_counter() - t0
        times = interleaved_medians({"eager": eager, "compile": inductor, "onnxruntime": onnxruntime},
                                    args.warmup, args.iters)
        row = dict(model=name, batch=batch, compile_s=compile_s,
                   **{label: batch / seconds for label, seconds in times.items()})
        print(f"  batch {batch}: " + ", ".join(f"{k} {row[k]:.2f} crops/s" for k in times)
              + f" (first compiled call {compile_s:.1f} s)", flush=True)
        rows.append(row)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["vitpose-s", "vitpose-b"])
    parser.add_argument("--decoder", default="classic", choices=["classic", "simple"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import onnxruntime

    print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, {args.threads} threads, "
          f"median of {args.iters} after {args.warmup} warm-up runs, load average {os.getloadavg()[0]:.1f}",
          flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            rows += bench_model(name, args, Path(tmp))
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    print("| model | batch | eager crops/s | torch.compile crops/s (x eager) | onnxruntime crops/s (x eager) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} {args.decoder} | {r['batch']} | {r['eager']:.2f} | "
              f"{r['compile']:.2f} ({r['compile'] / r['eager']:.2f}x) | "
              f"{r['onnxruntime']:.2f} ({r['onnxruntime'] / r['eager']:.2f}x) |")


if __name__ == "__main__":
    main()
