"""What an exported graph computes, and what its file records about the model.

The graph (`ExportGraph`): normalised float32 RGB crops (N, 3, h, w) named `input` -> float32
heatmaps (N, K, h/4, w/4) named `heatmaps`. Normalisation stays outside the graph (the same
`vitpose.data.pixels.normalize_images` with the spec's mean/std on every runtime); the flip test can
be baked in (`flip_test=True`: `vitpose.flip_test` itself, with the codec's shift); with
`fp16=True` the weights and the arithmetic are float16 while the graph's input and output stay float32.

What the file records: the model's `ModelSpec` (`_recorded_spec`: sizes, codec, pixel mean/std,
skeleton and flip order), the only description of the model, and `EXPORT_KEY`, how the graph itself
was made (`_export_facts`: flip test inside, precision, batch, vitpose version).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from vitpose.coco_meta import FLIP_INDICES, KEYPOINT_NAMES
from vitpose.inference.export_errors import NonFiniteWeightsError
from vitpose.models.spec import ModelSpec, spec_of_model
from vitpose.models.vitpose import flip_test as run_flip_test
from vitpose.models.wrappers import unwrap_model

__all__ = ["EXPORT_KEY", "INPUT_NAME", "OUTPUT_NAME", "ExportGraph", "own_flip_indices", "refuse_nonfinite_weights"]

INPUT_NAME, OUTPUT_NAME = "input", "heatmaps"
EXPORT_KEY = "vitpose.export"  # how the graph was made: {"flip_test", "precision", "batch", "version"}


class ExportGraph(nn.Module):
    """The exported computation: normalised float32 crops -> float32 heatmaps of `model`.

    Args:
        model: a ViTPose (any module mapping (N, 3, h, w) to (N, K, h', w') heatmaps).
        flip_test: bake the flip test in: the crops and their mirrors run as one batch of 2N, the
            mirrored heatmaps are flipped back, left/right channels swapped, and the two averaged
            (what `vitpose.flip_test` does; the gate compares against that function).
        flip_indices: left/right channel order (None: COCO-17).
        fp16: run the model in float16 (the caller passes a float16 model); input and output
            stay float32 so consumers need not know.
        flip_shift: the codec's flip-test shift (`codec.flip_shift`: MSRA True, UDP False).
    The flip test is `vitpose.flip_test` itself (one definition for eager, ONNX and torch.export).
    """

    def __init__(self, model: nn.Module, flip_test: bool = False, flip_indices: Sequence[int] | None = None,
                 fp16: bool = False, flip_shift: bool = False):
        super().__init__()
        self.model = model
        self.flip_test = bool(flip_test)
        self.flip_indices = [int(i) for i in (FLIP_INDICES if flip_indices is None else flip_indices)]
        self.fp16 = bool(fp16)
        self.flip_shift = bool(flip_shift)

    def forward(self, images):
        x = images.half() if self.fp16 else images
        if self.flip_test:
            heatmaps = run_flip_test(self.model, x, self.flip_indices, self.flip_shift)
        else:
            heatmaps = self.model(x)
        return heatmaps.float()


def _plain_copy(model: nn.Module, fp16: bool) -> nn.Module:
    """An eval-mode CPU copy (the caller's model is left as it was), optionally float16."""
    model = copy.deepcopy(unwrap_model(model)).cpu().eval()
    if hasattr(model, "set_grad_checkpointing"):
        model.set_grad_checkpointing(False)
    return model.half() if fp16 else model


def _model_spec(model: nn.Module, codec=None) -> ModelSpec:
    """The model's ModelSpec (its `.spec`, else read from its modules), with the codec the export is
    made for when one is given: what the file records and what the gate runs."""
    if codec is None:
        return spec_of_model(model)
    return spec_of_model(model, codec=type(codec).__name__, sigma=float(codec.sigma),
                         input_size=tuple(codec.input_size), heatmap_size=tuple(codec.heatmap_size))


def _check_batch(batch) -> str | int:
    if isinstance(batch, str) and batch == "dynamic":
        return batch
    if isinstance(batch, (int, np.integer)) and not isinstance(batch, bool) and batch >= 1:
        return int(batch)
    raise ValueError(f"batch must be 'dynamic' or a positive int, got {batch!r}")


def _keypoint_names(model: nn.Module) -> tuple[str, ...]:
    """The names the model's `.spec` skeleton gives its heatmaps, else COCO's (for the gate's report)."""
    spec = getattr(unwrap_model(model), "spec", None)
    return tuple(spec.skeleton["keypoint_names"]) if spec is not None and spec.skeleton else KEYPOINT_NAMES


def own_flip_indices(model: nn.Module) -> list[int] | None:
    """The left/right order of the skeleton the model's `.spec` records (None when it records none)."""
    spec = getattr(unwrap_model(model), "spec", None)
    if spec is None or spec.skeleton is None:
        return None
    return [int(i) for i in spec.skeleton["flip_indices"]]


def _recorded_spec(spec: ModelSpec, flip_indices, num_keypoints: int) -> ModelSpec:
    """The spec a file records: the model's, with a skeleton whose flip order is the export's.

    A model without a recorded skeleton gets a bare one when the export knows its flip order
    (given, or COCO's for 17 keypoints), so that a consumer never has to guess it."""
    if flip_indices is None and num_keypoints == len(FLIP_INDICES):
        flip_indices = FLIP_INDICES
    if flip_indices is None:
        return spec
    order = [int(i) for i in flip_indices]
    if spec.skeleton is not None:
        return spec.replace(skeleton={**spec.skeleton, "flip_indices": order})
    names = list(KEYPOINT_NAMES) if num_keypoints == len(KEYPOINT_NAMES) else [f"keypoint_{k}" for k in
                                                                               range(num_keypoints)]
    name = "coco" if order == list(FLIP_INDICES) and num_keypoints == len(FLIP_INDICES) else "unnamed"
    return spec.replace(skeleton={"name": name, "keypoint_names": names, "flip_indices": order})


def _export_facts(flip_test: bool, fp16: bool, batch, layout: str | None = None) -> str:
    """How the graph was made (`EXPORT_KEY`): what a consumer needs besides the model's spec
    (`layout`: "int8" for `vitpose.inference.int8_graph`'s layout)."""
    from vitpose import __version__

    facts = {"flip_test": bool(flip_test), "precision": "float16" if fp16 else "float32", "batch": batch,
             "version": __version__}
    if layout is not None:
        facts["layout"] = layout
    return json.dumps(facts, sort_keys=True)


def refuse_nonfinite_weights(model: nn.Module) -> None:
    """Before the export's work: a model with NaN / Inf parameters or buffers cannot be exported
    meaningfully (nothing finite to compare the file with); one line naming the first tensor."""
    bad = [(name, int((~torch.isfinite(t)).sum())) for name, t in unwrap_model(model).state_dict().items()
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        total = sum(count for _, count in bad)
        raise NonFiniteWeightsError(f"the model's weights hold {total} NaN/Inf values (first in {bad[0][0]}, "
                                    f"{len(bad)} tensors in all): PyTorch's own heatmaps would not be finite, so "
                                    f"there is nothing to export; use weights from before the run diverged")

