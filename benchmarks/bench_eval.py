"""Evaluation throughput (crops/s) of ViTPose with the flip test: this project's loop vs a naive one.

    python benchmarks/bench_eval.py [--quick] [--device cpu|cuda] [--batch-sizes 8 16] [--amp bf16]

Both paths start from uint8 RGB crops on the host and end with image-space keypoints and scores,
on the same model (ViTPose-S, classic decoder, random weights: speed does not depend on them):
  naive     two forward passes per batch (the crop, then its mirror), heatmaps back to the host,
            then `UDPHeatmap.decode` one instance at a time (what a straight port of MMPose's
            `predict()` loop does);
  ours      `vitpose.engine.evaluate.predict`: both views in ONE forward of 2B crops, vectorised
            `batch_decode`, and (on CUDA) the host decode of batch n overlapped with the forward
            of batch n + 1.
A third line times the decode alone (per-sample `decode` vs `batch_decode`). Figures come from
one run on one machine; the ratio is the number to quote. The machine may be shared: use
`--threads` and a quiet machine for final figures.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vitpose.coco_meta import FLIP_INDICES
from vitpose.codecs.udp import UDPHeatmap
from vitpose.data.geometry import crop_to_image
from vitpose.data.pixels import normalize_images as normalize
from vitpose.engine.evaluate import predict
from vitpose.models import build_model

AMP = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def make_batches(num_batches, batch_size, seed=0):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for b in range(num_batches):
        n = batch_size
        batches.append({
            "image": torch.randint(0, 256, (n, 3, 256, 192), dtype=torch.uint8, generator=g),
            "id": torch.arange(b * n, (b + 1) * n), "image_id": torch.arange(b * n, (b + 1) * n),
            "center": torch.rand(n, 2, generator=g) * 400 + 100,
            "scale": torch.tensor([[150.0, 200.0]]).repeat(n, 1),
            "bbox_score": torch.ones(n, dtype=torch.float64),
        })
    return batches


@torch.no_grad()
def naive_predict(model, batches, codec, device, amp_dtype):
    """Two forwards per batch, per-sample decode: the straightforward loop."""
    out = []
    flip = list(FLIP_INDICES)
    for batch in batches:
        x = normalize(batch["image"].to(device))
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            heatmaps = model(x)
            mirrored = model(x.flip(-1))
        heatmaps = ((heatmaps + mirrored.flip(-1)[:, flip]) * 0.5).float().cpu().numpy()
        for i in range(len(heatmaps)):
            keypoints, scores = codec.decode(heatmaps[i])
            keypoints = crop_to_image(keypoints, batch["center"][i].numpy(), batch["scale"][i].numpy())
            out.append((keypoints[0], scores[0]))
    return out


def timed(fn, device, repeats):
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 16])
    p.add_argument("--batches", type=int, default=4, help="batches per timed run")
    p.add_argument("--repeats", type=int, default=3, help="timed runs (best is kept)")
    p.add_argument("--amp", choices=sorted(AMP), default="none")
    p.add_argument("--model", default="vitpose-s")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--quick", action="store_true", help="batch 8, 2 batches, 1 repeat (a smoke run)")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.batches, args.repeats = [8], 2, 1

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    amp_dtype = AMP[args.amp]
    torch.manual_seed(0)
    model = build_model(args.model).to(device).eval()
    codec = UDPHeatmap()
    print(f"{args.model} classic, device {device}, amp {args.amp}, torch threads {args.threads}, "
          f"{args.batches} batches x {args.repeats} repeats (best)")
    print(f"{'batch':>5} | {'naive crops/s':>13} | {'ours crops/s':>12} | {'ratio':>6} | "
          f"{'decode/sample ms':>16} | {'batch_decode ms':>15} | {'ratio':>6}")
    for batch_size in args.batch_sizes:
        batches = make_batches(args.batches, batch_size)
        n = args.batches * batch_size
        # Warm-up (allocator, kernels, cuDNN autotune) on one batch of each path.
        naive_predict(model, batches[:1], codec, device, amp_dtype)
        predict(model, batches[:1], codec, flip_test=True, device=device, amp_dtype=amp_dtype)
        t_naive = timed(lambda b=batches: naive_predict(model, b, codec, device, amp_dtype), device, args.repeats)
        t_ours = timed(lambda b=batches: predict(model, b, codec, flip_test=True, device=device, amp_dtype=amp_dtype),
                       device, args.repeats)
        heatmaps = np.random.default_rng(0).standard_normal((n, 17, 64, 48)).astype(np.float32)
        t_single = timed(lambda h=heatmaps: [codec.decode(x) for x in h], torch.device("cpu"), args.repeats)
        t_batch = timed(lambda h=heatmaps: codec.batch_decode(h), torch.device("cpu"), args.repeats)
        print(f"{batch_size:>5} | {n / t_naive:>13.1f} | {n / t_ours:>12.1f} | {t_naive / t_ours:>5.2f}x | "
              f"{1e3 * t_single / n:>16.3f} | {1e3 * t_batch / n:>15.3f} | {t_single / t_batch:>5.2f}x")


if __name__ == "__main__":
    main()
