"""The top-down steps that evaluation and inference share: crops -> heatmaps -> image keypoints.

`forward_heatmaps` (uint8 RGB crops -> normalised input -> model, with the flip test) and
`heatmaps_to_keypoints` (UDP decode -> image pixels) are what both `vitpose.engine.evaluate.predict`
(validation and evaluate.py) and `vitpose.Predictor` run, so the two paths cannot drift apart.
Every step is MMPose's top-down `predict()`; see docs/evaluation.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import torch

from vitpose.data.geometry import crop_to_image
from vitpose.data.pixels import normalize_images
from vitpose.models.vitpose import flip_test as run_flip_test
from vitpose.models.vitpose import flip_views as run_flip_views

__all__ = ["forward_flip_views", "forward_heatmaps", "heatmaps_to_keypoints"]


def forward_heatmaps(model, images: torch.Tensor, flip_test: bool = True, amp_dtype=None,
                     flip_indices: Sequence[int] | None = None) -> torch.Tensor:
    """Heatmaps (N, K, H, W) float32 of uint8 RGB crops (N, 3, h, w) already on the model's device.

    With `flip_test` the crops and their mirrors go through the model as ONE batch of 2N; the
    mirrored heatmaps are flipped back and averaged (`vitpose.flip_test`: MMPose's heatmap mode,
    no 1-px shift). `amp_dtype` (torch.bfloat16 / torch.float16) runs the model under autocast.
    """
    with _autocast(images, amp_dtype) as x:
        heatmaps = run_flip_test(model, x, flip_indices) if flip_test else model(x)
    return heatmaps.float()


def forward_flip_views(model, images: torch.Tensor, amp_dtype=None,
                       flip_indices: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The flip test's two views of uint8 RGB crops, each (N, K, H, W) float32: the plain
    forward and the mirrored one flipped back (`vitpose.models.vitpose.flip_views`). Their mean
    is what `forward_heatmaps(flip_test=True)` returns."""
    with _autocast(images, amp_dtype) as x:
        plain, mirrored = run_flip_views(model, x, flip_indices)
    return plain.float(), mirrored.float()


@contextlib.contextmanager
def _autocast(images: torch.Tensor, amp_dtype):
    """The normalised input, under autocast when `amp_dtype` is given."""
    x = normalize_images(images)  # TypeError / ValueError for anything but uint8 (N, 3, H, W)
    autocast = (torch.autocast(x.device.type, dtype=amp_dtype) if amp_dtype is not None
                else contextlib.nullcontext())
    with autocast:
        yield x


def heatmaps_to_keypoints(heatmaps, center, scale, codec) -> tuple[np.ndarray, np.ndarray]:
    """Decode heatmaps (B, K, H, W) and map them to image pixels.

    center, scale (B, 2): the crop box (aspect-fixed scale). Returns keypoints (B, K, 2) float64
    and scores (B, K) float32: `x_img = x_in / w * S_w + c_x - S_w / 2` (MMPose's top-down
    estimator; with the UDP decode this is the official UDP mapping).
    """
    if isinstance(heatmaps, torch.Tensor):
        heatmaps = heatmaps.detach().float().cpu().numpy()
    keypoints, scores = codec.batch_decode(heatmaps)
    return crop_to_image(keypoints, np.asarray(center), np.asarray(scale), codec.input_size), scores
