"""vitpose.inference.detect wiring: batched calls, people only, score threshold, xyxy boxes, empty results.

Nothing downloads: stand-in models return chosen outputs, and torchvision's models are built
with random weights (`pretrained=False`); the boxes themselves are not judged.
"""

import numpy as np
import pytest
import torch

from vitpose.inference import detect
from vitpose.inference.detect import Detections, FullFrame, PersonDetector, build_detector, make_detector


class StandIn(torch.nn.Module):
    """A detection model that records its inputs and returns the outputs it was given, per image."""

    def __init__(self, outputs):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the module a device
        self.outputs = outputs
        self.calls = []

    def forward(self, images):
        self.calls.append([t.clone() for t in images])
        first = sum(len(c) for c in self.calls[:-1])
        return [self.outputs[first + i] for i in range(len(images))]


def output(labels, scores, boxes):
    return {"labels": torch.tensor(labels, dtype=torch.int64), "scores": torch.tensor(scores),
            "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)}


BOXES = [[10, 20, 50, 90], [0, 0, 30, 30], [5.5, 6.5, 40.25, 80.75], [1, 2, 3, 4]]


def test_people_above_the_threshold_highest_score_first():
    images = [np.full((40, 30, 3), i, np.uint8) for i in range(3)]
    outputs = [
        output([1, 3, 1, 1], [0.5, 0.99, 0.9, 0.29], BOXES),  # person, car, person, person below thr
        output([], [], []),
        output([2, 2], [0.9, 0.8], BOXES[:2]),  # nobody: only bicycles
    ]
    found = PersonDetector(StandIn(outputs), score_threshold=0.3)(images)
    assert len(found) == 3 and all(isinstance(f, Detections) for f in found)
    np.testing.assert_array_equal(found[0].boxes, np.array([BOXES[2], BOXES[0]], np.float32))  # xyxy unchanged
    np.testing.assert_array_equal(found[0].scores, np.array([0.9, 0.5], np.float32))
    assert found[0].boxes.dtype == np.float32 and found[0].scores.dtype == np.float32
    for empty in found[1:]:
        assert empty.boxes.shape == (0, 4) and empty.scores.shape == (0,)


def test_threshold_is_inclusive_and_checked():
    outputs = [output([1, 1], [0.3, 0.2999], BOXES[:2])]
    found = PersonDetector(StandIn(outputs), score_threshold=0.3)([np.zeros((8, 8, 3), np.uint8)])
    np.testing.assert_array_equal(found[0].scores, np.array([0.3], np.float32))
    with pytest.raises(ValueError, match="score_threshold"):
        PersonDetector(StandIn([]), score_threshold=1.5)


@pytest.mark.parametrize("batch_size, calls", [(8, [3]), (2, [2, 1])])
def test_images_go_through_in_batches_as_float_rgb(batch_size, calls):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((20, 30), (25, 15), (10, 10))]
    model = StandIn([output([], [], [])] * 3)
    PersonDetector(model, batch_size=batch_size)(images, channels="bgr")
    assert [len(c) for c in model.calls] == calls  # one forward pass per batch of images
    seen = [t for call in model.calls for t in call]
    for image, tensor in zip(images, seen):
        assert tensor.dtype == torch.float32 and tensor.shape == (3, *image.shape[:2])
        # BGR in, RGB (3, H, W) in [0, 1] out: the layout torchvision's detectors take.
        np.testing.assert_allclose(tensor.numpy(), image[:, :, ::-1].transpose(2, 0, 1) / 255.0, atol=1e-7)
    with pytest.raises(ValueError, match="channels"):
        PersonDetector(model)(images, channels="hsv")


