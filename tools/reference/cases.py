"""Fresh test cases (the inputs of the fixtures), drawn with numpy from one seed per file.

`make_fixtures.py --cases-from DIR` reuses the cases stored in an existing fixture set instead,
which is how the committed set is kept stable; these recipes are what a new set is drawn with
(tests/fixtures/README.md §2 describes each case). Every recipe needs only numpy and the
coco-mini annotation file, so the same seed gives the same cases on any machine.
"""

import json

import numpy as np
from common import HEATMAP_SIZE, IMAGE_IDS, INPUT_SIZE

K = 17
W_IN, H_IN = INPUT_SIZE
W_HM, H_HM = HEATMAP_SIZE
UDP_STRIDE = np.array([(W_IN - 1) / (W_HM - 1), (H_IN - 1) / (H_HM - 1)])
MSRA_STRIDE = np.array([W_IN / W_HM, H_IN / H_HM])
FRACTIONAL_VISIBILITY = [0, 0.2, 0.49, 0.5, 0.51, 0.8, 1, 2, 1, 0, 1, 0.5, 1, 1, 0.3, 1, 1]
CODEC_SEED, AFFINE_SEED, MODEL_INPUT_SEED, METRIC_SEED = 3101, 4242, 2024, 5150


# ----------------------------------------------------------------------------- codecs

def _random_points(rng, low, high):
    return rng.uniform(low, high, (K, 2))


def _near_border_points(rng):
    """Each point within 3 px of one of the four crop borders, along a random stretch of it."""
    points = rng.uniform([0, 0], [W_IN - 1, H_IN - 1], (K, 2))
    side = rng.integers(0, 4, K)
    offset = rng.uniform(-3, 3, K)
    points[side == 0, 0] = offset[side == 0]
    points[side == 1, 0] = W_IN - 1 + offset[side == 1]
    points[side == 2, 1] = offset[side == 2]
    points[side == 3, 1] = H_IN - 1 + offset[side == 3]
    return points


def _fixed_codec_cases():
    """The hand-made keypoint sets: borders, grids, half-pixel ties, far and just outside."""
    steps = np.arange(K)
    borders = [[0, 0], [191, 0], [0, 255], [191, 255], [96, 128], [192, 256], [191.5, 255.5],
               [-0.5, -0.5], [-0.49, -0.49], [-0.51, 10], [10, -0.51], [192.49, 100], [100, 256.49],
               [0.5, 0.5], [1.5, 2.5], [95.5, 127.5], [191.999, 255.999]]
    far = [[[-1000, 50], [1000, 50], [50, -1000], [50, 1000]][i % 4] for i in range(K)]
    just_outside = [[-1 - 4.875 * i, 128] for i in range(9)] + [[96, 256 + 39 / 7 * i] for i in range(8)]
    return {
        "borders_corners_ties": np.array(borders),
        "on_udp_grid": np.stack([steps * (W_IN - 1) / 16, steps * (H_IN - 1) / 16], -1),
        "on_msra_grid": np.stack([steps * 11.0, steps * 15.0], -1),
        "half_pixel_hm_udp": np.stack([0.5 + 2.5 * steps, 0.5 + 3.5 * steps], -1) * UDP_STRIDE,
        "half_pixel_hm_msra": np.stack([0.5 + 2.5 * steps, 0.5 + 3.5 * steps], -1) * MSRA_STRIDE,
        "far_outside": np.array(far, float),
        "just_outside": np.array(just_outside),
    }


