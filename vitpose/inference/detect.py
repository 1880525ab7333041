"""Person boxes for top-down pose estimation, from torchvision's COCO detectors (BSD-3).

Choice of defaults (torchvision's published COCO val2017 box mAP and GFLOPs per image):
- GPU: `fasterrcnn-resnet50-fpn-v2` (46.7 box mAP, 280 GFLOPs): the most accurate torchvision
  detector for people that is not a segmentation model; a GPU runs it at video rates, and the
  pose AP of top-down models follows the detector's recall.
- CPU: `fasterrcnn-mobilenet-v3-large-fpn` (32.8 box mAP, 4.5 GFLOPs): about 60x fewer
  operations than the ResNet-50 model and still a two-stage detector at full resolution (the
  320-pixel variant and SSDlite, 22.8 / 21.3 mAP, miss the small people of ordinary photos).
Every detector here is torchvision's own (BSD-3); nothing is AGPL. Weights download through
torchvision's cache (`$TORCH_HOME/hub/checkpoints`) only when a detector is built by name.

Classes: the detector keeps the classes the model's skeleton names (its `detector_classes`:
person for COCO, AIC, MPII and whole-body; COCO's animal classes bird, cat, dog, horse, sheep, cow,
elephant, bear, zebra, giraffe for AP-10K / APT-36K; a user's skeleton file says, see
vitpose/data/metainfo.py). A skeleton that names none (`full-frame`, the default of a skeleton
whose keypoints are no built-in's: hands, faces, ...) is cropped as the whole image: the "default"
detector is then `FullFrame` (`detector_labels` gives no class). `--det-classes` / `det_classes=`
names classes instead, by COCO name or torchvision label id (`detector_labels`).

A detector is a callable `detector(images, channels="rgb") -> [Detections(boxes, scores), ...]`:
one entry per image, boxes (M, 4) float32 xyxy image pixels, scores (M,) float32, highest score
first. `FullFrame` is the whole image as one box (single-person clips).
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vitpose.inference.results import Detections, FullFrame

__all__ = ["ANIMAL_LABELS", "DETECTORS", "DetectorInfo", "Detections", "FullFrame", "PersonDetector",
           "build_detector", "coco_label_names", "default_detector_name", "detector_labels", "make_detector",
           "parse_det_classes"]

PERSON_LABEL = 1  # COCO category id of "person" in torchvision's 91-entry label space
# COCO's animal classes (supercategory "animal": bird .. giraffe, ids 16-25 in torchvision's label
# space): what AP-10K's and APT-36K's animals are found as by a COCO detector.
ANIMAL_LABELS = (16, 17, 18, 19, 20, 21, 22, 23, 24, 25)
DEFAULT_SCORE_THRESHOLD = 0.3  # MMPose's top-down demo (`--bbox-thr 0.3`)
# An image whose longest side is more than this many times the detector's working side is shrunk
# (in uint8) before the detector converts it to float (PersonDetector._shrunk). 2: images up to
# ~2666 px are given as they are (the numbers of ordinary photos and video frames do not change).
SHRINK_ABOVE = 2.0


@dataclass(frozen=True)
class DetectorInfo:
    """A torchvision detection model: its builder and weights enum in torchvision.models.detection."""

    builder: str
    weights: str
    description: str

    def build(self, pretrained: bool) -> torch.nn.Module:
        import torchvision.models.detection as tvd  # imported on use: torchvision is slow to import

        if pretrained:
            return getattr(tvd, self.builder)(weights=getattr(tvd, self.weights).DEFAULT)
        return getattr(tvd, self.builder)(weights=None, weights_backbone=None)  # random init, no download

    def weights_url(self) -> str:
        import torchvision.models.detection as tvd

        return getattr(tvd, self.weights).DEFAULT.url


DETECTORS: dict[str, DetectorInfo] = {
    "fasterrcnn-resnet50-fpn-v2": DetectorInfo(
        "fasterrcnn_resnet50_fpn_v2", "FasterRCNN_ResNet50_FPN_V2_Weights",
        "Faster R-CNN ResNet-50 FPN v2, 46.7 box mAP (GPU default)"),
    "fasterrcnn-mobilenet-v3-large-fpn": DetectorInfo(
        "fasterrcnn_mobilenet_v3_large_fpn", "FasterRCNN_MobileNet_V3_Large_FPN_Weights",
        "Faster R-CNN MobileNetV3-Large FPN, 32.8 box mAP (CPU default)"),
    "fasterrcnn-mobilenet-v3-large-320-fpn": DetectorInfo(
        "fasterrcnn_mobilenet_v3_large_320_fpn", "FasterRCNN_MobileNet_V3_Large_320_FPN_Weights",
        "the same at 320 px, 22.8 box mAP"),
    "retinanet-resnet50-fpn-v2": DetectorInfo(
        "retinanet_resnet50_fpn_v2", "RetinaNet_ResNet50_FPN_V2_Weights", "RetinaNet ResNet-50 FPN v2, 41.5 box mAP"),
    "ssdlite320-mobilenet-v3-large": DetectorInfo(
        "ssdlite320_mobilenet_v3_large", "SSDLite320_MobileNet_V3_Large_Weights",
        "SSDlite 320 MobileNetV3-Large, 21.3 box mAP"),
}


def default_detector_name(device) -> str:
    """The accurate detector on a GPU, the light one elsewhere (see the module docstring)."""
    return "fasterrcnn-resnet50-fpn-v2" if torch.device(device).type == "cuda" else "fasterrcnn-mobilenet-v3-large-fpn"


class PersonDetector:
    """A torchvision detection model kept to people (or the classes of `labels`) above a score threshold.

    Args:
        model: a torchvision detection model (input: list of float RGB (3, H, W) in [0, 1];
            output: one dict per image with `boxes` xyxy, `labels`, `scores`).
        score_threshold: boxes with a lower score are dropped.
        device: where the model runs (default: where its parameters are).
        batch_size: images per forward pass.
        person_label: the label of people in the model's label space.
        labels: the labels to keep instead of people (e.g. `ANIMAL_LABELS`; see `detector_labels`).
    """

    def __init__(self, model: torch.nn.Module, score_threshold: float = DEFAULT_SCORE_THRESHOLD, device=None,
                 batch_size: int = 8, person_label: int = PERSON_LABEL, labels: Sequence[int] | None = None):
        if not 0.0 <= score_threshold <= 1.0:
            raise ValueError(f"score_threshold (vitpose predict --detector-threshold) must be in [0, 1], "
                             f"got {score_threshold}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if device is None:
            device = next(model.parameters()).device
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.score_threshold = float(score_threshold)
        self.batch_size = int(batch_size)
        self.person_label = int(person_label)
        self.labels = tuple(int(label) for label in labels) if labels is not None else (self.person_label,)

    def working_side(self) -> int | None:
        """The longest image side the model's own transform resizes to (torchvision's
        GeneralizedRCNNTransform: `max_size`, `min_size`, `fixed_size`), None when it has none."""
        transform = getattr(self.model, "transform", None)
        sides = [getattr(transform, "max_size", None), *(getattr(transform, "min_size", None) or ()),
                 *(getattr(transform, "fixed_size", None) or ())]
        sides = [int(side) for side in sides if side]
        return max(sides) if sides else None

    def _shrunk(self, image: np.ndarray) -> tuple[np.ndarray, float, float]:
        """The image the detector is given and the factors (x, y) back to the image's pixels.

        torchvision's detectors resize every image to their working size (~800 x 1333) inside the
        model, but only after converting it to float and normalising it at full size: 4 bytes a
        channel, in two or three copies, so a 12000x9000 photo took 3.6 GB for the detector alone.
        An image more than SHRINK_ABOVE times the working side is shrunk first, in uint8 (area
        averaging), to that side: the model still shrinks the rest of the way itself, so its input
        is never smaller than what it would have used, and smaller images are given as they are.
        """
        side = self.working_side()
        height, width = image.shape[:2]
        if side is None or max(height, width) <= SHRINK_ABOVE * side:
            return image, 1.0, 1.0
        import cv2

        factor = side / max(height, width)
        size = (max(1, round(width * factor)), max(1, round(height * factor)))
        small = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
        return small, width / size[0], height / size[1]

    def _as_input(self, image: np.ndarray, channels: str) -> torch.Tensor:
        # Upload uint8 (4x fewer bytes) and convert on the device.
        t = torch.from_numpy(np.ascontiguousarray(image)).to(self.device, non_blocking=True)
        if channels == "bgr":
            t = t.flip(-1)
        return t.permute(2, 0, 1).float().div_(255.0)

    def _people(self, output: dict) -> Detections:
        labels, scores = output["labels"], output["scores"]
        keep = torch.isin(labels, torch.tensor(self.labels, device=labels.device)) & (scores >= self.score_threshold)
        boxes = output["boxes"][keep].float().cpu().numpy().reshape(-1, 4)
        scores = scores[keep].float().cpu().numpy()
        order = np.argsort(-scores, kind="stable")
        return Detections(boxes[order].astype(np.float32), scores[order].astype(np.float32))

    @torch.no_grad()
    def __call__(self, images: Sequence[np.ndarray], channels: str = "rgb") -> list[Detections]:
        """Person boxes of each image (uint8 (H, W, 3), RGB or `channels="bgr"`), batched."""
        if channels not in ("rgb", "bgr"):
            raise ValueError(f"channels must be 'rgb' or 'bgr', got {channels!r}")
        found: list[Detections] = []
        for start in range(0, len(images), self.batch_size):
            shrunk = [self._shrunk(image) for image in images[start:start + self.batch_size]]
            outputs = self.model([self._as_input(image, channels) for image, _, _ in shrunk])
            for output, (_, fx, fy) in zip(outputs, shrunk):
                people = self._people(output)
                if fx != 1.0 or fy != 1.0:  # back to the pixels of the image given
                    people.boxes[:] *= np.array([fx, fy, fx, fy], np.float32)
                found.append(people)
        return found


def build_detector(name: str, device=None, score_threshold: float = DEFAULT_SCORE_THRESHOLD,
                   pretrained: bool = True, batch_size: int = 8, labels: Sequence[int] | None = None) -> PersonDetector:
    """A PersonDetector from a name of `DETECTORS` (COCO weights via torchvision's cache).

    Args:
        name: a key of DETECTORS.
        device: where it runs (default CPU).
        score_threshold: minimum person score.
        pretrained: load torchvision's COCO weights (downloaded once); False = random init
            (tests: nothing is downloaded).
        batch_size: images per forward pass.
        labels: the classes kept (default: person); see `detector_labels`.
    """
    if name not in DETECTORS:
        raise ValueError(f"unknown detector {name!r}; choose one of: " + ", ".join(DETECTORS)
                         + ", 'default', 'full-frame' or 'none'")
    if pretrained:
        from vitpose import hub

        url = DETECTORS[name].weights_url()
        cached = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)
        if not cached.is_file():  # fetched with timeouts and tries (torch.hub's own download has none)
            digits = re.search(r"-([a-f0-9]+)\.", cached.name)  # torch.hub's check: the name's hash digits
            hub.download_url(url, cached, digits.group(1) if digits else None, f"detector {name}",
                             alternative="; or use --detector full-frame / --boxes FILE")
        try:
            model = DETECTORS[name].build(True)  # found in the cache: no network
        except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as e:  # torch.load of the cached file
            from vitpose.models.checkpoint import CheckpointError, describe_file

            raise CheckpointError(
                f"detector {name}: its cached weights {cached} cannot be read ({describe_file(cached)}; "
                f"{type(e).__name__}) -- a download that did not survive: delete {cached} and run again to fetch "
                f"it anew (or use --detector full-frame / --boxes FILE)") from None
    else:
        model = DETECTORS[name].build(False)
    return PersonDetector(model, score_threshold, device=device or "cpu", batch_size=batch_size, labels=labels)


def make_detector(detector, device=None, score_threshold: float = DEFAULT_SCORE_THRESHOLD,
                  labels: Sequence[int] | None = None):
    """What `Predictor.from_pretrained(detector=...)` takes -> a detector callable or None.

    None / "none": no detector (boxes come from the caller). "full-frame": `FullFrame()`.
    "default": `default_detector_name(device)`. Another string: `build_detector(name)`.
    A callable (e.g. a PersonDetector) is used as it is.
    labels: the classes a detector built here keeps (default: person; see `detector_labels`); () =
        the skeleton names none (full-frame): "default" is then `FullFrame()`, a named detector is
        refused (it needs classes to keep).
    """
    if detector is None or detector == "none":
        return None
    if detector == "full-frame" or (detector == "default" and labels is not None and len(labels) == 0):
        return FullFrame()
    if isinstance(detector, str) and labels is not None and len(labels) == 0:
        raise ValueError(f"detector {detector!r}: the model's skeleton names no classes to detect (its "
                         "detector_classes is full-frame); name them with --det-classes (det_classes=), e.g. person")
    if isinstance(detector, str):
        name = default_detector_name(device or "cpu") if detector == "default" else detector
        return build_detector(name, device=device, score_threshold=score_threshold, labels=labels)
    if callable(detector):
        return detector
    raise TypeError(f"detector must be a name, None or a callable, got {type(detector).__name__}")


def coco_label_names() -> list[str]:
    """torchvision's COCO label space: 91 names indexed by label id ("__background__" 0, "person" 1,
    "N/A" for the ids COCO left unused). The same list for every detector of `DETECTORS`."""
    import torchvision.models.detection as tvd  # metadata only: nothing downloads

    return list(tvd.FasterRCNN_ResNet50_FPN_V2_Weights.DEFAULT.meta["categories"])


def parse_det_classes(values: Sequence[str | int]) -> tuple[int, ...]:
    """`--det-classes` values -> label ids: COCO names ("dog", "person"; case-insensitive) or ids ("18").

    Raises ValueError in one line naming the value that is neither, with the closest names.
    """
    import difflib

    names = coco_label_names()
    by_name = {name.lower(): i for i, name in enumerate(names) if name not in ("__background__", "N/A")}
    labels = []
    for value in values:
        text = str(value).strip().lower()
        if text.isdigit() and int(text) in by_name.values():
            labels.append(int(text))
        elif text in by_name:
            labels.append(by_name[text])
        else:
            close = difflib.get_close_matches(text, list(by_name), n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ValueError(f"--det-classes: {value!r} is not a COCO class name or label id; {hint}"
                             f"e.g. person, dog, horse, cow, or ids 1-90 ({len(by_name)} classes)")
    if not labels:
        raise ValueError("--det-classes: name at least one class (e.g. person, or dog cat)")
    return tuple(dict.fromkeys(labels))  # in the order given, once each


def detector_labels(skeleton=None, det_classes: Sequence[str | int] | None = None) -> tuple[int, ...]:
    """The classes a detector keeps for a pose model: `det_classes` when given (`parse_det_classes`);
    else the skeleton's `detector_classes` (a `DatasetInfo`, or a built-in's name): () when it names
    none (full-frame: the whole image is the instance; see `make_detector`); person for None."""
    if det_classes is not None:
        return parse_det_classes(det_classes)
    if skeleton is None:
        return (PERSON_LABEL,)
    if isinstance(skeleton, str):
        from vitpose.data.metainfo import dataset_info

        skeleton = dataset_info(skeleton)
    classes = skeleton.detector_classes
    return parse_det_classes(classes) if classes else ()
