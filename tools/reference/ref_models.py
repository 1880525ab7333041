"""ViTPose-S in MMPose 1.3.2: the weight key specs, the eval-mode outputs of both decoders, one
train-mode step and the layer-decay optimizer groups (tests/fixtures/README.md §1, §2, §4.7-4.12).

The weights are the numpy recipe of tests/weights_recipe.py (seed 7) loaded strictly into
`init_model(config)`: no checkpoint is involved anywhere.
"""

import contextlib
import copy
import io
import json
import os.path as osp
import re

import cases as case_recipes
import mmpose
import numpy as np
import ref_geometry
import ref_hf
import torch
from common import (
    CONFIGS,
    FLIP_INDICES,
    HEATMAP_SIZE,
    INPUT_SIZE,
    WEIGHTS_SEED,
    load_cases,
    load_spec,
    make_weights,
    normalize_crops,
    save_npz,
    spec_digest,
    write_json,
)
from fixture_files import MEAN_RGB, STD_RGB
from mmengine.config import Config
from mmengine.structures import InstanceData, PixelData
from mmpose.apis import init_model
from mmpose.codecs import UDPHeatmap
from mmpose.structures import PoseDataSample
from mmpose.utils import register_all_modules

REAL_INSTANCE, REAL_IMAGE = 437295, 197388
TRAIN_INSTANCES = (230195, 1717641, 531914)
INPUT_NAMES = ("randn", "uniform_pixels", "real_coco")
FULL_GRADIENTS = ("head.final_layer.bias", "backbone.ln1.weight", "head.deconv_layers.4.weight")
HEAD_BATCHNORMS = ("head.deconv_layers.1", "head.deconv_layers.4")
# What the committed (compact) files keep of the eval outputs: every input of the classic
# decoder (test_geometry decodes all of them); the backbone features, the simple decoder and the
# HF heatmaps of the real crop only (the HF differences of all inputs stay); the first
# instance's heatmaps of the train step.
COMPACT_FEATURE_INPUTS = ("real_coco",)
COMPACT_SIMPLE_INPUTS = ("real_coco",)
COMPACT_HF_INPUTS = ("real_coco",)
COMPACT_TRAIN_HEATMAPS = 1

IO_NOTES = (
    "Weights = make_weights(weights_spec, seed) (tests/weights_recipe.py) loaded strictly into "
    "init_model(config), model.eval(). Per input <name>/: input (1,3,256,192) normalized RGB (stored as "
    "<name>/input_uint8_bgr pixels or float16 values where that is exact: tests/fixture_files.py expands "
    "them); backbone_feat (1,384,16,12) = backbone output (after the final LayerNorm, before any neck); "
    "heatmaps (1,17,64,48) = head(neck(backbone(x))); flip_test_heatmaps = the TopdownPoseEstimator.predict "
    "flip test, (heatmaps + hm_flip.flip(-1)[:, flip_indices]) * 0.5 in float32 (shift_heatmap=False); "
    "flip_test_keypoints_img/noflip_keypoints_img (1,17,2) float64 and *_scores (1,17) = predict(): UDP "
    "decode, then kpt/input_size*input_scale + input_center - 0.5*input_scale. batch3/max_abs_diff_vs_single: "
    "the three inputs as one batch vs one at a time. loss/*: HeatmapHead.loss in eval mode on real_coco with "
    "UDP targets. Inputs: randn = N(0,1) rounded to multiples of 1/64; uniform_pixels = uniform random pixel "
    "values 0..255, normalized like the crops; real_coco = the val-pipeline crop of GT instance "
    "real_instance_id. Made by tools/reference/make_fixtures.py (ref_models.py).")