def draw_codec_cases(seed=CODEC_SEED):
    """21 keypoint sets (one instance each) and 10 noisy heatmap sets for the codec fixtures.

    Returns:
        {"keypoints" (S,1,17,2) f32, "keypoints_visible" (S,1,17) f32, "case_names",
        "noisy_heatmaps" (10,17,64,48) f32 (float16 values), "noisy_kinds", "seed"}; the noisy
        maps need the UDP encoding of sets 0-2, so `noisy_from_clean` finishes them.
    """
    rng = np.random.default_rng(seed)
    names, points, visible = [], [], []

    def add(name, pts, vis=None):
        names.append(name)
        points.append(np.asarray(pts, float))
        visible.append(np.ones(K) if vis is None else np.asarray(vis, float))

    for i in range(6):
        add(f"inside_random_{i}", _random_points(rng, [0, 0], [W_IN - 1, H_IN - 1]),
            (rng.random(K) >= 0.15).astype(float))
    for i in range(2):
        add(f"wide_random_{i}", _random_points(rng, [-40, -40], [W_IN + 39, H_IN + 39]))
    fixed = _fixed_codec_cases()
    for name in ("borders_corners_ties", "on_udp_grid", "on_msra_grid", "half_pixel_hm_udp",
                 "half_pixel_hm_msra", "far_outside", "just_outside"):
        add(name, fixed[name])
    add("all_invisible", _random_points(rng, [0, 0], [W_IN - 1, H_IN - 1]), np.zeros(K))
    add("fractional_visibility", _random_points(rng, [0, 0], [W_IN - 1, H_IN - 1]), FRACTIONAL_VISIBILITY)
    add("all_same_point", np.tile([77.3, 140.9], (K, 1)))
    add("near_zero_negative", np.stack([np.linspace(-0.01, -3.9, K), np.linspace(0, 30, K)], -1))
    for i in range(2):
        add(f"near_border_random_{i}", _near_border_points(rng))
    return {
        "keypoints": np.stack(points)[:, None].astype(np.float32),
        "keypoints_visible": np.stack(visible)[:, None].astype(np.float32),
        "case_names": names,
        "seed": seed,
        "rng": rng,  # the noisy maps continue this stream
    }


def _blobs(rng, count):
    """(17,64,48) maps holding `count` Gaussian blobs of random size and height per channel."""
    ys, xs = np.mgrid[0:H_HM, 0:W_HM]
    maps = np.zeros((K, H_HM, W_HM))
    for k in range(K):
        for _ in range(count):
            cx, cy = rng.uniform(-2, W_HM + 1), rng.uniform(-2, H_HM + 1)
            sigma, height = rng.uniform(1.0, 4.0), rng.uniform(0.2, 0.9)
            maps[k] += height * np.exp(-((xs - cx) ** 2 + (ys - cy) ** 2) / (2 * sigma**2))
    return maps


def _border_peaks(rng):
    """One sharp peak per channel on a border cell, with weaker single cells next to some."""
    maps = np.zeros((K, H_HM, W_HM))
    for k in range(K):
        y = int(rng.choice([0, H_HM - 1])) if k % 2 else int(rng.integers(0, H_HM))
        x = int(rng.integers(0, W_HM)) if k % 2 else int(rng.choice([0, W_HM - 1]))
        maps[k, y, x] = 1.0
        maps[k, min(y + 1, H_HM - 1), x] = [0.1, 0.25, 0.5, 0.75, 0.0][k % 5]
    return maps


def noisy_from_clean(cases, clean_heatmaps):
    """Adds the 10 noisy/degenerate heatmap sets to `cases` (float16 values, stored float32).

    Args:
        cases: the dict from draw_codec_cases (its rng continues).
        clean_heatmaps: (S,17,64,48) UDP encodings of the keypoint sets.
    """
    rng = cases.pop("rng")
    shape = (K, H_HM, W_HM)
    maps = {
        "gauss_plus_noise0.05_from_set0": clean_heatmaps[0] + rng.uniform(-0.05, 0.05, shape),
        "gauss_plus_noise0.05_from_set1": clean_heatmaps[1] + rng.uniform(-0.05, 0.05, shape),
        "gauss_plus_normal0.15_from_set2": clean_heatmaps[2] + rng.normal(0, 0.15, shape),
        "random_blobs_0": _blobs(rng, 2) + rng.uniform(-0.05, 0.05, shape),
        "random_blobs_1": _blobs(rng, 3) + rng.uniform(-0.05, 0.05, shape),
        "pure_uniform_noise_SENSITIVE": rng.uniform(0, 1, shape),
        "all_zero_DEGENERATE": np.zeros(shape),
        "all_negative_DEGENERATE": np.full(shape, -0.1),
        "constant_positive_tie": np.full(shape, 0.25),
        "sharp_peaks_on_borders": _border_peaks(rng),
    }
    cases["noisy_kinds"] = list(maps)
    # float16 values: the maps compress to half, and every reference is decoded from these values
    cases["noisy_heatmaps"] = np.stack(list(maps.values())).astype(np.float16).astype(np.float32)
    return cases


# ----------------------------------------------------------------------------- affine crops

