"""Top-down inference: `Predictor.from_pretrained(name)(image) -> Poses`, `predict(image, boxes)`.

The same steps as evaluation (and as MMPose's `inference_topdown` with a ViTPose config):
box -> centre and scale (padding 1.25) -> aspect fix to the input's w/h -> UDP warp of the uint8
image with OpenCV -> normalise -> model (with the flip test) -> UDP decode -> image pixels.
The model and decoding steps are `vitpose.topdown`'s, which the evaluation loop
(`vitpose.engine.evaluate.predict`) runs too, so the two paths cannot drift apart.

`predictor(image)` finds the people with the predictor's detector (`vitpose.inference.detect`) and returns
a `Poses`; `predictor([image, ...])` does the same for several images in one call, with the crops
of all of them batched through the model. `predictor.timer` adds up the seconds of each stage.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vitpose.codecs.udp import UDPHeatmap
from vitpose.data.geometry import bbox_xywh2xyxy, person_boxes_to_center_scale
from vitpose.data.transforms import topdown_crops
from vitpose.device import resolve_device, resolve_precision
from vitpose.topdown import forward_heatmaps, heatmaps_to_keypoints

__all__ = ["Poses", "Predictor", "StageTimer"]


@dataclass
class Poses:
    """The people of one image.

    boxes: (M, 4) float32 person boxes, xyxy image pixels. box_scores: (M,) float32 (detector
    scores; 1 for full-frame boxes and for caller boxes without a 5th column).
    keypoints: (M, K, 2) float64 image pixels (x, y). keypoint_scores: (M, K) float32
    (heatmap maxima; ~0.3 is a usual display threshold).
    """

    boxes: np.ndarray
    box_scores: np.ndarray
    keypoints: np.ndarray
    keypoint_scores: np.ndarray

    def __len__(self) -> int:
        return len(self.boxes)


class StageTimer:
    """Seconds spent per named stage, added up over calls (`with timer.stage("pose"): ...`)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def reset(self) -> None:
        self.seconds.clear()

    def summary(self, count: int, unit: str = "image") -> str:
        """One line per stage: seconds, share of the total and milliseconds per `unit`."""
        total = sum(self.seconds.values())
        lines = [f"{'stage':<15} {'seconds':>8} {'share':>6} {'ms/' + unit:>10}"]
        for name, seconds in self.seconds.items():
            lines.append(f"{name:<15} {seconds:8.2f} {100 * seconds / max(total, 1e-12):5.1f}% "
                         f"{1000 * seconds / max(count, 1):10.1f}")
        lines.append(f"{'total':<15} {total:8.2f} {100.0 if total else 0.0:5.1f}% {1000 * total / max(count, 1):10.1f}")
        return "\n".join(lines)