TRAIN_NOTES = (
    "Classic ViTPose-S built from the config with backbone drop_path_rate=0, weights = make_weights(spec, "
    "seed), model.train() (BatchNorm uses batch statistics and updates its running stats, momentum 0.1). "
    "inputs (3,3,256,192) = the val-pipeline crops of GT instances instance_ids, normalized (stored as "
    "inputs_uint8_bgr); target_heatmaps/keypoint_weights = UDPHeatmap(sigma 2) encode of their transformed "
    "keypoints. One TopdownPoseEstimator.loss(inputs, data_samples) call, then loss_kpt.backward(). heatmaps "
    "= the train-mode head output of that call ({heatmap_note}); loss_kpt, acc_pose as reported; "
    "grad_norms_json: {{MMPose 1.x parameter name: L2 norm of its .grad}}; grad_total_norm = L2 norm of those "
    "norms; grad/<name>: three full gradients; bn_after/*: head BatchNorm buffers after the forward. Made by "
    "tools/reference/make_fixtures.py (ref_models.py).")


# ----------------------------------------------------------------------------- building models

def mmpose_config(decoder, drop_path_rate=None):
    """The ViTPose-S config of one decoder with random init switched off."""
    register_all_modules()
    cfg = Config.fromfile(osp.join(osp.dirname(mmpose.__file__), ".mim", "configs", CONFIGS[decoder]))
    cfg.model.backbone.init_cfg = None
    if drop_path_rate is not None:
        cfg.model.backbone.drop_path_rate = drop_path_rate
    return cfg


def recipe_weights(spec_dir, decoder):
    spec = load_spec(spec_dir, decoder, "mmpose1x")
    weights = make_weights(spec, WEIGHTS_SEED)
    return spec, weights


def build_mmpose_model(spec_dir, decoder, drop_path_rate=None):
    """(model in eval mode with the recipe weights, spec, weights) of one decoder."""
    model = init_model(mmpose_config(decoder, drop_path_rate), checkpoint=None, device="cpu")
    spec, weights = recipe_weights(spec_dir, decoder)
    model.load_state_dict({name: torch.from_numpy(array) for name, array in weights.items()}, strict=True)
    return model.eval(), spec, weights


# ----------------------------------------------------------------------------- key specs

def _kind(name, norm_modules):
    if name.endswith("num_batches_tracked"):
        return "count"
    if name.endswith("running_mean"):
        return "bn_mean"
    if name.endswith("running_var"):
        return "bn_var"
    if name.endswith("pos_embed"):
        return "pos_embed"
    if name.endswith(".bias"):
        return "bias"
    if name.rsplit(".", 1)[0] in norm_modules:
        return "norm_weight"
    return "weight"


def mmpose_spec(model):
    """The recipe key spec of an MMPose model: its state_dict order, shapes, dtypes and kinds."""
    norms = {name for name, module in model.named_modules()
             if isinstance(module, (torch.nn.LayerNorm, torch.nn.modules.batchnorm._BatchNorm))}
    return [{"name": name, "shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch."),
             "kind": _kind(name, norms)} for name, tensor in model.state_dict().items()]


