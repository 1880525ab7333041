"""CocoKeypoints against MMPose 1.3.2: the val pipeline bit for bit, the train augmentation by
its distributions and by geometry (the image and the keypoints move together)."""

import hashlib

import cv2
import numpy as np
import pytest

from vitpose.data import transforms as T
from vitpose.data.coco import CocoKeypoints

# The fixture crops were made with OpenCV 4.10; every 4.x reproduces them, 5.0 rounds uint8
# warpAffine differently (docs/data.md §6.3).
needs_opencv4 = pytest.mark.skipif(int(cv2.__version__.split(".")[0]) != 4,
                                   reason=f"exact crops need OpenCV 4.x, found {cv2.__version__}")


@pytest.fixture(scope="module")
def ref(fixtures_dir):
    return np.load(fixtures_dir / "pipeline_val.npz")


@pytest.fixture(scope="module")
def val_gt(coco_mini_dir):
    return CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir)


@pytest.fixture(scope="module")
def val_det(coco_mini_dir):
    return CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir,
                         bbox_file=coco_mini_dir / "test_coco_det_AP_H_56.json")


def test_gt_instances_match_mmpose(val_gt, ref):
    assert len(val_gt) == 12
    samples = [val_gt[i] for i in range(len(val_gt))]
    np.testing.assert_array_equal([s["id"] for s in samples], ref["id"])
    np.testing.assert_array_equal([s["image_id"] for s in samples], ref["img_id"])
    np.testing.assert_array_equal(np.stack([s["center"].numpy() for s in samples]), ref["bbox_center"])
    np.testing.assert_array_equal(np.stack([s["scale"].numpy() for s in samples]), ref["bbox_scale"])
    np.testing.assert_array_equal([s["bbox_score"] for s in samples], ref["bbox_score"])
    np.testing.assert_array_equal(val_gt.index.bbox_xyxy, ref["bbox_xyxy"])
    np.testing.assert_allclose([s["area"] for s in samples], ref["bbox_scale"].prod(axis=1), rtol=1e-6)


@needs_opencv4
def test_gt_crops_bit_exact(val_gt, ref):
    for i in range(len(val_gt)):
        image = val_gt[i]["image"]
        assert image.dtype.__str__() == "torch.uint8" and tuple(image.shape) == (3, 256, 192)
        bgr = np.ascontiguousarray(image.numpy()[::-1])
        assert hashlib.md5(bgr.tobytes()).hexdigest() == ref["crop_md5"][i], (
            f"instance {i}: crop differs (channel means {bgr.reshape(3, -1).mean(1)} vs {ref['crop_mean_bgr'][i]})")


def test_gt_keypoints_through_the_warp(val_gt, ref):
    # The val crop's matrix carries the GT keypoints to MMPose's transformed_keypoints.
    for i in range(len(val_gt)):
        info = val_gt.instance_info(i)
        _, matrix = T.crop_geometry(info["center"], info["scale"], 0.0)
        got = T.transform_points(info["keypoints"], matrix)
        np.testing.assert_allclose(got, ref["transformed_keypoints"][i], atol=1e-4)
        np.testing.assert_array_equal(info["keypoints_visible"], ref["keypoints_visible"][i])


def test_detection_boxes_match_mmpose(val_det, ref):
    assert len(val_det) == 118
    np.testing.assert_array_equal(val_det.index.bbox_xyxy, ref["det_bbox_xyxy"])
    np.testing.assert_array_equal(val_det.index.bbox_score, ref["det_bbox_score"])
    np.testing.assert_array_equal(val_det.index.center, ref["det_bbox_center"])
    for i in (0, 21, 22, 60, 117):
        s = val_det[i]
        assert s["image_id"] == ref["det_img_id"][i] and s["id"] == i
        np.testing.assert_array_equal(s["scale"].numpy(), ref["det_bbox_scale"][i])


@needs_opencv4
def test_detection_crops_md5(val_det, ref):
    for i in range(len(val_det)):
        bgr = np.ascontiguousarray(val_det[i]["image"].numpy()[::-1])
        assert hashlib.md5(bgr.tobytes()).hexdigest() == ref["det_crop_md5"][i], f"detection {i}"
