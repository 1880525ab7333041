"""A tiny ViTPose+ (mixture-of-experts) model's weights from a seed, in HF's and the official layout.

Numpy only: used by tests/test_vitpose_plus.py and, in the MMPose reference environment, by
tools/reference/make_vitpose_plus.py, which records HF transformers' heatmaps for these weights and
what the official ViTPose repository's tools/model_split.py makes of the official-layout file.

- HF layout (`VitPoseForPoseEstimation` with `VitPoseBackboneConfig(num_experts=6, ...)`): the
  spec (names, shapes, kinds in HF's state_dict order) is stored in the fixture; `make_weights`
  of tests/weights_recipe.py draws every tensor from one PCG64 stream in that order.
- Official layout (ViTAE-Transformer/ViTPose `ViTMoE` + `TopDownMoE`): `official_from_hf` renames
  the same tensors (q/k/v fused into qkv, `last_norm`, `keypoint_head`) and adds the five other
  dataset heads `associate_keypoint_heads.{0..4}` (AIC 14, MPII 16, AP-10K 17, APT-36K 17,
  COCO-WholeBody 133 keypoints). Each is HF's COCO head with its output channels drawn from COCO's
  17 in a per-dataset order (`head_channels`), so its heatmaps are known from HF's while a wrong
  head still shows.
"""

import numpy as np
from weights_recipe import make_weights

SEED = 11
# A ViTPose+ model small enough to run in a test: 2 blocks of 64-d tokens on 64x48 crops (a 4x3
# token grid), part_features a quarter of the width as in ViTPose+-B (192 of 768).
CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "mlp_ratio": 4,
          "num_experts": 6, "part_features": 16, "image_size": [64, 48], "patch_size": [16, 16],
          "layer_norm_eps": 1e-6, "num_labels": 17}
DATASETS = ("coco", "aic", "mpii", "ap10k", "apt36k", "coco_wholebody")
KEYPOINTS = (17, 14, 16, 17, 17, 133)
HEAD_RENAMES = {"deconv1": "deconv_layers.0", "batchnorm1": "deconv_layers.1", "deconv2": "deconv_layers.3",
                "batchnorm2": "deconv_layers.4", "conv": "final_layer"}


def weight_kind(name: str) -> str:
    """The draw of weights_recipe for an HF parameter name."""
    if name.endswith("num_batches_tracked"):
        return "count"
    if name.endswith("running_mean"):
        return "bn_mean"
    if name.endswith("running_var"):
        return "bn_var"
    if name.endswith("position_embeddings"):
        return "pos_embed"
    if ("layernorm" in name or "batchnorm" in name) and name.endswith(".weight"):
        return "norm_weight"
    return "bias" if name.endswith(".bias") else "weight"


def hf_weights(spec, seed=SEED):
    return make_weights(spec, seed)


def head_channels(index: int) -> list[int]:
    """Which of the COCO head's 17 output channels each output channel of dataset `index`'s head is
    (identity for COCO itself)."""
    k = KEYPOINTS[index]
    if index == 0:
        return list(range(k))
    order = np.random.default_rng(100 + index).permutation(17)
    return [int(order[c % 17]) for c in range(k)]


def official_from_hf(hf: dict) -> dict:
    """The official ViTPose+ state dict (names of its `state_dict`) of the same tensors."""
    out = {}
    for name, value in hf.items():
        if not name.startswith("backbone."):
            continue
        body = name[len("backbone."):]
        if body.startswith("embeddings.patch_embeddings.projection."):
            out["backbone.patch_embed.proj." + body.rsplit(".", 1)[1]] = value
        elif body == "embeddings.position_embeddings":
            out["backbone.pos_embed"] = value
        elif body.startswith("layernorm."):
            out["backbone.last_norm." + body.rsplit(".", 1)[1]] = value
        elif body.startswith("encoder.layer."):
            _, _, block, rest = body.split(".", 3)
            prefix = f"backbone.blocks.{block}."
            renames = {"layernorm_before.": "norm1.", "layernorm_after.": "norm2.",
                       "attention.output.dense.": "attn.proj.", "mlp.": "mlp."}
            for old, new in renames.items():
                if rest.startswith(old):
                    out[prefix + new + rest[len(old):]] = value
    for block in range(CONFIG["num_hidden_layers"]):
        for kind in ("weight", "bias"):
            parts = [hf[f"backbone.encoder.layer.{block}.attention.attention.{p}.{kind}"]
                     for p in ("query", "key", "value")]
            out[f"backbone.blocks.{block}.attn.qkv.{kind}"] = np.concatenate(parts, axis=0)
    for index in range(len(DATASETS)):
        prefix = "keypoint_head." if index == 0 else f"associate_keypoint_heads.{index - 1}."
        rows = head_channels(index)
        for name, value in hf.items():
            if name.startswith("head."):
                layer, rest = name[len("head."):].split(".", 1)
                if layer == "conv":
                    value = value[rows]
                out[prefix + HEAD_RENAMES[layer] + "." + rest] = np.array(value, order="C")
    return out
