"""vitpose.Predictor and vitpose.draw_pose against MMPose's predictions on coco-mini."""

import json

import cv2
import numpy as np
import pytest
import torch
from fixture_files import load_npz
from test_evaluate import INSTANCE, ReferenceHeatmaps, decode_sensitivity, tiny_model
from weights_recipe import layout_weights

import vitpose
from vitpose.coco_meta import FLIP_INDICES, SKELETON
from vitpose.inference.predictor import Predictor


@pytest.fixture(scope="module")
def io_ref(fixtures_dir):
    return load_npz(fixtures_dir / "model_vitpose_s_io.npz")


@pytest.fixture(scope="module")
def instance(fixtures_dir, coco_mini_dir):
    """Image 197388 (BGR, as OpenCV decodes it) and the clipped GT box of instance 437295 (xyxy)."""
    val = np.load(fixtures_dir / "pipeline_val.npz")
    index = list(val["id"]).index(INSTANCE)
    image = cv2.imread(str(coco_mini_dir / "000000197388.jpg"), cv2.IMREAD_COLOR)
    return image, val["bbox_xyxy"][index]


class OneCropReference(ReferenceHeatmaps):
    """ReferenceHeatmaps for a batch of one crop (two rows with the flip test)."""

    def forward(self, x):
        self.calls.append(tuple(x.shape))
        assert torch.equal(x[:1], self.ref_input)
        if x.shape[0] == 1:
            return self.ref_heatmaps.clone()
        assert torch.equal(x[1:], self.ref_input.flip(-1))
        return torch.cat([self.ref_heatmaps, self.ref_heatmaps.flip(-1)[:, list(FLIP_INDICES)]])


@pytest.mark.parametrize("flip", [True, False])
@pytest.mark.parametrize("channels", ["bgr", "rgb"])
def test_predictor_pipeline_is_exact_given_mmpose_heatmaps(io_ref, instance, flip, channels):
    image, box = instance
    key = "flip_test" if flip else "noflip"
    model = OneCropReference(io_ref["real_coco/input"],
                             io_ref["real_coco/flip_test_heatmaps" if flip else "real_coco/heatmaps"])
    predictor = Predictor(model, device="cpu", flip_test=flip)
    image = image if channels == "bgr" else image[:, :, ::-1]
    keypoints, scores = predictor.predict(image, box[None], channels=channels)
    assert keypoints.shape == (1, 17, 2) and scores.shape == (1, 17)
    np.testing.assert_allclose(keypoints[0], io_ref[f"real_coco/{key}_keypoints_img"][0], rtol=0, atol=1e-9)
    np.testing.assert_array_equal(scores[0], io_ref[f"real_coco/{key}_scores"][0])


def test_predictor_box_formats_agree(io_ref, instance):
    image, box = instance
    model = OneCropReference(io_ref["real_coco/input"], io_ref["real_coco/flip_test_heatmaps"])
    predictor = Predictor(model, device="cpu")
    xyxy, _ = predictor.predict(image, box, channels="bgr")
    xywh = np.array([box[0], box[1], box[2] - box[0], box[3] - box[1]], np.float32)
    with_score = np.append(xywh, 0.77)  # a detector's 5th column is ignored
    other, _ = predictor.predict(image, with_score[None], box_format="xywh", channels="bgr")
    np.testing.assert_allclose(other, xyxy, atol=1e-4)


@pytest.fixture(scope="module")
def reference_predictor(fixtures_dir):
    model = vitpose.build_model("vitpose-s")
    vitpose.load_weights(model, layout_weights(fixtures_dir, "classic", "mmpose1x"))
    return Predictor(model, device="cpu")


def test_predictor_with_real_model_matches_mmpose(io_ref, instance, reference_predictor):
    image, box = instance
    # Two boxes in one batch: the reference one and a shifted one (batching must not matter).
    boxes = np.stack([box + np.float32(7.0), box])
    keypoints, scores = reference_predictor.predict(image, boxes, channels="bgr")
    np.testing.assert_allclose(scores[1], io_ref["real_coco/flip_test_scores"][0], atol=1e-4)
    error = np.abs(keypoints[1] - io_ref["real_coco/flip_test_keypoints_img"][0]).max(-1)
    # See test_evaluate.test_predict_with_real_model_matches_mmpose for why some keypoints
    # are held to their measured decode conditioning rather than 1e-3 px.
    sensitivity = decode_sensitivity(io_ref["real_coco/flip_test_heatmaps"], amplitude=1e-5)
    sensitivity *= float(io_ref["real_coco/input_scale"][0]) / 192
    assert (error < 1e-3).sum() >= 8, (error, sensitivity)
    assert np.all(error <= np.maximum(1e-3, 3 * sensitivity)), (error, sensitivity)


