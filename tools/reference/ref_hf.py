"""HF transformers VitPoseForPoseEstimation with the recipe weights in the HF layout (tests/fixtures/README.md §2).

An independent implementation of the same network: its heatmaps agree with MMPose's to a few
1e-6 (classic) and about 1e-5 (simple), which the info of each file records.
"""

import numpy as np
import torch
from common import derive, load_spec
from transformers import VitPoseBackboneConfig, VitPoseConfig, VitPoseForPoseEstimation

COCO_FLIP_PAIRS = [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12], [13, 14], [15, 16]]
HF_NOTES = (
    "HF VitPoseForPoseEstimation(use_simple_decoder={simple}), SDPA attention, loaded strictly with "
    "derive(make_weights(weights_spec_{decoder}_mmpose1x.json, seed), weights_spec_{decoder}_hf.json). "
    "Inputs: <name>/input of model_vitpose_s_io.npz. <name>/heatmaps = model(x).heatmaps (kept for the "
    "names in `names`); max_abs_diff_vs_mmpose = max|heatmaps - <name>/heatmaps of the MMPose file| and "
    "flip_test_max_abs_diff_vs_mmpose the same for 0.5*(model(x) + model(x.flip(-1), flip_pairs=COCO "
    "pairs)) against <name>/flip_test_heatmaps, for every input. Made by tools/reference/make_fixtures.py "
    "(ref_hf.py).")


def build_hf_model(decoder):
    """An untrained HF ViTPose-S of one decoder ('classic' or 'simple'), SDPA attention, eval mode."""
    backbone = VitPoseBackboneConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=12, mlp_ratio=4,
                                     layer_norm_eps=1e-6, qkv_bias=True, image_size=[256, 192], patch_size=[16, 16],
                                     out_indices=[12])
    config = VitPoseConfig(backbone_config=backbone, use_simple_decoder=decoder == "simple", num_labels=17)
    model = VitPoseForPoseEstimation(config).eval()
    # transformers' default for the backbone is scaled_dot_product_attention, like mmpretrain's
    # ViT; the "eager" matmul-softmax path would move the heatmaps by a few 1e-6.
    if model.backbone.config._attn_implementation != "sdpa":
        raise RuntimeError(f"expected SDPA attention in the HF backbone, got {model.backbone.config._attn_implementation}")
    return model


def load_recipe(model, spec_dir, decoder, mmpose_weights):
    """Loads the HF layout of the recipe weights strictly into `model`."""
    state = derive(mmpose_weights, load_spec(spec_dir, decoder, "hf"))
    model.load_state_dict({name: torch.from_numpy(array) for name, array in state.items()}, strict=True)
    return model


def hf_outputs(decoder, spec_dir, mmpose_weights, inputs, mmpose_arrays, names, keep):
    """(arrays, info) of hf_vitpose_s[_simple]_io.npz.

    Args:
        decoder: 'classic' or 'simple'.
        spec_dir: the folder with the weight key specs.
        mmpose_weights: make_weights() of the MMPose 1.x spec.
        inputs: {name/input: float32 (1,3,256,192)}.
        mmpose_arrays: the MMPose outputs of the same decoder (heatmaps, flip_test_heatmaps).
        names: the inputs to run.
        keep: the inputs whose heatmaps the file keeps (the differences are kept for all).
    """
    model = load_recipe(build_hf_model(decoder), spec_dir, decoder, mmpose_weights)
    pairs = torch.tensor(COCO_FLIP_PAIRS)
    arrays = {}
    for name in names:
        x = torch.from_numpy(inputs[f"{name}/input"])
        with torch.no_grad():
            heatmaps = model(pixel_values=x).heatmaps
            flipped = 0.5 * (heatmaps + model(pixel_values=x.flip(-1), flip_pairs=pairs).heatmaps)
        if name in keep:
            arrays[f"{name}/heatmaps"] = heatmaps.numpy()
        arrays[f"{name}/max_abs_diff_vs_mmpose"] = np.float32(
            np.abs(heatmaps.numpy() - mmpose_arrays[f"{name}/heatmaps"]).max())
        arrays[f"{name}/flip_test_max_abs_diff_vs_mmpose"] = np.float32(
            np.abs(flipped.numpy() - mmpose_arrays[f"{name}/flip_test_heatmaps"]).max())
    info = {"seed": 7, "decoder": decoder, "weights_spec": f"weights_spec_{decoder}_hf.json",
            "hf_config": model.config.to_dict(), "names": list(keep),
            "notes": HF_NOTES.format(simple=decoder == "simple", decoder=decoder)}
    return arrays, info
