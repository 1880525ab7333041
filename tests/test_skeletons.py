"""Datasets of other skeletons: the readers equal MMPose's datasets, and K flows through the data layer.

tests/fixtures/reader_cases.json holds what MMPose 1.3.2's AicDataset, AP10KDataset,
CocoWholeBodyDataset and MpiiDataset give for MMPose's own test files (tests/data/mmpose/) and a few
hand-made edge cases, after GetBBoxCenterScale (tools/reference/make_reader_cases.py).
"""

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from vitpose.data.coco import CocoKeypoints
from vitpose.data.coco_index import build_coco_index
from vitpose.data.errors import DataError
from vitpose.data.metainfo import dataset_info

HERE = Path(__file__).parent
CASES = json.loads((HERE / "fixtures" / "reader_cases.json").read_text())["cases"]
DATA = HERE / "data" / "mmpose"


def _case_files(case, tmp_path):
    """(annotation file, image folder) of a case; MPII gets stand-in images of the recorded sizes."""
    if "content" in case:
        ann = tmp_path / case["file"].split(":", 1)[1]
        ann.write_text(json.dumps(case["content"]))
    else:
        ann = DATA / case["file"]
    img_dir = tmp_path / "images"
    img_dir.mkdir()
    for name, (w, h) in case.get("image_sizes", {}).items():
        cv2.imwrite(str(img_dir / name), np.zeros((h, w, 3), np.uint8))
    return ann, img_dir


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_reader_equals_mmpose_dataset(case, tmp_path):
    ann, img_dir = _case_files(case, tmp_path)
    info = dataset_info(case["skeleton"])
    index = build_coco_index(ann, dataset_info=info, img_dir=img_dir)
    ref = case["instances"]
    assert len(index) == len(ref) > 0
    assert index.ids.tolist() == [r["id"] for r in ref]
    assert [index.image_id(i) for i in range(len(index))] == [r["img_id"] for r in ref]
    assert [index.image_file(i) for i in range(len(index))] == [r["img_path"] for r in ref]
    assert index.category_ids.tolist() == [r["category_id"] for r in ref]

    def f32(key, shape):
        return np.array([r[key] for r in ref], np.float64).astype(np.float32).reshape(shape)

    n, K = len(ref), info.num_keypoints
    np.testing.assert_array_equal(index.bbox_xyxy, f32("bbox", (n, 4)))
    np.testing.assert_array_equal(index.center, f32("center", (n, 2)))
    np.testing.assert_array_equal(index.scale, f32("scale", (n, 2)))
    # COCO-WholeBody's keypoints are float64 in MMPose (np.array of a list); float32 here.
    np.testing.assert_array_equal(index.keypoints, f32("keypoints", (n, K, 2)))
    np.testing.assert_array_equal(index.keypoints_visible, f32("keypoints_visible", (n, K)))
    if "image_sizes" in case:
        sizes = [tuple(case["image_sizes"][index.image_file(i)]) for i in range(n)]
        assert [index.image_size(i) for i in range(n)] == sizes


def test_wholebody_training_sample_has_133_channels(coco_mini_dir):
    info = dataset_info("coco_wholebody")
    ds = CocoKeypoints(DATA / "coco" / "test_coco_wholebody.json", coco_mini_dir, train=True, dataset_info=info)
    assert ds.num_keypoints == 133 and ds.flip_indices == info.flip_indices
    sample = ds[0]
    assert sample["heatmaps"].shape == (133, 64, 48) and sample["keypoint_weights"].shape == (133,)
    # the flip mirrors with the wholebody table: find an epoch whose draw flips instance 0
    for epoch in range(20):
        geo = ds.augment_geometry(0, np.random.default_rng((ds.seed, epoch, 0)))
        if geo["flipped"]:
            break
    assert geo["flipped"]
    raw = ds.index.keypoints[0]
    width = ds.index.image_size(0)[0]
    expected = raw[list(info.flip_indices)].copy()
    expected[:, 0] = width - 1 - expected[:, 0]
    np.testing.assert_array_equal(geo["keypoints"], expected)


def test_ap10k_samples_carry_their_category(tmp_path):
    case = next(c for c in CASES if c["file"] == "edge:ap10k_edge.json")
    ann, _ = _case_files(case, tmp_path)
    img_dir = tmp_path / "images"
    cv2.imwrite(str(img_dir / "b.jpg"), np.zeros((240, 320, 3), np.uint8))
    ds = CocoKeypoints(ann, img_dir, dataset_info="ap10k")
    assert [ds[i]["category_id"] for i in range(len(ds))] == [26, 3]


