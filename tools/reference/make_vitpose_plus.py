"""Write tests/fixtures/vitpose_plus_tiny.json and vitpose_plus_tiny_io.npz: a tiny ViTPose+ checked
against HF transformers and the official ViTPose repository.

Run it in the MMPose reference environment (HF transformers with VitPose+, torch):

    ~/.cache/mmpose-ref-venv/bin/python tools/reference/make_vitpose_plus.py \
        [--model-split PATH/TO/ViTPose/tools/model_split.py]

1. HF: `VitPoseForPoseEstimation` (classic decoder) on a `VitPoseBackboneConfig` with
   `num_experts=6` and `part_features` a quarter of the width (tests/vitpose_plus_recipe.py
   CONFIG), its weights drawn from a seed by tests/vitpose_plus_recipe.py and loaded strictly.
   The fixture keeps the weight spec (HF names, shapes, kinds), one input batch and the heatmaps
   of `model(x, dataset_index=i)` for i = 0..5 (eager attention, float32, CPU).
2. Official: the same tensors in the official ViTPose+ layout (`official_from_hf`), saved as
   `{"state_dict": ...}` and split by the official repository's own `tools/model_split.py` into
   one plain checkpoint per dataset. For each, the fixture keeps the SHA-256 of the tensors the
   split sets (every block's `mlp.fc2.*` and every `keypoint_head.*`), so the test can check that
   `load_weights(..., expert=...)` makes the same plain model as the official tool.
   With `--model-split` absent the official step is skipped (the JSON says so). The fixture was
   made with model_split.py of ViTAE-Transformer/ViTPose at commit c050ed2 (its SHA-256 is stored).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from vitpose_plus_recipe import (  # noqa: E402
    CONFIG,
    DATASETS,
    KEYPOINTS,
    SEED,
    hf_weights,
    official_from_hf,
    weight_kind,
)

SPLIT_NAMES = ("coco", "aic", "mpii", "ap10k", "apt36k", "wholebody")  # model_split.py's file names


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-split", type=Path, default=None,
                   help="the official ViTPose repository's tools/model_split.py")
    p.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "vitpose_plus_tiny.json")
    return p.parse_args()


def build_hf():
    import torch
    from transformers import VitPoseBackboneConfig, VitPoseConfig, VitPoseForPoseEstimation

    backbone = VitPoseBackboneConfig(
        hidden_size=CONFIG["hidden_size"], num_hidden_layers=CONFIG["num_hidden_layers"],
        num_attention_heads=CONFIG["num_attention_heads"], mlp_ratio=CONFIG["mlp_ratio"],
        num_experts=CONFIG["num_experts"], part_features=CONFIG["part_features"],
        layer_norm_eps=CONFIG["layer_norm_eps"], qkv_bias=True, image_size=CONFIG["image_size"],
        patch_size=CONFIG["patch_size"], out_indices=[CONFIG["num_hidden_layers"]])
    config = VitPoseConfig(backbone_config=backbone, use_simple_decoder=False, num_labels=CONFIG["num_labels"])
    config._attn_implementation = "eager"
    model = VitPoseForPoseEstimation(config).eval()
    spec = [{"name": n, "shape": list(t.shape), "kind": weight_kind(n)} for n, t in model.state_dict().items()]
    weights = hf_weights(spec)
    model.load_state_dict({n: torch.from_numpy(np.array(v)) for n, v in weights.items()}, strict=True)
    assert any("mlp.experts.5." in n for n in weights), "not a mixture-of-experts model"
    return model, spec, weights


def hf_heatmaps(model, x):
    import torch

    out = {}
    with torch.no_grad():
        for i in range(CONFIG["num_experts"]):
            index = torch.full((x.shape[0],), i, dtype=torch.long)
            out[f"heatmaps_{i}"] = model(torch.from_numpy(x), dataset_index=index).heatmaps.numpy()
    for i in range(1, CONFIG["num_experts"]):
        assert np.abs(out[f"heatmaps_{i}"] - out["heatmaps_0"]).max() > 1e-3, "the experts do not matter"
    return out


def split_digest(state_dict) -> dict:
    """SHA-256 of what model_split.py sets: every mlp.fc2.* and keypoint_head.* tensor, by name."""
    names = sorted(n for n in state_dict if ".mlp.fc2." in n or n.startswith("keypoint_head."))
    h = hashlib.sha256()
    for name in names:
        h.update(state_dict[name].contiguous().numpy().tobytes())
    return {"names": names, "sha256": h.hexdigest()}


def official_split(model_split: Path, weights) -> dict:
    """Run the official tools/model_split.py on the official-layout file -> {dataset: digest}."""
    import torch

    official = official_from_hf(weights)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "vitpose_plus_official.pth"
        torch.save({"state_dict": {n: torch.from_numpy(np.array(v)) for n, v in official.items()}}, source)
        subprocess.run([sys.executable, str(model_split), "--source", str(source), "--target", tmp], check=True)
        out = {}
        for dataset, file_name, k in zip(DATASETS, SPLIT_NAMES, KEYPOINTS):
            split = torch.load(Path(tmp) / f"{file_name}.pth", map_location="cpu")["state_dict"]
            assert split["keypoint_head.final_layer.weight"].shape[0] == k, (dataset, k)
            out[dataset] = split_digest(split)
    return out


def main():
    args = parse_args()
    import torch
    import transformers

    torch.manual_seed(0)
    model, spec, weights = build_hf()
    x = np.random.default_rng(SEED + 1).normal(0, 1, (1, 3, *CONFIG["image_size"])).astype(np.float32)
    arrays = {"input": x, **hf_heatmaps(model, x)}
    npz = args.out.with_name(args.out.stem + "_io.npz")
    np.savez_compressed(npz, **arrays)
    split = official_split(args.model_split, weights) if args.model_split else None
    info = {"about": "tiny HF ViTPose+ (VitPoseForPoseEstimation, classic decoder, num_experts=6) with "
                     "seeded weights; heatmaps per dataset_index in the _io.npz; official model_split.py "
                     "digests; written by tools/reference/make_vitpose_plus.py",
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                         "numpy": np.__version__},
            "config": CONFIG, "seed": SEED, "datasets": list(DATASETS), "keypoints": list(KEYPOINTS),
            "spec": spec,
            "official_model_split": split if split is not None else "not run (no --model-split given)",
            "model_split_py_sha256": hashlib.sha256(args.model_split.read_bytes()).hexdigest() if args.model_split
            else None}
    args.out.write_text(json.dumps(info, indent=1) + "\n")
    print(f"wrote {args.out} and {npz} ({npz.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