def test_predictor_loads_a_checkpoint_path(tmp_path, instance):
    image, box = instance
    model = tiny_model(seed=1)
    path = tmp_path / "tiny.safetensors"
    vitpose.save_weights(model, path)

    from_path = Predictor(path, device="cpu")  # the file records what to build
    direct = Predictor(model, device="cpu")
    a = from_path.predict(image, box, channels="bgr")
    b = direct.predict(image, box, channels="bgr")
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    with pytest.raises(FileNotFoundError, match="nope.pth"):
        Predictor(tmp_path / "nope.pth")


def test_predictor_batches_boxes(instance):
    image, box = instance
    model = tiny_model(seed=2)
    boxes = np.stack([box + np.float32(d) for d in range(5)])
    one_batch = Predictor(model, device="cpu", batch_size=8).predict(image, boxes, channels="bgr")
    small = Predictor(model, device="cpu", batch_size=2).predict(image, boxes, channels="bgr")
    np.testing.assert_allclose(one_batch[0], small[0], atol=1e-3)
    np.testing.assert_allclose(one_batch[1], small[1], atol=1e-5)


def test_predictor_whole_image_and_no_boxes(instance):
    image, _ = instance
    predictor = Predictor(tiny_model(), device="cpu")
    keypoints, scores = predictor.predict(image)
    assert keypoints.shape == (1, 17, 2)
    keypoints, scores = predictor.predict(image, np.zeros((0, 4)))
    assert keypoints.shape == (0, 17, 2) and scores.shape == (0, 17)


@pytest.mark.parametrize("kwargs, match", [
    ({"boxes": [[10, 10, 5, 50]]}, "zero or negative width"),
    ({"boxes": [[1, 2, 3]]}, r"shape \(M, 4\)"),
    ({"boxes": [[0, 0, 10, 10]], "box_format": "cxcywh"}, "box_format"),
    ({"boxes": [[0, 0, 10, 10]], "channels": "hsv"}, "channels"),
])
def test_predictor_bad_input(instance, kwargs, match):
    image, _ = instance
    predictor = Predictor(tiny_model(), device="cpu")
    with pytest.raises(ValueError, match=match):
        predictor.predict(image, **kwargs)
    with pytest.raises(ValueError, match="uint8"):
        predictor.predict(image.astype(np.float32), [[0, 0, 10, 10]])


def test_draw_pose_draws_visible_limbs_only():
    image = np.zeros((120, 100, 3), np.uint8)
    keypoints = np.stack([np.linspace(10, 90, 17), np.linspace(10, 110, 17)], axis=1)
    scores = np.full(17, 0.9)
    scores[[5, 6]] = 0.1  # both shoulders hidden
    out = vitpose.draw_pose(image, keypoints, scores, thr=0.3, radius=2, thickness=1)
    assert out is not image and image.sum() == 0
    drawn = out.sum(-1) > 0
    x, y = np.round(keypoints).astype(int).T
    assert drawn[y[0], x[0]] and drawn[y[16], x[16]]
    assert not drawn[y[5], x[5]] and not drawn[y[6], x[6]]
    # Colours: RGB by default, swapped with channels="bgr".
    rgb = vitpose.draw_pose(image, keypoints, scores, radius=2)[y[16], x[16]]
    bgr = vitpose.draw_pose(image, keypoints, scores, radius=2, channels="bgr")[y[16], x[16]]
    np.testing.assert_array_equal(rgb, bgr[::-1])
    # Several people at once, and every limb of the skeleton within range.
    many = vitpose.draw_pose(image, np.stack([keypoints, keypoints + 3]), np.stack([scores, scores]))
    assert many.shape == image.shape and max(max(pair) for pair in SKELETON) < 17
    with pytest.raises(ValueError, match="keypoints"):
        vitpose.draw_pose(image, np.zeros((17, 3)))


def test_readme_snippet_on_synthetic_set(tmp_path):
    """The README's quick start: make a synthetic val set, run Predictor on its boxes, draw."""
    from vitpose.data.synthetic import make_coco

    make_coco(tmp_path, num_images=2, seed=0, split="val")
    dets = json.loads((tmp_path / "person_detection_results" / "val_detections.json").read_text())
    images = {im["id"]: im["file_name"] for im in
              json.loads((tmp_path / "annotations" / "person_keypoints_val2017.json").read_text())["images"]}
    image_id = dets[0]["image_id"]
    image = cv2.imread(str(tmp_path / "val2017" / images[image_id]))[:, :, ::-1]  # RGB
    boxes = np.array([d["bbox"] for d in dets if d["image_id"] == image_id])
    keypoints, scores = Predictor(tiny_model(), device="cpu").predict(image, boxes, box_format="xywh")
    assert keypoints.shape == (len(boxes), 17, 2)
    drawn = vitpose.draw_pose(image, keypoints, scores)
    assert drawn.shape == image.shape


