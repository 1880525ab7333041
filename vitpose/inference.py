"""Top-down inference on an image: `Predictor(...).predict(image, boxes) -> keypoints, scores`.

The same steps as evaluation (and as MMPose's `inference_topdown` with a ViTPose config):
box -> centre and scale (padding 1.25) -> aspect fix to the input's w/h -> UDP warp of the uint8
image with OpenCV -> normalise -> model (with the flip test) -> UDP decode -> image pixels.
The model and decoding steps are `vitpose.topdown`'s, which the evaluation loop
(`vitpose.engine.evaluate.predict`) runs too, so the two paths cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from vitpose.codecs.udp import UDPHeatmap
from vitpose.data.geometry import bbox_xywh2xyxy, bbox_xyxy2cs
from vitpose.data.transforms import topdown_affine
from vitpose.device import resolve_device
from vitpose.topdown import forward_heatmaps, heatmaps_to_keypoints

__all__ = ["Predictor"]


class Predictor:
    """ViTPose on person boxes of one image.

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
        model_kwargs: extra `build_model` arguments (checkpoint paths only).

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
                 flip_indices: Sequence[int] | None = None, **model_kwargs):
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
        self.flip_indices = flip_indices

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
        if "flip_indices" not in kwargs:  # the flip test mirrors with the config's skeleton
            kwargs["flip_indices"] = build_dataset_info(cfg).flip_indices
        model = build_model_from_config(cfg.model)
        load_weights(model, checkpoint)
        return cls(model, codec=build_codec(cfg.model), **kwargs)

    def boxes_to_center_scale(self, boxes, box_format: str = "xyxy", image_shape=None):
        """(M, 4|5) boxes -> centre (M, 2), scale (M, 2) float32 (padding 1.25, before the aspect fix)."""
        if boxes is None:
            if image_shape is None:
                raise ValueError("boxes=None needs the image shape")
            h, w = image_shape[:2]
            boxes = [[0, 0, w, h]]
            box_format = "xyxy"
        boxes = np.asarray(boxes, dtype=np.float32)
        if boxes.ndim == 1 and boxes.shape[0] in (4, 5):
            boxes = boxes[None]
        if boxes.ndim != 2 or boxes.shape[1] not in (4, 5):
            raise ValueError(f"boxes must have shape (M, 4) or (M, 5), got {boxes.shape}")
        boxes = boxes[:, :4].copy()
        if not np.all(np.isfinite(boxes)):
            raise ValueError("boxes contain non-finite values")
        if box_format == "xywh":
            boxes = bbox_xywh2xyxy(boxes)
        elif box_format != "xyxy":
            raise ValueError(f"box_format must be 'xyxy' or 'xywh', got {box_format!r}")
        if np.any(boxes[:, 2:] <= boxes[:, :2]):
            bad = np.nonzero(np.any(boxes[:, 2:] <= boxes[:, :2], axis=1))[0].tolist()
            raise ValueError(f"boxes {bad} have zero or negative width/height (box_format={box_format!r})")
        return bbox_xyxy2cs(boxes, padding=1.25)

    def crops(self, image: np.ndarray, center: np.ndarray, scale: np.ndarray):
        """UDP crops of the boxes: uint8 (M, 3, h, w) in the image's channel order, aspect-fixed scales (M, 2)."""
        out, scales = [], []
        for c, s in zip(center, scale):
            crop, _, fixed, _ = topdown_affine(image, c, s, 0.0, self.codec.input_size)
            out.append(crop.transpose(2, 0, 1))
            scales.append(fixed)
        w, h = self.codec.input_size
        if not out:
            return np.zeros((0, 3, h, w), np.uint8), np.zeros((0, 2), np.float32)
        return np.stack(out), np.stack(scales).astype(np.float32)

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
        num_keypoints = len(self.flip_indices) if self.flip_indices is not None else None
        keypoints, scores = [], []
        for start in range(0, len(crops), self.batch_size):
            batch = torch.from_numpy(np.ascontiguousarray(crops[start:start + self.batch_size])).to(self.device)
            heatmaps = forward_heatmaps(self.model, batch, self.flip_test, self.amp_dtype, self.flip_indices)
            kpts, kpt_scores = heatmaps_to_keypoints(
                heatmaps, center[start:start + self.batch_size], fixed_scale[start:start + self.batch_size],
                self.codec)
            keypoints.append(kpts)
            scores.append(kpt_scores)
        if not keypoints:
            k = num_keypoints or 17
            return np.zeros((0, k, 2)), np.zeros((0, k), np.float32)
        return np.concatenate(keypoints), np.concatenate(scores)

    __call__ = predict
