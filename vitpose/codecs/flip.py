"""Flip heatmaps back for the flip test (MMPose's `flip_heatmaps`, flip_mode='heatmap')."""

import numpy as np

__all__ = ["flip_heatmaps"]


def flip_heatmaps(heatmaps, flip_indices, shift=False):
    """Mirror heatmaps (..., K, H, W) horizontally and swap left/right channels.

    Works on numpy arrays and torch tensors (on any device) and returns a new array/tensor.
    flip_indices: channel k of the result is channel flip_indices[k] of the mirrored maps
    (None: no channel swap). shift=True moves the mirrored maps right by one column (the
    non-UDP alignment fix); ViTPose's UDP flip test uses shift=False, where x -> W - 1 - x is exact.
    """
    K = heatmaps.shape[-3]
    if flip_indices is not None and len(flip_indices) != K:
        raise ValueError(f"flip_heatmaps: {len(flip_indices)} flip indices for {K} heatmap channels")
    if hasattr(heatmaps, "index_select"):  # torch
        import torch

        flipped = heatmaps.flip(-1)
        if flip_indices is not None:
            index = torch.as_tensor(flip_indices, dtype=torch.long, device=heatmaps.device)
            flipped = flipped.index_select(-3, index)
        if shift:
            # clone: the right-hand side overlaps the left-hand side in memory
            flipped[..., 1:] = flipped[..., :-1].clone()
        return flipped
    flipped = np.flip(np.asarray(heatmaps), -1)
    if flip_indices is not None:
        flipped = np.take(flipped, np.asarray(flip_indices, dtype=np.int64), axis=-3)
    else:
        flipped = flipped.copy()
    if shift:
        flipped[..., 1:] = flipped[..., :-1].copy()
    return flipped
