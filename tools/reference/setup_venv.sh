#!/usr/bin/env bash
# Builds the MMPose 1.3.2 reference venv (CPU) that tools/reference/make_fixtures.py and the
# benchmarks' --mmpose runs use. It is a separate environment: vitpose never imports any of it.
#
#   bash tools/reference/setup_venv.sh [VENV]      # default ~/.cache/mmpose-ref-venv, a few minutes
#
# Then point the benchmarks at VENV/bin/python with VITPOSE_MMPOSE_PYTHON if VENV is not the default.
set -euo pipefail
VENV=${1:-$HOME/.cache/mmpose-ref-venv}
HERE=$(cd "$(dirname "$0")" && pwd)

[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip install -q"

# xtcocotools 1.14.3 ships wheels built against NumPy 1.x; mmengine 0.10.7 imports pkg_resources
# (gone from setuptools 81); OpenCV 4.10 is the build the fixtures' crops were warped with.
PINS=(numpy==1.26.4 "setuptools<81" opencv-python-headless==4.10.0.84)

$PIP torch==2.14.1 torchvision==0.29.1
$PIP "${PINS[@]}" pycocotools==2.0.11 scipy matplotlib json_tricks munkres addict pyyaml yapf rich \
    termcolor packaging einops importlib-metadata mat4py modelindex cython six shapely terminaltables tqdm
# The OpenMMLab packages without their dependency resolution: mmpose 1.3.2 accepts only mmcv < 2.2,
# mmcv-lite has no compiled ops (mmcompat.py covers that), and mmdet is needed only because
# mmpose imports mmdet.utils.
$PIP --no-deps mmengine==0.10.7 mmcv-lite==2.1.0 xtcocotools==1.14.3 mmpretrain==1.2.0 mmpose==1.3.2 mmdet==3.3.0
$PIP "${PINS[@]}" transformers==5.24.0 timm safetensors

# Smoke test: build ViTPose-S from its config with random weights.
cd "$HERE" && "$VENV/bin/python" - <<'PY' 2>&1 | grep -v -i warn
import os.path as osp

import mmcompat  # noqa: F401  (before mmpose)
import mmpose
from mmengine.config import Config
from mmpose.apis import init_model

name = "body_2d_keypoint/topdown_heatmap/coco/td-hm_ViTPose-small_8xb64-210e_coco-256x192.py"
cfg = Config.fromfile(osp.join(osp.dirname(mmpose.__file__), ".mim", "configs", name))
cfg.model.backbone.init_cfg = None
model = init_model(cfg, checkpoint=None, device="cpu")
print("MMPose", mmpose.__version__, "ViTPose-S:", sum(p.numel() for p in model.parameters()), "parameters")
PY
