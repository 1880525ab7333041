"""Heatmap heads of ViTPose (docs/model.md §2): the classic deconv decoder and the simple decoder.

Both map the (N, C, 16, 12) feature map to (N, K, 64, 48) heatmaps and end without an
activation. Module names match MMPose / official ViTPose so that checkpoints map 1:1.
"""

import torch
import torch.nn.functional as F
from torch import nn

from vitpose.models.vit import init_layers


class PointwiseConv2d(nn.Conv2d):
    """A 1x1 convolution computed as a matmul over the channels (the same sum of products).

    Why: the backbone's feature map comes out channels-last (tokens are (H*W, C) rows), so the
    head's activations are channels-last and a 1x1 `nn.Conv2d`'s weight gradient comes back with
    channels-last strides, (C, 1, C, C) instead of the weight's (C, 1, 1, 1). DDP then warns "Grad
    strides do not match bucket view strides" and copies the gradient on every step. As a matmul
    over `weight.flatten(1)` the gradient is always made in the weight's own (contiguous) layout,
    whatever the input's memory format. Same parameters and names as `nn.Conv2d(C, K, 1)`.
    """

    def __init__(self, in_channels, out_channels):
        super().__init__(in_channels, out_channels, kernel_size=1)

    def forward(self, x):
        if torch.onnx.is_in_onnx_export():  # exported graphs keep a Conv node and the weight's own name
            return super().forward(x)
        # (N, C, H, W) -> (N, H, W, C) is a free view of a channels-last tensor; the output is
        # moved back to (N, K, H, W), channels-last as the convolution's would be.
        return F.linear(x.movedim(1, -1), self.weight.flatten(1), self.bias).movedim(-1, 1)


def _init_head(module):
    # MMPose / official: N(0, 0.001) on conv and deconv weights, zero bias, BN (1, 0).
    init_layers(module, (nn.Conv2d, nn.ConvTranspose2d), lambda w: nn.init.normal_(w, std=0.001), nn.BatchNorm2d)


class ClassicHead(nn.Module):
    """Deconv(4x4, s2) -> BN -> ReLU per entry of `deconv_channels`, then a 1x1 conv to K maps.

    The Sequential keeps the ReLUs as modules, so the two default stages are named
    `deconv_layers.{0,1,3,4}`, as in every released checkpoint.
    """

    def __init__(self, in_channels, num_keypoints=17, deconv_channels=(256, 256)):
        super().__init__()
        layers = []
        for out_channels in deconv_channels:
            layers += [
                nn.ConvTranspose2d(in_channels, out_channels, 4, stride=2, padding=1, output_padding=0, bias=False),
                nn.BatchNorm2d(out_channels),
                nn.ReLU(inplace=True),
            ]
            in_channels = out_channels
        self.deconv_layers = nn.Sequential(*layers)
        self.final_layer = PointwiseConv2d(in_channels, num_keypoints)
        _init_head(self)

    def forward(self, x):
        return self.final_layer(self.deconv_layers(x))


class SimpleHead(nn.Module):
    """ReLU -> bilinear x4 (align_corners=False) -> 3x3 conv to K maps."""

    def __init__(self, in_channels, num_keypoints=17, scale_factor=4):
        super().__init__()
        self.scale_factor = scale_factor
        self.final_layer = nn.Conv2d(in_channels, num_keypoints, kernel_size=3, padding=1)
        _init_head(self)

    def forward(self, x):
        x = F.interpolate(F.relu(x), scale_factor=self.scale_factor, mode="bilinear", align_corners=False)
        return self.final_layer(x)


__all__ = ["ClassicHead", "PointwiseConv2d", "SimpleHead"]
