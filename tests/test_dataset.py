"""CocoKeypoints: sample layout, determinism, targets, the fast train path's tolerance, index size."""

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from vitpose.codecs.udp import UDPHeatmap
from vitpose.data import synthetic
from vitpose.data import transforms as T
from vitpose.data.coco import CocoKeypoints
from vitpose.data.coco_index import build_coco_index

DETECTION_IDS = Path(__file__).parent / "fixtures" / "detection_ids.json"


@pytest.fixture(scope="module")
def train_ds(coco_mini_dir):
    return CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir, train=True, seed=3)


def test_train_sample_layout_and_collate(train_ds):
    s = train_ds[0]
    assert s["image"].dtype == torch.uint8 and tuple(s["image"].shape) == (3, 256, 192)
    assert s["heatmaps"].dtype == torch.float32 and tuple(s["heatmaps"].shape) == (17, 64, 48)
    for key, shape in (("keypoints", (17, 2)), ("keypoints_visible", (17,)), ("keypoint_weights", (17,)),
                       ("center", (2,)), ("scale", (2,))):
        assert s[key].dtype == torch.float32 and tuple(s[key].shape) == shape, key
    batch = torch.utils.data.default_collate([train_ds[i] for i in range(4)])
    assert tuple(batch["image"].shape) == (4, 3, 256, 192) and batch["id"].dtype == torch.int64
    assert batch["heatmaps"].shape == (4, 17, 64, 48)


def test_samples_are_a_function_of_seed_epoch_index(coco_mini_dir, train_ds):
    other = CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir, train=True, seed=3)
    other.set_epoch(5)
    a, b = train_ds[(4, 5)], other[4]
    for key in ("image", "keypoints", "heatmaps", "center", "scale"):
        assert torch.equal(a[key], b[key]), key
    # a different epoch or seed gives a different augmentation
    assert not torch.equal(train_ds[(4, 6)]["center"], a["center"])
    reseeded = CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir, train=True, seed=4)
    assert not torch.equal(reseeded[(4, 5)]["center"], a["center"])


def test_targets_are_the_codec_of_the_crop_keypoints(coco_mini_dir, train_ds):
    codec = UDPHeatmap()
    lazy = CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir, train=True, seed=3,
                         encode_targets=False)
    for epoch in range(8):
        for i in range(len(train_ds)):
            s, t = train_ds[(i, epoch)], lazy[(i, epoch)]
            heatmaps, weights = codec.encode(s["keypoints"].numpy()[None], s["keypoints_visible"].numpy()[None])
            np.testing.assert_array_equal(s["heatmaps"].numpy(), heatmaps)
            np.testing.assert_array_equal(s["keypoint_weights"].numpy(), weights[0])
            # encode_targets=False: same keypoints and the same weights, no heatmaps
            assert "heatmaps" not in t
            np.testing.assert_array_equal(t["keypoints"].numpy(), s["keypoints"].numpy())
            np.testing.assert_array_equal(t["keypoint_weights"].numpy(), s["keypoint_weights"].numpy())


def test_reduced_decode_within_tolerance(coco_mini_dir):
    """The opt-in reduced path decodes big boxes at 1/2 (or less): keypoints and targets are
    identical; pixels differ by the resampling only (mean abs difference <= 6 grey levels per
    crop, <= 4 on average; measured about 2.3-4.8 and 3.0). Crops with only the flip folded
    into the warp differ by 1/32-px rounding (mean <= 0.05; measured 0.01)."""
    ds = CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir, train=True, reduced_decode=True)
    reduced, folded = [], []
    for epoch in range(12):
        for i in range(len(ds)):
            geo = ds.augment_geometry(i, np.random.default_rng((0, epoch, i)))
            fast = ds.render_crop(i, geo, reduced=True).astype(np.int16)
            exact = ds.render_crop(i, geo, reduced=False).astype(np.int16)
            diff = np.abs(fast - exact).mean()
            if T.choose_reduction(geo["scale_fixed"]) > 1:
                reduced.append(diff)
            elif geo["flipped"]:
                folded.append(diff)
            else:
                assert diff == 0
    assert len(reduced) >= 3 and len(folded) >= 20
    assert max(reduced) <= 6 and np.mean(reduced) <= 4
    assert max(folded) <= 0.05
    a = ds[(3, 1)]
    b = CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir, train=True, reduced_decode=False)[(3, 1)]
    assert torch.equal(a["keypoints"], b["keypoints"]) and torch.equal(a["heatmaps"], b["heatmaps"])