# MMPose 1.x name -> official ViTPose (mmpose 0.x) name, applied in order.
OFFICIAL_RENAMES = [
    (r"^backbone\.patch_embed\.projection\.", "backbone.patch_embed.proj."),
    (r"^backbone\.layers\.(\d+)\.ln1\.", r"backbone.blocks.\1.norm1."),
    (r"^backbone\.layers\.(\d+)\.ln2\.", r"backbone.blocks.\1.norm2."),
    (r"^backbone\.layers\.(\d+)\.ffn\.layers\.0\.0\.", r"backbone.blocks.\1.mlp.fc1."),
    (r"^backbone\.layers\.(\d+)\.ffn\.layers\.1\.", r"backbone.blocks.\1.mlp.fc2."),
    (r"^backbone\.layers\.(\d+)\.attn\.", r"backbone.blocks.\1.attn."),
    (r"^backbone\.ln1\.", "backbone.last_norm."),
    (r"^head\.", "keypoint_head."),
]
# HF transformers name -> MMPose 1.x name, applied in order (q/k/v handled separately).
HF_TO_MMPOSE = [
    (r"^backbone\.embeddings\.patch_embeddings\.projection\.", "backbone.patch_embed.projection."),
    (r"^backbone\.encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"backbone.layers.\1.attn.proj."),
    (r"^backbone\.encoder\.layer\.(\d+)\.mlp\.fc1\.", r"backbone.layers.\1.ffn.layers.0.0."),
    (r"^backbone\.encoder\.layer\.(\d+)\.mlp\.fc2\.", r"backbone.layers.\1.ffn.layers.1."),
    (r"^backbone\.encoder\.layer\.(\d+)\.layernorm_before\.", r"backbone.layers.\1.ln1."),
    (r"^backbone\.encoder\.layer\.(\d+)\.layernorm_after\.", r"backbone.layers.\1.ln2."),
    (r"^backbone\.layernorm\.", "backbone.ln1."),
    (r"^head\.deconv1\.", "head.deconv_layers.0."),
    (r"^head\.batchnorm1\.", "head.deconv_layers.1."),
    (r"^head\.deconv2\.", "head.deconv_layers.3."),
    (r"^head\.batchnorm2\.", "head.deconv_layers.4."),
    (r"^head\.conv\.", "head.final_layer."),
]
QKV = {"query": 0, "key": 1, "value": 2}


def _rename(name, rules):
    for pattern, replacement in rules:
        name = re.sub(pattern, replacement, name)
    return name


def official_spec(spec):
    out = []
    for entry in spec:
        name = _rename(entry["name"], OFFICIAL_RENAMES)
        shape, op = list(entry["shape"]), "copy"
        if entry["name"] == "backbone.pos_embed":
            shape[1] += 1  # the official ViT keeps a (zero here) row for the class token
            op = "prepend_zero_token"
        out.append({**{k: entry[k] for k in ("dtype", "kind")}, "name": name, "shape": shape, "src": entry["name"],
                    "op": op})
    return [_ordered(e) for e in out]


def hf_spec(spec, hf_state_dict):
    """The HF layout in HF state_dict order, each entry pointing at its MMPose 1.x source."""
    by_name = {entry["name"]: entry for entry in spec}
    out = []
    for name, tensor in hf_state_dict.items():
        entry = {"name": name, "shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch.")}
        qkv = re.match(r"^backbone\.encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(weight|bias)$",
                       name)
        if name == "backbone.embeddings.position_embeddings":
            entry.update(src="backbone.pos_embed", op="prepend_zero_token")
        elif qkv:
            layer, part, leaf = qkv.groups()
            width = tensor.shape[0]
            entry.update(src=f"backbone.layers.{layer}.attn.qkv.{leaf}", op="rows",
                         rows=[QKV[part] * width, (QKV[part] + 1) * width])
        else:
            entry.update(src=_rename(name, HF_TO_MMPOSE), op="copy")
        if entry["src"] not in by_name:
            raise KeyError(f"HF tensor {name}: no MMPose source {entry['src']}")
        entry["kind"] = by_name[entry["src"]]["kind"]
        out.append(_ordered(entry))
    return out


def _ordered(entry):
    keys = ("name", "shape", "dtype", "kind", "src", "op", "rows")
    return {key: entry[key] for key in keys if key in entry}


def write_spec_file(path, spec):
    path.write_text("[\n" + ",\n".join(json.dumps(entry) for entry in spec) + "\n]\n")


def write_specs(out_dir):
    """weights_spec_{classic,simple}_{mmpose1x,official0x,hf}.json from the MMPose and HF models."""
    written = []
    for decoder in ("classic", "simple"):
        model = init_model(mmpose_config(decoder), checkpoint=None, device="cpu")
        spec = mmpose_spec(model)
        hf_model = ref_hf.build_hf_model(decoder)
        for layout, entries in (("mmpose1x", spec), ("official0x", official_spec(spec)),
                                ("hf", hf_spec(spec, hf_model.state_dict()))):
            name = f"weights_spec_{decoder}_{layout}.json"
            write_spec_file(out_dir / name, entries)
            written.append(name)
    return written