def test_mpii_half_body_uses_mpii_sets(tmp_path):
    from vitpose.coco_meta import LOWER_BODY_IDS, UPPER_BODY_IDS
    from vitpose.data import transforms as T

    case = next(c for c in CASES if c["file"] == "mpii/test_mpii.json")
    ann, img_dir = _case_files(case, tmp_path)
    ds = CocoKeypoints(ann, img_dir, train=True, dataset_info="mpii", encode_targets=False)
    info, ix = ds.dataset_info, ds.index

    def replay(epoch, upper, lower):
        """The train geometry of instance 0 redone step by step with the given half-body sets."""
        rng = np.random.default_rng((ds.seed, epoch, 0))
        _, center, kpts, vis = T.random_flip(rng, ix.center[0].copy(), ix.keypoints[0].copy(),
                                             ix.keypoints_visible[0].copy(), ix.image_size(0)[0],
                                             flip_indices=info.flip_indices)
        center, scale, part = T.random_half_body(rng, center, ix.scale[0].copy(), kpts, vis,
                                                 upper_body_ids=upper, lower_body_ids=lower)
        center, scale, _ = T.random_bbox_transform(rng, center, scale)
        return center, part

    differs = 0
    for epoch in range(40):
        geo = ds.augment_geometry(0, np.random.default_rng((ds.seed, epoch, 0)))
        center, part = replay(epoch, info.upper_body_ids, info.lower_body_ids)
        assert part == geo["half_body"]
        np.testing.assert_array_equal(center, geo["center"])
        if part is not None:
            coco_sets = [i for i in UPPER_BODY_IDS if i < 16], [i for i in LOWER_BODY_IDS if i < 16]
            differs += not np.array_equal(replay(epoch, *coco_sets)[0], center)
    assert differs > 0, "no half-body draw where MPII's sets matter"


# ------------------------------------------------------------------------------ bad input

def _raises(parts, fn):
    with pytest.raises((DataError, ValueError)) as e:
        fn()
    for part in parts:
        assert part in str(e.value), (part, str(e.value))


def _coco(tmp_path, K, record_K=None, category_K=None):
    kp = [v for k in range(record_K or K) for v in (10.0 + k, 20.0 + k, 2)]
    cats = [{"id": 1, "name": "x", "keypoints": [f"k{k}" for k in range(category_K)]}] if category_K else [
        {"id": 1, "name": "x"}]
    path = tmp_path / "ann.json"
    path.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 64}],
                                "annotations": [{"id": 7, "image_id": 1, "category_id": 1, "bbox": [1, 1, 40, 40],
                                                 "num_keypoints": 3, "keypoints": kp}],
                                "categories": cats}))
    return path


def test_skeleton_of_other_k_than_the_file(tmp_path):
    five = tmp_path / "five.yaml"
    five.write_text("name: five\nkeypoints: [a, b, c, d, e]\n")
    path = _coco(tmp_path, 17, category_K=17)
    _raises([str(path), "'categories[0].keypoints'", "category 1 has 17 keypoints but the skeleton 'five' has 5",
             "data.dataset_info", "model.num_keypoints to 17"], lambda: CocoKeypoints(path, tmp_path, dataset_info=five))
    path = _coco(tmp_path, 17)  # no keypoint names in the file: the first record tells
    _raises([str(path), "annotation id 7", "'keypoints'", "must hold 15 numbers", "got 51 (17 keypoints)",
             "the skeleton 'five' has 5 keypoints"], lambda: CocoKeypoints(path, tmp_path, dataset_info=five))


def test_num_keypoints_must_agree_with_the_skeleton(tmp_path):
    path = _coco(tmp_path, 17)
    _raises(["num_keypoints=5 but the skeleton 'coco'", "17 keypoints"],
            lambda: CocoKeypoints(path, tmp_path, dataset_info="coco", num_keypoints=5))
    _raises(["num_keypoints=5", "needs dataset_info="], lambda: CocoKeypoints(path, tmp_path, num_keypoints=5))
    _raises(["flip_indices=", "differ from the skeleton 'coco'"],
            lambda: CocoKeypoints(path, tmp_path, flip_indices=list(range(17))))