class Predictor:
    """ViTPose on the people of images: person boxes from a detector or the caller.

    Args:
        model: a built `ViTPose` (weights already loaded) or the path of a checkpoint in any
            layout `vitpose.load_weights` reads (then `model_name`/`decoder` say what to build).
        model_name: "vitpose-s" | "vitpose-b" | "vitpose-l" | "vitpose-h" (checkpoint paths only).
        decoder: "classic" | "simple" (checkpoint paths only).
        device: where the model runs ("auto"/None: CUDA when available, else CPU).
        flip_test: average with the mirrored crop (on by default, as in ViTPose's evaluation).
        codec: the heatmap codec (default: `UDPHeatmap()`, 192x256 input, 48x64 heatmaps).
        amp_dtype: torch.bfloat16 / torch.float16 to run under autocast; None = float32.
        precision: "auto" | "fp32" | "bf16" | "fp16" instead of `amp_dtype`
            (`vitpose.device.resolve_precision`: auto = bf16 on a CPU with AVX512-BF16 or AMX, bf16
            or fp16 on CUDA, else fp32). None (default) = `amp_dtype`, i.e. fp32 unless given.
        batch_size: boxes per forward pass.
        detector: the person detector `predictor(image)` uses: a callable
            `(images, channels) -> [vitpose.inference.detect.Detections]` (e.g. `vitpose.inference.detect.PersonDetector`,
            `FullFrame()`), or None (boxes come from the caller). See `from_pretrained` for names.
        model_kwargs: extra `build_model` arguments (checkpoint paths only).

    `predictor(image_or_images, boxes=None)`: see `__call__` (all people, `Poses`).

    `predict(image, boxes)`:
        image: (H, W, 3) uint8, **RGB** by default (`channels="bgr"` for `cv2.imread` output).
        boxes: (M, 4) person boxes, **xyxy** (x1, y1, x2, y2) image pixels by default, or
            `box_format="xywh"`; a 5th column (a detector score) is ignored. None = the whole image.
        Returns keypoints (M, K, 2) float64 in image pixels (x, y) and scores (M, K) float32
        (heatmap maxima: higher is more confident; ~0.3 is a usual display threshold).
    Boxes are used as given (no clipping), like detector boxes in MMPose.
    """

    def __init__(self, model, model_name: str = "vitpose-s", decoder: str = "classic", device=None,
                 flip_test: bool = True, codec=None, amp_dtype=None, batch_size: int = 32,
                 flip_indices: Sequence[int] | None = None, detector=None, precision: str | None = None,
                 **model_kwargs):
        if isinstance(model, (str, Path)):
            from vitpose.models.checkpoint import load_weights
            from vitpose.models.vitpose import build_model

            path = Path(model)
            if not path.is_file():
                raise FileNotFoundError(f"checkpoint not found: {path}")
            model = build_model(model_name, decoder=decoder, **model_kwargs)
            load_weights(model, path)
        elif not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or a checkpoint path, got {type(model).__name__}")
        self.device = resolve_device(device)
        if precision is not None:
            if amp_dtype is not None:
                raise ValueError("give precision= or amp_dtype=, not both")
            amp_dtype = resolve_precision(precision, self.device)
        self.model = model.to(self.device).eval()
        self.codec = codec if codec is not None else UDPHeatmap()
        self.flip_test = bool(flip_test)
        self.amp_dtype = amp_dtype
        self.batch_size = int(batch_size)
        self.flip_indices = flip_indices
        self.detector = detector
        self.timer = StageTimer()

    @classmethod
    def from_pretrained(cls, name_or_path, detector="default", device=None, config=None, expert: str | None = None,
                        detector_threshold: float | None = None, det_classes=None, **kwargs) -> Predictor:
        """A Predictor for published weights by name (`vitpose.models.hub.list_models()`) or a weights file.

        Args:
            name_or_path: e.g. "vitpose-b-simple" (downloaded once, then cached), or a path to
                weights in any layout `vitpose.load_weights` reads; its size, decoder and number of
                keypoints are read from the file's tensors unless `config` is given.
            detector: "default" (Faster R-CNN ResNet-50 FPN v2 on a GPU, MobileNetV3 FPN on CPU),
                a name of `vitpose.inference.detect.DETECTORS`, "full-frame" (the whole image is one person),
                None (boxes from the caller), or a detector callable.
            device: where the model and the detector run (None/"auto": CUDA when available).
            config: a training config (YAML path or `Config`) for weights of a custom model.
            expert: the ViTPose+ expert for `vitpose-plus-*` files ("coco" by default).
            detector_threshold: minimum person score (default `vitpose.inference.detect.DEFAULT_SCORE_THRESHOLD`).
            det_classes: COCO class names or ids the detector keeps (default: the model's skeleton's:
                animals for AP-10K / APT-36K, else person; `vitpose.inference.detect.detector_labels`).
            kwargs: go to `Predictor` (flip_test, batch_size, amp_dtype, ...).
        """
        from vitpose.models import hub
        from vitpose.inference.detect import DEFAULT_SCORE_THRESHOLD, detector_labels, make_detector

        path = hub.download(name_or_path)
        if config is not None:
            predictor = cls.from_config(config, path, device=device, **kwargs)
        else:
            spec = hub.model_spec(name_or_path, expert=expert)
            predictor = cls(_build_and_load(spec, path, str(name_or_path)), device=device, **kwargs)
        threshold = DEFAULT_SCORE_THRESHOLD if detector_threshold is None else detector_threshold
        labels = detector_labels(getattr(predictor, "skeleton", None), det_classes)
        predictor.detector = make_detector(detector, predictor.device, threshold, labels)
        return predictor

    @classmethod
    def from_config(cls, config, checkpoint, **kwargs) -> Predictor:
        """A Predictor for a training config (a YAML path or a `Config`) and a checkpoint of it.

        The model and the codec are built exactly as `train.py` builds them, so this works for any
        config, e.g. the demo's small ViT on 128x96 crops: `Predictor.from_config(
        "configs/demo.yaml", "work_dirs/demo/best.pth")`. `kwargs` go to `Predictor`.
        """
        from vitpose.builders import build_codec, build_dataset_info, build_model_from_config
        from vitpose.config import Config, load_config
        from vitpose.models.checkpoint import load_weights

        cfg = config if isinstance(config, Config) else load_config(config)
        skeleton = build_dataset_info(cfg)
        if "flip_indices" not in kwargs:  # the flip test mirrors with the config's skeleton
            kwargs["flip_indices"] = skeleton.flip_indices
        model = build_model_from_config(cfg.model)
        load_weights(model, checkpoint)
        predictor = cls(model, codec=build_codec(cfg.model), **kwargs)
        predictor.skeleton = skeleton  # the detector's classes follow it (until __init__ takes skeleton=)
        return predictor

    def boxes_to_center_scale(self, boxes, box_format: str = "xyxy", image_shape=None):
        """(M, 4|5) boxes -> centre (M, 2), scale (M, 2) float32 (`geometry.person_boxes_to_center_scale`)."""
        return person_boxes_to_center_scale(boxes, box_format, image_shape)

    def crops(self, image: np.ndarray, center: np.ndarray, scale: np.ndarray):
        """UDP crops of the boxes: uint8 (M, 3, h, w) in the image's channel order, aspect-fixed scales (M, 2)."""
        return topdown_crops(image, center, scale, self.codec.input_size)

    @torch.no_grad()
    def predict(self, image: np.ndarray, boxes=None, box_format: str = "xyxy", channels: str = "rgb"):
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"image must be (H, W, 3) uint8, got {image.shape} {image.dtype}")
        if channels not in ("rgb", "bgr"):
            raise ValueError(f"channels must be 'rgb' or 'bgr', got {channels!r}")
        center, scale = self.boxes_to_center_scale(boxes, box_format, image.shape)
        crops, fixed_scale = self.crops(image, center, scale)
        if channels == "bgr":  # the warp is per channel, so swapping after it is the same
            crops = crops[:, ::-1]
        if not len(crops):
            k = len(self.flip_indices) if self.flip_indices is not None else 17
            return np.zeros((0, k, 2)), np.zeros((0, k), np.float32)
        return self._keypoints_of_crops(crops, center, fixed_scale)

    def detect(self, images: Sequence[np.ndarray], channels: str = "rgb"):
        """The detector's person boxes of each image (list of `vitpose.inference.detect.Detections`)."""
        if self.detector is None:
            raise ValueError("this Predictor has no detector: pass boxes=..., or build it with "
                             "Predictor.from_pretrained(..., detector='default' | 'full-frame')")
        with self.timer.stage("detect"):
            return self.detector(images, channels=channels)

    @torch.no_grad()
    def __call__(self, images, boxes=None, box_format: str = "xyxy", channels: str = "rgb"):
        """All people of one image (-> `Poses`) or of a list of images (-> list of `Poses`).

        Args:
            images: (H, W, 3) uint8, RGB (or `channels="bgr"`), or a list of such images.
            boxes: None: the detector finds the people. Otherwise the caller's boxes: (M, 4|5)
                for one image, a list of them for a list of images; a 5th column is the box score.
            box_format: "xyxy" | "xywh" (caller boxes).
        The crops of all the images go through the model together, `batch_size` at a time.
        """
        single = isinstance(images, np.ndarray)
        images = [images] if single else list(images)
        for image in images:
            _check_image(image, channels)
        if boxes is None:
            found = self.detect(images, channels)
        else:
            boxes = [boxes] if single else list(boxes)
            if len(boxes) != len(images):
                raise ValueError(f"{len(images)} images but {len(boxes)} box arrays")
            found = [_caller_boxes(b, box_format) for b in boxes]
        poses = self._pose(images, found, channels)
        return poses[0] if single else poses

    def _pose(self, images, found, channels: str) -> list[Poses]:
        """Crops of every box of every image -> model in batches -> keypoints, split per image."""
        centers, scales, crops, counts = [], [], [], []
        with self.timer.stage("crop"):
            for image, (boxes, _) in zip(images, found):
                counts.append(len(boxes))
                if len(boxes):
                    center, scale = self.boxes_to_center_scale(boxes)
                    image_crops, fixed = self.crops(image, center, scale)
                    centers.append(center)
                    scales.append(fixed)
                    crops.append(image_crops[:, ::-1] if channels == "bgr" else image_crops)
        k = len(self.flip_indices) if self.flip_indices is not None else 17
        keypoints, scores = np.zeros((0, k, 2)), np.zeros((0, k), np.float32)
        if crops:  # one model pass over the crops of every image
            keypoints, scores = self._keypoints_of_crops(np.concatenate(crops), np.concatenate(centers),
                                                         np.concatenate(scales))
        out, start = [], 0
        for (boxes, box_scores), n in zip(found, counts):
            out.append(Poses(np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(box_scores, np.float32),
                             keypoints[start:start + n], scores[start:start + n]))
            start += n
        return out

    def _keypoints_of_crops(self, crops: np.ndarray, center: np.ndarray, fixed_scale: np.ndarray):
        """uint8 RGB crops (N, 3, h, w) -> keypoints (N, K, 2) image pixels, scores (N, K)."""
        keypoints, scores = [], []
        for start in range(0, len(crops), self.batch_size):
            stop = start + self.batch_size
            with self.timer.stage("pose"):
                batch = torch.from_numpy(np.ascontiguousarray(crops[start:stop])).to(self.device)
                heatmaps = forward_heatmaps(self.model, batch, self.flip_test, self.amp_dtype, self.flip_indices)
                if heatmaps.device.type == "cuda":
                    torch.cuda.synchronize(heatmaps.device)  # charge the model's time to this stage
            with self.timer.stage("decode heatmaps"):
                kpts, kpt_scores = heatmaps_to_keypoints(heatmaps, center[start:stop], fixed_scale[start:stop],
                                                         self.codec)
            keypoints.append(kpts)
            scores.append(kpt_scores)
        return np.concatenate(keypoints), np.concatenate(scores)


