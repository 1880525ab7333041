"""vitpose.inference.warp: the torch crop warp equals cv2.warpAffine (bilinear, constant 0 border).

Measured tolerance: none. On coco-mini's 118 detection boxes, on rotated, enlarged and shrunk
crops and on crops far outside the image, every pixel equals OpenCV's. The plain float bilinear
formula differs from OpenCV by up to 6 grey levels on the same crops (OpenCV rounds sampling
positions to 1/32 pixel); the last test shows the comparison is sharp enough to see that.
"""

import json

import cv2
import numpy as np
import pytest
import torch

from vitpose.data.geometry import bbox_xywh2xyxy, bbox_xyxy2cs, get_udp_warp_matrix
from vitpose.data.transforms import crop_geometry
from vitpose.inference.warp import invert_affine_like_opencv, warp_affine_uint8

INPUT_SIZE = (192, 256)


def cv2_crop(image, matrix, size=INPUT_SIZE):
    return cv2.warpAffine(image, np.asarray(matrix), size, flags=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=0)


@pytest.fixture(scope="module")
def coco_mini_crops(coco_mini_dir):
    """Every detection box of coco-mini: (images (4, H, W, 3) padded, image index, UDP matrices)."""
    detections = json.loads((coco_mini_dir / "test_coco_det_AP_H_56.json").read_text())
    ids = sorted({d["image_id"] for d in detections})
    images = [cv2.imread(str(coco_mini_dir / f"{i:012d}.jpg")) for i in ids]
    index, matrices = [], []
    for d in detections:
        center, scale = bbox_xyxy2cs(bbox_xywh2xyxy(np.array(d["bbox"], np.float32)))
        _, matrix = crop_geometry(center, scale, 0.0, INPUT_SIZE)
        index.append(ids.index(d["image_id"]))
        matrices.append(matrix)
    return images, np.array(index), np.stack(matrices)


def test_coco_mini_detection_crops_equal_opencv(coco_mini_crops):
    images, index, matrices = coco_mini_crops
    assert len(matrices) == 118
    for i, image in enumerate(images):
        mine = warp_affine_uint8(torch.from_numpy(image), matrices[index == i], INPUT_SIZE)
        expected = np.stack([cv2_crop(image, m).transpose(2, 0, 1) for m in matrices[index == i]])
        assert mine.dtype == torch.uint8 and mine.shape == expected.shape
        np.testing.assert_array_equal(mine.numpy(), expected)


def test_crops_of_several_frames_in_one_call(coco_mini_crops):
    images, index, matrices = coco_mini_crops
    # frames of one video have one size: cut the four images to a common size
    h = min(im.shape[0] for im in images)
    w = min(im.shape[1] for im in images)
    frames = np.stack([np.ascontiguousarray(im[:h, :w]) for im in images])
    pick = np.arange(0, len(matrices), 7)
    mine = warp_affine_uint8(torch.from_numpy(frames), matrices[pick], INPUT_SIZE, image_index=index[pick])
    expected = np.stack([cv2_crop(frames[index[i]], matrices[i]).transpose(2, 0, 1) for i in pick])
    np.testing.assert_array_equal(mine.numpy(), expected)


@pytest.mark.parametrize("rotation", [0.0, 17.5, -90.0, 135.0])
@pytest.mark.parametrize("box", [(300, 200, 80, 160), (320, 210, 900, 700), (-30, -40, 120, 200),
                                 (600, 400, 200, 300), (2000, 2000, 50, 50), (100, 100, 3, 2)])
def test_rotated_scaled_and_outside_crops_equal_opencv(coco_mini_dir, rotation, box):
    image = cv2.imread(str(coco_mini_dir / "000000197388.jpg"))
    center, size = np.array(box[:2], np.float32), np.array(box[2:], np.float32)
    matrix = get_udp_warp_matrix(center, size, rotation, INPUT_SIZE)
    mine = warp_affine_uint8(torch.from_numpy(image), matrix[None], INPUT_SIZE)
    np.testing.assert_array_equal(mine[0].numpy(), cv2_crop(image, matrix).transpose(2, 0, 1))