# ----------------------------------------------------------------------------- eval outputs

def model_inputs(cases_dir, crops_by_id, real_box):
    """{name/input (float32 normalised), name/input_center|input_scale} and the compact forms.

    Returns:
        (inputs, stored): `inputs` as the model sees them; `stored` = what the compact file keeps
        (uint8 pixels / float16 values), checked to expand back to `inputs` bit for bit.
    """
    loaded = load_cases(cases_dir, "model_vitpose_s_io.npz")
    drawn = case_recipes.draw_model_inputs() if loaded is None else dict(loaded[0])
    real_crop = crops_by_id[REAL_INSTANCE][None]
    inputs, stored = {}, {}
    for name in ("randn", "uniform_pixels"):
        for key in ("input_center", "input_scale"):
            inputs[f"{name}/{key}"] = drawn[f"{name}/{key}"]
    inputs["randn/input"] = drawn["randn/input"].astype(np.float32)
    stored["randn/input"] = inputs["randn/input"].astype(np.float16)
    if "uniform_pixels/input_uint8_bgr" in drawn:
        pixels = drawn["uniform_pixels/input_uint8_bgr"]
    else:  # a full set stores the normalised input: recover its pixels
        rgb = drawn["uniform_pixels/input"] * STD_RGB[:, None, None] + MEAN_RGB[:, None, None]
        pixels = np.round(rgb[:, ::-1]).astype(np.uint8)
    stored["uniform_pixels/input_uint8_bgr"] = pixels
    inputs["uniform_pixels/input"] = normalize_crops(pixels)
    stored["real_coco/input_uint8_bgr"] = real_crop
    inputs["real_coco/input_center"], inputs["real_coco/input_scale"] = real_box
    inputs["real_coco/input"] = normalize_crops(real_crop)
    for key, value in stored.items():
        model_key = key.removesuffix("_uint8_bgr")
        expanded = normalize_crops(value) if key != model_key else value.astype(np.float32)
        assert np.array_equal(expanded, inputs[model_key]), f"{key} does not expand back to the model input"
        if model_key in drawn:  # the cases carry this input themselves: it must not have changed
            assert np.array_equal(inputs[model_key], drawn[model_key]), f"{model_key} differs from the cases"
    return inputs, stored


def _data_sample(center, scale):
    """The metadata predict() reads: the box the keypoints map into, the flip pairs."""
    sample = PoseDataSample(metainfo={"input_size": INPUT_SIZE, "input_center": center, "input_scale": scale,
                                      "flip_indices": FLIP_INDICES})
    sample.gt_instances = InstanceData(bboxes=np.zeros((1, 4), np.float32), bbox_scores=np.ones(1, np.float32))
    return sample


def _predict(model, x, center, scale, flip_test):
    """(image keypoints, scores, heatmaps) of MMPose's predict() with or without the flip test."""
    test_cfg = {"flip_test": flip_test, "flip_mode": "heatmap", "shift_heatmap": False, "output_heatmaps": True}
    model.test_cfg = dict(test_cfg)
    model.head.test_cfg = dict(test_cfg)
    with torch.no_grad():
        result = model.predict(x, [_data_sample(center, scale)])[0]
    heatmaps = result.pred_fields.heatmaps
    heatmaps = heatmaps.numpy() if torch.is_tensor(heatmaps) else np.asarray(heatmaps)
    return result.pred_instances.keypoints, result.pred_instances.keypoint_scores, heatmaps[None]


def _check_preprocessor(model, crop):
    """MMPose's PoseDataPreprocessor must give normalize_crops' input bit for bit."""
    packed = model.data_preprocessor({"inputs": [torch.from_numpy(crop[0])], "data_samples": [PoseDataSample()]})
    assert torch.equal(packed["inputs"], torch.from_numpy(normalize_crops(crop))), "normalisation differs"


