"""Crop geometry against MMPose 1.3.2 (fixtures affine.npz, pipeline_val.npz, model_vitpose_s_io.npz)."""

import hashlib
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from vitpose.codecs import UDPHeatmap
from vitpose.data.geometry import (
    bbox_xywh2xyxy,
    bbox_xyxy2cs,
    crop_to_image,
    fix_aspect_ratio,
    get_udp_warp_matrix,
    get_warp_matrix,
    transform_points,
)

INPUT_SIZE = (192, 256)
CV2_MAJOR = int(cv2.__version__.split(".")[0])
needs_opencv4 = pytest.mark.skipif(
    CV2_MAJOR >= 5,
    reason=f"exact crops need OpenCV 4.x (uint8 warpAffine rounding changed in 5.0); found {cv2.__version__}")


@pytest.fixture(scope="module")
def affine(fixtures_dir):
    data = np.load(fixtures_dir / "affine.npz")
    out = {k: data[k] for k in data.files}
    out["info"] = json.loads(str(data["info_json"]))
    return out


@pytest.fixture(scope="module")
def images(affine, coco_mini_dir):
    """The 4 coco-mini images decoded with cv2 (BGR), checked against the fixtures' md5s."""
    info = affine["info"]
    out = {}
    for image_id, name, md5 in zip(info["image_ids"], info["image_file_names"], info["decoded_image_md5_bgr_uint8"]):
        image = cv2.imread(str(coco_mini_dir / name), cv2.IMREAD_COLOR)
        assert image is not None, f"cv2 could not read {coco_mini_dir / name}"
        assert hashlib.md5(image.tobytes()).hexdigest() == md5, f"JPEG decoder differs from the fixtures' on {name}"
        out[image_id] = image
    return out


# ----------------------------------------------------------------------------- matrices

def test_fix_aspect_ratio_matches_mmpose_and_only_enlarges(affine):
    fixed = fix_aspect_ratio(affine["scale_in"], aspect_ratio=0.75)
    np.testing.assert_array_equal(fixed, affine["scale_fixed"])
    assert fixed.dtype == np.float32
    assert (fixed >= affine["scale_in"]).all()
    np.testing.assert_allclose(fixed[:, 0] / fixed[:, 1], 0.75, rtol=1e-6)
    np.testing.assert_array_equal(fix_aspect_ratio(np.array([30.0, 100.0])), [75.0, 100.0])
    np.testing.assert_array_equal(fix_aspect_ratio(np.array([90.0, 100.0])), [90.0, 120.0])


def test_udp_warp_matrix_matches_mmpose(affine):
    matrices = get_udp_warp_matrix(affine["center"], affine["scale_fixed"], affine["rotation"], INPUT_SIZE)
    assert matrices.dtype == np.float32 and matrices.shape == (24, 2, 3)
    np.testing.assert_allclose(matrices, affine["udp_matrix"], rtol=0, atol=1e-5)
    # One sample with its float32 rotation gives the batch's row (a Python float would compute the
    # angle in float64, as MMPose does: tests/fixtures/numeric_cases.npz covers that).
    one = get_udp_warp_matrix(affine["center"][5], affine["scale_fixed"][5], affine["rotation"][5], INPUT_SIZE)
    np.testing.assert_array_equal(one, matrices[5])


def test_plain_warp_matrix_matches_mmpose(affine):
    matrices = get_warp_matrix(affine["center"], affine["scale_fixed"], affine["rotation"], INPUT_SIZE)
    assert matrices.dtype == np.float64 and matrices.shape == (24, 2, 3)
    np.testing.assert_allclose(matrices, affine["plain_matrix"], rtol=1e-7, atol=1e-5)


def test_udp_warp_matrix_analytic():
    center, scale = np.array([300.0, 200.0], np.float32), np.array([150.0, 200.0], np.float32)
    m = get_udp_warp_matrix(center, scale, 0.0, INPUT_SIZE)
    corners = np.array([[225.0, 100.0], [375.0, 300.0], [300.0, 200.0]])
    # the box spans exactly [0, w-1] x [0, h-1] of the crop; its centre lands on ((w-1)/2, (h-1)/2)
    np.testing.assert_allclose(transform_points(corners, m), [[0, 0], [191, 255], [95.5, 127.5]], atol=1e-4)
    # docs/data.md §6.1: y' = sy * (sin(r) (x - cx) + cos(r) (y - cy) + S_h / 2); at r = 90 degrees a
    # point 10 px right of the centre lands 10 * sy below the crop centre.
    m90 = get_udp_warp_matrix(center, scale, 90.0, INPUT_SIZE)
    moved = transform_points(np.array([[310.0, 200.0]]), m90)[0]
    np.testing.assert_allclose(moved, [95.5, 127.5 + 10 * 255 / 200], atol=1e-4)


