"""Model input pixels: the one normalisation of uint8 crops, shared by training and inference."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..coco_meta import PIXEL_MEAN, PIXEL_STD

__all__ = ["normalize_images"]


def normalize_images(images: torch.Tensor, mean: Sequence[float] = PIXEL_MEAN, std: Sequence[float] = PIXEL_STD,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 RGB crops (N, C, H, W) on the 0-255 scale -> (x - mean) / std in `dtype`, on their device.

    Float32 by default, bit-identical to MMPose's PoseDataPreprocessor (convert, subtract, divide).

    Args:
        images: uint8 tensor (N, C, H, W), RGB (C = len(mean)).
        mean, std: per-channel statistics on the 0-255 scale (ImageNet's by default).
        dtype: the floating dtype to compute and return in.
    """
    if images.dtype != torch.uint8:
        raise TypeError(f"expected uint8 RGB crops (N, C, H, W), got dtype {images.dtype}")
    if images.ndim != 4 or images.shape[1] != len(mean):
        raise ValueError(f"expected uint8 RGB crops (N, {len(mean)}, H, W), got shape {tuple(images.shape)}")
    mean_t = torch.as_tensor(mean, dtype=dtype, device=images.device).view(1, -1, 1, 1)
    std_t = torch.as_tensor(std, dtype=dtype, device=images.device).view(1, -1, 1, 1)
    # One memory layout whatever the crops': OpenCV's HWC crops arrive as a channels-last view, and
    # channels-last input makes the patch convolution pick other kernels whose sums differ in the
    # last bits (measured with AVX2 kernels: 4e-7 on the heatmaps), so the Predictor and the video
    # path would disagree on the same crops.
    return (images.to(dtype, memory_format=torch.contiguous_format) - mean_t) / std_t