def test_default_training_crops_are_exact(coco_mini_dir):
    """By default (no reduced decoding) a training crop is the full-resolution warp, also for
    the boxes that reduced decoding would shrink."""
    ds = CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir, train=True, encode_targets=False)
    shrinking = 0
    for epoch in range(16):
        for i in range(len(ds)):
            geo = ds.augment_geometry(i, np.random.default_rng((ds.seed, epoch, i)))
            if T.choose_reduction(geo["scale_fixed"]) == 1:
                continue
            shrinking += 1
            exact = torch.from_numpy(np.ascontiguousarray(ds.render_crop(i, geo, reduced=False)[:, :, ::-1]
                                                          .transpose(2, 0, 1)))
            assert torch.equal(ds[(i, epoch)]["image"], exact), (i, epoch)
    assert shrinking >= 1


def test_validation_has_no_randomness(coco_mini_dir):
    ds = CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir)
    a = ds[(2, 0)]
    ds.set_epoch(9)
    assert torch.equal(ds[2]["image"], a["image"]) and "heatmaps" not in a
    assert torch.equal(ds[-1]["image"], ds[len(ds) - 1]["image"])
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_detection_ids_are_numbered_before_the_score_filter(tmp_path):
    """MMPose numbers the person boxes in file order, then drops low scores: a kept box keeps
    its number. Checked against MMPose 1.3.2's CocoDataset on the same files
    (tools/reference/make_detection_ids.py), at thresholds that drop some boxes."""
    ref = json.loads(DETECTION_IDS.read_text())
    ann, det = tmp_path / "ann.json", tmp_path / "det.json"
    ann.write_text(json.dumps({"images": ref["images"], "annotations": []}))
    det.write_text(json.dumps(ref["detections"]))
    people = [j for j, d in enumerate(ref["detections"]) if d["category_id"] == 1]
    for case in ref["cases"]:
        thr = case["bbox_score_thr"]
        index = build_coco_index(ann, det, bbox_score_thr=thr)
        np.testing.assert_array_equal(index.ids, case["ids"], err_msg=str(thr))
        np.testing.assert_array_equal(index.image_ids[index.image_index], case["image_ids"])
        np.testing.assert_array_equal(index.bbox_score, np.float32(case["bbox_score"]))
        np.testing.assert_array_equal(index.bbox_xyxy, np.float32(case["bbox_xyxy"]))
        # the kept numbers are the boxes' positions among the file's person boxes
        kept = [j for j in people if np.float32(ref["detections"][j]["score"]) >= np.float32(thr)]
        assert [people.index(j) for j in kept] == case["ids"]
        assert index.dropped.get("not a person") == len(ref["detections"]) - len(people)
        ds = CocoKeypoints(ann, tmp_path, bbox_file=det, bbox_score_thr=thr)
        assert ds.index.ids.tolist() == case["ids"]
    assert any(len(c["ids"]) < len(people) and c["ids"] != list(range(len(c["ids"]))) for c in ref["cases"])