# ----------------------------------------------------------------------------- boxes

def test_boxes_to_center_scale_match_val_pipeline(fixtures_dir):
    data = np.load(fixtures_dir / "pipeline_val.npz")
    for prefix in ("", "det_"):
        center, scale = bbox_xyxy2cs(data[f"{prefix}bbox_xyxy"], padding=1.25)
        np.testing.assert_array_equal(center, data[f"{prefix}bbox_center"], err_msg=prefix or "gt")
        np.testing.assert_array_equal(fix_aspect_ratio(scale), data[f"{prefix}bbox_scale"], err_msg=prefix or "gt")
    center, scale = bbox_xyxy2cs(data["bbox_xyxy"][0])
    assert center.shape == (2,) and scale.shape == (2,)


def test_bbox_xywh2xyxy():
    np.testing.assert_array_equal(bbox_xywh2xyxy(np.array([[10.0, 20.0, 30.0, 40.0]])), [[10, 20, 40, 60]])
    center, scale = bbox_xyxy2cs(bbox_xywh2xyxy(np.array([10.0, 20.0, 30.0, 40.0])), padding=1.0)
    np.testing.assert_array_equal(center, [25, 40])
    np.testing.assert_array_equal(scale, [30, 40])


# ----------------------------------------------------------------------------- points and crops

def test_keypoints_through_the_matrices(affine):
    udp = transform_points(affine["keypoints_in"], affine["udp_matrix"])
    assert udp.dtype == np.float32 and udp.shape == (24, 34, 2)
    np.testing.assert_allclose(udp, affine["keypoints_udp"], rtol=0, atol=1e-4)
    plain = transform_points(affine["keypoints_in"], affine["plain_matrix"])
    np.testing.assert_allclose(plain, affine["keypoints_plain_matrix"], rtol=0, atol=1e-4)
    one = transform_points(affine["keypoints_in"][7], affine["udp_matrix"][7])
    np.testing.assert_array_equal(one, udp[7])