def test_wholebody_record_with_a_short_part(tmp_path):
    doc = json.loads((DATA / "coco" / "test_coco_wholebody.json").read_text())
    doc["annotations"][3]["lefthand_kpts"] = doc["annotations"][3]["lefthand_kpts"][:-3]
    path = tmp_path / "wb.json"
    path.write_text(json.dumps(doc))
    rec = doc["annotations"][3]["id"]
    _raises([str(path), f"annotation id {rec}", "'lefthand_kpts'", "must hold 63 numbers", "got 60 (20 keypoints)"],
            lambda: build_coco_index(path, dataset_info=dataset_info("coco_wholebody")))
    del doc["annotations"][0]["foot_kpts"]
    path.write_text(json.dumps(doc))
    _raises([str(path), f"annotation id {doc['annotations'][0]['id']}", "missing field", "'foot_kpts'"],
            lambda: build_coco_index(path, dataset_info=dataset_info("coco_wholebody")))


def test_mpii_bad_records(tmp_path):
    case = next(c for c in CASES if c["file"] == "mpii/test_mpii.json")
    _, img_dir = _case_files(case, tmp_path)
    records = json.loads((DATA / "mpii" / "test_mpii.json").read_text())
    path = tmp_path / "mpii.json"
    info = dataset_info("mpii")

    def broken(j, key, value):
        bad = [dict(r) for r in records]
        bad[j][key] = value
        path.write_text(json.dumps(bad))
        return lambda: build_coco_index(path, dataset_info=info, img_dir=img_dir)

    _raises([str(path), "MPII record 2", "'joints'", "must hold 32 numbers, got 30"],
            broken(2, "joints", records[2]["joints"][:-1]))
    _raises(["MPII record 1", "'joints_vis'", "must hold 16 numbers"], broken(1, "joints_vis", [1] * 14))
    _raises(["MPII record 0", "'center'", "not numeric"], broken(0, "center", ["a", 1]))
    _raises(["MPII record 4", "'image'", "must be a number"], broken(4, "image", "frame_a.jpg"))
    _raises([str(img_dir / "999.jpg"), "image file not found"], broken(3, "image", "999.jpg"))
    _raises(["needs img_dir"], lambda: build_coco_index(DATA / "mpii" / "test_mpii.json", dataset_info=info))
    path.write_text(json.dumps({"images": []}))
    _raises([str(path), "JSON list of {image, center, scale, joints, joints_vis}"],
            lambda: build_coco_index(path, dataset_info=info, img_dir=img_dir))


# ------------------------------------------------------------------------------ drawing and predictions

def test_draw_pose_with_a_skeletons_limbs_and_colours():
    from vitpose.inference.draw import draw_pose

    info = dataset_info("ap10k")
    image = np.zeros((120, 160, 3), np.uint8)
    rng = np.random.default_rng(0)
    keypoints = rng.uniform(10, 110, (info.num_keypoints, 2))
    drawn = draw_pose(image, keypoints, skeleton=info.skeleton, keypoint_colors=info.keypoint_colors,
                      link_colors=info.link_colors, radius=3, thickness=1)
    for k, (x, y) in enumerate(np.round(keypoints).astype(int)):
        # keypoints are drawn last, in their own colour (unless a later one covers this one)
        later = [j for j in range(k + 1, info.num_keypoints) if np.abs(np.round(keypoints[j]) - (x, y)).max() <= 6]
        if not later:
            assert tuple(drawn[y, x]) == info.keypoint_colors[k], k
    with pytest.raises(ValueError, match=r"skeleton limb \(15, 13\) is out of range for 5 keypoints"):
        draw_pose(image, keypoints[:5])  # COCO's limbs on a 5-keypoint pose
    with pytest.raises(ValueError, match="keypoint_colors must hold 17 RGB triples, got 2"):
        draw_pose(image, keypoints, skeleton=info.skeleton, keypoint_colors=[(1, 2, 3)] * 2)


def test_predictions_carry_the_category_id():
    import torch

    from vitpose.codecs.udp import UDPHeatmap
    from vitpose.engine.evaluate import predict

    class Constant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return torch.rand(len(x), 17, 64, 48, generator=torch.Generator().manual_seed(0)) + self.w

    batch = {"image": torch.zeros(2, 3, 256, 192, dtype=torch.uint8), "id": torch.tensor([4, 5]),
             "image_id": torch.tensor([1, 1]), "center": torch.ones(2, 2), "scale": torch.ones(2, 2) * 100,
             "category_id": torch.tensor([26, 3])}
    preds = predict(Constant(), [batch], UDPHeatmap(), flip_test=True,
                    flip_indices=dataset_info("ap10k").flip_indices)
    assert [p["category_id"] for p in preds] == [26, 3]