def test_random_matrices_any_channel_count_and_float64_equal_opencv():
    rng = np.random.default_rng(3)
    for channels in (1, 3, 4):
        image = rng.integers(0, 256, (97, 131, channels), dtype=np.uint8)
        for _ in range(10):
            matrix = np.concatenate([rng.normal(0, 1.5, (2, 2)), rng.uniform(-60, 60, (2, 1))], 1)
            expected = cv2_crop(image, matrix, (50, 40)).reshape(40, 50, channels)
            mine = warp_affine_uint8(torch.from_numpy(image), matrix[None], (50, 40))
            np.testing.assert_array_equal(mine[0].permute(1, 2, 0).numpy(), expected)


def test_inverse_matches_opencv():
    rng = np.random.default_rng(0)
    matrices = rng.normal(0, 2, (20, 2, 3))
    expected = np.stack([cv2.invertAffineTransform(m) for m in matrices])
    np.testing.assert_allclose(invert_affine_like_opencv(matrices), expected, rtol=1e-13, atol=1e-12)


def test_bad_arguments_are_named():
    image = torch.zeros((10, 10, 3), dtype=torch.uint8)
    with pytest.raises(TypeError, match="uint8"):
        warp_affine_uint8(image.float(), np.eye(2, 3)[None], (4, 4))
    with pytest.raises(ValueError, match=r"\(N, 2, 3\)"):
        warp_affine_uint8(image, np.eye(2, 3), (4, 4))
    with pytest.raises(ValueError, match="image_index"):
        warp_affine_uint8(torch.zeros((2, 10, 10, 3), dtype=torch.uint8), np.stack([np.eye(2, 3)] * 3), (4, 4))
    assert warp_affine_uint8(image, np.zeros((0, 2, 3)), (4, 5)).shape == (0, 3, 5, 4)


def test_float_bilinear_is_not_opencv(coco_mini_crops):
    """The comparison above would catch a plain float bilinear sampler (grid_sample-like)."""
    images, index, matrices = coco_mini_crops
    image, matrix = images[index[0]], matrices[0]
    inverse = invert_affine_like_opencv(matrix[None])[0]
    u, v = np.meshgrid(np.arange(INPUT_SIZE[0]), np.arange(INPUT_SIZE[1]))
    xs = inverse[0, 0] * u + inverse[0, 1] * v + inverse[0, 2]
    ys = inverse[1, 0] * u + inverse[1, 1] * v + inverse[1, 2]
    x0, y0 = np.floor(xs).astype(int), np.floor(ys).astype(int)
    fx, fy = xs - x0, ys - y0
    h, w = image.shape[:2]
    exact = np.zeros(xs.shape + (3,))
    for dy, dx, weight in ((0, 0, (1 - fx) * (1 - fy)), (0, 1, fx * (1 - fy)), (1, 0, (1 - fx) * fy), (1, 1, fx * fy)):
        yy, xx = y0 + dy, x0 + dx
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        exact += image[yy.clip(0, h - 1), xx.clip(0, w - 1)] * (weight * inside)[..., None]
    float_crop = np.rint(exact).astype(np.uint8)
    opencv = cv2_crop(image, matrix)
    assert np.abs(float_crop.astype(int) - opencv).max() > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_crops_on_cuda_equal_opencv(coco_mini_crops):
    images, index, matrices = coco_mini_crops
    for i, image in enumerate(images):
        on_gpu = warp_affine_uint8(torch.from_numpy(image).cuda(), matrices[index == i], INPUT_SIZE)
        assert on_gpu.device.type == "cuda"
        expected = np.stack([cv2_crop(image, m).transpose(2, 0, 1) for m in matrices[index == i]])
        np.testing.assert_array_equal(on_gpu.cpu().numpy(), expected)
