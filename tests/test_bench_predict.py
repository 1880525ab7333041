"""benchmarks/bench_predict.py's rule for which trained configs the peers can run.

The peers (MMPose, HF) build the published ViTPose from their own config and only take our
weights; a trained config the rule lets through must therefore be that model exactly, or the peers'
rows would time (and compare keypoints of) another network than ours.
"""

import sys
from pathlib import Path

import pytest

from vitpose.builders import build_codec, build_model_from_config
from vitpose.config import load_config, shipped_configs
from vitpose.models.vitpose import build_model

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_predict import MMPOSE_CONFIGS, peers_cannot_run  # noqa: E402


def shapes(model):
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


TRAINING_CONFIGS = [n for n in shipped_configs() if not n.endswith("_skeleton")]  # skeleton files sit beside them


@pytest.mark.parametrize("name", TRAINING_CONFIGS)
def test_a_config_the_peers_run_is_the_published_model(name):
    cfg = load_config(name)
    why_not = peers_cannot_run(cfg, name)
    if why_not:
        assert why_not.startswith(name), why_not  # the line names the config ...
        assert "model." in why_not or "skeleton" in why_not or "the peers here" in why_not  # ... and the field
        return
    assert (cfg.model.name, cfg.model.decoder) in MMPOSE_CONFIGS
    ours = build_model_from_config(cfg.model)
    assert shapes(ours) == shapes(build_model(cfg.model.name, cfg.model.decoder))
    codec = build_codec(cfg.model)  # MMPose's ViTPose configs: UDPHeatmap((192, 256), (48, 64), sigma=2)
    assert (tuple(codec.input_size), tuple(codec.heatmap_size), codec.sigma) == ((192, 256), (48, 64), 2.0)


def test_the_trained_vitpose_s_config_runs_the_peers_and_the_demo_does_not():
    def why_not(name):
        return peers_cannot_run(load_config(name), name)

    assert why_not("configs/demo_vitpose-s.yaml") == ""
    assert "model.extra" in why_not("configs/demo.yaml")
    assert "skeleton" in why_not("configs/ap10k_vitpose-b_256x192.yaml")
    assert "vitpose-l" in why_not("configs/vitpose-l_coco_256x192.yaml")
