"""Crop cache: crops equal the exact path's bit for bit, the region bound holds at the
augmentation limits, stale caches are refused, and a crop the cache cannot serve is decoded."""

import dataclasses
import json
import pickle
import shutil

import numpy as np
import pytest
import torch

from vitpose.cli import build_crop_cache as tool
from vitpose.builders import build_train_set
from vitpose.coco_meta import LOWER_BODY_IDS, UPPER_BODY_IDS
from vitpose.config import load_config
from vitpose.data import crop_cache as C
from vitpose.data import transforms as T
from vitpose.data.coco import CocoKeypoints
from vitpose.data.errors import DataError
from vitpose.data.image_io import load_image
from vitpose.data.synthetic import make_coco

KEYS = ("image", "keypoints", "keypoints_visible", "keypoint_weights", "center", "scale", "bbox")


def _pair(ann, img_dir, cache_dir, seed=0, share_regions=True):
    exact = CocoKeypoints(ann, img_dir, train=True, seed=seed, reduced_decode=False, encode_targets=False)
    info = C.build_crop_cache(exact.index, exact.img_dir, cache_dir, exact.input_size, num_workers=1,
                              share_regions=share_regions)
    cached = CocoKeypoints(ann, img_dir, train=True, seed=seed, encode_targets=False, crop_cache=cache_dir)
    return exact, cached, info


@pytest.fixture(scope="module")
def mini(coco_mini_dir, tmp_path_factory):
    return _pair(coco_mini_dir / "test_coco.json", coco_mini_dir, tmp_path_factory.mktemp("cc") / "mini", seed=5)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    # Larger images than the people, several per image, some truncated at the border: regions
    # smaller than the image and regions clipped by it (one region per instance).
    paths = make_coco(tmp_path_factory.mktemp("synth"), num_images=6, seed=1, image_size=(640, 480))
    return _pair(paths.ann_file, paths.img_dir, paths.root / "crop_cache", seed=2, share_regions=False)


def _assert_same_samples(exact, cached, epochs):
    for epoch in epochs:
        for i in range(len(exact)):
            a, b = exact[(i, epoch)], cached[(i, epoch)]
            for key in KEYS:
                assert torch.equal(a[key], b[key]), (key, i, epoch)
    assert cached.crop_cache_misses == 0


def test_coco_mini_crops_are_bit_exact(mini):
    exact, cached, info = mini
    assert info["instances"] == len(exact) == 12 and info["images_left_out"] == 0
    _assert_same_samples(exact, cached, range(16))  # 192 samples, ~45% flipped, ~60% rotated


def test_synthetic_crops_are_bit_exact(synth):
    exact, cached, info = synth
    wh = exact.index.image_sizes[exact.index.image_index]
    boxes = np.array([cached.crop_cache.region(i)[1] for i in range(len(exact))])
    full = (boxes[:, 0] == 0) & (boxes[:, 1] == 0) & (boxes[:, 2] == wh[:, 0]) & (boxes[:, 3] == wh[:, 1])
    assert not full.all(), "the synthetic set should exercise regions smaller than the image"
    assert info["regions"] == len(exact)
    _assert_same_samples(exact, cached, range(6))


# The augmentation limits (docs/data.md §5.5, MMPose's defaults), written out so that the
# tests do not trust the module's own reading of them.
LIMITS = {"shift_factor": 0.16, "max_scale_factor": 1.5, "half_body_padding": 1.5, "half_body_min_keypoints": 9}
# The rotated crop box (3:4) reaches furthest in x at atan(4/3) = 53.13 deg and in y at 36.87 deg.
ROTATIONS = (0.0, 30.0, 36.8699, -36.8699, -45.0, 53.1301, -53.1301, 80.0, -80.0)


def test_limits_are_the_spec_values():
    """One constant: the transforms' defaults and the cache's regions both read it."""
    limits = T.AUGMENTATION_LIMITS
    assert C.region_limits() == LIMITS
    assert (limits.shift_factor, max(limits.scale_range), limits.half_body_padding,
            limits.half_body_min_keypoints) == tuple(LIMITS.values())
    assert (limits.scale_range, limits.rotate_limit, limits.rotate_prob, limits.shift_prob) == ((0.5, 1.5), 80.0, 0.6, 0.3)
    assert (limits.flip_prob, limits.half_body_prob, limits.half_body_upper_prob) == (0.5, 0.3, 0.7)
    # a change of the constant moves the regions (and so the fingerprint records it)
    wider = dataclasses.replace(limits, shift_factor=0.3)
    center, scale = np.array([[500.0, 500.0]]), np.array([[100.0, 200.0]])
    args = (center, scale, None, np.zeros((1, 17)), np.array([[1000, 1000]]), 0.75)
    assert np.all(C.instance_regions(*args, limits=wider)[:, :2] < C.instance_regions(*args)[:, :2])