@needs_opencv4
def test_udp_crops_exact(affine, images):
    matrices = get_udp_warp_matrix(affine["center"], affine["scale_fixed"], affine["rotation"], INPUT_SIZE)
    for j, i in enumerate(affine["warped_udp_index"]):
        crop = cv2.warpAffine(images[int(affine["image_id"][i])], matrices[i], INPUT_SIZE,
                              flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
        np.testing.assert_array_equal(crop, affine["warped_udp"][j], err_msg=f"sample {i}")


@needs_opencv4
def test_plain_crops_exact(affine, images):
    matrices = get_warp_matrix(affine["center"], affine["scale_fixed"], affine["rotation"], INPUT_SIZE)
    for j, i in enumerate(affine["warped_plain_index"]):
        crop = cv2.warpAffine(images[int(affine["image_id"][i])], matrices[i], INPUT_SIZE,
                              flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
        np.testing.assert_array_equal(crop, affine["warped_plain"][j], err_msg=f"sample {i}")


@pytest.mark.parametrize("name", ["real_coco", "randn", "uniform_pixels"])
def test_crop_to_image_matches_mmpose_predict(fixtures_dir, name):
    data = np.load(fixtures_dir / "model_vitpose_s_io.npz")
    codec = UDPHeatmap()
    center, scale = data[f"{name}/input_center"], data[f"{name}/input_scale"]
    for maps, expected in ((f"{name}/flip_test_heatmaps", f"{name}/flip_test_keypoints_img"),
                           (f"{name}/heatmaps", f"{name}/noflip_keypoints_img")):
        keypoints, _ = codec.batch_decode(data[maps])
        image_keypoints = crop_to_image(keypoints, center[None], scale[None], INPUT_SIZE)
        assert image_keypoints.dtype == np.float64
        np.testing.assert_allclose(image_keypoints, data[expected], rtol=0, atol=1e-3, err_msg=maps)
        as_torch = crop_to_image(torch.from_numpy(keypoints), torch.from_numpy(center)[None],
                                 torch.from_numpy(scale)[None], INPUT_SIZE)
        np.testing.assert_allclose(as_torch.numpy(), data[expected], rtol=0, atol=1e-3, err_msg=maps)


def test_crop_to_image_is_the_official_udp_mapping():
    # x_in = x_hm / (W-1) * w, then x_img = x_in / w * S + c - S/2  ==  x_hm * S / (W-1) + c - S/2
    hm = np.array([[[0.0, 0.0], [47.0, 63.0], [12.5, 40.25]]])
    keypoints_in = hm / [47, 63] * [192, 256]
    center, scale = np.array([[300.0, 200.0]]), np.array([[150.0, 200.0]])
    expected = hm * scale[:, None] / [47, 63] + center[:, None] - scale[:, None] / 2
    np.testing.assert_allclose(crop_to_image(keypoints_in, center, scale, INPUT_SIZE), expected, atol=1e-9)


# ----------------------------------------------------------------------------- dtypes (MMPose's own)
# tests/fixtures/numeric_cases.npz (tools/reference/make_numeric_cases.py): MMPose's matrices for
# boxes and angles given as float64 / a Python float (the angle converted in float64) and as
# float32 values (the training pipeline's dtypes, the angle converted in float32).

NUMERIC_CASES = Path(__file__).parent / "fixtures" / "numeric_cases.npz"
DTYPES = {"f64": (np.float64, float), "f32": (np.float32, np.float32)}


@pytest.fixture(scope="module")
def warp_cases():
    with np.load(NUMERIC_CASES) as data:
        return {k[len("warp/"):]: data[k] for k in data.files if k.startswith("warp/")}


@pytest.mark.parametrize("suffix", DTYPES)
def test_warp_matrices_compute_in_the_callers_dtype(warp_cases, suffix):
    box_dtype, angle_type = DTYPES[suffix]
    center, scale = warp_cases["center"].astype(box_dtype), warp_cases["scale"].astype(box_dtype)
    for i, rot in enumerate(warp_cases["rot"]):
        angle = angle_type(rot)
        np.testing.assert_array_equal(get_udp_warp_matrix(center[i], scale[i], angle, INPUT_SIZE),
                                      warp_cases[f"udp_{suffix}"][i], err_msg=f"udp {i}")
        np.testing.assert_array_equal(get_warp_matrix(center[i], scale[i], angle, INPUT_SIZE),
                                      warp_cases[f"plain_{suffix}"][i], err_msg=f"plain {i}")
        np.testing.assert_array_equal(get_warp_matrix(center[i], scale[i], angle, INPUT_SIZE, fix_aspect_ratio=False),
                                      warp_cases[f"plain_no_aspect_fix_{suffix}"][i], err_msg=f"no aspect fix {i}")
    # Batched: an array of angles converts in its own dtype too.
    angles = warp_cases["rot"].astype(box_dtype)
    np.testing.assert_array_equal(get_udp_warp_matrix(center, scale, angles, INPUT_SIZE), warp_cases[f"udp_{suffix}"])
    np.testing.assert_array_equal(get_warp_matrix(center, scale, angles, INPUT_SIZE), warp_cases[f"plain_{suffix}"])


def test_python_float_and_float32_angles_differ_as_in_mmpose(warp_cases):
    """The cases can tell the two conversions apart: -90 degrees in float32 radians leaves a
    cos of -4.4e-8, in float64 one of 6.1e-17."""
    center, scale = warp_cases["center"][2], warp_cases["scale"][2]
    assert warp_cases["rot"][2] == -90.0
    in_float64 = get_udp_warp_matrix(center, scale, -90.0, INPUT_SIZE)
    in_float32 = get_udp_warp_matrix(center, scale, np.float32(-90.0), INPUT_SIZE)
    np.testing.assert_array_equal(in_float64, warp_cases["udp_f64"][2])
    assert abs(in_float64[0, 0]) < 1e-15 < abs(in_float32[0, 0])
