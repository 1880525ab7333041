"""ViTPose model speed: one train step and one eval forward, ours against MMPose 1.3.2.

    python benchmarks/bench_model.py [--quick] [--amp] [--mmpose] [--device cpu|cuda]
                                     [--model vitpose-s] [--decoder classic] [--batch 8]

Train step = forward + KeypointMSELoss + backward + clip_grad_norm_(1.0) + AdamW step (layer-
decay groups, fused AdamW where the device supports it) on random 256x192 inputs and targets,
drop path as configured for the size. Eval = forward under inference_mode. fp32 by default;
`--amp` adds an autocast run (bf16 on CPU; `--amp-dtype bf16|fp16` on CUDA, fp16 with a
GradScaler). Median of `--iters` (10) after `--warmup` (3); 2 threads on CPU. `--compile`
wraps our model in torch.compile (compilation happens in the warm-up iterations).

`--mmpose` runs MMPose 1.3.2's ViTPose (same config, random weights via init_cfg=None and
mmpose.apis.init_model; train step = model.loss on fake data samples + backward + clip +
torch AdamW; eval = model(x, None, mode='tensor')) in a subprocess of the MMPose reference venv
($VITPOSE_MMPOSE_PYTHON, default ~/.cache/mmpose-ref-venv/bin/python; tools/reference/README.md),
fp32, same protocol, and prints ours/MMPose time ratios. Machines are noisy: compare figures
from one run only.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mmpose_reference import MMCOMPAT_DIR, missing_message, mmpose_python

from vitpose.engine.losses import KeypointMSELoss
from vitpose.engine.optim import LAYER_DECAY, param_groups
from vitpose.models.vitpose import build_model

MMPOSE_CONFIGS = {
    ("vitpose-s", "classic"): "td-hm_ViTPose-small_8xb64-210e_coco-256x192.py",
    ("vitpose-s", "simple"): "td-hm_ViTPose-small-simple_8xb64-210e_coco-256x192.py",
    ("vitpose-b", "classic"): "td-hm_ViTPose-base_8xb64-210e_coco-256x192.py",
    ("vitpose-b", "simple"): "td-hm_ViTPose-base-simple_8xb64-210e_coco-256x192.py",
}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, warmup, iters):
    times = []
    for i in range(warmup + iters):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fake_batch(batch, device, num_keypoints=17, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, 256, 192, generator=g)
    target = torch.rand(batch, num_keypoints, 64, 48, generator=g)
    weights = torch.ones(batch, num_keypoints)
    return x.to(device), target.to(device), weights.to(device)


def bench_ours(args, device, amp_dtype):
    torch.manual_seed(0)
    model = build_model(args.model, args.decoder, grad_checkpointing=args.grad_checkpointing).to(device)
    x, target, weights = fake_batch(args.batch, device)
    groups = param_groups(model, lr=5e-4, weight_decay=0.1, layer_decay=LAYER_DECAY[args.model])
    try:
        opt = torch.optim.AdamW(groups, betas=(0.9, 0.999), fused=not args.no_fused)
    except (RuntimeError, TypeError):  # fused AdamW unsupported here: plain AdamW
        opt = torch.optim.AdamW(groups, betas=(0.9, 0.999))
    criterion = KeypointMSELoss()
    if args.compile:  # after the groups: compiled and eager modules share the parameters
        model = torch.compile(model)
    enabled = amp_dtype is not None
    scaler = torch.amp.GradScaler(device.type, enabled=enabled and amp_dtype == torch.float16)
    params = [p for p in model.parameters() if p.requires_grad]

    def train_step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=enabled):
            heatmaps = model(x)
        loss = criterion(heatmaps, target, weights)  # fp32 loss on the (possibly bf16) heatmaps
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()

    def eval_forward():
        with torch.inference_mode(), torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=enabled):
            model(x)

    model.train()
    train_s = timed(train_step, device, args.warmup, args.iters)
    model.eval()
    eval_s = timed(eval_forward, device, args.warmup, args.iters)
    return dict(train_s=train_s, eval_s=eval_s)


def check_autocast_dtypes(args, device, amp_dtype):
    """Which dtypes the matmuls, attention and convs of one forward really run in."""
    model = build_model(args.model, args.decoder, depth=1).to(device).eval()
    seen = {}

    def hook(name):
        def fn(module, inputs, output):
            seen[name] = str(output.dtype).replace("torch.", "")
        return fn

    blk = model.backbone.blocks[0]
    for name, mod in [("patch conv", model.backbone.patch_embed.proj), ("qkv linear", blk.attn.qkv),
                      ("mlp linear", blk.mlp.fc1), ("layernorm", blk.norm1), ("head", model.head)]:
        mod.register_forward_hook(hook(name))
    attn_dtype = {}
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *a, **kw):
        out = sdpa(q, k, v, *a, **kw)
        attn_dtype["sdpa"] = str(out.dtype).replace("torch.", "")
        return out

    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        with torch.inference_mode(), torch.autocast(device.type, dtype=amp_dtype):
            model(torch.randn(1, 3, 256, 192, device=device))
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
    seen.update(attn_dtype)
    return seen


MMPOSE_SCRIPT = textwrap.dedent(
    """
    import json, statistics, sys, time
    sys.path.insert(0, {mmref!r})
    import mmcompat  # noqa: F401  (before mmpose: stubs for mmcv ops ViTPose never uses)
    import os, torch
    import mmpose
    from mmengine.config import Config
    from mmengine.structures import InstanceData, PixelData
    from mmpose.apis import init_model
    from mmpose.structures import PoseDataSample

    torch.set_num_threads({threads})
    torch.manual_seed(0)
    cfg_dir = os.path.join(os.path.dirname(mmpose.__file__), '.mim', 'configs', 'body_2d_keypoint',
                           'topdown_heatmap', 'coco')
    cfg = Config.fromfile(os.path.join(cfg_dir, {config!r}))
    cfg.model.backbone.init_cfg = None
    model = init_model(cfg, checkpoint=None, device={device!r})
    g = torch.Generator().manual_seed(0)
    B = {batch}
    x = torch.randn(B, 3, 256, 192, generator=g).to({device!r})
    target = torch.rand(B, 17, 64, 48, generator=g)
    samples = []
    for i in range(B):
        s = PoseDataSample()
        s.gt_fields = PixelData(heatmaps=target[i].to({device!r}))
        s.gt_instance_labels = InstanceData(keypoint_weights=torch.ones(1, 17, device={device!r}))
        samples.append(s)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.999), weight_decay=0.1)

    def sync():
        if {device!r}.startswith('cuda'):
            torch.cuda.synchronize()

    def timed(fn):
        times = []
        for i in range({warmup} + {iters}):
            sync(); t0 = time.perf_counter(); fn(); sync()
            if i >= {warmup}:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def train_step():
        opt.zero_grad(set_to_none=True)
        losses = model.loss(x, samples)
        losses['loss_kpt'].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    def eval_forward():
        with torch.no_grad():
            model(x, None, mode='tensor')

    model.train()
    train_s = timed(train_step)
    model.eval()
    eval_s = timed(eval_forward)
    print(json.dumps(dict(train_s=train_s, eval_s=eval_s, torch=torch.__version__, mmpose=mmpose.__version__)))
    """
)


def bench_mmpose(args, device):
    config = MMPOSE_CONFIGS.get((args.model, args.decoder))
    if config is None:
        raise SystemExit(f"no MMPose config mapped for {args.model} {args.decoder}")
    python = mmpose_python()
    if not python.exists():
        raise SystemExit(missing_message(python))
    script = MMPOSE_SCRIPT.format(
        mmref=str(MMCOMPAT_DIR), threads=args.threads, config=config, device=str(device),
        batch=args.batch, warmup=args.warmup, iters=args.iters,
    )
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.run([str(python), "-c", script], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"MMPose benchmark failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vitpose-s")
    parser.add_argument("--decoder", default="classic", choices=["classic", "simple"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="3 iterations after 1 warm-up (smoke run)")
    parser.add_argument("--amp", action="store_true", help="also time an autocast run")
    parser.add_argument("--amp-dtype", default=None, choices=["bf16", "fp16"],
                        help="autocast dtype (default bf16; fp16 only on CUDA)")
    parser.add_argument("--mmpose", action="store_true", help="time MMPose 1.3.2 fp32 with the same protocol")
    parser.add_argument("--grad-checkpointing", action="store_true")
    parser.add_argument("--compile", action="store_true", help="torch.compile our model (warm-up absorbs compile)")
    parser.add_argument("--no-fused", action="store_true", help="plain (for-loop) AdamW instead of fused")
    args = parser.parse_args()
    if args.quick:
        args.iters, args.warmup = 3, 1
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, None: torch.bfloat16}[args.amp_dtype]

    print(f"{args.model} {args.decoder}, batch {args.batch}, {device}, {args.threads} threads, "
          f"median of {args.iters} after {args.warmup} warm-up, torch {torch.__version__}")
    rows = [("ours", "fp32", bench_ours(args, device, None))]
    print(f"ours fp32: train {rows[0][2]['train_s']:.4f} s/step, eval {rows[0][2]['eval_s']:.4f} s/step", flush=True)
    if args.amp:
        dtypes = check_autocast_dtypes(args, device, amp_dtype)
        print("autocast output dtypes: " + ", ".join(f"{k} {v}" for k, v in dtypes.items()), flush=True)
        if device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            print("note: this CPU has no native bf16 (no avx512_bf16/AMX): oneDNN emulates bf16 matmuls")
        rows.append(("ours", "amp-" + str(amp_dtype).replace("torch.", ""), bench_ours(args, device, amp_dtype)))
    if args.mmpose:
        rows.append(("mmpose", "fp32", bench_mmpose(args, device)))

    print(f"{'impl':8} {'precision':14} {'train s/step':>12} {'train samp/s':>12} {'eval s/step':>12} {'eval samp/s':>12}")
    for impl, prec, r in rows:
        print(f"{impl:8} {prec:14} {r['train_s']:12.4f} {args.batch / r['train_s']:12.2f} "
              f"{r['eval_s']:12.4f} {args.batch / r['eval_s']:12.2f}")
    if args.mmpose:
        ref = rows[-1][2]
        for impl, prec, r in rows[:-1]:
            print(f"ratio {impl} {prec} / mmpose fp32 (time): train {r['train_s'] / ref['train_s']:.3f}  "
                  f"eval {r['eval_s'] / ref['eval_s']:.3f}")


if __name__ == "__main__":
    main()