def test_index_is_frozen_and_can_be_shared(coco_mini_dir):
    ann = coco_mini_dir / "test_coco.json"
    index = build_coco_index(ann)
    assert len(index) == 12 and index.has_keypoints and index.dropped == {"num_keypoints == 0": 2}
    with pytest.raises(dataclasses.FrozenInstanceError):
        index.ids = index.ids[:3]
    with pytest.raises(ValueError, match="read-only"):
        index.keypoints[0, 0, 0] = 1.0
    # a dataset given the index samples what a dataset that builds its own samples
    shared = CocoKeypoints(ann, coco_mini_dir, train=True, seed=2, index=index)
    own = CocoKeypoints(ann, coco_mini_dir, train=True, seed=2)
    for key in ("image", "keypoints", "heatmaps", "bbox"):
        assert torch.equal(shared[(5, 3)][key], own[(5, 3)][key]), key
    assert shared.index is index
    # an index of other files (or another threshold) is refused
    with pytest.raises(ValueError, match="the index was built from"):
        CocoKeypoints(ann, coco_mini_dir, bbox_file=coco_mini_dir / "test_coco_det_AP_H_56.json", index=index)
    detections = build_coco_index(ann, coco_mini_dir / "test_coco_det_AP_H_56.json", bbox_score_thr=0.5)
    with pytest.raises(ValueError, match="bbox_score_thr=0.0"):
        CocoKeypoints(ann, coco_mini_dir, bbox_file=coco_mini_dir / "test_coco_det_AP_H_56.json", index=detections)
    assert not detections.has_keypoints and detections.keypoints is None
    assert detections.record(0) == f"detection {detections.ids[0]} (image id {detections.image_id(0)})"


def test_synthetic_set_loads(tmp_path):
    paths = synthetic.make_coco(tmp_path, num_images=3, seed=0, split="val")
    ds = CocoKeypoints(paths.ann_file, paths.img_dir, train=True)
    assert len(ds) > 0
    s = ds[0]
    assert tuple(s["image"].shape) == (3, 256, 192) and s["keypoint_weights"].sum() > 0
    det = CocoKeypoints(paths.ann_file, paths.img_dir, bbox_file=paths.det_file)
    assert len(det) > 0 and tuple(det[0]["image"].shape) == (3, 256, 192)


def _write_big_annotations(path, num_instances, per_image=3):
    """A COCO-shaped keypoint file (no pixels needed to build the index)."""
    rng = np.random.default_rng(0)
    num_images = -(-num_instances // per_image)
    images = [{"id": i + 1, "file_name": f"{i + 1:012d}.jpg", "width": 640, "height": 480}
              for i in range(num_images)]
    kp = np.round(rng.uniform(50, 400, (num_instances, 17, 3)), 1)
    kp[..., 2] = rng.integers(0, 3, (num_instances, 17))
    anns = [{"id": 10 + j, "image_id": j // per_image + 1, "category_id": 1, "iscrowd": 0,
             "bbox": [30.5, 40.0, 200.0, 300.0], "area": 6e4, "num_keypoints": int((kp[j, :, 2] > 0).sum()),
             "keypoints": kp[j].ravel().tolist()} for j in range(num_instances)]
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1}]}))
    return num_instances


def _index_cost(tmp_path, n):
    ann = tmp_path / "big.json"
    _write_big_annotations(ann, n)
    t0 = time.perf_counter()
    ds = CocoKeypoints(ann, tmp_path, train=True, encode_targets=False)
    return ds, time.perf_counter() - t0


def test_index_size_scales_to_coco_train(tmp_path):
    # 15k instances here; the bytes per instance x 150k (COCO train) must stay under 100 MB.
    ds, _ = _index_cost(tmp_path, 15000)
    assert len(ds) == sum(1 for _ in range(15000)) - ds.dropped.get("num_keypoints == 0", 0)
    per_instance = ds.index_nbytes() / len(ds)
    assert per_instance * 150_000 < 100e6, per_instance
    assert ds.index.keypoints.dtype == np.float32 and ds.index.ids.dtype == np.int64


@pytest.mark.slow
def test_index_build_coco_train_size(tmp_path):
    ds, seconds = _index_cost(tmp_path, 150_000)
    print(f"150k instances: index built in {seconds:.1f} s, {ds.index_nbytes() / 1e6:.1f} MB")
    assert ds.index_nbytes() < 100e6
    assert seconds < 60
