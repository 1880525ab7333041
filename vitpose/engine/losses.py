"""Heatmap loss and PCK accuracy, as MMPose's HeatmapHead reports them (docs/recipe.md §6; tests/fixtures/README.md §4)."""

import torch
from torch import nn


class KeypointMSELoss(nn.Module):
    """mean over B x K x H x W of w_k * (pred - target)^2 (MMPose 1.x KeypointMSELoss).

    The weight is applied once, not squared (the 0.x JointsMSELoss squared it; this matters for
    fractional visibilities). Computed in float32 whatever the autocast dtype of `pred`.
    """

    def __init__(self, use_target_weight=True, loss_weight=1.0):
        super().__init__()
        self.use_target_weight = use_target_weight
        self.loss_weight = loss_weight

    def forward(self, pred, target, keypoint_weights=None):
        sq = (pred.float() - target.float()).square()
        if self.use_target_weight:
            if keypoint_weights is None:
                raise ValueError("KeypointMSELoss(use_target_weight=True) needs keypoint_weights (B, K)")
            sq = sq * keypoint_weights.float()[..., None, None]
        return sq.mean() * self.loss_weight


def heatmap_argmax(heatmaps):
    """(B, K, H, W) -> locations (B, K, 2) float as (x, y), max values (B, K); (-1, -1) where max <= 0."""
    B, K, H, W = heatmaps.shape
    vals, idx = heatmaps.reshape(B, K, H * W).max(dim=-1)
    locs = torch.stack([idx % W, idx // W], dim=-1).to(torch.float32)
    return locs.masked_fill((vals <= 0)[..., None], -1.0), vals


@torch.no_grad()
def pck_accuracy(pred, target, keypoint_weights, thr=0.05):
    """MMPose's `acc_pose`: PCK@thr between the argmaxes of predicted and target heatmaps.

    Distances are normalised by [H, W] against (x, y) (MMPose's order: x / H, y / W); only
    keypoints with weight > 0 count; the mean is over keypoints that have any valid sample.
    Returns a 0-d float32 tensor (no host sync).
    """
    H, W = pred.shape[-2:]
    p, _ = heatmap_argmax(pred.float())
    t, _ = heatmap_argmax(target.float())
    norm = torch.tensor([H, W], dtype=torch.float32, device=pred.device)
    dist = ((p - t) / norm).norm(dim=-1)  # (B, K)
    valid = keypoint_weights > 0
    hits = ((dist < thr) & valid).sum(0).float()
    counts = valid.sum(0).float()
    has = counts > 0
    per_kpt = hits[has] / counts[has]
    return per_kpt.mean() if per_kpt.numel() else torch.zeros((), device=pred.device)


__all__ = ["KeypointMSELoss", "heatmap_argmax", "pck_accuracy"]
