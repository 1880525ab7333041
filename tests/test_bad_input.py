"""Bad input gives a DataError naming the file, the record and the field (one test each)."""

import json
import logging
import shutil

import cv2
import numpy as np
import pytest

from vitpose.data.coco import CocoKeypoints
from vitpose.data.errors import DataError
from vitpose.data.image_io import load_image

K = 17


def _person(ann_id, image_id, x=20.0, y=10.0, w=40.0, h=80.0):
    kpts = []
    for k in range(K):
        kpts += [x + 2 + (k % 5) * 7, y + 3 + k * 4, 2]
    return {"id": ann_id, "image_id": image_id, "category_id": 1, "iscrowd": 0,
            "bbox": [x, y, w, h], "area": w * h, "num_keypoints": K, "keypoints": kpts}


@pytest.fixture
def mini(tmp_path):
    """Two 120x100 JPEG images, one person each; returns (dir, annotation dict, writer)."""
    rng = np.random.default_rng(0)
    for name in ("a.jpg", "b.jpg"):
        cv2.imwrite(str(tmp_path / name), rng.integers(0, 255, (100, 120, 3), dtype=np.uint8))
    data = {"images": [{"id": 1, "file_name": "a.jpg", "width": 120, "height": 100},
                       {"id": 2, "file_name": "b.jpg", "width": 120, "height": 100}],
            "annotations": [_person(11, 1), _person(12, 2)],
            "categories": [{"id": 1, "name": "person"}]}

    def write(d, name="ann.json"):
        path = tmp_path / name
        path.write_text(json.dumps(d))
        return path

    return tmp_path, data, write


def _raises(match_parts, fn):
    with pytest.raises(DataError) as info:
        fn()
    msg = str(info.value)
    for part in match_parts:
        assert part in msg, f"{part!r} not in {msg!r}"
    return info.value


def test_missing_image_file(mini):
    root, data, write = mini
    (root / "b.jpg").unlink()
    ds = CocoKeypoints(write(data), root)
    ds[0]
    _raises(["b.jpg", "annotation id 12", "file_name", "not found"], lambda: ds[1])


def test_truncated_jpeg(mini):
    # Some OpenCV builds decode this without error (grey bottom, a stderr warning); the
    # end-of-image marker check catches it whatever the OpenCV version does.
    root, data, write = mini
    raw = (root / "b.jpg").read_bytes()
    (root / "b.jpg").write_bytes(raw[: len(raw) * 2 // 3])
    ds = CocoKeypoints(write(data), root)
    _raises(["b.jpg", "annotation id 12", "truncated"], lambda: ds[1])


def test_corrupt_image_bytes(mini):
    root, data, write = mini
    (root / "b.jpg").write_bytes(b"this is not an image at all")
    ds = CocoKeypoints(write(data), root)
    _raises(["b.jpg", "annotation id 12", "could not be decoded"], lambda: ds[1])


def test_grayscale_and_four_channel_images_become_bgr(tmp_path):
    # Policy: decode as colour like MMPose's LoadImage (cv2.IMREAD_COLOR): grey is
    # replicated to three channels, alpha is dropped.
    gray = np.arange(60 * 80, dtype=np.uint32).reshape(60, 80).astype(np.uint8)
    cv2.imwrite(str(tmp_path / "g.png"), gray)
    img, _ = load_image(tmp_path / "g.png", expected_size=(80, 60))
    assert img.shape == (60, 80, 3)
    for c in range(3):
        np.testing.assert_array_equal(img[..., c], gray)
    bgra = np.dstack([np.full((60, 80), v, np.uint8) for v in (10, 20, 30, 99)])
    cv2.imwrite(str(tmp_path / "rgba.png"), bgra)
    img, _ = load_image(tmp_path / "rgba.png", expected_size=(80, 60))
    assert img.shape == (60, 80, 3)
    np.testing.assert_array_equal(img[0, 0], [10, 20, 30])


def test_image_size_disagrees_with_record(mini):
    root, data, write = mini
    data["images"][1]["width"] = 300
    ds = CocoKeypoints(write(data), root)
    _raises(["b.jpg", "annotation id 12", "width/height", "300x100"], lambda: ds[1])


def test_wrong_keypoints_length(mini):
    root, data, write = mini
    data["annotations"][1]["keypoints"] = data["annotations"][1]["keypoints"][:-3]
    path = write(data)
    _raises([str(path), "annotation id 12", "'keypoints'", "51", "48"], lambda: CocoKeypoints(path, root))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), None])
def test_nonfinite_keypoint(mini, value):
    root, data, write = mini
    data["annotations"][1]["keypoints"][4] = value  # y of keypoint 1
    path = write(data)
    _raises([str(path), "annotation id 12", "'keypoints'", "non-finite"], lambda: CocoKeypoints(path, root))


