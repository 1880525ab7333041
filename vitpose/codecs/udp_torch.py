"""UDP Gaussian targets computed in torch on the keypoints' device (one instance per sample).

The trainer encodes targets next to the model, so only (B, K, 2) keypoints cross the PCIe bus
instead of (B, K, 64, 48) heatmaps. The numbers equal `UDPHeatmap.encode` (MMPose's UDP
Gaussian) to float32 rounding of exp: same integer centre int(x + 0.5) (truncation toward zero),
same 3-sigma window, and the weight rule itself is the numpy codec's function
(`gaussian_keypoint_weights`, written once for arrays and tensors). All arithmetic is
float32/int64, so it also runs where float64 is missing.
"""

import numpy as np
import torch

from .udp import gaussian_keypoint_weights, udp_stride

__all__ = ["udp_encode_torch"]

_FAR = 1.0e6  # see vitpose.codecs.udp: clip keypoints that are not drawn before the integer cast


def udp_encode_torch(keypoints, keypoints_visible, input_size=(192, 256), heatmap_size=(48, 64), sigma=2.0):
    """keypoints (B, K, 2) in input-crop pixels, keypoints_visible (B, K) ->
    heatmaps (B, K, H, W) float32, keypoint_weights (B, K) float32, on keypoints.device.

    The weights follow `gaussian_keypoint_weights` (the rule the numpy codec uses): the
    visibility, and 0 for a labelled keypoint whose 13x13 window misses the map or whose
    coordinates are not finite; visibility < 0.5 draws nothing.
    """
    keypoints = torch.as_tensor(keypoints)
    device = keypoints.device
    keypoints_visible = torch.as_tensor(keypoints_visible, device=device)
    if keypoints.ndim != 3 or keypoints.shape[-1] != 2:
        raise ValueError(f"udp_encode_torch: keypoints must have shape (B, K, 2), got {tuple(keypoints.shape)}")
    if tuple(keypoints_visible.shape) != tuple(keypoints.shape[:2]):
        raise ValueError(
            f"udp_encode_torch: keypoints_visible must have shape {tuple(keypoints.shape[:2])}, "
            f"got {tuple(keypoints_visible.shape)}")
    W, H = int(heatmap_size[0]), int(heatmap_size[1])
    # The float32 stride MMPose divides by: (w - 1) / (W - 1), rounded to float32.
    stride = torch.from_numpy(udp_stride(input_size, heatmap_size)).to(device)

    visible = keypoints_visible.to(torch.float32)
    keypoints_hm = keypoints.to(torch.float32) / stride
    weights, drawn = gaussian_keypoint_weights(keypoints_hm, visible, heatmap_size, sigma)
    keypoints_hm = torch.nan_to_num(keypoints_hm, nan=0.0).clamp(-_FAR, _FAR)

    radius = sigma * 3
    window = 2 * radius + 1
    window_cells = len(np.arange(0, window, 1))
    centre_in_window = window // 2

    mu = (keypoints_hm + 0.5).long()  # truncation toward zero, like Python's int()
    low = (mu.float() - radius).long()
    high = (mu.float() + radius + 1).long()

    # keypoints_hm - mu is exact in float32 (|difference| < 1), so this rounds once, like MMPose.
    centre = centre_in_window + (keypoints_hm - mu.float())

    # Evaluate each keypoint's 13x13 window only, then scatter it into the map; cells off the map
    # (or of keypoints not drawn) go to one spare slot past the end, which is dropped.
    steps = torch.arange(window_cells, device=device)

    def axis_terms(size, axis):
        cells = low[..., axis, None] + steps                      # (B, K, window) map cells
        inside = (cells >= 0) & (cells < size) & (cells < high[..., axis, None])
        d = steps.float() - centre[..., axis, None]
        return d * d, cells, inside

    dx2, cells_x, in_x = axis_terms(W, 0)
    dy2, cells_y, in_y = axis_terms(H, 1)
    two_sigma2 = torch.tensor(2 * sigma ** 2, dtype=torch.float32, device=device)
    gauss = torch.exp(-((dx2[..., None, :] + dy2[..., :, None]) / two_sigma2))
    mask = in_y[..., :, None] & in_x[..., None, :] & drawn[..., None, None]
    flat = torch.where(mask, cells_y[..., :, None] * W + cells_x[..., None, :], H * W)
    B, K = keypoints_hm.shape[:2]
    heatmaps = torch.zeros(B, K, H * W + 1, dtype=torch.float32, device=device)
    heatmaps.scatter_(-1, flat.reshape(B, K, -1), gauss.reshape(B, K, -1))
    heatmaps = heatmaps[..., :H * W].reshape(B, K, H, W)
    return heatmaps, weights
