"""ViTPose model speed: one train step and one eval forward, ours (fp32, bf16/fp16) against MMPose 1.3.2.

    python benchmarks/bench_model.py [--amp] [--mmpose] [--device cpu|cuda] [--rounds 5]
                                     [--model vitpose-s] [--decoder classic] [--batch 8]

Train step = forward + KeypointMSELoss + backward + clip_grad_norm_(1.0) + AdamW step (layer-
decay groups, fused AdamW where the device supports it) on random 256x192 inputs and targets,
drop path as configured for the size. Eval = forward under inference_mode. `--amp` adds an
autocast run (bf16 on CPU; `--amp-dtype bf16|fp16` on CUDA, fp16 with a GradScaler). `--compile`
wraps our model in torch.compile (compilation happens in the warm-up).

Protocol (benchmarks/rounds.py): for each phase (train, eval), every contestant warms up until
three consecutive step times agree within 10% (not a fixed count: compilation, allocator growth
and oneDNN's kernel choices take a varying number of steps); then `--rounds` rounds, each timing
every contestant for `--iters` steps (median), in an order reversed every other round. The table
gives each contestant's median [min-max] over rounds; ratios are taken round by round (both sides
under the same load) and summarised the same way.

`--mmpose` adds MMPose 1.3.2's ViTPose (same config, random weights via init_cfg=None and
mmpose.apis.init_model; train step = model.loss on fake data samples + backward + clip + torch
AdamW; eval = model(x, None, mode='tensor')), fp32, in a subprocess of the MMPose reference venv
($VITPOSE_MMPOSE_PYTHON, default ~/.cache/mmpose-ref-venv/bin/python; tools/reference/README.md)
that answers one timing request at a time, so that it alternates with ours. Without that venv the
run says so and still times ours fp32 against ours at reduced precision (a baseline with no peer).
"""

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mmpose_reference import MMCOMPAT_DIR, missing_message, mmpose_python
from rounds import alternate, load_note, ratios, spread, warm_up

from vitpose.engine.losses import KeypointMSELoss
from vitpose.engine.optim import LAYER_DECAY, param_groups
from vitpose.models.vitpose import build_model

MMPOSE_CONFIGS = {
    ("vitpose-s", "classic"): "td-hm_ViTPose-small_8xb64-210e_coco-256x192.py",
    ("vitpose-s", "simple"): "td-hm_ViTPose-small-simple_8xb64-210e_coco-256x192.py",
    ("vitpose-b", "classic"): "td-hm_ViTPose-base_8xb64-210e_coco-256x192.py",
    ("vitpose-b", "simple"): "td-hm_ViTPose-base-simple_8xb64-210e_coco-256x192.py",
}
PHASES = ("train", "eval")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def fake_batch(batch, device, num_keypoints=17, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, 256, 192, generator=g)
    target = torch.rand(batch, num_keypoints, 64, 48, generator=g)
    weights = torch.ones(batch, num_keypoints)
    return x.to(device), target.to(device), weights.to(device)