def test_negative_box(mini):
    root, data, write = mini
    data["annotations"][0]["bbox"] = [20, 10, -5, 80]
    path = write(data)
    _raises([str(path), "annotation id 11", "'bbox'", "negative"], lambda: CocoKeypoints(path, root))


def test_zero_box_is_dropped_and_counted(mini):
    # MMPose drops boxes that are empty after clipping (part of its 149,813 COCO count); we do
    # the same, and say so in ds.dropped.
    root, data, write = mini
    data["annotations"][0]["bbox"] = [20, 10, 0, 80]
    data["annotations"][1]["bbox"] = [500, 10, 40, 80]  # right of the 120-px image
    path = write(data)
    _raises([str(path), "no usable person instances", "box empty after clipping"],
            lambda: CocoKeypoints(path, root))
    data["annotations"].append(_person(13, 2))
    ds = CocoKeypoints(write(data), root)
    assert len(ds) == 1 and ds.dropped == {"box empty after clipping": 2}


def test_image_id_absent_from_images(mini):
    root, data, write = mini
    data["annotations"][1]["image_id"] = 777
    path = write(data)
    _raises([str(path), "annotation id 12", "'image_id'", "777"], lambda: CocoKeypoints(path, root))


def test_detection_file_unknown_image_id(mini):
    root, data, write = mini
    dets = [{"image_id": 1, "category_id": 1, "bbox": [1, 2, 30, 40], "score": 0.9},
            {"image_id": 5, "category_id": 1, "bbox": [1, 2, 30, 40], "score": 0.8}]
    det_path = write(dets, "det.json")
    _raises([str(det_path), "detection [1]", "'image_id'", "5"],
            lambda: CocoKeypoints(write(data), root, bbox_file=det_path))


def test_detection_file_wrong_schema(mini):
    root, data, write = mini
    ann = write(data)
    det_path = write({"image_id": 1, "bbox": [1, 2, 3, 4]}, "det.json")
    _raises([str(det_path), "JSON list"], lambda: CocoKeypoints(ann, root, bbox_file=det_path))
    det_path = write([{"image_id": 1, "category_id": 1, "bbox": [1, 2, 30, 40]}], "det.json")
    _raises([str(det_path), "detection [0]", "'score'", "missing"],
            lambda: CocoKeypoints(ann, root, bbox_file=det_path))
    det_path = write([{"image_id": 1, "category_id": 1, "bbox": "1,2,3,4", "score": 1}], "det.json")
    _raises([str(det_path), "detection [0]", "'bbox'"], lambda: CocoKeypoints(ann, root, bbox_file=det_path))


def test_empty_dataset(mini):
    root, data, write = mini
    data["annotations"] = []
    path = write(data)
    _raises([str(path), "no usable person instances", "'annotations'"], lambda: CocoKeypoints(path, root))


def test_annotation_file_not_json(tmp_path):
    path = tmp_path / "ann.json"
    path.write_text("{ not json")
    _raises([str(path), "not valid JSON"], lambda: CocoKeypoints(path, tmp_path))


def test_training_skips_unreadable_images_up_to_a_limit(mini, caplog):
    root, data, write = mini
    data["images"].append({"id": 3, "file_name": "c.jpg", "width": 120, "height": 100})
    data["annotations"].append(_person(13, 3))
    shutil.copy(root / "a.jpg", root / "c.jpg")
    (root / "b.jpg").write_bytes((root / "b.jpg").read_bytes()[:500])  # truncated
    path = write(data)
    ds = CocoKeypoints(path, root, train=True, max_bad_images=2)
    with caplog.at_level(logging.WARNING, logger="vitpose.data.coco"):
        s1 = ds[(1, 0)]
    assert ds.bad_images == 1 and "1 so far" in caplog.text and "b.jpg" in caplog.text
    assert s1["id"] in (11, 13)  # a readable substitute
    # The substitute is a pure function of (seed, epoch, index): another dataset agrees.
    ds2 = CocoKeypoints(path, root, train=True, max_bad_images=2)
    s2 = ds2[(1, 0)]
    assert s2["id"] == s1["id"] and np.array_equal(s2["image"], s1["image"])
    ds[(1, 0)]
    assert ds.bad_images == 2
    _raises(["3 unreadable images", "max_bad_images=2", "b.jpg", "annotation id 12"], lambda: ds[(1, 0)])


def test_validation_never_skips(mini):
    root, data, write = mini
    (root / "a.jpg").unlink()
    ds = CocoKeypoints(write(data), root, max_bad_images=100)
    _raises(["a.jpg", "annotation id 11"], lambda: ds[0])