def test_a_torchvision_detector_with_random_weights():
    """The real model class, wiring only: the people of its own raw output above the threshold."""
    torch.manual_seed(0)
    detector = build_detector("fasterrcnn-mobilenet-v3-large-320-fpn", pretrained=False)
    # Random logits give every class ~1/91; make people (1) and cars (3) the likely labels so the
    # output mixes both: p ~ 403 / (2 * 403 + 89) = 0.45 each, give or take the random weights.
    with torch.no_grad():
        cls_score = detector.model.roi_heads.box_predictor.cls_score
        cls_score.bias[[1, 3]] = 6.0
        cls_score.weight[1] *= 1000  # and let the person score vary from box to box
    detector.model.roi_heads.detections_per_img = 1000  # both classes, not only the top 100
    images = [np.random.default_rng(i).integers(0, 256, (96 + 32 * i, 128, 3), dtype=np.uint8) for i in range(2)]
    with torch.no_grad():
        raw = detector.model([torch.from_numpy(im).permute(2, 0, 1).float() / 255 for im in images])
    person_scores = torch.cat([r["scores"][r["labels"] == 1] for r in raw])
    detector.score_threshold = float(person_scores.median())  # some people on either side
    found = detector(images)
    assert len(found) == 2
    for image, mine, theirs in zip(images, found, raw):
        people = (theirs["labels"] == 1) & (theirs["scores"] >= detector.score_threshold)
        assert (theirs["labels"] == 3).any()
        assert len(mine.boxes) == int(people.sum())
        np.testing.assert_array_equal(mine.scores, np.sort(theirs["scores"][people].numpy())[::-1])
        assert {tuple(b) for b in mine.boxes} == {tuple(b) for b in theirs["boxes"][people].numpy()}
        assert np.all(mine.boxes[:, 2:] >= mine.boxes[:, :2])  # xyxy in the image
        assert np.all(mine.boxes[:, 2] <= image.shape[1]) and np.all(mine.boxes[:, 3] <= image.shape[0])
    assert 0 < sum(len(f.boxes) for f in found) < len(person_scores)


def test_full_frame_is_the_whole_image():
    found = FullFrame()([np.zeros((40, 30, 3), np.uint8), np.zeros((5, 7, 3), np.uint8)])
    np.testing.assert_array_equal(found[0].boxes, [[0, 0, 30, 40]])
    np.testing.assert_array_equal(found[1].boxes, [[0, 0, 7, 5]])
    np.testing.assert_array_equal(found[1].scores, [1.0])


def test_names(monkeypatch, tmp_path):
    assert make_detector(None) is None and make_detector("none") is None
    assert isinstance(make_detector("full-frame"), FullFrame)
    stand_in = FullFrame()
    assert make_detector(stand_in) is stand_in
    assert detect.default_detector_name("cpu") == "fasterrcnn-mobilenet-v3-large-fpn"
    assert detect.default_detector_name("cuda:0") == "fasterrcnn-resnet50-fpn-v2"
    with pytest.raises(ValueError, match="unknown detector 'yolo'.*fasterrcnn-resnet50-fpn-v2.*full-frame"):
        make_detector("yolo")
    # Weights come from torchvision's cache; offline and not cached: say what to fetch.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match=r"not in the torch.hub cache and HF_HUB_OFFLINE is set: fetch "
                                           r".*fasterrcnn_mobilenet_v3_large_fpn.*--detector full-frame"):
        make_detector("default", device="cpu")


# ----------------------------------------------------------------------------------------------
# Which classes the detector keeps: the model's skeleton's (animals for AP-10K / APT-36K), or --det-classes.

# COCO's "animal" supercategory (instances_val2017.json categories 16-25), the classes AP-10K's and
# APT-36K's mammals are found as.
COCO_ANIMALS = ["bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe"]


@pytest.mark.parametrize("skeleton, animals", [("coco", False), ("coco_wholebody", False), ("aic", False),
                                               ("mpii", False), ("ap10k", True), ("apt36k", True)])