def _extreme_geometries(center, scale, keypoints, visible, width, flip_indices):
    """(flipped, centre, scale, rotation) at the augmentation limits: both flips, the full box
    and both half bodies, the four extreme shifts and none, the largest and the smallest scale,
    and the rotations where the crop reaches furthest."""
    for flipped in (False, True):
        c, kpts, vis = center, keypoints, visible
        if flipped:
            kpts, vis = T.flip_keypoints(kpts, vis, width, flip_indices)
            c = T.flip_center(c, width)
        boxes = [(c, scale)]
        if vis.sum() >= LIMITS["half_body_min_keypoints"]:
            for ids in (UPPER_BODY_IDS, LOWER_BODY_IDS):
                ids = [k for k in ids if vis[k] > 0]
                if len(ids) >= 2:
                    boxes.append(T.half_body_box(kpts, ids, LIMITS["half_body_padding"]))
        for bc, bs in boxes:
            for sx, sy in ((-1, -1), (-1, 1), (1, -1), (1, 1), (0, 0)):
                shift = np.float32(LIMITS["shift_factor"]) * np.array([sx, sy], np.float32) * bs
                for factor in (LIMITS["max_scale_factor"], 0.5):
                    for rot in ROTATIONS:
                        yield flipped, (bc + shift).astype(np.float32), (bs * np.float32(factor)).astype(np.float32), rot


def _instance_extremes(ds, i):
    info = ds.instance_info(i)
    return _extreme_geometries(info["center"], info["scale"], info["keypoints"], info["keypoints_visible"],
                               info["image_size"][0], ds.flip_indices)


@pytest.mark.parametrize("which", ["mini", "synth"])
def test_region_holds_every_crop_at_the_augmentation_limits(which, request):
    exact, cached, _ = request.getfixturevalue(which)
    cache = cached.crop_cache
    for i in range(len(exact)):
        wh = exact.index.image_size(i)
        image = load_image(exact.image_path(i), expected_size=wh)[0]
        _, (rx0, ry0, rx1, ry1) = cache.region(i)
        for k, (flipped, center, scale, rot) in enumerate(_instance_extremes(exact, i)):
            _, matrix = T.crop_geometry(center, scale, rot, exact.input_size)
            x0, y0, x1, y1 = C.read_window(C.inverse_affine(matrix), exact.input_size, wh)
            if x1 > x0 and y1 > y0:
                ox0, ox1 = (wh[0] - x1, wh[0] - x0) if flipped else (x0, x1)
                assert rx0 <= ox0 and ox1 <= rx1 and ry0 <= y0 and y1 <= ry1, (i, flipped, center, scale, rot)
            if k % 11 == 0:  # and the crop from the region is the exact one
                want = T.warp_crop(T.flip_image(image) if flipped else image, matrix, exact.input_size)
                got = cache.render(i, matrix, flipped, wh, exact.input_size)
                np.testing.assert_array_equal(got, want)


def _assert_bound_unclipped(center, scale, keypoints, visible, width, flip_indices=T.FLIP_INDICES):
    """The bound itself, in a frame far larger than the person, so no clipping hides a miss: the
    pixels every extreme crop reads (mirrored back when flipped) lie inside the region."""
    off, big = 4000.0, (10000, 10000)
    region = C.instance_regions(center[None] + np.float32(off), scale[None], keypoints[None] + np.float32(off),
                                visible[None], np.array([big]), 0.75)[0]
    for flipped, c, s, rot in _extreme_geometries(center, scale, keypoints, visible, width, flip_indices):
        _, matrix = T.crop_geometry(c, s, rot)
        a, b, cc, d, e, f = C.inverse_affine(matrix)
        x0, y0, x1, y1 = C.read_window((a, b, cc + off, d, e, f + off), (192, 256), big)
        assert 0 < x0 and 0 < y0 and x1 < big[0] and y1 < big[1]
        if flipped:  # column x of the flipped image is column width - 1 - x of the original
            x0, x1 = int(2 * off + width) - x1, int(2 * off + width) - x0
        assert region[0] <= x0 and x1 <= region[2] and region[1] <= y0 and y1 <= region[3], (flipped, c, s, rot)


@pytest.mark.parametrize("which", ["mini", "synth"])
def test_region_bound_without_clipping(which, request):
    exact, _, _ = request.getfixturevalue(which)
    for i in range(len(exact)):
        info = exact.instance_info(i)
        _assert_bound_unclipped(info["center"], info["scale"], info["keypoints"], info["keypoints_visible"],
                                info["image_size"][0])