# -- predictor(image): the people of whole images -------------------------------------------------

class CountingModel(torch.nn.Module):
    """Wraps a model and records the batch size of every forward pass."""

    def __init__(self, model):
        super().__init__()
        self.inner = model
        self.batches = []

    def forward(self, x):
        self.batches.append(x.shape[0])
        return self.inner(x)


class FixedDetector:
    """A detector stand-in: the given boxes and scores for each image, and a record of its calls."""

    def __init__(self, per_image):
        self.per_image = per_image
        self.calls = []

    def __call__(self, images, channels="rgb"):
        from vitpose.inference.detect import Detections

        self.calls.append((len(images), channels))
        return [Detections(np.asarray(b, np.float32).reshape(-1, 4), np.asarray(s, np.float32))
                for b, s in self.per_image[:len(images)]]


def test_call_finds_people_with_the_detector(instance):
    image, box = instance
    other = box + np.float32(11.0)
    detector = FixedDetector([([box, other], [0.9, 0.6])])
    predictor = Predictor(tiny_model(seed=4), device="cpu", detector=detector)
    poses = predictor(image, channels="bgr")
    assert isinstance(poses, vitpose.inference.predictor.Poses) and len(poses) == 2
    assert detector.calls == [(1, "bgr")]
    np.testing.assert_array_equal(poses.boxes, np.stack([box, other]))
    np.testing.assert_array_equal(poses.box_scores, np.array([0.9, 0.6], np.float32))
    keypoints, scores = predictor.predict(image, np.stack([box, other]), channels="bgr")
    np.testing.assert_array_equal(poses.keypoints, keypoints)
    np.testing.assert_array_equal(poses.keypoint_scores, scores)
    assert poses.keypoints.shape == (2, 17, 2) and poses.keypoint_scores.shape == (2, 17)
    assert set(predictor.timer.seconds) >= {"detect", "crop", "pose", "decode heatmaps"}


def test_images_of_one_call_share_the_model_batches(instance):
    image, box = instance
    small = np.ascontiguousarray(image[50:300, 40:400])
    boxes = {0: ([box, box + np.float32(5)], [0.8, 0.7]), 1: ([[10, 20, 200, 240]], [0.5]), 2: ([], [])}
    model = CountingModel(tiny_model(seed=6))
    detector = FixedDetector([boxes[0], boxes[1], boxes[2]])
    predictor = Predictor(model, device="cpu", detector=detector, batch_size=2, flip_test=False)
    together = predictor([image, small, small], channels="bgr")
    assert detector.calls == [(3, "bgr")]
    assert model.batches == [2, 1]  # 3 crops of 2 images in batches of 2, not one pass per image
    assert [len(p) for p in together] == [2, 1, 0]
    assert together[2].keypoints.shape == (0, 17, 2) and together[2].boxes.shape == (0, 4)
    for i, img in enumerate([image, small]):
        alone = Predictor(tiny_model(seed=6), device="cpu", flip_test=False).predict(img, boxes[i][0], channels="bgr")
        np.testing.assert_allclose(together[i].keypoints, alone[0], atol=1e-3)  # batch composition only
        np.testing.assert_allclose(together[i].keypoint_scores, alone[1], atol=1e-5)


def test_call_with_caller_boxes(instance):
    image, box = instance
    predictor = Predictor(tiny_model(seed=7), device="cpu")
    xywh = np.array([box[0], box[1], box[2] - box[0], box[3] - box[1], 0.42], np.float32)
    poses = predictor(image, boxes=xywh[None], box_format="xywh", channels="bgr")
    expected = predictor.predict(image, xywh[None], box_format="xywh", channels="bgr")
    np.testing.assert_array_equal(poses.keypoints, expected[0])
    np.testing.assert_array_equal(poses.box_scores, [np.float32(0.42)])
    np.testing.assert_allclose(poses.boxes[0], box, atol=1e-4)
    many = predictor([image, image], boxes=[box[None], np.zeros((0, 4))], channels="bgr")
    np.testing.assert_array_equal(many[0].box_scores, [1.0])  # no 5th column: score 1
    assert len(many[1]) == 0
    with pytest.raises(ValueError, match="no detector: pass boxes="):
        predictor(image)
    with pytest.raises(ValueError, match="2 images but 1 box arrays"):
        predictor([image, image], boxes=[box[None]])
    with pytest.raises(ValueError, match="uint8"):
        predictor([image.astype(np.float32)], boxes=[box[None]])
