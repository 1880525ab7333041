"""Config -> model/codec/datasets: one builder used by train.py, evaluate.py, tune and Predictor."""

import numpy as np
import torch
from conftest import REPO

from vitpose.builders import build_codec, build_model_from_config, build_train_set, build_val_set
from vitpose.config import load_config
from vitpose.engine.checkpoint import save_checkpoint
from vitpose.inference.predictor import Predictor


def test_model_and_codec_follow_the_config():
    cfg = load_config(REPO / "configs" / "demo.yaml", ["model.drop_path_rate=0.05"])
    model = build_model_from_config(cfg.model)
    w, h = cfg.model.input_size
    out = model.eval()(torch.zeros(1, 3, h, w))
    assert out.shape == (1, cfg.model.num_keypoints, cfg.model.heatmap_size[1], cfg.model.heatmap_size[0])
    assert model.backbone.embed_dim == cfg.model.extra["embed_dim"]
    assert len(model.backbone.blocks) == cfg.model.extra["depth"]
    codec = build_codec(cfg.model)
    assert tuple(codec.input_size) == tuple(cfg.model.input_size) and codec.sigma == cfg.model.sigma


def test_datasets_follow_the_config(tmp_path):
    from vitpose.data.synthetic import make_coco

    make_coco(tmp_path, 3, seed=1, split="train")
    make_coco(tmp_path, 2, seed=1, split="val")
    cfg = load_config(REPO / "configs" / "demo.yaml", [f"data.root={tmp_path}"])
    train_set, val_set = build_train_set(cfg), build_val_set(cfg)
    assert train_set.train and not val_set.train
    sample = train_set[0]
    w, h = cfg.model.input_size
    assert sample["image"].shape == (3, h, w)
    assert "heatmaps" not in sample  # loader.targets_on_device: the trainer encodes on the device
    det = build_val_set(cfg, bbox_file=tmp_path / "person_detection_results" / "val_detections.json")
    assert all(val_set[i]["bbox_score"] == 1.0 for i in range(len(val_set)))  # demo: GT boxes
    assert any(det[i]["bbox_score"] != 1.0 for i in range(len(det)))  # detector scores


def test_predictor_from_config_loads_a_training_checkpoint(tmp_path):
    cfg_path = REPO / "configs" / "demo.yaml"
    cfg = load_config(cfg_path)
    torch.manual_seed(0)
    model = build_model_from_config(cfg.model).eval()
    for p in model.parameters():  # not the tiny init: make the heatmaps depend on every weight
        p.data.normal_(0, 0.05)
    payload = {"model": model.state_dict(), "optimizer": {"state": {}, "param_groups": []},
               "epoch": 1, "iteration": 7, "config": cfg.to_dict()}
    path = save_checkpoint(payload, tmp_path / "last.pth")

    image = np.random.default_rng(0).integers(0, 255, (240, 320, 3), dtype=np.uint8)
    boxes = np.array([[40, 30, 140, 220], [150, 20, 300, 230]], np.float32)
    direct = Predictor(model, codec=build_codec(cfg.model), device="cpu").predict(image, boxes)
    loaded = Predictor.from_config(cfg_path, path, device="cpu").predict(image, boxes)
    np.testing.assert_array_equal(direct[0], loaded[0])
    np.testing.assert_array_equal(direct[1], loaded[1])