def test_classes_follow_the_skeleton(skeleton, animals):
    from vitpose.data import dataset_info

    names = detect.coco_label_names()
    labels = detect.detector_labels(dataset_info(skeleton))
    assert [names[label] for label in labels] == (COCO_ANIMALS if animals else ["person"])
    assert detect.detector_labels(skeleton) == labels  # by name as well
    assert detect.detector_labels(None) == (detect.PERSON_LABEL,)


def test_det_classes_override_by_name_or_id():
    assert detect.detector_labels("ap10k", ["person"]) == (1,)
    assert detect.detector_labels("coco", ["Dog", "19", "dog", " cat "]) == (18, 19, 17)  # once each, in order
    assert detect.detector_labels("coco", ["traffic light"]) == (10,)
    with pytest.raises(ValueError, match=r"--det-classes: 'dgo' is not a COCO class.*did you mean dog"):
        detect.parse_det_classes(["dgo"])
    with pytest.raises(ValueError, match=r"--det-classes: '12' is not"):  # an id COCO left unused ("N/A")
        detect.parse_det_classes(["12"])
    with pytest.raises(ValueError, match=r"--det-classes: '0' is not"):  # the background
        detect.parse_det_classes(["0"])
    with pytest.raises(ValueError, match="at least one class"):
        detect.parse_det_classes([])


def test_a_random_weight_detector_keeps_the_classes_of_the_skeleton():
    """torchvision's model with random weights biased towards people, cars, dogs and horses: the kept
    boxes are exactly its raw boxes of the chosen classes above the threshold (classes checked, not boxes)."""
    from vitpose.data import dataset_info

    torch.manual_seed(0)
    detector = build_detector("fasterrcnn-mobilenet-v3-large-320-fpn", pretrained=False, score_threshold=0.2)
    mixed = [1, 3, 18, 19]  # person, car, dog, horse
    with torch.no_grad():
        cls_score = detector.model.roi_heads.box_predictor.cls_score
        cls_score.bias[mixed] = 6.0
        cls_score.weight[mixed] *= 100  # seed 0: scores person ~0.29, car ~0.28, dog ~0.10, horse ~0.25
    detector.model.roi_heads.detections_per_img = 1000
    images = [np.random.default_rng(i).integers(0, 256, (96 + 32 * i, 128, 3), dtype=np.uint8) for i in range(2)]
    with torch.no_grad():
        raw = detector.model([torch.from_numpy(im).permute(2, 0, 1).float() / 255 for im in images])
    raw_labels = torch.cat([r["labels"] for r in raw])
    assert all((raw_labels == label).any() for label in mixed)  # every class is there to be kept or dropped
    names = detect.coco_label_names()
    # ap10k: horses kept, dogs below the threshold dropped, people and cars dropped for their class.
    cases = [("ap10k", None, set(COCO_ANIMALS), {"horse"}), ("coco", None, {"person"}, {"person"}),
             ("coco", ["car", "horse"], {"car", "horse"}, {"car", "horse"})]
    for skeleton, det_classes, chosen_names, expected_kept in cases:
        detector.labels = detect.detector_labels(dataset_info(skeleton), det_classes)
        found = detector(images)
        kept = set()
        for mine, theirs in zip(found, raw):
            chosen = torch.tensor([names[label] in chosen_names for label in theirs["labels"].tolist()], dtype=torch.bool)
            keep = chosen & (theirs["scores"] >= detector.score_threshold)
            assert {tuple(b) for b in mine.boxes} == {tuple(b) for b in theirs["boxes"][keep].numpy()}
            np.testing.assert_array_equal(mine.scores, np.sort(theirs["scores"][keep].numpy())[::-1])
            kept |= {names[label] for label in theirs["labels"][keep].tolist()}
        assert kept == expected_kept, (skeleton, det_classes)