def _check_image(image, channels: str) -> None:
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        got = f"{image.shape} {image.dtype}" if isinstance(image, np.ndarray) else type(image).__name__
        raise ValueError(f"image must be (H, W, 3) uint8, got {got}")
    if channels not in ("rgb", "bgr"):
        raise ValueError(f"channels must be 'rgb' or 'bgr', got {channels!r}")


def _caller_boxes(boxes, box_format: str):
    """(M, 4|5) caller boxes -> Detections(xyxy float32, scores): the 5th column or ones.

    xywh -> xyxy in float32, as CocoKeypoints converts detection files (same crops, same numbers).
    """
    from vitpose.inference.detect import Detections

    boxes = np.asarray(boxes, dtype=np.float32)
    if boxes.size == 0:
        return Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32))
    if boxes.ndim == 1:
        boxes = boxes[None]
    if boxes.ndim != 2 or boxes.shape[1] not in (4, 5):
        raise ValueError(f"boxes must have shape (M, 4) or (M, 5), got {boxes.shape}")
    scores = boxes[:, 4].copy() if boxes.shape[1] == 5 else np.ones(len(boxes), np.float32)
    xyxy = boxes[:, :4].copy()
    if box_format == "xywh":
        xyxy = bbox_xywh2xyxy(xyxy)
    elif box_format != "xyxy":
        raise ValueError(f"box_format must be 'xyxy' or 'xywh', got {box_format!r}")
    return Detections(xyxy, scores)


def _build_and_load(spec, path: Path, origin: str):
    """`build_model` for a hub.ModelSpec, weights loaded (ViTPose+ files need `expert=` support)."""
    import inspect

    from vitpose.models.checkpoint import load_weights
    from vitpose.models.vitpose import build_model

    model = build_model(spec.size, decoder=spec.decoder, num_keypoints=spec.num_keypoints)
    if spec.expert is None:
        load_weights(model, path)
    elif "expert" in inspect.signature(load_weights).parameters:
        load_weights(model, path, expert=spec.expert)
    else:
        raise NotImplementedError(f"{origin} is a ViTPose+ (mixture-of-experts) checkpoint; loading one expert "
                                  f"of it comes with issue #11 (vitpose.load_weights(..., expert=)). The file "
                                  f"is at {path}.")
    return model
