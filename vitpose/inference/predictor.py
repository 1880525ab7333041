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
from vitpose.device import resolve_device
from vitpose.inference.pipeline import TopDown
from vitpose.inference.results import Poses, StageTimer
from vitpose.inference.warp import warp_affine_uint8
from vitpose.topdown import forward_heatmaps

__all__ = ["Poses", "Predictor", "StageTimer"]


class Predictor(TopDown):
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
        batch_size: boxes per forward pass.
        detector: the person detector `predictor(image)` uses: a callable
            `(images, channels) -> [vitpose.inference.detect.Detections]` (e.g. `vitpose.inference.detect.PersonDetector`,
            `FullFrame()`), or None (boxes come from the caller). See `from_pretrained` for names.
        skeleton: the model's keypoints (a `vitpose.data.DatasetInfo`: names, flip order, limbs to
            draw); None: COCO-17.
        model_kwargs: extra `build_model` arguments (checkpoint paths only).

    `predictor(image_or_images, boxes=None)`: see `__call__` (all people, `Poses`).

    `predict(image, boxes)`:
        image: (H, W, 3) uint8, **RGB** by default (`channels="bgr"` for `cv2.imread` output), or a
            PIL image.
        boxes: (M, 4) person boxes, **xyxy** (x1, y1, x2, y2) image pixels by default, or
            `box_format="xywh"`; a 5th column (a detector score) is ignored. None = the whole
            image, [] = nobody (as `predictor(image, boxes=[])`).
        Returns keypoints (M, K, 2) float64 in image pixels (x, y) and scores (M, K) float32
        (heatmap maxima: higher is more confident; ~0.3 is a usual display threshold).
    Boxes are used as given (no clipping), like detector boxes in MMPose.
    """

    def __init__(self, model, model_name: str = "vitpose-s", decoder: str = "classic", device=None,
                 flip_test: bool = True, codec=None, amp_dtype=None, batch_size: int = 32,
                 flip_indices: Sequence[int] | None = None, detector=None, skeleton=None, **model_kwargs):
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
        self.model = model.to(self.device).eval()
        self.codec = codec if codec is not None else UDPHeatmap()
        self.flip_test = bool(flip_test)
        self.amp_dtype = amp_dtype
        self.batch_size = int(batch_size)
        if skeleton is None:  # COCO's unless told (the "weights" branch reads it from the file)
            from vitpose.data.metainfo import dataset_info

            skeleton = dataset_info("coco")
        self.skeleton = skeleton
        self.flip_indices = flip_indices
        self.detector = detector
        self.timer = StageTimer()
        # crops warped where the model runs: on a GPU, OpenCV on the CPU would limit a video
        self.warp_on_device = self.device.type == "cuda"

    @classmethod
    def from_pretrained(cls, name_or_path, detector="default", device=None, config=None, expert: str | None = None,
                        detector_threshold: float | None = None, **kwargs) -> Predictor:
        """A Predictor for published weights by name (`vitpose.hub.list_models()`) or a weights file.

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
            kwargs: go to `Predictor` (flip_test, batch_size, amp_dtype, ...).
        """
        from vitpose.models import hub
        from vitpose.inference.detect import DEFAULT_SCORE_THRESHOLD, make_detector

        path = hub.download(name_or_path)
        if config is not None:
            predictor = cls.from_config(config, path, device=device, **kwargs)
        else:
            spec = hub.model_spec(name_or_path, expert=expert)
            predictor = cls(_build_and_load(spec, path), device=device, **kwargs)
        threshold = DEFAULT_SCORE_THRESHOLD if detector_threshold is None else detector_threshold
        predictor.detector = make_detector(detector, predictor.device, threshold)
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
        info = build_dataset_info(cfg)
        kwargs.setdefault("skeleton", info)  # drawing uses its limbs
        if "flip_indices" not in kwargs:  # the flip test mirrors with the config's skeleton
            kwargs["flip_indices"] = info.flip_indices
        model = build_model_from_config(cfg.model)
        load_weights(model, checkpoint)
        return cls(model, codec=build_codec(cfg.model), **kwargs)

    @property
    def num_keypoints(self) -> int:
        return len(self.flip_indices) if self.flip_indices is not None else self.skeleton.num_keypoints

    @torch.no_grad()
    def run_network(self, crops) -> np.ndarray:
        """uint8 RGB crops (N, 3, h, w), numpy or a tensor on the model's device -> heatmaps (N, K, H, W)."""
        if isinstance(crops, np.ndarray):
            crops = torch.from_numpy(np.ascontiguousarray(crops))
        heatmaps = forward_heatmaps(self.model, crops.to(self.device), self.flip_test, self.amp_dtype,
                                    self.flip_indices)
        return heatmaps.cpu().numpy()  # waits for the GPU: its time is charged to the "pose" stage

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


def _build_and_load(spec, path: Path):
    """`build_model` for a hub.ModelSpec, weights loaded (ViTPose+ files need `expert=` support)."""
    from vitpose.models.checkpoint import load_weights
    from vitpose.models.vitpose import build_model

    model = build_model(spec.size, decoder=spec.decoder, num_keypoints=spec.num_keypoints)
    load_weights(model, path, expert=spec.expert)
    return model