def test_predict_command_names_a_misspelt_class_before_loading_a_model(tmp_path, capsys):
    import cv2

    from vitpose.cli import main

    image = tmp_path / "a.png"
    cv2.imwrite(str(image), np.zeros((32, 24, 3), np.uint8))
    code = main(["predict", str(image), "--model", str(tmp_path / "no-such-model.pth"), "--det-classes", "dgo"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines()[-1] == ("vitpose predict: error: --det-classes: 'dgo' is not a COCO class name or "
                                            "label id; did you mean dog? e.g. person, dog, horse, cow, or ids 1-90 "
                                            "(80 classes)")


def test_skeleton_class_names_are_torchvisions_coco_classes():
    """A skeleton's detector_classes are checked against vitpose.coco_meta.DETECTION_CLASSES when it is
    read (no torchvision there); the detectors use torchvision's label list: the two must agree."""
    from vitpose.coco_meta import DETECTION_CLASSES

    names = [n for n in detect.coco_label_names() if n not in ("__background__", "N/A")]
    assert list(DETECTION_CLASSES) == names

class WorkingSize:
    """torchvision's GeneralizedRCNNTransform sizes, as a stand-in model carries them."""

    min_size, max_size = (800,), 1333


def test_a_huge_image_is_shrunk_in_uint8_before_the_detector_and_its_boxes_scaled_back():
    # torchvision's detectors shrink a 6000x3000 image to ~1333 px themselves, but only after
    # converting and normalising it in float at full size (row 15 of round 3: a 12000x9000 photo
    # peaked at 5.7 GB). The detector is given the image already shrunk to its working side.
    model = StandIn([output([1], [0.9], [[100, 50, 200, 150]]), output([1], [0.9], [[100, 50, 200, 150]])])
    model.transform = WorkingSize()
    detector = PersonDetector(model)
    assert detector.working_side() == 1333
    huge = np.zeros((3000, 6000, 3), np.uint8)
    huge[:, 3000:] = 255  # right half white: the shrunk image must keep left and right
    ordinary = np.zeros((2000, 2600, 3), np.uint8)  # at most 2x the working side: given as it is
    found = detector([huge, ordinary])
    given = model.calls[0]
    assert tuple(given[0].shape) == (3, 666, 1333) or tuple(given[0].shape) == (3, 667, 1333)
    assert float(given[0][:, :, :600].max()) == 0.0 and float(given[0][:, :, 700:].min()) == 1.0
    assert tuple(given[1].shape) == (3, 2000, 2600)
    fx, fy = 6000 / 1333, 3000 / given[0].shape[1]
    np.testing.assert_allclose(found[0].boxes, [[100 * fx, 50 * fy, 200 * fx, 150 * fy]], rtol=1e-6)
    np.testing.assert_array_equal(found[1].boxes, [[100, 50, 200, 150]])


MEMORY_PROBE = """
import resource, sys
import numpy as np, torch
torch.set_num_threads(1)
from vitpose.inference.detect import build_detector
detector = build_detector("fasterrcnn-mobilenet-v3-large-fpn", pretrained=False)
detector([np.zeros((480, 640, 3), np.uint8)])  # the model's own buffers, once
image = np.full((4500, 6000, 3), 128, np.uint8)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
detector([image], channels="bgr")
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 / image.nbytes)
"""


@pytest.mark.slow  # a subprocess building a torchvision detector (the CI tier has the unit test above)
def test_the_detectors_peak_memory_on_a_huge_image_is_a_small_multiple_of_the_image():
    # A 27-megapixel image (77 MiB in uint8). At full size the detector's float copies take 4
    # bytes a channel, two or three at once: the peak grew by 11.6x the image's bytes. Shrunk
    # first, what is left is the model's activations at its working size, and the peak reached
    # before (the warm-up's) hides part of them: 2.4x measured. 5x lies between with room.
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", MEMORY_PROBE], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    growth = float(result.stdout.strip().splitlines()[-1])
    assert growth < 5.0, f"peak memory grew by {growth:.1f}x the image's bytes"
