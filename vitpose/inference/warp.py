"""OpenCV's bilinear `warpAffine` on uint8 images, in torch: crops made where the model runs.

When the model runs on a GPU, warping every person crop with OpenCV on the CPU (and copying the
crops over) is what limits a video pipeline, not the model. `warp_affine_uint8` makes the crops
of many boxes of many frames in one batched gather on the frames' device, and it reproduces
`cv2.warpAffine(image, M, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
borderValue=0)` bit for bit, because it follows OpenCV's fixed-point arithmetic step by step
(OpenCV 4.x, `imgwarp.cpp`):

1. M (image -> crop) is inverted in float64 the way warpAffine does it (explicit 2x2 inverse).
2. The source position of crop pixel (u, v) is computed in 1/1024 pixel units from two rounded
   terms, round(A00 u 1024) + round((A01 v + A02) 1024) (round half to even), plus 16, and
   shifted right by 5: a position in 1/32 pixel units (OpenCV's INTER_BITS = 5).
3. The integer part picks the top-left source pixel, the 5-bit fractions fx, fy pick the weights
   (32 - fx)(32 - fy), fx (32 - fy), (32 - fx) fy, fx fy (sum 1024; OpenCV's table holds the same
   numbers times 32, exact since they are multiples of 1/1024).
4. Pixel = (sum of weight * neighbour + 512) >> 10, where neighbours outside the image are 0.

On coco-mini's 118 detection boxes (256x192 UDP crops) the result equals OpenCV 4.14's crops in
every pixel (tests/test_warp_torch.py); the same bilinear formula in floating point instead differs
by up to 6 grey levels (mean 0.21) because OpenCV rounds positions to 1/32 pixel.
The tables of step 2 are computed on the CPU in float64 (N * (w + h) numbers) so that devices
without float64 (MPS) give the same result; everything per pixel is integer arithmetic.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["invert_affine_like_opencv", "warp_affine_uint8"]

_INTER_BITS = 5  # OpenCV's INTER_BITS: positions in 1/32 pixel
_AB_BITS = 10  # OpenCV's AB_BITS = max(10, INTER_BITS): positions first in 1/1024 pixel
_ROUND_DELTA = (1 << _AB_BITS) // (1 << _INTER_BITS) // 2  # 16


def invert_affine_like_opencv(matrices) -> np.ndarray:
    """(N, 2, 3) image -> crop matrices -> their inverses (crop -> image), float64, computed with
    the operations and order of warpAffine's own inversion (so the result matches to the bit)."""
    m = np.asarray(matrices, dtype=np.float64).reshape(-1, 2, 3)
    det = m[:, 0, 0] * m[:, 1, 1] - m[:, 0, 1] * m[:, 1, 0]
    inv_det = np.divide(1.0, det, out=np.zeros_like(det), where=det != 0)
    a00 = m[:, 1, 1] * inv_det
    a11 = m[:, 0, 0] * inv_det
    a01 = m[:, 0, 1] * -inv_det
    a10 = m[:, 1, 0] * -inv_det
    b0 = -a00 * m[:, 0, 2] - a01 * m[:, 1, 2]
    b1 = -a10 * m[:, 0, 2] - a11 * m[:, 1, 2]
    return np.stack([np.stack([a00, a01, b0], -1), np.stack([a10, a11, b1], -1)], 1)


def _fixed_point_positions(inverse: np.ndarray, width: int, height: int):
    """Source positions in 1/32 pixel, as int64 tables: x (N, h, w) and y (N, h, w) are built on the
    device from per-column and per-row terms (N, w) and (N, h)."""
    scale = float(1 << _AB_BITS)
    u = np.arange(width, dtype=np.float64)
    v = np.arange(height, dtype=np.float64)
    # OpenCV: adelta[x] = round(M0 * x * 1024); X0 = round((M1 * y + M2) * 1024) + round_delta
    col_x = np.rint(inverse[:, 0, 0, None] * u * scale)
    col_y = np.rint(inverse[:, 1, 0, None] * u * scale)
    row_x = np.rint((inverse[:, 0, 1, None] * v + inverse[:, 0, 2, None]) * scale) + _ROUND_DELTA
    row_y = np.rint((inverse[:, 1, 1, None] * v + inverse[:, 1, 2, None]) * scale) + _ROUND_DELTA
    limit = float(np.iinfo(np.int32).max)  # OpenCV saturates these to int
    return [np.clip(t, -limit - 1, limit).astype(np.int64) for t in (col_x, col_y, row_x, row_y)]


