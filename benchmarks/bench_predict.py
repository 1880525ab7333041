"""End-to-end top-down pose inference on the CPU: this project vs HF transformers vs MMPose.

    python benchmarks/bench_predict.py [--model vitpose-s] [--decoder classic] [--repeats 5]
                                       [--threads 2] [--no-flip] [--no-peers] [--pipeline]
    python benchmarks/bench_predict.py --config configs/demo.yaml --weights work_dirs/demo/best.pth \
        --data-root work_dirs/demo/synthetic_coco --no-peers        # a trained model: fp32 vs bf16
    python benchmarks/bench_predict.py --speed-peers ...            # int8 students vs rtmlib, YOLO-pose
                                                                    # (benchmarks/peer_speed.py)

Trained model (`--config` + `--weights`, with `--data-root`: a COCO-layout root whose val split's
images and detection boxes are the inputs): keypoint agreement between precisions then means
something (random weights give flat heatmaps, where any rounding moves a keypoint anywhere); it
is reported over the keypoints the fp32 run scores above 0.3 (median / 99th percentile / max px).
The peers build the published ViTPose shapes and take only the weights: with a config of such a
model (configs/demo_vitpose-s.yaml: ViTPose-S trained on the demo's set) they run the trained
weights too, and their keypoint agreement with ours is over peaked heatmaps; with any other config
(configs/demo.yaml's 4-block ViT) the run is ours only.

Timing protocol (benchmarks/rounds.py): every implementation warms up until three consecutive
passes agree within 10%, then `--repeats` rounds of one pass each, the order reversed every other
round; the table gives the median [min-max] over rounds, and "x ours" is taken round by round.
Without peers (`--no-peers`, or no reference venv) ours runs at fp32 and bf16 (the baseline that
needs no peer); `--amp` adds the bf16 run when peers are there.

Same images, boxes and weights for all: coco-mini's four images (JPEG files, decoded by each run
with cv2.imread) and their 118 detection boxes (test_coco_det_AP_H_56.json), one random ViTPose
drawn with the fixtures' recipe (std 0.05 weights, 0.1 biases, norm scales U(0.5, 1.5)) so that
heatmap peaks are clear and differ per crop. The weights are written in MMPose 1.x and HF layouts
by the key maps below; `vitpose.load_weights` reads both files back into our model bit for bit
before anything is timed (so the maps are checked by this project's own loader).

- ours, predict: `Predictor.predict(image, boxes)` per image (the public API on photos).
- ours, batched: the crops of all four images through the model together, JPEG decoding in a
  reader thread (`vitpose.inference.video`'s pipeline: what `vitpose predict DIR` and videos run).
- HF transformers: `VitPoseImageProcessor` (crops + normalisation) -> `VitPoseForPoseEstimation`
  -> `post_process_pose_estimation`, one call each per image, as HF's model card shows; with
  the flip test, a second forward of the mirrored crops with `flip_pairs` (HF's own flip-back),
  the two heatmaps averaged (what ViTPose's evaluation does; HF has no flip-test switch).
- MMPose 1.3.2: `mmpose.apis.inference_topdown(model, image_array, boxes)` per image, the
  ViTPose-S config's test_cfg (flip test on, heatmap mode, no shift).

HF and MMPose run in the MMPose reference venv (env VITPOSE_MMPOSE_PYTHON, default
~/.cache/mmpose-ref-venv/bin/python) in a subprocess that answers one command at a time, so that
nothing runs at the same time and the implementations alternate: `--repeats` rounds (after a
warm-up round) of one pass of each, in the same order; the table gives the median per
implementation. All use `--threads` torch threads. Stage shares come from one extra,
instrumented pass (timers around each stage's function; MMPose's "other" is inference_topdown's
own overhead: per-box pipeline dicts, collation, data samples). Keypoints are compared box by box
against ours (max |diff| in image pixels, and the share of keypoints within 0.01 px).

Allocator: ours runs as `vitpose predict` does on a CPU, after `vitpose.device.tune_cpu_allocator()`
(glibc's malloc keeps freed pages; benchmarks/bench_allocator.py); `--default-allocator` leaves
glibc as it comes. The peers run with glibc's defaults, as their users get them; `--tune-peers`
gives their process the same setting (by glibc's environment variables), which separates the
allocator from the code. `--control` with the default allocator for the peers times ours untuned.

`--control` also times ours (Predictor.predict) inside the peers' process, in their venv: it
separates the implementations from the process they run in (same torch version in both venvs).

`--video` (with a trained model) adds the video row: `benchmarks/bench_det_every.py` on a panning
synthetic clip, frames/s with `--det-every 1` and `5` in alternating rounds, track ids, keypoint
agreement.

`--pipeline` also times `vitpose.inference.video.run_video` on a synthetic 640x480 clip with the threaded
and the sequential pipeline (the measurement behind the threads in vitpose/inference/video.py).
Machines are noisy: compare figures of one run only.
"""

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import peer_speed
from rounds import alternate, cpu_note, load_note, ratios, spread, warm_up
from safetensors.torch import save_file

from vitpose.config import ModelConfig, load_config
from vitpose.data.geometry import bbox_xywh2xyxy
from vitpose.device import allocator_environment, tune_cpu_allocator
from vitpose.inference.predictor import Predictor
from vitpose.inference.results import StageTimer
from vitpose.models.loading import load_weights
from vitpose.models.vitpose import build_model