def ours(args, device, amp_dtype):
    """{"train": one train step, "eval": one eval forward} of our model (each synchronised)."""
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
        model.train()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=enabled):
            heatmaps = model(x)
        loss = criterion(heatmaps, target, weights)  # fp32 loss on the (possibly bf16) heatmaps
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()
        sync(device)

    def eval_forward():
        model.eval()
        with torch.inference_mode(), torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=enabled):
            model(x)
        sync(device)

    return {"train": train_step, "eval": eval_forward}


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
    import json, sys, time
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

    def train_step():
        model.train()
        opt.zero_grad(set_to_none=True)
        losses = model.loss(x, samples)
        losses['loss_kpt'].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    def eval_forward():
        model.eval()
        with torch.no_grad():
            model(x, None, mode='tensor')

    steps = dict(train=train_step, eval=eval_forward)
    print(json.dumps(dict(ready=True, torch=torch.__version__, mmpose=mmpose.__version__)), flush=True)
    for line in sys.stdin:  # one request at a time: the phase to time once
        sync(); t0 = time.perf_counter(); steps[line.strip()](); sync()
        print(json.dumps(dict(seconds=time.perf_counter() - t0)), flush=True)
    """
)


class MMPoseServer:
    """MMPose's model in the reference venv, timing one step per request (so it alternates with ours)."""

    def __init__(self, args, device):
        config = MMPOSE_CONFIGS.get((args.model, args.decoder))
        if config is None:
            raise SystemExit(f"no MMPose config mapped for {args.model} {args.decoder}")
        script = MMPOSE_SCRIPT.format(mmref=str(MMCOMPAT_DIR), threads=args.threads, config=config,
                                      device=str(device), batch=args.batch)
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        self.proc = subprocess.Popen([str(mmpose_python()), "-c", script], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.info = self._answer()

    def _answer(self):
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"MMPose benchmark process ended (exit status {self.proc.wait()}); see its stderr above")
        return json.loads(line)

    def step(self, phase):
        self.proc.stdin.write(phase + "\n")
        self.proc.stdin.flush()
        return self._answer()["seconds"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vitpose-s")
    parser.add_argument("--decoder", default="classic", choices=["classic", "simple"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default %(default)s)")
    parser.add_argument("--iters", type=int, default=3, help="steps per contestant and round (median; default %(default)s)")
    parser.add_argument("--amp", action="store_true", help="also time an autocast run (always done without --mmpose)")
    parser.add_argument("--amp-dtype", default=None, choices=["bf16", "fp16"],
                        help="autocast dtype (default bf16; fp16 only on CUDA)")
    parser.add_argument("--mmpose", action="store_true", help="time MMPose 1.3.2 fp32 in the same rounds")
    parser.add_argument("--grad-checkpointing", action="store_true")
    parser.add_argument("--compile", action="store_true", help="torch.compile our model (warm-up absorbs compile)")
    parser.add_argument("--no-fused", action="store_true", help="plain (for-loop) AdamW instead of fused")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, None: torch.bfloat16}[args.amp_dtype]
    amp_name = "ours " + str(amp_dtype).replace("torch.", "")

    peer = None
    if args.mmpose:
        if mmpose_python().exists():
            peer = MMPoseServer(args, device)
        else:
            print(f"note: {missing_message(mmpose_python())}; timing ours fp32 against {amp_name} instead")
    contestants = {"ours fp32": ours(args, device, None)}
    if args.amp or peer is None:
        dtypes = check_autocast_dtypes(args, device, amp_dtype)
        print("autocast output dtypes: " + ", ".join(f"{k} {v}" for k, v in dtypes.items()), flush=True)
        if device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            print("note: this CPU has no native bf16 (no avx512_bf16/AMX): oneDNN emulates bf16 matmuls")
        contestants[amp_name] = ours(args, device, amp_dtype)
    if peer is not None:
        contestants["mmpose fp32"] = {phase: (lambda phase=phase: peer.step(phase)) for phase in PHASES}
    print(f"{args.model} {args.decoder}, batch {args.batch}, {device}, {args.threads} threads, torch "
          f"{torch.__version__}; warm-up until steady, {args.rounds} alternating rounds of {args.iters} steps; "
          f"{load_note()}", flush=True)
    try:
        seconds = {}
        for phase in PHASES:
            steps = {name: c[phase] for name, c in contestants.items()}
            warmed = {name: warm_up(step) for name, step in steps.items()}
            print(f"{phase}: warm-up steps until steady: " + ", ".join(f"{k} {v}" for k, v in warmed.items()), flush=True)
            seconds[phase] = alternate(steps, args.rounds, args.iters, report=lambda line, p=phase: print(f"  {p} {line}"))
    finally:
        if peer is not None:
            peer.close()
    print_table(args, seconds, list(contestants))
    print(f"after: {load_note()}")


def print_table(args, seconds, names):
    print("\n| contestant | train s/step | train samples/s | eval s/step | eval samples/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in names:
        tr, ev = seconds["train"][name], seconds["eval"][name]
        print(f"| {name} | {spread(tr)} | {spread([args.batch / t for t in tr])} | {spread(ev)} | "
              f"{spread([args.batch / t for t in ev])} |")
    base = "mmpose fp32" if "mmpose fp32" in names else "ours fp32"
    for name in names:
        if name != base:
            print(f"time ratio {name} / {base} (per round, median [min-max]): "
                  f"train {spread(ratios(seconds['train'], name, base))}, eval {spread(ratios(seconds['eval'], name, base))}")


if __name__ == "__main__":
    main()