def warp_affine_uint8(images: torch.Tensor, matrices, output_size, image_index=None) -> torch.Tensor:
    """Bilinear affine crops of uint8 images, equal to OpenCV's `warpAffine` (constant 0 border).

    Args:
        images: uint8 tensor (F, H, W, C) or (H, W, C), channels last (as frames are decoded), on
            the device where the crops are wanted.
        matrices: (N, 2, 3) image -> crop matrices (numpy or tensor), e.g. from
            `vitpose.data.get_udp_warp_matrix`; float32 matrices are used as OpenCV uses them
            (widened to float64).
        output_size: (w, h) of the crops.
        image_index: (N,) which image each crop is taken from (default: image 0 for every crop
            when there is one image, else crop i from image i).
    Returns:
        uint8 tensor (N, C, h, w) on the images' device (channels first, as the model takes it).
    """
    if images.dtype != torch.uint8:
        raise TypeError(f"warp_affine_uint8 needs uint8 images, got {images.dtype}")
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4:
        raise ValueError(f"images must be (F, H, W, C) or (H, W, C), got shape {tuple(images.shape)}")
    if isinstance(matrices, torch.Tensor):
        matrices = matrices.detach().cpu().numpy()
    matrices = np.asarray(matrices)
    if matrices.ndim != 3 or matrices.shape[1:] != (2, 3):
        raise ValueError(f"matrices must be (N, 2, 3), got shape {matrices.shape}")
    num_images, height, width, channels = images.shape
    num_crops = matrices.shape[0]
    if image_index is None:
        if num_images != 1 and num_images != num_crops:
            raise ValueError(f"{num_crops} matrices for {num_images} images: pass image_index")
        image_index = np.zeros(num_crops, np.int64) if num_images == 1 else np.arange(num_crops)
    image_index = np.asarray(image_index, np.int64).reshape(-1)
    if image_index.shape[0] != num_crops:
        raise ValueError(f"image_index has {image_index.shape[0]} entries for {num_crops} matrices")
    if num_crops and (image_index.min() < 0 or image_index.max() >= num_images):
        raise ValueError(f"image_index must lie in [0, {num_images}), got {image_index.min()}..{image_index.max()}")
    out_w, out_h = int(output_size[0]), int(output_size[1])
    device = images.device
    if num_crops == 0:
        return torch.zeros((0, channels, out_h, out_w), dtype=torch.uint8, device=device)

    tables = _fixed_point_positions(invert_affine_like_opencv(matrices), out_w, out_h)
    col_x, col_y, row_x, row_y = (torch.from_numpy(t).to(device) for t in tables)
    shift = _AB_BITS - _INTER_BITS
    x = (row_x[:, :, None] + col_x[:, None, :]) >> shift  # (N, h, w) in 1/32 pixel
    y = (row_y[:, :, None] + col_y[:, None, :]) >> shift
    one = 1 << _INTER_BITS
    # OpenCV keeps the integer positions as int16 (saturated); then everything fits in int32
    x0 = torch.clamp(x >> _INTER_BITS, -32768, 32767).to(torch.int32)
    y0 = torch.clamp(y >> _INTER_BITS, -32768, 32767).to(torch.int32)
    fx = (x & (one - 1)).to(torch.int32)
    fy = (y & (one - 1)).to(torch.int32)
    del x, y
    # per-axis weights, zero where that neighbour lies outside the image (the constant border)
    wx = ((one - fx) * ((x0 >= 0) & (x0 < width)), fx * ((x0 >= -1) & (x0 < width - 1)))
    wy = ((one - fy) * ((y0 >= 0) & (y0 < height)), fy * ((y0 >= -1) & (y0 < height - 1)))
    xs = (x0.clamp(0, width - 1), (x0 + 1).clamp(0, width - 1))
    rows = [(y0 + dy).clamp(0, height - 1) * width
            + torch.from_numpy(image_index * (height * width)).to(device, torch.int32)[:, None, None]
            for dy in (0, 1)]

    flat = images.reshape(-1, channels)
    total = torch.zeros((num_crops, out_h, out_w, channels), dtype=torch.int32, device=device)
    for dy in (0, 1):
        for dx in (0, 1):
            index = (rows[dy] + xs[dx]).reshape(-1).long()
            pixels = flat.index_select(0, index).reshape(num_crops, out_h, out_w, channels)
            total += pixels.to(torch.int32) * (wy[dy] * wx[dx])[..., None]
    rounding = 1 << (2 * _INTER_BITS - 1)  # 512: round half up, as OpenCV's FixedPtCast
    crops = ((total + rounding) >> (2 * _INTER_BITS)).clamp(0, 255).to(torch.uint8)
    return crops.permute(0, 3, 1, 2).contiguous()