def _eval_loss(model, x, transformed_keypoints, keypoints_visible):
    codec = UDPHeatmap(input_size=INPUT_SIZE, heatmap_size=HEATMAP_SIZE, sigma=2)
    target = codec.encode(transformed_keypoints[None], keypoints_visible[None])
    sample = PoseDataSample()
    sample.gt_fields = PixelData(heatmaps=torch.from_numpy(target["heatmaps"]))
    sample.gt_instance_labels = InstanceData(keypoint_weights=torch.from_numpy(target["keypoint_weights"]))
    with torch.no_grad():
        losses = model.head.loss(model.extract_feat(x), [sample], train_cfg={})
    return {"loss/target_heatmaps": target["heatmaps"], "loss/keypoint_weights": target["keypoint_weights"],
            "loss/loss_kpt": np.float32(losses["loss_kpt"].item()), "loss/acc_pose": np.float32(losses["acc_pose"].item())}


def eval_outputs(model, inputs, with_features):
    arrays = {}
    singles = []
    for name in INPUT_NAMES:
        x = torch.from_numpy(inputs[f"{name}/input"])
        center, scale = inputs[f"{name}/input_center"], inputs[f"{name}/input_scale"]
        with torch.no_grad():
            heatmaps = model(x, None, mode="tensor")
            if with_features:
                arrays[f"{name}/backbone_feat"] = model.backbone(x)[-1].numpy()
        singles.append(heatmaps)
        flip_keypoints, flip_scores, flip_heatmaps = _predict(model, x, center, scale, flip_test=True)
        noflip_keypoints, noflip_scores, noflip_heatmaps = _predict(model, x, center, scale, flip_test=False)
        assert np.array_equal(noflip_heatmaps, heatmaps.numpy()), "predict() heatmaps differ from forward()"
        arrays.update({f"{name}/heatmaps": heatmaps.numpy(), f"{name}/flip_test_heatmaps": flip_heatmaps,
                       f"{name}/flip_test_keypoints_img": flip_keypoints, f"{name}/flip_test_scores": flip_scores,
                       f"{name}/noflip_keypoints_img": noflip_keypoints, f"{name}/noflip_scores": noflip_scores,
                       f"{name}/input_center": center, f"{name}/input_scale": scale})
    batch = torch.cat([torch.from_numpy(inputs[f"{name}/input"]) for name in INPUT_NAMES])
    with torch.no_grad():
        together = model(batch, None, mode="tensor")
    arrays["batch3/max_abs_diff_vs_single"] = np.float32((together - torch.cat(singles)).abs().max().item())
    return arrays


def _io_info(decoder, spec, weights, inputs_note):
    return {"seed": WEIGHTS_SEED, "decoder": decoder, "mmpose_config": CONFIGS[decoder].rsplit("/", 1)[-1],
            "weights_spec": f"weights_spec_{decoder}_mmpose1x.json", "weights_sha256": spec_digest(weights, spec),
            "n_tensors": len(spec),
            "n_float_params": int(sum(w.size for w in weights.values() if w.dtype == np.float32)),
            "names": list(INPUT_NAMES), "real_instance_id": REAL_INSTANCE, "real_image_id": REAL_IMAGE,
            "notes": IO_NOTES + inputs_note}


def _real_instance(pipeline_arrays, crops_by_id, instance_id):
    index = pipeline_arrays["id"].tolist().index(instance_id)
    return (crops_by_id[instance_id], pipeline_arrays["transformed_keypoints"][index],
            pipeline_arrays["keypoints_visible"][index])