SHARED = Path(os.environ.get("VITPOSE_SHARED", REPO.parent / "shared"))
COCO_MINI = SHARED / "data" / "coco-mini"
MMPOSE_PY = Path(os.environ.get("VITPOSE_MMPOSE_PYTHON", Path.home() / ".cache/mmpose-ref-venv/bin/python"))
MMPOSE_CONFIGS = {
    ("vitpose-s", "classic"): "td-hm_ViTPose-small_8xb64-210e_coco-256x192.py",
    ("vitpose-s", "simple"): "td-hm_ViTPose-small-simple_8xb64-210e_coco-256x192.py",
    ("vitpose-b", "classic"): "td-hm_ViTPose-base_8xb64-210e_coco-256x192.py",
    ("vitpose-b", "simple"): "td-hm_ViTPose-base-simple_8xb64-210e_coco-256x192.py",
}


# ---------------------------------------------------------------------------------------------
# Weights: one random draw, written in the three layouts


def draw_weights(model, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif p.ndim == 1:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.05 if "pos_embed" not in name else 0.5)
        for name, b in model.named_buffers():  # BN statistics of the classic head
            if name.endswith("running_mean"):
                b.normal_(0, 0.3)
            elif name.endswith("running_var"):
                b.uniform_(0.5, 2.0)
    return model


def mmpose_layout(state):
    """Our names -> MMPose 1.x names (the inverse of models.layouts' MMPose rules)."""
    out = {}
    for name, t in state.items():
        n = name.replace("backbone.patch_embed.proj.", "backbone.patch_embed.projection.")
        n = n.replace("backbone.norm.", "backbone.ln1.")
        if ".blocks." in n:
            n = n.replace("backbone.blocks.", "backbone.layers.")
            n = n.replace(".norm1.", ".ln1.").replace(".norm2.", ".ln2.")
            n = n.replace(".mlp.fc1.", ".ffn.layers.0.0.").replace(".mlp.fc2.", ".ffn.layers.1.")
        out[n] = t
    return out


def hf_layout(state, decoder):
    """Our names -> HF transformers VitPose names: q/k/v split by rows, a zero class-token row on
    the position embedding, head layers renamed."""
    out = {}
    for name, t in state.items():
        if name == "backbone.pos_embed":
            out["backbone.embeddings.position_embeddings"] = torch.cat([torch.zeros_like(t[:, :1]), t], 1)
            continue
        n = name.replace("backbone.patch_embed.proj.", "backbone.embeddings.patch_embeddings.projection.")
        n = n.replace("backbone.norm.", "backbone.layernorm.")
        if ".blocks." in n:
            n = n.replace("backbone.blocks.", "backbone.encoder.layer.")
            n = n.replace(".norm1.", ".layernorm_before.").replace(".norm2.", ".layernorm_after.")
            n = n.replace(".attn.proj.", ".attention.output.dense.")
            if ".attn.qkv." in n:
                for part, chunk in zip(("query", "key", "value"), t.chunk(3, dim=0)):
                    out[n.replace(".attn.qkv.", f".attention.attention.{part}.")] = chunk.clone()
                continue
        if decoder == "classic":
            for ours, theirs in ((".deconv_layers.0.", ".deconv1."), (".deconv_layers.1.", ".batchnorm1."),
                                 (".deconv_layers.3.", ".deconv2."), (".deconv_layers.4.", ".batchnorm2.")):
                n = n.replace(ours, theirs)
        n = n.replace("head.final_layer.", "head.conv.")
        out[n] = t
    return out


def write_weights(model, model_name, decoder, folder):
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    files = {"mmpose": folder / "mmpose1x.pth", "hf": folder / "hf.safetensors"}
    torch.save({"state_dict": mmpose_layout(state)}, files["mmpose"])
    save_file(hf_layout(state, decoder), str(files["hf"]))
    for layout, path in files.items():  # our loader reads each layout back to the same tensors
        probe = build_model(model_name, decoder)
        load_weights(probe, path)
        for k, v in probe.state_dict().items():
            if not torch.equal(v, state[k]):
                raise SystemExit(f"{layout} layout does not round-trip at {k}")
    return files


# ---------------------------------------------------------------------------------------------
# Data


def peers_cannot_run(cfg, name):
    """Why the peers cannot run the model of config `cfg` (loaded from `name`), or "" when they can.
    They build the published COCO ViTPose (MMPose's config file, HF's VitPoseConfig) and take only
    its weights, so the config must be that model: a size and decoder with an MMPose config, no
    `model.extra`, 256x192 crops, 64x48 UDP heatmaps with sigma 2, COCO's 17 keypoints (the peers'
    flip pairs)."""
    model_cfg = cfg.model
    if (model_cfg.name, model_cfg.decoder) not in MMPOSE_CONFIGS:
        return f"{name} is {model_cfg.name} {model_cfg.decoder} (the peers here: " \
               f"{', '.join(' '.join(k) for k in MMPOSE_CONFIGS)})"
    published = ModelConfig(name=model_cfg.name, decoder=model_cfg.decoder)
    for field in ("extra", "input_size", "heatmap_size", "sigma", "num_keypoints"):
        ours, theirs = getattr(model_cfg, field), getattr(published, field)
        if ours != theirs:  # load_config makes the sizes tuples, as the defaults
            return f"{name} sets model.{field}: {ours} (published: {theirs})"
    if cfg.data.dataset_info != "coco":
        return f"{name} is not COCO's skeleton (the peers flip with COCO's pairs)"
    return ""


