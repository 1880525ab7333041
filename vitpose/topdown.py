"""The network step that evaluation and `Predictor` share: uint8 crops -> heatmaps.

`forward_heatmaps` (uint8 RGB crops -> the model's normalisation -> model, with the flip test) is
what both `vitpose.engine.evaluate.predict` (validation and evaluate.py) and `vitpose.Predictor`
run; the model's `ModelSpec` says the pixel mean/std and whether the flip test shifts (its codec).
The decode after it is `vitpose.codecs.decode_to_image` (here as `heatmaps_to_keypoints`), which
`OnnxPredictor` runs too. Every step is MMPose's top-down `predict()`; see docs/evaluation.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from vitpose.codecs.decode import decode_to_image
from vitpose.data.pixels import normalize_images
from vitpose.models.spec import ModelSpec
from vitpose.models.vitpose import flip_test as run_flip_test
from vitpose.models.vitpose import flip_views as run_flip_views
from vitpose.models.wrappers import unwrap_model

__all__ = ["forward_flip_views", "forward_heatmaps", "heatmaps_to_keypoints", "model_input_spec"]

DEFAULT_SPEC = ModelSpec(origin="default")


def model_input_spec(model) -> ModelSpec:
    """The `ModelSpec` a model carries (`model.spec`), else the default (ImageNet pixels, UDP)."""
    spec = getattr(unwrap_model(model), "spec", None)
    return spec if isinstance(spec, ModelSpec) else DEFAULT_SPEC


def forward_heatmaps(model, images: torch.Tensor, flip_test: bool = True, amp_dtype=None,
                     flip_indices: Sequence[int] | None = None, flip_shift: bool | None = None) -> torch.Tensor:
    """Heatmaps (N, K, H, W) float32 of uint8 RGB crops (N, 3, h, w) already on the model's device.

    The crops are normalised with the model's spec's pixel mean/std. With `flip_test` the crops and
    their mirrors go through the model as ONE batch of 2N; the mirrored heatmaps are flipped back
    and averaged (`vitpose.flip_test`: MMPose's heatmap mode; `flip_shift`, default the spec's
    codec's rule: no shift for UDP, one cell for MSRA). `amp_dtype` (torch.bfloat16 /
    torch.float16) runs the model under autocast.
    """
    spec = model_input_spec(model)
    shift = spec.flip_shift if flip_shift is None else bool(flip_shift)
    with _autocast(images, amp_dtype, spec) as x:
        heatmaps = run_flip_test(model, x, flip_indices, shift) if flip_test else model(x)
    return heatmaps.float()


def forward_flip_views(model, images: torch.Tensor, amp_dtype=None, flip_indices: Sequence[int] | None = None,
                       flip_shift: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The flip test's result and its two views of uint8 RGB crops, each (N, K, H, W) float32:
    (averaged, plain, flipped_back) of `vitpose.models.vitpose.flip_views`, with the input
    normalised and `flip_shift` defaulted as in `forward_heatmaps`, so `averaged` is what
    `forward_heatmaps(flip_test=True)` returns."""
    spec = model_input_spec(model)
    shift = spec.flip_shift if flip_shift is None else bool(flip_shift)
    with _autocast(images, amp_dtype, spec) as x:
        views = run_flip_views(model, x, flip_indices, shift)
    return tuple(view.float() for view in views)


@contextlib.contextmanager
def _autocast(images: torch.Tensor, amp_dtype, spec: ModelSpec):
    """The input normalised with the spec's pixel mean/std, under autocast when `amp_dtype` is given."""
    x = normalize_images(images, spec.pixel_mean, spec.pixel_std)  # TypeError / ValueError unless uint8 (N, 3, H, W)
    autocast = (torch.autocast(x.device.type, dtype=amp_dtype) if amp_dtype is not None
                else contextlib.nullcontext())
    with autocast:
        yield x


# The one decode of validation and prediction (heatmaps (B, K, H, W), center, scale, codec ->
# image keypoints (B, K, 2) float64, scores (B, K)); the argument order of the older name.
def heatmaps_to_keypoints(heatmaps, center, scale, codec):
    """`vitpose.codecs.decode_to_image(codec, heatmaps, center, scale)`."""
    return decode_to_image(codec, heatmaps, center, scale)
