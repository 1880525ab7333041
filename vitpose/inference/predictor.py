"""Top-down inference: `Predictor.from_pretrained(name)(image) -> Poses`, `predict(image, boxes)`.

The same steps as evaluation (and as MMPose's `inference_topdown` with a ViTPose config):
box -> centre and scale (padding 1.25) -> aspect fix to the input's w/h -> UDP warp of the uint8
image with OpenCV -> normalise -> model (with the flip test) -> UDP decode -> image pixels.
Every step but the network is `vitpose.inference.pipeline.TopDown`'s, shared with `OnnxPredictor`;
the network step is `vitpose.topdown.forward_heatmaps`, which the evaluation loop runs too.

`predictor(image)` finds the people with the predictor's detector (`vitpose.inference.detect`) and returns
a `Poses`; `predictor([image, ...])` does the same for several images (or video frames) in one
call, with the crops of all of them batched through the model. `predictor.timer` adds up the
seconds of each stage. On a GPU the crops are warped there (`vitpose.inference.warp`, bit-equal
to OpenCV's).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from vitpose.codecs.udp import UDPHeatmap
from vitpose.data.transforms import crop_geometry
from vitpose.device import default_batch_size, resolve_device, resolve_precision
from vitpose.inference.pipeline import TopDown
from vitpose.inference.results import Poses, StageTimer
from vitpose.inference.warp import warp_affine_uint8
from vitpose.models.wrappers import unwrap_model
from vitpose.topdown import forward_flip_views, forward_heatmaps

__all__ = ["Poses", "Predictor", "StageTimer"]


SPEED_STEP_CROPS = 4  # crops of the one forward `auto` times at fp32 and bf16 on a CPU (seconds, once)


def _speed_step(model):
    """(one forward of `model` on SPEED_STEP_CROPS crops, its name) for `precision="auto"` on a CPU:
    the model's own step is what bf16 must speed up (`vitpose.device.cpu_bf16_speedup`)."""
    base = unwrap_model(model)
    h, w = base.backbone.patch_embed.img_size
    x = torch.zeros(SPEED_STEP_CROPS, 3, h, w)
    params = sum(p.numel() for p in base.parameters())
    name = (f"{type(base).__name__} {params / 1e6:.2f}M parameters, {len(base.backbone.blocks)} blocks, "
            f"{w}x{h}, {SPEED_STEP_CROPS} crops")
    return (lambda: base.cpu().eval()(x)), name