def load_inputs(max_images=None, max_boxes=None, data_root=None):
    """coco-mini's images and detections, or (data_root) a COCO-layout root's val2017 and its detections."""
    if data_root is None:
        folder, detections_file = COCO_MINI, COCO_MINI / "test_coco_det_AP_H_56.json"
    else:
        folder = Path(data_root) / "val2017"
        detections_file = next((Path(data_root) / "person_detection_results").glob("*val*.json"))
    detections = json.loads(detections_file.read_text())
    ids = sorted({d["image_id"] for d in detections})[:max_images]
    images = []
    for image_id in ids:
        boxes = np.array([d["bbox"] for d in detections if d["image_id"] == image_id][:max_boxes], np.float32)
        images.append({"path": str(folder / f"{image_id:012d}.jpg"), "boxes_xywh": boxes.tolist(),
                       "boxes_xyxy": bbox_xywh2xyxy(boxes).tolist()})
    return images


def read_rgb(path):
    return cv2.cvtColor(cv2.imread(path, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


# ---------------------------------------------------------------------------------------------
# Ours


def run_ours_predict(predictor, inputs, timer=None):
    out = []
    for item in inputs:
        t0 = time.perf_counter()
        rgb = read_rgb(item["path"])
        if timer:
            timer.add("decode", time.perf_counter() - t0)
        kpts, scores = predictor.predict(rgb, np.array(item["boxes_xyxy"]))
        out.append((kpts, scores))
    return out


def run_ours_batched(predictor, inputs, timer=None, flip=True):
    """All images' crops through the model together (`predictor(images, boxes)`); JPEG decoding in a reader thread."""
    timer = timer or StageTimer()
    frames = [None] * len(inputs)

    def read():
        for i, item in enumerate(inputs):
            t0 = time.perf_counter()
            frames[i] = cv2.imread(item["path"], cv2.IMREAD_COLOR)
            timer.add("decode", time.perf_counter() - t0)

    reader = threading.Thread(target=read)
    reader.start()
    reader.join()
    restore = instrument_predictor(predictor, timer)
    predictor.flip_test = flip
    try:
        poses = predictor(frames, boxes=[np.array(item["boxes_xyxy"], np.float32) for item in inputs], channels="bgr")
    finally:
        restore()
    return [(p.keypoints, p.keypoint_scores) for p in poses]


def instrument_predictor(predictor, timer):
    """The predictor's own stage timer (crop, pose, decode heatmaps) adds into `timer` until restored."""
    original = predictor.timer
    predictor.timer = timer

    def restore():
        predictor.timer = original
    return restore


# ---------------------------------------------------------------------------------------------
# Peers (in the MMPose reference venv)

PEERS_SCRIPT = textwrap.dedent(
    r"""
    import json, os, sys, time
    spec = json.loads(sys.argv[1])
    sys.path.insert(0, spec["mmref"])
    import mmcompat  # noqa: F401  (before mmpose)
    import cv2, numpy as np, torch
    torch.set_num_threads(spec["threads"])
    FLIP_PAIRS = [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12], [13, 14], [15, 16]]

    def read_rgb(path):
        return cv2.cvtColor(cv2.imread(path, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)

    class Timer(dict):
        def add(self, k, v):
            self[k] = self.get(k, 0.0) + v

    result, runners, instrumented = {}, {}, {}
    # ---------------- HF transformers
    if "hf" in spec["peers"]:
        import transformers
        from transformers import VitPoseBackboneConfig, VitPoseConfig, VitPoseForPoseEstimation, VitPoseImageProcessor
        from transformers.models.vitpose.modeling_vitpose import VitPoseEstimatorOutput
        from safetensors.torch import load_file
        size = spec["hf_backbone"]
        config = VitPoseConfig(backbone_config=VitPoseBackboneConfig(
            hidden_size=size["hidden"], num_hidden_layers=size["depth"], num_attention_heads=size["heads"],
            mlp_ratio=4, layer_norm_eps=1e-6, qkv_bias=True, image_size=[256, 192], patch_size=[16, 16],
            out_indices=[size["depth"]]), use_simple_decoder=spec["decoder"] == "simple", num_labels=17)
        hf_model = VitPoseForPoseEstimation(config).eval()
        hf_model.load_state_dict(load_file(spec["hf_weights"]), strict=True)
        hf_model.to(spec["device"])
        processor = VitPoseImageProcessor()
        flip_pairs = torch.tensor(FLIP_PAIRS)

        def hf_run(timer=None):
            timer = timer if timer is not None else Timer()
            out = []
            for item in spec["inputs"]:
                t0 = time.perf_counter(); rgb = read_rgb(item["path"]); t1 = time.perf_counter()
                boxes = [item["boxes_xywh"]]
                inputs = processor(images=[rgb], boxes=boxes, return_tensors="pt")
                pixels = inputs["pixel_values"].to(spec["device"]); t2 = time.perf_counter()
                with torch.no_grad():
                    heatmaps = hf_model(pixels).heatmaps
                    if spec["flip"]:
                        flipped = hf_model(pixels.flip(-1), flip_pairs=flip_pairs.to(spec["device"])).heatmaps
                        heatmaps = (heatmaps + flipped) * 0.5
                    heatmaps = heatmaps.cpu()
                t3 = time.perf_counter()
                poses = processor.post_process_pose_estimation(VitPoseEstimatorOutput(heatmaps=heatmaps), boxes=boxes)
                t4 = time.perf_counter()
                timer.add("decode", t1 - t0); timer.add("crop", t2 - t1); timer.add("pose", t3 - t2)
                timer.add("decode heatmaps", t4 - t3)
                out.append([[p["keypoints"].tolist(), p["scores"].tolist()] for p in poses[0]])
            return out

        check = np.load(spec["check_file"])
        with torch.no_grad():
            same_input = hf_model(torch.from_numpy(check["x"]).to(spec["device"])).heatmaps.cpu().numpy()
        result["hf"] = dict(keypoints=hf_run(),
                            weights_check=float(np.abs(same_input - check["heatmaps"]).max()),
                            version=transformers.__version__, attn=hf_model.config._attn_implementation)
        runners["hf"] = hf_run

        def hf_stages():
            stages = Timer(); hf_run(stages); return stages
        instrumented["hf"] = hf_stages
    # ---------------- MMPose
    if "mmpose" in spec["peers"]:
        import mmpose
        from mmengine.config import Config
        from mmpose.apis import inference_topdown, init_model
        cfg_dir = os.path.join(os.path.dirname(mmpose.__file__), ".mim", "configs", "body_2d_keypoint",
                               "topdown_heatmap", "coco")
        cfg = Config.fromfile(os.path.join(cfg_dir, spec["mmpose_config"]))
        cfg.model.backbone.init_cfg = None
        cfg.model.test_cfg.flip_test = spec["flip"]
        mm_model = init_model(cfg, checkpoint=spec["mmpose_weights"], device=spec["device"])

        def mm_run():
            out = []
            for item in spec["inputs"]:
                bgr = cv2.imread(item["path"], cv2.IMREAD_COLOR)  # MMPose takes arrays in BGR (LoadImage's order)
                samples = inference_topdown(mm_model, bgr, np.array(item["boxes_xyxy"], np.float32))
                out.append([[s.pred_instances.keypoints[0].tolist(), s.pred_instances.keypoint_scores[0].tolist()]
                            for s in samples])
            return out

        check = np.load(spec["check_file"])
        with torch.no_grad():
            same_input = mm_model(torch.from_numpy(check["x"]).to(spec["device"]), None, mode="tensor").cpu().numpy()
        result["mmpose"] = dict(keypoints=mm_run(), version=mmpose.__version__,
                                weights_check=float(np.abs(same_input - check["heatmaps"]).max()))
        runners["mmpose"] = mm_run
        # the instrumented pass (last: it wraps MMPose's functions for good): timers around the
        # decode, the per-box pipeline (crop), the model and the heatmap decoding
        stages = Timer()
        def timed(fn, stage):
            def call(*a, **kw):
                t0 = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    stages.add(stage, time.perf_counter() - t0)
            return call
        def wrap(owner, name, stage):
            setattr(owner, name, timed(getattr(owner, name), stage))

        def mm_stages():
            import mmpose.apis.inference as mm_inference
            compose = mm_inference.Compose
            mm_inference.Compose = lambda *a, **kw: timed(compose(*a, **kw), "crop")
            wrap(mm_model, "extract_feat", "pose")
            wrap(mm_model.head, "forward", "pose")
            wrap(mm_model.head, "decode", "decode heatmaps")
            wrap(mm_model.data_preprocessor, "forward", "crop")  # normalisation on the batch
            wrap(cv2, "imread", "decode")
            t0 = time.perf_counter(); mm_run(); total = time.perf_counter() - t0
            stages["other"] = total - sum(stages.values())
            return stages
        instrumented["mmpose"] = mm_stages
    # ---------------- ours again, in this process: a control for the process and the venv
    if spec["control"]:
        sys.path.insert(0, spec["repo"])
        try:
            import psutil  # noqa: F401
        except ImportError:  # vitpose.data.loaders sizes worker pools with it; inference never calls it
            import types
            sys.modules["psutil"] = types.ModuleType("psutil")
        from vitpose.inference.predictor import Predictor
        from vitpose.models.loading import load_weights
        from vitpose.models.vitpose import build_model
        ours_model = build_model(spec["model"], spec["decoder"])
        load_weights(ours_model, spec["mmpose_weights"])
        predictor = Predictor(ours_model, device=spec["device"], flip_test=spec["flip"], batch_size=spec["batch_size"])

        def ours_run():
            return [[[k.tolist(), s.tolist()] for k, s in zip(*predictor.predict(read_rgb(item["path"]),
                                                                                  np.array(item["boxes_xyxy"])))]
                    for item in spec["inputs"]]
        result["control"] = dict(keypoints=ours_run())
        runners["control"] = ours_run

    # A server: one timed pass per command, so that the caller interleaves ours and the peers.
    print("READY " + json.dumps(result), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if "time" in command:
            t0 = time.perf_counter(); runners[command["time"]](); seconds = time.perf_counter() - t0
            print("DONE " + json.dumps(seconds), flush=True)
        elif "stages" in command:
            print("DONE " + json.dumps(instrumented[command["stages"]]()), flush=True)
        else:
            break
    """
)


def write_weights_check(model, inputs, folder):
    """Normalised crops of the first image's first boxes and our heatmaps of them: each peer runs
    its model on the same tensor, which shows the three hold the same weights."""
    from vitpose.data.loaders import normalize_images

    predictor = Predictor(copy.deepcopy(model), device="cpu", flip_test=False)  # the original stays put
    rgb = read_rgb(inputs[0]["path"])
    center, scale = predictor.boxes_to_center_scale(np.array(inputs[0]["boxes_xyxy"][:4]))
    crops, _ = predictor.crops(rgb, center, scale)
    x = normalize_images(torch.from_numpy(crops))
    with torch.no_grad():
        heatmaps = model(x)
    path = folder / "weights_check.npz"
    np.savez(path, x=x.numpy(), heatmaps=heatmaps.numpy())
    return path


class Peers:
    """The HF and MMPose runners in the reference venv, as a subprocess that answers one command
    at a time (a timed pass of one peer, or its instrumented pass)."""

    def __init__(self, args, files, inputs, folder):
        if not MMPOSE_PY.exists():
            raise SystemExit(f"MMPose reference venv not found: {MMPOSE_PY} (set VITPOSE_MMPOSE_PYTHON; "
                             f"see {SHARED}/mmpose-ref/README.md)")
        from vitpose.models.vitpose import MODEL_SIZES

        size = MODEL_SIZES[args.model]
        spec = dict(mmref=str(SHARED / "mmpose-ref"), threads=args.threads, device=args.device,
                    flip=not args.no_flip, decoder=args.decoder, inputs=inputs, peers=args.peers,
                    hf_weights=str(files["hf"]), mmpose_weights=str(files["mmpose"]), check_file=str(files["check"]),
                    mmpose_config=MMPOSE_CONFIGS[(args.model, args.decoder)], repo=str(REPO), model=args.model,
                    batch_size=args.batch_size, control=args.control,
                    hf_backbone=dict(hidden=size["embed_dim"], depth=size["depth"], heads=size["num_heads"]))
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        if args.tune_peers:
            env.update(allocator_environment())
        self.log = open(folder / "peers.log", "w+")
        self.proc = subprocess.Popen([str(MMPOSE_PY), "-c", PEERS_SCRIPT, json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.ready = self._answer("READY ")

    def _answer(self, prefix):
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return json.loads(line[len(prefix):])
        self.log.seek(0)
        raise SystemExit(f"peer benchmark failed (exit {self.proc.wait()}):\n{self.log.read()[-4000:]}")

    def time(self, name):
        self.proc.stdin.write(json.dumps({"time": name}) + "\n")
        self.proc.stdin.flush()
        return self._answer("DONE ")

    def stages(self, name):
        self.proc.stdin.write(json.dumps({"stages": name}) + "\n")
        self.proc.stdin.flush()
        return self._answer("DONE ")

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write("{}\n")
            self.proc.stdin.flush()
            self.proc.wait()
        self.log.close()


# ---------------------------------------------------------------------------------------------
# Comparison and table


RUNTIME_LABELS = {"ort-fp32": "ONNX Runtime fp32", "ort-int8-static": "ONNX Runtime int8 static (QDQ)",
                  "ort-int8-dynamic": "ONNX Runtime int8 dynamic", "openvino-fp32": "OpenVINO fp32 (f32 hint)",
                  "openvino-int8": "OpenVINO int8 (the static QDQ file as an IR)"}


def runtime_predictors(model, codec, folder, flip, args):
    """`--runtimes`: the model exported (fp32 ONNX gated equal to PyTorch, the OpenVINO IR gated the
    same way) and quantized (static calibrated on the gate's synthetic crops, dynamic), each as the
    predictor that runs it. Random weights: speed only (the AP cost of int8 is the gate's, on a
    trained model: `vitpose export --precision int8`)."""
    import vitpose.inference.export as E
    from vitpose.data.pixels import normalize_images
    from vitpose.device import default_batch_size
    from vitpose.inference import int8_graph
    from vitpose.inference import quantize as Q
    from vitpose.inference.onnx import OnnxPredictor, OpenVinoPredictor

    spec = E._model_spec(model, codec)
    fp32 = folder / "runtime.onnx"
    E.to_onnx(model, fp32, codec=codec, log=None)
    crops = E.gate_crops(None, spec.input_size)[0]
    calibration = normalize_images(crops, spec.pixel_mean, spec.pixel_std).numpy().astype(np.float32)
    batch = args.batch_size or default_batch_size("cpu")
    found = {"ort-fp32": OnnxPredictor(fp32, flip_test=flip, threads=args.threads, batch_size=batch)}
    # dynamic quantizes the graph `vitpose export --precision int8` writes for it (int8_graph's layout)
    laid_out = folder / "runtime.int8-layout.onnx"
    if int8_graph.available():
        E.to_onnx(model, laid_out, codec=codec, int8_layout=True, log=None)
    for mode in Q.QUANTIZATIONS:
        path = folder / f"runtime.int8.{mode}.onnx"
        Q.quantize_onnx(laid_out if mode == "dynamic" and laid_out.exists() else fp32, path, mode, calibration)
        found[f"ort-int8-{mode}"] = OnnxPredictor(path, flip_test=flip, threads=args.threads, batch_size=batch)
    try:
        E.to_openvino(model, folder / "runtime.xml", codec=codec, log=None)
        found["openvino-fp32"] = OpenVinoPredictor(folder / "runtime.xml", flip_test=flip, threads=args.threads,
                                                   batch_size=batch)
        E.onnx_to_openvino(folder / "runtime.int8.static.onnx", folder / "runtime.int8.xml", fp32)
        found["openvino-int8"] = OpenVinoPredictor(folder / "runtime.int8.xml", flip_test=flip, threads=args.threads,
                                                   batch_size=batch)
    except ImportError as e:
        print(f"note: no OpenVINO row ({e})")
    return found


def run_runtime(predictor, inputs):
    """All images' boxes through an exported file's predictor (`predictor(images, boxes)`, as ours batched)."""
    frames = [cv2.imread(item["path"], cv2.IMREAD_COLOR) for item in inputs]
    poses = predictor(frames, boxes=[np.array(item["boxes_xyxy"], np.float32) for item in inputs], channels="bgr")
    return [(p.keypoints, p.keypoint_scores) for p in poses]


def keypoint_agreement(ours, theirs, min_score=0.3):
    """Distances (px) between ours and their keypoints over the keypoints ours scores above
    `min_score` (median / 99th percentile / max, share within 0.01 px), and max |score diff|, box by box."""
    diffs, score_diffs, confident = [], [], []
    for (kpts, scores), image in zip(ours, theirs):
        other = np.array([k for k, _ in image], np.float64).reshape(kpts.shape)
        other_scores = np.array([s for _, s in image], np.float64).reshape(scores.shape)
        diffs.append(np.linalg.norm(kpts - other, axis=-1).reshape(-1))
        score_diffs.append(np.abs(scores - other_scores).reshape(-1))
        confident.append((np.asarray(scores) > min_score).reshape(-1))
    confident = np.concatenate(confident)
    diffs, score_diffs = np.concatenate(diffs)[confident], np.concatenate(score_diffs)
    if not diffs.size:
        diffs = np.array([np.nan])
    return dict(max_px=float(diffs.max()), within_001=float((diffs <= 0.01).mean()),
                p99_px=float(np.percentile(diffs, 99)), median_px=float(np.median(diffs)),
                max_score=float(score_diffs.max()), confident=int(confident.sum()), total=int(confident.size))


def print_table(rows, people, frames, reference):
    """reference: ours' seconds per round; "x ours" is each row's time over it, round by round."""
    print("\n| implementation | s / pass, median [min-max] over rounds | frames/s | people/s | x ours (time) | decode | "
          "crop | pose | decode heatmaps | other | keypoints vs ours fp32 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, times, stages, agreement in rows:
        t = statistics.median(times)
        relative = spread([a / b for a, b in zip(times, reference)])
        total = sum(stages.values())
        share = {k: 100 * v / total for k, v in stages.items()} if total else {}
        other = sum(v for k, v in share.items() if k not in ("decode", "crop", "pose", "decode heatmaps"))
        agree = ("-" if agreement is None else
                 f"{agreement['confident']} of {agreement['total']} keypoints scored > 0.3: "
                 f"median {agreement['median_px']:.2g} px, 99th percentile {agreement['p99_px']:.3g} px, "
                 f"max {agreement['max_px']:.3g} px, "
                 f"{100 * agreement['within_001']:.1f}% within 0.01 px, "
                 f"scores max {agreement['max_score']:.2g}")
        print(f"| {name} | {spread(times)} | {frames / t:.3f} | {spread([people / x for x in times])} | {relative} | "
              f"{share.get('decode', 0):.0f}% | {share.get('crop', 0):.0f}% | {share.get('pose', 0):.0f}% | "
              f"{share.get('decode heatmaps', 0):.0f}% | {other:.0f}% | {agree} |")


# ---------------------------------------------------------------------------------------------
# Pipeline: threads vs sequential on a synthetic clip


def demo_predictor(flip, device="cpu"):
    """The demo config's small ViTPose (4 blocks, 128x96 crops): a model fast enough on a CPU that
    decoding, drawing and writing are a real share of a frame's time."""
    from vitpose.builders import build_codec, build_model_from_config

    cfg = load_config(REPO / "configs" / "demo.yaml")
    model = draw_weights(build_model_from_config(cfg.model)).eval()
    return Predictor(model, codec=build_codec(cfg.model), device=device, flip_test=flip)


def bench_pipeline(predictors, args, folder):
    from vitpose.inference.video import run_video

    path = folder / "clip.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 25.0, (640, 480))
    rng = np.random.default_rng(0)
    background = cv2.GaussianBlur(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8), (0, 0), 5)
    for f in range(args.pipeline_frames):
        frame = background.copy()
        for p in range(2):
            x = 60 + 200 * p + 4 * f
            cv2.rectangle(frame, (x, 100), (x + 80, 380), (40 + 100 * p, 200, 90), -1)
        writer.write(frame)
    writer.release()
    boxes = folder / "clip_boxes.json"
    boxes.write_text(json.dumps([{"frame": f, "bbox": [60 + 200 * p + 4 * f - 10, 90, 100, 300], "score": 0.9}
                                 for f in range(args.pipeline_frames) for p in range(2)]))
    print(f"\nvideo pipeline (vitpose.inference.video.run_video), {args.pipeline_frames} frames 640x480 mp4, 2 boxes per "
          f"frame from a file, --track --out --json, {args.batch_frames} frames per model batch, best of 2 runs "
          f"each, alternating:")
    for label, predictor in predictors:
        results = {}
        for pipeline in ("sequential", "threads", "sequential", "threads"):
            ns = argparse.Namespace(out=str(folder / f"out_{pipeline}"), json=str(folder / f"{pipeline}.json"),
                                    track=True, smooth=False, boxes=str(boxes), pipeline=pipeline, progress=False, quiet=True,
                                    batch_frames=args.batch_frames)
            results.setdefault(pipeline, []).append(run_video(predictor, str(path), ns))
        best = {k: min(v, key=lambda s: s.wall_seconds) for k, v in results.items()}
        print(f"  {label}: threads {best['threads'].frames_per_second:.2f} frames/s, sequential "
              f"{best['sequential'].frames_per_second:.2f} frames/s "
              f"({best['sequential'].wall_seconds / best['threads'].wall_seconds:.2f}x)")
        for pipeline, summary in best.items():
            total = sum(summary.stage_seconds.values())
            print(f"    {pipeline:10s} {summary.wall_seconds:.2f} s wall; stage time "
                  + ", ".join(f"{k} {v:.2f} s ({100 * v / total:.0f}%)" for k, v in summary.stage_seconds.items()))


# ---------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vitpose-s")
    parser.add_argument("--decoder", default="classic", choices=["classic", "simple"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu | cuda (GPU figures: ours warps crops on the GPU)")
    parser.add_argument("--repeats", type=int, default=5, help="alternating rounds (default %(default)s)")
    parser.add_argument("--config", default=None, help="config of a trained model (with --weights)")
    parser.add_argument("--weights", default=None, help="trained weights (with --config): agreement then means something")
    parser.add_argument("--data-root", default=None, help="COCO-layout root: its val2017 images and detections "
                        "(default: coco-mini)")
    parser.add_argument("--max-images", type=int, default=None, help="the first N coco-mini images only")
    parser.add_argument("--max-boxes", type=int, default=None, help="the first N boxes of each image only")
    parser.add_argument("--no-flip", action="store_true", help="single forward (default: flip test, as ViTPose)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="boxes per forward pass for ours (default: Predictor's, 8 on a CPU, 32 on a GPU)")
    parser.add_argument("--peers", nargs="*", default=["hf", "mmpose"], choices=["hf", "mmpose"])
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--control", action="store_true",
                        help="also time ours (Predictor.predict) inside the peers' process and venv")
    parser.add_argument("--default-allocator", action="store_true",
                        help="leave glibc's malloc as it comes for ours (default: tune_cpu_allocator(), as "
                             "`vitpose predict` and evaluate.py do on a CPU)")
    parser.add_argument("--tune-peers", action="store_true",
                        help="the peers' process with the same malloc setting (vitpose.device.allocator_environment()): "
                             "ours vs the peers as if they did what we do")
    parser.add_argument("--amp", action="store_true", help="add a bf16-autocast run of ours (always without peers)")
    parser.add_argument("--runtimes", action="store_true",
                        help="add ours through exported files: ONNX Runtime fp32, int8 static and dynamic "
                             "(vitpose.inference.quantize), OpenVINO fp32 (OnnxPredictor / OpenVinoPredictor)")
    parser.add_argument("--pipeline", action="store_true", help="also time the video pipeline, threads vs sequential")
    parser.add_argument("--video", action="store_true",
                        help="also the video row: frames/s with --det-every 1 and 5 (benchmarks/bench_det_every.py; "
                             "needs a trained model: --config and --weights)")
    parser.add_argument("--pipeline-frames", type=int, default=24)
    parser.add_argument("--batch-frames", type=int, default=8)
    peer_speed.add_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.speed_peers:  # its own contestants and table: ours int8 against rtmlib and Ultralytics
        return peer_speed.run(args, draw_weights, COCO_MINI)
    flip = not args.no_flip
    if (args.config is None) != (args.weights is None):
        raise SystemExit("--config and --weights go together (a trained model of that config)")
    if args.video and args.weights is None:
        raise SystemExit("--video needs a trained model (--config and --weights): its keypoints carry the people")
    if args.config is not None and not args.no_peers:
        cfg = load_config(args.config)
        why_not = peers_cannot_run(cfg, args.config)
        if why_not:
            print(f"note: the peers build the published ViTPose shapes only, and {why_not}: ours only (fp32 vs bf16)")
            args.no_peers = True
        else:  # a published shape (e.g. configs/demo_vitpose-s.yaml): the peers get the trained weights
            args.model, args.decoder = cfg.model.name, cfg.model.decoder
    if not args.no_peers and not MMPOSE_PY.exists():
        print(f"note: MMPose reference venv not found ({MMPOSE_PY}); ours only (fp32 vs bf16)")
        args.no_peers = True
    args.amp = args.amp or args.no_peers
    tuned = not args.default_allocator and tune_cpu_allocator(args.device)
    allocator_note = (f"malloc: ours {'tuned (tune_cpu_allocator, as vitpose predict)' if tuned else 'glibc default'}"
                      f"{'' if args.no_peers else ', peers ' + ('tuned' if args.tune_peers else 'glibc default')}")
    inputs = load_inputs(args.max_images, args.max_boxes, args.data_root)
    people = sum(len(item["boxes_xywh"]) for item in inputs)
    frames = len(inputs)
    model_label = args.config if args.config is not None else f"{args.model} {args.decoder}"
    source = "coco-mini" if args.data_root is None else f"{args.data_root} val2017"
    print(f"{model_label}, flip test {'on' if flip else 'off'}, {frames} {source} images, {people} "
          f"boxes, {args.device}, {args.threads} torch threads, warm-up until steady then {args.repeats} alternating "
          f"rounds, torch {torch.__version__}, OpenCV {cv2.__version__}; {allocator_note}; {load_note()}")
    print(cpu_note())

    if args.config is not None:
        trained = Predictor.from_config(args.config, args.weights, device=args.device, flip_test=flip,
                                        batch_size=args.batch_size)
        model, codec = trained.model, trained.codec
        print(f"trained model: {args.config} with {args.weights}")
    else:
        model, codec = draw_weights(build_model(args.model, args.decoder)).eval(), None
    predictor = Predictor(model, device=args.device, flip_test=flip, batch_size=args.batch_size, codec=codec)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = {}
        if not args.no_peers:
            files = write_weights(model, args.model, args.decoder, folder)
            files["check"] = write_weights_check(model, inputs, folder)
        ours_predict = run_ours_predict(predictor, inputs)
        ours_batched = run_ours_batched(predictor, inputs, flip=flip)
        # Per image and batched over images cut the crops into other batches; on AVX2-only CPUs
        # oneDNN and MKL pick other kernels by batch size (~1e-6 relative), so report, not assert.
        same = [np.array_equal(a, b) and np.array_equal(sa, sb) for (a, sa), (b, sb) in zip(ours_predict, ours_batched)]
        if not all(same):
            print(f"note: batched keypoints equal predict's on {sum(same)} of {len(same)} images "
                  f"(other crop batches: other kernels on this CPU)")

        runners = {"ours-predict": lambda: run_ours_predict(predictor, inputs),
                   "ours-batched": lambda: run_ours_batched(predictor, inputs, flip=flip)}
        amp_keypoints = None
        if args.amp:
            amp = Predictor(model, device=args.device, flip_test=flip, batch_size=args.batch_size, codec=codec,
                            precision="bf16")
            amp_keypoints = run_ours_batched(amp, inputs, flip=flip)
            runners["ours-bf16"] = lambda: run_ours_batched(amp, inputs, flip=flip)
        runtimes = runtime_predictors(model, codec, folder, flip, args) if args.runtimes else {}
        runtime_keypoints = {}
        for name, runtime in runtimes.items():
            runtime_keypoints[name] = run_runtime(runtime, inputs)
            runners[name] = lambda runtime=runtime: run_runtime(runtime, inputs)
        peers = None if args.no_peers else Peers(args, files, inputs, folder)
        try:
            for name in ([] if peers is None else args.peers + (["control"] if args.control else [])):
                runners[name] = lambda name=name: peers.time(name)
            # Warm-up until steady, then rounds in alternating order: the machine's drift (other
            # jobs) spreads over all implementations, and ratios are taken within a round.
            warmed = {name: warm_up(run, max_steps=10) for name, run in runners.items()}
            print("warm-up passes until steady: " + ", ".join(f"{k} {v}" for k, v in warmed.items()), flush=True)
            times = alternate(runners, args.repeats, report=lambda line: print(line, flush=True))
            peer_stages = {} if peers is None else {name: peers.stages(name) for name in args.peers}
        finally:
            if peers is not None:
                peers.close()

        rows = []
        stages = StageTimer()
        restore = instrument_predictor(predictor, stages)
        try:
            run_ours_predict(predictor, inputs, stages)
        finally:
            restore()
        rows.append(("ours, Predictor.predict per image", times["ours-predict"], stages.seconds, None))
        stages = StageTimer()
        run_ours_batched(predictor, inputs, stages, flip=flip)
        rows.append(("ours, batched over images + reader thread", times["ours-batched"], stages.seconds, None))
        labels = {"hf": "HF transformers {version} ({attn} attention)", "mmpose": "MMPose {version} inference_topdown"}
        for name in peer_stages:
            res = peers.ready[name]
            rows.append((labels[name].format(**res), times[name], peer_stages[name],
                         keypoint_agreement(ours_predict, res["keypoints"])))
            print(f"weights check, {name} model on our normalised crops: max |heatmap diff| {res['weights_check']:.2g}")
        if args.control and peers is not None:
            control = peers.ready["control"]["keypoints"]
            rows.append(("control: ours, predict, in the peers' process and venv", times["control"], {},
                         keypoint_agreement(ours_predict, control)))
        if amp_keypoints is not None:
            stages = StageTimer()
            run_ours_batched(amp, inputs, stages, flip=flip)
            as_lists = [[[k.tolist(), s.tolist()] for k, s in zip(*image)] for image in amp_keypoints]
            rows.append(("ours, batched, bf16 autocast", times["ours-bf16"], stages.seconds,
                         keypoint_agreement(ours_predict, as_lists)))
        for name, found in runtime_keypoints.items():
            as_lists = [[[k.tolist(), s.tolist()] for k, s in zip(*image)] for image in found]
            rows.append((f"ours, {RUNTIME_LABELS[name]}", times[name], {}, keypoint_agreement(ours_predict, as_lists)))
        best = "ours-predict" if statistics.median(times["ours-predict"]) < statistics.median(times["ours-batched"]) \
            else "ours-batched"
        print_table(rows, people, frames, times[best])
        print(f"\nafter: {load_note()}")
        if amp_keypoints is not None:
            print(f"ours bf16 vs ours fp32 (batched), speed-up per round: "
                  f"{spread(ratios(times, 'ours-batched', 'ours-bf16'))}")
        if peer_stages:
            fastest = min(peer_stages, key=lambda name: statistics.median(times[name]))
            print(f"ours fp32 ({best}) vs the faster peer ({fastest}), speed-up per round: "
                  f"{spread(ratios(times, fastest, best))} (goal >= 1.2x at fp32)")
            for name in runtime_keypoints:
                print(f"ours {RUNTIME_LABELS[name]} vs the faster peer ({fastest}), speed-up per round: "
                      f"{spread(ratios(times, fastest, name))}")
            if amp_keypoints is not None:
                print(f"ours bf16 vs the faster peer ({fastest}), speed-up per round: "
                      f"{spread(ratios(times, fastest, 'ours-bf16'))} (goal >= 2x where bf16 is native; "
                      f"its AP cost: benchmarks/precision_gate.py)")
        if args.video:
            import bench_det_every

            print("\nvideo (benchmarks/bench_det_every.py, the same trained model):", flush=True)
            bench_det_every.main(["--model", args.weights, "--threads", str(args.threads), "--every", "5"])
        if args.pipeline:
            bench_pipeline([(f"{args.model} {args.decoder}", predictor),
                            ("demo config (4-block ViT, 128x96 crops)", demo_predictor(flip, args.device))], args, folder)


if __name__ == "__main__":
    main()
