"""Model input pixels: the one normalisation of uint8 crops, for training, validation, `Predictor`,
the export gate and `OnnxPredictor` (numpy arrays and torch tensors alike; torch is imported only
for tensors, so the ONNX path stays torch-free).

The mean and std are the model's (`ModelSpec.pixel_mean` / `pixel_std`, recorded in every file this
project writes); ImageNet's (MMPose's) are only the default of a spec.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..coco_meta import PIXEL_MEAN, PIXEL_STD

__all__ = ["normalize_images"]


def normalize_images(images, mean: Sequence[float] = PIXEL_MEAN, std: Sequence[float] = PIXEL_STD, dtype=None):
    """uint8 RGB crops (N, C, H, W) on the 0-255 scale -> (x - mean) / std, in float32 by default.

    Bit-identical to MMPose's PoseDataPreprocessor (convert, subtract, divide) in float32, for a
    torch tensor (on its device) or a numpy array alike.

    Args:
        images: uint8 tensor or array (N, C, H, W), RGB (C = len(mean)).
        mean, std: per-channel statistics on the 0-255 scale (the model spec's; ImageNet's by default).
        dtype: the floating dtype to compute and return in (torch or numpy; default float32).
    """
    is_torch = type(images).__module__.split(".")[0] == "torch"
    if not is_torch:
        images = np.asarray(images)
    if str(images.dtype) not in ("uint8", "torch.uint8"):
        raise TypeError(f"expected uint8 RGB crops (N, C, H, W), got dtype {images.dtype}")
    if images.ndim != 4 or images.shape[1] != len(mean):
        raise ValueError(f"expected uint8 RGB crops (N, {len(mean)}, H, W), got shape {tuple(images.shape)}")
    if not is_torch:
        dtype = np.float32 if dtype is None else dtype
        mean_a = np.asarray(mean, dtype=dtype).reshape(1, -1, 1, 1)
        std_a = np.asarray(std, dtype=dtype).reshape(1, -1, 1, 1)
        return (np.ascontiguousarray(images).astype(dtype) - mean_a) / std_a
    import torch

    dtype = torch.float32 if dtype is None else dtype
    mean_t = torch.as_tensor(mean, dtype=dtype, device=images.device).view(1, -1, 1, 1)
    std_t = torch.as_tensor(std, dtype=dtype, device=images.device).view(1, -1, 1, 1)
    # One memory layout whatever the crops': OpenCV's HWC crops arrive as a channels-last view, and
    # channels-last input makes the patch convolution pick other kernels whose sums differ in the
    # last bits (measured with AVX2 kernels: 4e-7 on the heatmaps), so the Predictor and the video
    # path would disagree on the same crops.
    return (images.to(dtype, memory_format=torch.contiguous_format) - mean_t) / std_t