# ------------------------------------------------------------------------------ acceptance: K = 5 trains

def _train_k5(tmp_path, *overrides):
    """train.py on configs/demo_k5.yaml in tmp_path; returns the AP of every validation."""
    import sys

    sys.path.insert(0, str(HERE.parent))
    import train

    args = ["--config", str(HERE.parent / "configs" / "demo_k5.yaml"), "--work-dir", str(tmp_path / "run"),
            "--data-root", str(tmp_path / "data")]
    for item in overrides:
        args += ["--set", item]
    assert train.main(args) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r["AP"] for r in records if r.get("kind") == "eval"]


def test_k5_custom_coco_file_trains_and_ap_rises(tmp_path):
    """The fast variant: a K=5 COCO-format file whose skeleton is read from the file itself
    (categories[0]: flip pairs from the names, default sigmas), 64 images, a smaller ViT (2 blocks,
    8-px patches on 64x48 crops) for 16 short epochs: ~20 s on 2 idle cores."""
    from vitpose.data.synthetic import make_coco
    from vitpose.engine.checkpoint import load_checkpoint

    info = dataset_info(HERE.parent / "configs" / "demo_k5_skeleton.yaml")
    make_coco(tmp_path / "data", 64, seed=0, split="train", dataset_info=info)
    make_coco(tmp_path / "data", 16, seed=0, split="val", dataset_info=info)
    ann = tmp_path / "data" / "annotations" / "person_keypoints_train2017.json"
    aps = _train_k5(tmp_path, f"data.dataset_info={ann}", "data.synthetic_train_images=0",
                    "data.synthetic_val_images=0", "schedule.epochs=16", "schedule.milestones=[15]",
                    "schedule.warmup_iters=10", "loader.batch_size=16", "optim.lr=4e-3", "train.val_every=4",
                    "model.input_size=[48,64]", "model.heatmap_size=[24,32]",
                    "model.extra={embed_dim: 96, depth: 2, num_heads: 3, deconv_channels: [32, 32], "
                    "patch_size: 8, patch_padding: 1}")
    assert len(aps) == 4
    assert aps[-1] > aps[0] + 0.01, aps  # measured: 0.0000, 0.0064, 0.0066, 0.0255
    state = load_checkpoint(tmp_path / "run" / "best.pth")["model"]
    assert state["head.final_layer.weight"].shape[0] == 5  # five heatmaps


@pytest.mark.slow
def test_k5_demo_ap_rises_well_above_where_it_started(tmp_path):
    """The acceptance run: configs/demo_k5.yaml (500 synthetic images labelled with a 5-keypoint
    skeleton YAML, its sigmas in the metric) for its 10 epochs on a CPU."""
    aps = _train_k5(tmp_path, f"data.dataset_info={HERE.parent / 'configs' / 'demo_k5_skeleton.yaml'}")
    assert len(aps) == 10
    assert aps[-1] > aps[0] + 0.15, aps
    assert aps[-1] == max(aps) or aps[-1] > 0.9 * max(aps), aps


def test_flip_test_needs_one_flip_index_per_heatmap():
    import torch

    from vitpose.models import build_model, flip_test

    model = build_model("vitpose-s", decoder="simple", num_keypoints=5, depth=1, embed_dim=32, num_heads=2).eval()
    x = torch.randn(1, 3, 256, 192)
    with pytest.raises(ValueError, match="predicts 5 heatmaps but 17 flip indices"):
        flip_test(model, x)
    info = dataset_info(HERE.parent / "configs" / "demo_k5_skeleton.yaml")
    with torch.no_grad():
        out = flip_test(model, x, info.flip_indices)
        plain, mirrored = model(x), model(x.flip(-1)).flip(-1)
    # channel 1 (left_wrist) averages with the mirrored crop's channel 2 (right_wrist)
    torch.testing.assert_close(out[:, 1], (plain[:, 1] + mirrored[:, 2]) / 2)
    torch.testing.assert_close(out[:, 0], (plain[:, 0] + mirrored[:, 0]) / 2)