def _instances_by_image(ann_file):
    data = json.loads(ann_file.read_text())
    shapes = {im["id"]: (im["height"], im["width"]) for im in data["images"]}
    by_image = {image_id: [] for image_id in IMAGE_IDS}
    for ann in data["annotations"]:
        if ann["num_keypoints"] > 0 and not ann.get("iscrowd", 0):
            by_image[ann["image_id"]].append(ann)
    return shapes, by_image


def draw_affine_cases(ann_file, seed=AFFINE_SEED, per_image=6):
    """Boxes (centre, scale, rotation) and points for the affine fixture, `per_image` per image.

    Sample 0 of an image is the box of its last annotated instance, padded by 1.25, unrotated.
    The other samples are random: centres from -10 % to 110 % of the image, extreme aspect
    ratios in samples 1 and 2, no rotation in 3 and 4, a multiple of 90 degrees in 5, otherwise
    up to +-80 degrees. Every sample of an image carries the 17 keypoints of that instance
    (unlabelled ones at (0, 0)) and 17 random points of the image. The plain (non-UDP) crops are
    kept for samples 0 and 2 of each image.
    """
    rng = np.random.default_rng(seed)
    shapes, by_image = _instances_by_image(ann_file)
    rows = {key: [] for key in ("image_id", "center", "scale_in", "rotation", "keypoints_in")}
    for image_id in IMAGE_IDS:
        h, w = shapes[image_id]
        ann = by_image[image_id][-1]
        x, y, bw, bh = ann["bbox"]
        gt_points = np.array(ann["keypoints"], float).reshape(K, 3)[:, :2]
        for sample in range(per_image):
            if sample == 0:
                center, scale, rotation = [x + bw / 2, y + bh / 2], [bw * 1.25, bh * 1.25], 0.0
            else:
                center = rng.uniform(-0.1, 1.1, 2) * [w, h]
                size = rng.uniform(0.1, 0.8) * min(w, h)
                aspect = {1: 0.15, 2: 6.0}.get(sample, rng.uniform(0.5, 2.0))
                scale = [size * np.sqrt(aspect), size / np.sqrt(aspect)]
                if sample in (3, 4):
                    rotation = 0.0
                elif sample == 5:
                    rotation = float(rng.choice([-90.0, 90.0, 180.0]))
                else:
                    rotation = rng.uniform(-80, 80)
            rows["image_id"].append(image_id)
            rows["center"].append(center)
            rows["scale_in"].append(scale)
            rows["rotation"].append(rotation)
            rows["keypoints_in"].append(np.concatenate([gt_points, rng.uniform([0, 0], [w - 1, h - 1], (K, 2))]))
    plain = [i * per_image + sample for i in range(len(IMAGE_IDS)) for sample in (0, 2)]
    return {
        "image_id": np.array(rows["image_id"], np.int64),
        "center": np.array(rows["center"], np.float32),
        "scale_in": np.array(rows["scale_in"], np.float32),
        "rotation": np.array(rows["rotation"], np.float32),
        "keypoints_in": np.array(rows["keypoints_in"], np.float32),
        "warped_plain_index": np.array(plain, np.int64),
        "seed": seed,
        "n_per_image": per_image,
    }


# ----------------------------------------------------------------------------- model inputs

def draw_model_inputs(seed=MODEL_INPUT_SEED):
    """The two synthetic model inputs and the boxes their keypoints are mapped into.

    Returns:
        {"randn/input": N(0,1) rounded to multiples of 1/64 (float16 values, float32 array),
        "uniform_pixels/input_uint8_bgr": uniform random pixels 0..255 (1,3,256,192) BGR, and
        "<name>/input_center|input_scale": arbitrary float32 boxes}.
    """
    rng = np.random.default_rng(seed)
    randn = np.round(rng.standard_normal((1, 3, H_IN, W_IN)) * 64) / 64
    return {
        "randn/input": randn.astype(np.float32),
        "uniform_pixels/input_uint8_bgr": rng.integers(0, 256, (1, 3, H_IN, W_IN), dtype=np.uint8),
        "randn/input_center": np.array([100.0, 150.0], np.float32),
        "randn/input_scale": np.array([192.0, 256.0], np.float32),
        "uniform_pixels/input_center": np.array([320.5, 200.25], np.float32),
        "uniform_pixels/input_scale": np.array([300.0, 400.0], np.float32),
    }