def _compact_io(arrays, decoder):
    """The committed subset of one decoder's eval outputs (COMPACT_* above)."""
    if decoder == "classic":
        return {key: value for key, value in arrays.items()
                if not key.endswith("/backbone_feat") or key.split("/")[0] in COMPACT_FEATURE_INPUTS}
    return {key: value for key, value in arrays.items()
            if key.split("/")[0] not in INPUT_NAMES or key.split("/")[0] in COMPACT_SIMPLE_INPUTS}


SIMPLE_NOTE = (" Simple decoder: neck = ReLU + bilinear x4 (align_corners=False), head = 3x3 conv (padding 1) to 17 "
               "channels. Inputs and backbone features are those of model_vitpose_s_io.npz (same seed, and the "
               "backbone entries come first in both specs, so the backbone tensors are identical).")
IO_FILES = {"classic": ("model_vitpose_s_io.npz", "hf_vitpose_s_io.npz"),
            "simple": ("model_vitpose_s_simple_io.npz", "hf_vitpose_s_simple_io.npz")}


def write_models(out_dir, cases_dir, coco_mini, compact):
    """model_vitpose_s_io.npz, model_vitpose_s_simple_io.npz and the two HF files."""
    pipeline_arrays, _, crops_by_id = ref_geometry.make_pipeline_val(coco_mini, ref_geometry.val_pipeline_config(),
                                                                     compact=True)
    index = pipeline_arrays["id"].tolist().index(REAL_INSTANCE)
    real_box = pipeline_arrays["input_center"][index], pipeline_arrays["input_scale"][index]
    inputs, stored = model_inputs(cases_dir, crops_by_id, real_box)
    _, transformed, visible = _real_instance(pipeline_arrays, crops_by_id, REAL_INSTANCE)
    written = []
    for decoder, (file_name, hf_file_name) in IO_FILES.items():
        model, spec, weights = build_mmpose_model(out_dir, decoder)
        _check_preprocessor(model, crops_by_id[REAL_INSTANCE][None])
        arrays = eval_outputs(model, inputs, with_features=decoder == "classic")
        arrays.update(_eval_loss(model, torch.from_numpy(inputs["real_coco/input"]), transformed, visible))
        if decoder == "classic":
            arrays.update(stored if compact else {f"{n}/input": inputs[f"{n}/input"] for n in INPUT_NAMES})
        keep = COMPACT_HF_INPUTS if compact else INPUT_NAMES
        hf_arrays, hf_info = ref_hf.hf_outputs(decoder, out_dir, weights, inputs, arrays, INPUT_NAMES, keep)
        info = _io_info(decoder, spec, weights, SIMPLE_NOTE if decoder == "simple" else "")
        if compact:
            arrays = _compact_io(arrays, decoder)
            if decoder == "simple":
                info["names"] = list(COMPACT_SIMPLE_INPUTS)
        save_npz(out_dir / file_name, arrays, info)
        save_npz(out_dir / hf_file_name, hf_arrays, hf_info)
        written += [file_name, hf_file_name]
    return written


# ----------------------------------------------------------------------------- one train step