def test_half_body_beyond_the_box_is_covered():
    """Keypoints far outside a small box: the half-body crops reach beyond any crop of the box."""
    rng = np.random.default_rng(0)
    kpts = rng.uniform(-300, 300, (17, 2)).astype(np.float32)
    kpts[:11, 0] *= 2.0  # the upper body spread wide
    visible = np.ones(17, np.float32)
    center, scale = np.zeros(2, np.float32), np.array([40, 60], np.float32)
    box_only = C.instance_regions(center[None] + 5000, scale[None], kpts[None] + 5000, np.zeros((1, 17)),
                                  np.array([[10000, 10000]]), 0.75)[0]
    with_half = C.instance_regions(center[None] + 5000, scale[None], kpts[None] + 5000, visible[None],
                                   np.array([[10000, 10000]]), 0.75)[0]
    assert with_half[2] - with_half[0] > 2 * (box_only[2] - box_only[0])
    _assert_bound_unclipped(center, scale, kpts, visible, width=1000)


def test_stale_or_missing_cache_is_refused(mini, coco_mini_dir, tmp_path):
    _, cached, _ = mini
    data = json.loads((coco_mini_dir / "test_coco.json").read_text())
    data["annotations"][0]["keypoints"][0] += 3.0  # one keypoint moved: another index
    ann = tmp_path / "changed.json"
    ann.write_text(json.dumps(data))
    with pytest.raises(DataError, match="crop cache was built for another annotation index"):
        CocoKeypoints(ann, coco_mini_dir, train=True, crop_cache=cached.crop_cache.path)
    with pytest.raises(DataError, match="another annotation index"):  # another crop aspect
        CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir, train=True, input_size=(256, 256),
                      heatmap_size=(64, 64), crop_cache=cached.crop_cache.path)
    with pytest.raises(DataError, match="crop cache not found"):
        CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir, train=True, crop_cache=tmp_path / "none")
    with pytest.raises(ValueError, match="crop_cache is for training"):
        CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir, crop_cache=cached.crop_cache.path)


def test_crop_outside_the_region_is_decoded_exactly(mini, tmp_path):
    exact, cached, _ = mini
    cache = cached.crop_cache
    cached[0]  # maps the pixel file; a pickled cache (for a loader worker) still leaves it out
    assert len(pickle.dumps(cache)) < cache.nbytes() / 10
    # A copy of the cache whose index claims 4x4 px regions: every crop misses them.
    shrunk_dir = tmp_path / "shrunk"
    shutil.copytree(cache.path, shrunk_dir)
    with np.load(shrunk_dir / C.INDEX_FILE) as f:
        arrays = dict(f)
    arrays["region_boxes"][:, 2:] = arrays["region_boxes"][:, :2] + 4
    np.savez(shrunk_dir / C.INDEX_FILE, **arrays)
    ds = CocoKeypoints(exact.ann_file, exact.img_dir, train=True, seed=exact.seed, encode_targets=False,
                       crop_cache=shrunk_dir)
    for i in range(4):
        assert torch.equal(ds[(i, 1)]["image"], exact[(i, 1)]["image"])
    assert ds.crop_cache_misses == 4


def test_unreadable_image_is_left_out(coco_mini_dir, tmp_path):
    root = tmp_path / "mini"
    shutil.copytree(coco_mini_dir, root)
    jpg = root / "000000040083.jpg"
    jpg.write_bytes(jpg.read_bytes()[:5000])  # truncated
    ds = CocoKeypoints(root / "test_coco.json", root, train=True, encode_targets=False, max_bad_images=0)
    info = C.build_crop_cache(ds.index, ds.img_dir, tmp_path / "cache", ds.input_size, num_workers=1)
    assert info["images_left_out"] == 1
    cached = CocoKeypoints(root / "test_coco.json", root, train=True, encode_targets=False,
                           max_bad_images=0, crop_cache=tmp_path / "cache")
    bad = [i for i in range(len(ds)) if ds.image_path(i) == jpg]
    assert bad and all(cached.crop_cache.region(i) is None for i in bad)
    with pytest.raises(DataError, match="truncated"):  # the exact path names the file
        cached[bad[0]]


def test_command_line_builds_the_cache_of_the_configs_training_set(tmp_path, capsys):
    """`vitpose build-crop-cache --config CFG` builds the cache for the set
    build_train_set makes from the config, which then trains from it with the exact crops."""
    paths = make_coco(tmp_path / "coco", num_images=3, seed=4, split="train")
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(f"data:\n  root: {paths.root}\n  crop_cache: crop_cache/train2017\n")
    assert tool.main(["--config", str(cfg_file), "--workers", "1", "--set", "train.seed=3"]) == 0
    assert "instances in" in capsys.readouterr().out
    cfg = load_config(cfg_file, ["train.seed=3"])
    cached = build_train_set(cfg)
    assert cached.crop_cache is not None and cached.crop_cache.path == paths.root / "crop_cache/train2017"
    cfg.data.crop_cache, cfg.data.reduced_decode = None, False
    exact = build_train_set(cfg)
    _assert_same_samples(exact, cached, range(2))
    # without a cache path it refuses before any work
    cfg_file.write_text(f"data:\n  root: {paths.root}\n")
    assert tool.main(["--config", str(cfg_file)]) == 2
    assert "no cache path" in capsys.readouterr().err