class Predictor(TopDown):
    """ViTPose on the people of images: person boxes from a detector or the caller.

    Args:
        model: a built `ViTPose` (weights already loaded), or anything `vitpose.load_model` takes
            (a weights file, a model name, an HF repo id): then its codec and skeleton come with it.
        device: where the model runs ("auto"/None: CUDA when available, else CPU).
        flip_test: average with the mirrored crop (on by default, as in ViTPose's evaluation).
        codec: the heatmap codec (default: the model's `.spec` codec, else `UDPHeatmap()`, 192x256
            input, 48x64 heatmaps).
        amp_dtype: torch.bfloat16 / torch.float16 to run under autocast; None = float32.
        precision: "auto" | "fp32" | "bf16" | "fp16" instead of `amp_dtype`
            (`vitpose.device.resolve_precision`: auto = fp16 on CUDA, bf16 on a CPU with
            AVX512-BF16 or AMX, else fp32). None (default) = `amp_dtype`, i.e. fp32 unless given.
        batch_size: boxes per forward pass (the flip test doubles it); None (default): 8 on a CPU,
            32 on a GPU (`vitpose.device.default_batch_size`).
        flip_indices: left/right order of the flip test (default: the skeleton's).
        detector: the person detector `predictor(image)` uses: a callable
            `(images, channels) -> [vitpose.inference.detect.Detections]` (e.g. `vitpose.inference.detect.PersonDetector`,
            `FullFrame()`), or None (boxes come from the caller). See `from_pretrained` for names.
        skeleton: the `vitpose.data.DatasetInfo` of the model's keypoints (flip indices, limbs, K);
            default: the one the model's `.spec` records, else COCO's.

    `predictor(image_or_images, boxes=None)`: see `__call__` (all people, `Poses`).

    `predict(image, boxes)`:
        image: (H, W, 3) uint8, **RGB** by default (`channels="bgr"` for `cv2.imread` output).
        boxes: (M, 4) person boxes, **xyxy** (x1, y1, x2, y2) image pixels by default, or
            `box_format="xywh"`; a 5th column (a detector score) is ignored. None = the whole
            image, [] = nobody (as `predictor(image, boxes=[])`); the image may be a PIL image.
        Returns keypoints (M, K, 2) float64 in image pixels (x, y) and scores (M, K) float32
            (heatmap maxima: higher is more confident; ~0.3 is a usual display threshold).
    Boxes are used as given (no clipping), like detector boxes in MMPose.
    """

    def __init__(self, model, device=None, flip_test: bool = True, codec=None, amp_dtype=None,
                 batch_size: int | None = None, flip_indices: Sequence[int] | None = None, detector=None,
                 skeleton=None, precision: str | None = None):
        from vitpose.builders import load_model

        if isinstance(model, (str, Path)):
            loaded = load_model(model, device=device)
            model, codec = loaded.model, loaded.codec if codec is None else codec
            skeleton = loaded.skeleton if skeleton is None else skeleton
        elif not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, a weights file, a model name or an HF repo id, "
                            f"got {type(model).__name__}")
        self.device = resolve_device(device)
        if precision is not None:
            if amp_dtype is not None:
                raise ValueError("give precision= or amp_dtype=, not both")
            step, name = _speed_step(model) if precision == "auto" else (None, None)
            amp_dtype = resolve_precision(precision, self.device, step=step, step_name=name)
        self.model = model.to(self.device).eval()
        spec = getattr(unwrap_model(model), "spec", None)
        self.skeleton = skeleton if skeleton is not None else _skeleton_of_model(model, spec)
        self.codec = codec if codec is not None else spec.build_codec() if spec is not None else UDPHeatmap()
        self.calibration = spec.calibration if spec is not None else None  # `vitpose calibrate`'s fit, if any
        self.flip_test = bool(flip_test)
        self.amp_dtype = amp_dtype
        self.batch_size = default_batch_size(self.device) if batch_size is None else int(batch_size)
        self.flip_indices = list(self.skeleton.flip_indices if flip_indices is None else flip_indices)
        self.detector = detector
        self.timer = StageTimer()
        # crops warped where the model runs: on a GPU, OpenCV on the CPU would limit a video
        self.warp_on_device = self.device.type == "cuda"

    @classmethod
    def from_pretrained(cls, name_or_path, detector="default", device=None, config=None, expert: str | None = None,
                        detector_threshold: float | None = None, det_classes=None, **kwargs) -> Predictor:
        """A Predictor for a published model name, an HF repo id or a weights file (`vitpose.load_model`).

        Args:
            name_or_path: e.g. "vitpose-b-simple" (downloaded once, then cached; any case), an HF repo
                id "org/repo" or "org/repo@REVISION" (a VitPose `config.json` + `model.safetensors`),
                or a path to weights in any layout `vitpose.load_weights` reads; what the file records
                (or its tensors) says the model, codec and skeleton unless `config` is given.
            detector: "default" (Faster R-CNN ResNet-50 FPN v2 on a GPU, MobileNetV3 FPN on CPU),
                a name of `vitpose.inference.detect.DETECTORS`, "full-frame" (the whole image is one person),
                None (boxes from the caller), or a detector callable.
            device: where the model and the detector run (None/"auto": CUDA when available).
            config: a training config (YAML path or `Config`) for weights of a custom model.
            expert: the ViTPose+ expert ("coco" by default for `vitpose-plus-*` names; aliases such
                as "wholebody" work; see `vitpose.models.spec.EXPERTS`).
            detector_threshold: minimum person score (default `vitpose.inference.detect.DEFAULT_SCORE_THRESHOLD`).
            det_classes: COCO class names or ids the detector keeps (default: the model's skeleton's:
                animals for AP-10K / APT-36K, else person; `vitpose.inference.detect.detector_labels`).
            kwargs: go to `Predictor` (flip_test, batch_size, amp_dtype, precision, ...).
        """
        from vitpose.builders import load_model
        from vitpose.inference.detect import DEFAULT_SCORE_THRESHOLD, detector_labels, make_detector

        loaded = load_model(name_or_path, expert=expert, config=config, device=device)
        kwargs.setdefault("codec", loaded.codec)
        kwargs.setdefault("skeleton", loaded.skeleton)
        predictor = cls(loaded.model, device=device, **kwargs)
        threshold = DEFAULT_SCORE_THRESHOLD if detector_threshold is None else detector_threshold
        labels = detector_labels(predictor.skeleton, det_classes)
        predictor.detector = make_detector(detector, predictor.device, threshold, labels)
        return predictor

    @classmethod
    def from_config(cls, config, checkpoint, **kwargs) -> Predictor:
        """A Predictor for a training config (a YAML path or a `Config`) and a checkpoint of it.

        The model and the codec are built exactly as `train.py` builds them, so this works for any
        config, e.g. the demo's small ViT on 128x96 crops: `Predictor.from_config(
        "configs/demo.yaml", "work_dirs/demo/best.pth")`. `kwargs` go to `Predictor`.
        """
        from vitpose.builders import load_model

        loaded = load_model(checkpoint, config=config, device=kwargs.get("device"))
        kwargs.setdefault("codec", loaded.codec)
        kwargs.setdefault("skeleton", loaded.skeleton)
        return cls(loaded.model, **kwargs)

    @property
    def num_keypoints(self) -> int:
        return len(self.flip_indices) if self.flip_indices is not None else self.skeleton.num_keypoints

    def gives_views(self) -> bool:
        return self.flip_test  # the flip test's batch gives both views (`run_network_views`)

    @torch.no_grad()
    def run_network(self, crops) -> np.ndarray:
        """uint8 RGB crops (N, 3, h, w), numpy or a tensor on the model's device -> heatmaps (N, K, H, W)."""
        if isinstance(crops, np.ndarray):
            crops = torch.from_numpy(np.ascontiguousarray(crops))
        heatmaps = forward_heatmaps(self.model, crops.to(self.device), self.flip_test, self.amp_dtype,
                                    self.flip_indices)
        return heatmaps.cpu().numpy()  # waits for the GPU: its time is charged to the "pose" stage

    @torch.no_grad()
    def run_network_views(self, crops):
        """uint8 RGB crops -> (flip-averaged, plain, mirrored-and-flipped-back) heatmaps (N, K, H, W),
        numpy: one forward of the crops and their mirrors (`vitpose.topdown.forward_flip_views`)."""
        if isinstance(crops, np.ndarray):
            crops = torch.from_numpy(np.ascontiguousarray(crops))
        views = forward_flip_views(self.model, crops.to(self.device), self.amp_dtype, self.flip_indices)
        return tuple(view.cpu().numpy() for view in views)  # averaged: what run_network returns with the flip test

    def _crop_all(self, images, boxes_of_images, channels: str):
        """With `warp_on_device` (default on CUDA) the crops are warped on the model's device by
        `warp_affine_uint8` (bit-equal to OpenCV's), else by OpenCV."""
        if not self.warp_on_device:
            return super()._crop_all(images, boxes_of_images, channels)
        crops, centers, scales = [], [], []
        for image, boxes in zip(images, boxes_of_images):
            if not len(boxes):
                continue
            center, scale = self.boxes_to_center_scale(boxes)
            matrices, fixed = [], []
            for c, s in zip(center, scale):
                s_fixed, matrix = crop_geometry(c, s, 0.0, self.codec.input_size)
                matrices.append(matrix)
                fixed.append(s_fixed)
            pixels = torch.from_numpy(np.ascontiguousarray(image)).to(self.device, non_blocking=True)
            crops.append(warp_affine_uint8(pixels, np.stack(matrices), self.codec.input_size))
            centers.append(center)
            scales.append(np.stack(fixed).astype(np.float32))
        if not crops:
            return None, np.zeros((0, 2), np.float32), np.zeros((0, 2), np.float32)
        crops = torch.cat(crops)
        return (crops.flip(1) if channels == "bgr" else crops), np.concatenate(centers), np.concatenate(scales)


def _skeleton_of_model(model, spec):
    """The skeleton a model's spec records, else COCO's; checked against the model's K."""
    from vitpose.builders import skeleton_of
    from vitpose.data.metainfo import dataset_info

    skeleton = skeleton_of(spec) if spec is not None and spec.skeleton is not None else dataset_info("coco")
    head = getattr(unwrap_model(model), "head", None)
    k = getattr(getattr(head, "final_layer", None), "out_channels", skeleton.num_keypoints)
    if k != skeleton.num_keypoints:
        raise ValueError(f"the model predicts {k} keypoints but the skeleton {skeleton.name!r} has "
                         f"{skeleton.num_keypoints}: pass skeleton= (vitpose.data.dataset_info(...)), or load the "
                         f"model with vitpose.load_model, which reads it from the file")
    return skeleton