def write_train(out_dir, cases_dir, coco_mini, compact):
    pipeline_arrays, _, crops_by_id = ref_geometry.make_pipeline_val(coco_mini, ref_geometry.val_pipeline_config(),
                                                                     compact=True)
    loaded = load_cases(cases_dir, "model_vitpose_s_train.npz")
    instance_ids = tuple(loaded[0]["instance_ids"].tolist()) if loaded else TRAIN_INSTANCES
    crops, samples = [], []
    codec = UDPHeatmap(input_size=INPUT_SIZE, heatmap_size=HEATMAP_SIZE, sigma=2)
    for instance_id in instance_ids:
        crop, transformed, visible = _real_instance(pipeline_arrays, crops_by_id, instance_id)
        target = codec.encode(transformed[None], visible[None])
        sample = PoseDataSample()
        sample.gt_fields = PixelData(heatmaps=torch.from_numpy(target["heatmaps"]))
        sample.gt_instance_labels = InstanceData(keypoint_weights=torch.from_numpy(target["keypoint_weights"]))
        crops.append(crop)
        samples.append(sample)
    crops = np.stack(crops)
    inputs = normalize_crops(crops)
    if loaded:
        assert np.array_equal(inputs, loaded[0]["inputs"]), "the train inputs differ from the cases"

    model, spec, weights = build_mmpose_model(out_dir, "classic", drop_path_rate=0.0)
    model.train()
    # HeatmapHead.loss calls self.forward() directly: wrap that method for this one call to
    # record the heatmaps the loss was computed from.
    captured, head_forward = [], model.head.forward

    def recording_forward(feats):
        heatmaps = head_forward(feats)
        captured.append(heatmaps.detach().clone())
        return heatmaps

    model.head.forward = recording_forward
    losses = model.loss(torch.from_numpy(inputs), samples)
    del model.head.forward
    losses["loss_kpt"].backward()
    (heatmaps,) = captured

    norms = {name: float(p.grad.norm().item()) for name, p in model.named_parameters()}
    parameters = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    arrays = {
        "inputs_uint8_bgr" if compact else "inputs": crops if compact else inputs,
        "instance_ids": np.array(instance_ids, np.int64),
        "target_heatmaps": torch.stack([s.gt_fields.heatmaps for s in samples]).numpy(),
        "keypoint_weights": torch.cat([s.gt_instance_labels.keypoint_weights for s in samples]).numpy(),
        "heatmaps": heatmaps.numpy()[:COMPACT_TRAIN_HEATMAPS] if compact else heatmaps.numpy(),
        "loss_kpt": np.float32(losses["loss_kpt"].item()), "acc_pose": np.float32(losses["acc_pose"].item()),
        "grad_total_norm": np.float32(np.linalg.norm(np.array(list(norms.values()), np.float64))),
        "grad_norms_json": np.array(json.dumps(norms)),
    }
    for name in FULL_GRADIENTS:
        arrays[f"grad/{name}"] = parameters[name].grad.numpy()
    for bn in HEAD_BATCHNORMS:
        for leaf in ("running_mean", "running_var", "num_batches_tracked"):
            arrays[f"bn_after/{bn}.{leaf}"] = buffers[f"{bn}.{leaf}"].numpy()
    heatmap_note = ("the first instance only" if compact else "all instances")
    info = {"seed": WEIGHTS_SEED, "weights_spec": "weights_spec_classic_mmpose1x.json",
            "weights_sha256": spec_digest(weights, spec), "notes": TRAIN_NOTES.format(heatmap_note=heatmap_note)}
    save_npz(out_dir / "model_vitpose_s_train.npz", arrays, info)
    return ["model_vitpose_s_train.npz"]


# ----------------------------------------------------------------------------- optimizer groups

def write_llrd(out_dir):
    """llrd_vitpose_s.json: lr and weight decay of every parameter from MMPose's layer-decay constructor."""
    from mmengine.optim import build_optim_wrapper

    cfg = mmpose_config("classic")
    model = init_model(cfg, checkpoint=None, device="cpu")
    with contextlib.redirect_stdout(io.StringIO()):  # the constructor prints its paramwise_cfg
        wrapper = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    params = {}
    for group in wrapper.optimizer.param_groups:
        for name in group["param_names"]:
            params[name] = {"lr": group["lr"], "weight_decay": group["weight_decay"]}
    optimizer = cfg.optim_wrapper.optimizer
    record = {"config": CONFIGS["classic"], "base_lr": optimizer.lr, "weight_decay": optimizer.weight_decay,
              "paramwise_cfg": cfg.optim_wrapper.paramwise_cfg.to_dict(),
              "clip_grad": cfg.optim_wrapper.clip_grad.to_dict(), "optimizer": optimizer.type,
              "betas": list(optimizer.betas), "params": params}
    write_json(out_dir / "llrd_vitpose_s.json", record, indent=1)
    return ["llrd_vitpose_s.json"]
