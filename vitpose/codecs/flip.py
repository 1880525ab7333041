"""The flip test's numbers, once for numpy, torch and `torch.export` (MMPose's `flip_heatmaps`,
flip_mode='heatmap', and the average of `TopdownPoseEstimator.predict`).

`flip_heatmaps` turns the heatmaps of mirrored crops back; `flip_average` is the flip test's
result, `(heatmaps + flip_heatmaps(mirrored)) * 0.5`. `vitpose.flip_test` (eager, and the graph
`vitpose export --flip-test` bakes in) and `OnnxPredictor` (numpy, after the graph) both call
`flip_average`, so the three paths compute the same operations in the same order.
"""

import numpy as np

__all__ = ["flip_average", "flip_heatmaps"]


def _is_torch(array) -> bool:
    return type(array).__module__.split(".")[0] == "torch"


def flip_heatmaps(heatmaps, flip_indices, shift=False):
    """Mirror heatmaps (..., K, H, W) horizontally and swap left/right channels.

    Works on numpy arrays and torch tensors (on any device, and inside `torch.export`) and returns
    a new array/tensor. flip_indices: channel k of the result is channel flip_indices[k] of the
    mirrored maps (None: no channel swap). shift=True moves the mirrored maps right by one column,
    the first column kept (MMPose's `shift_heatmap`, the alignment fix of the MSRA codec; the codecs
    say which they need as `codec.flip_shift`); UDP uses shift=False, where x -> W - 1 - x is exact.
    """
    K = heatmaps.shape[-3]
    if flip_indices is not None and len(flip_indices) != K:
        raise ValueError(f"flip_heatmaps: {len(flip_indices)} flip indices for {K} heatmap channels")
    if _is_torch(heatmaps):
        import torch

        flipped = heatmaps.flip(-1)
        if flip_indices is not None:
            index = torch.as_tensor(list(flip_indices), dtype=torch.long, device=heatmaps.device)
            flipped = flipped.index_select(-3, index)
        if shift:  # out of place (no aliasing, and torch.export / ONNX trace it as one concat)
            flipped = torch.cat([flipped[..., :1], flipped[..., :-1]], dim=-1)
        return flipped
    flipped = np.flip(np.asarray(heatmaps), -1)
    if flip_indices is not None:
        flipped = np.take(flipped, np.asarray(flip_indices, dtype=np.int64), axis=-3)
    if shift:
        flipped = np.concatenate([flipped[..., :1], flipped[..., :-1]], axis=-1)
    return np.ascontiguousarray(flipped)


def flip_average(heatmaps, mirrored, flip_indices, shift=False):
    """The flip test's heatmaps: `(heatmaps + flip_heatmaps(mirrored, flip_indices, shift)) * 0.5`.

    heatmaps: the model's output on the crops (..., K, H, W); mirrored: on the crops mirrored
    left-right (same shape and kind: numpy or torch). In the dtype of the inputs (float32 stays
    float32: 0.5 is exact, the sum rounds once and the halving does not round).
    """
    if tuple(heatmaps.shape) != tuple(mirrored.shape):
        raise ValueError(f"flip_average: heatmaps {tuple(heatmaps.shape)} and mirrored heatmaps "
                         f"{tuple(mirrored.shape)} differ in shape")
    flipped = flip_heatmaps(mirrored, flip_indices, shift)
    if _is_torch(heatmaps):
        return (heatmaps + flipped) * 0.5
    return (heatmaps + flipped) * heatmaps.dtype.type(0.5)
