"""The numeric gate: an exported file run on real crops and compared with PyTorch eager.

`check_export(path, model, crops, format=...)` runs the file (onnxruntime on CPU for .onnx, OpenVINO's
CPU plugin in fp32 for an IR, `torch.export.load` for .pt2) at batch 1 and a larger batch, or at its
fixed batch, and compares its heatmaps and decoded keypoints with `vitpose.topdown.forward_heatmaps`
(the steps `Predictor` and evaluation run) on the same crops: a `GateRun` per batch, a `GateReport`
(`.passed`, `.lines()`: by how much and where, batch item, keypoint and heatmap pixel). The writers
(`vitpose.inference.export_writers`) move a file into place only when it passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vitpose.coco_meta import KEYPOINT_NAMES
from vitpose.data.pixels import normalize_images
from vitpose.inference.export_errors import FORMATS, require
from vitpose.inference.export_graph import (
    INPUT_NAME,
    OUTPUT_NAME,
    _check_batch,
    _keypoint_names,
    _model_spec,
    _plain_copy,
    own_flip_indices,
)
from vitpose.topdown import forward_heatmaps, model_input_spec

__all__ = ["FP16_RELATIVE_TOLERANCE", "FP32_TOLERANCE", "GATE_BATCHES", "KEYPOINT_FLOOR_PX",
           "KEYPOINT_SENSITIVITY_FACTOR", "GateReport", "GateRun", "check_export"]

# The gate. float32: the bound asked of every export; measured 7.6e-6 (classic) and 1.3e-5 (simple) for
# ViTPose-S on coco-mini crops with heatmaps of std ~1.5 and peaks ~7 (onnxruntime 1.32 CPU).
FP32_TOLERANCE = 1e-4
# float16 keeps 11 significant bits (a relative step of 4.9e-4 to 9.8e-4); ViTPose-S in fp16
# measured 6.5e-3 on peaks of 7.5 (8.6e-4 of the peak). The bound is 1e-2 of the reference's
# peak |heatmap|, about 10x that, so heavier sizes with more blocks have headroom.
FP16_RELATIVE_TOLERANCE = 1e-2
# Decoded keypoints: a keypoint may move by KEYPOINT_FLOOR_PX crop pixels, or by up to 3x what the
# PyTorch decode itself moves under heatmap noise of the measured size. The UDP decode's sub-pixel
# step divides by second derivatives of log-heatmaps, so on flat or two-peaked maps a 1e-5 change
# moves a keypoint by tenths of a pixel (0.32 px measured for ViTPose-S, random weights, fp32).
KEYPOINT_FLOOR_PX = 0.05
KEYPOINT_SENSITIVITY_FACTOR = 3.0
SENSITIVITY_DRAWS = 10
# Check at 1 and at 5, a size the trace (export_writers.TRACE_BATCH, 2) never saw.
GATE_BATCHES = (1, 5)


@dataclass
class GateRun:
    """The figures of one batch size. `*_where`: (batch item, keypoint, heatmap row, column)."""

    batch: int
    tolerance: float
    peak: float  # max |reference heatmap|
    heatmap_diff: float
    heatmap_where: tuple[int, int, int, int]
    keypoint_diff: float  # crop (input) pixels
    keypoint_where: tuple[int, int]
    keypoints_moved: int  # beyond KEYPOINT_FLOOR_PX
    keypoints_unexplained: int  # beyond the floor and beyond what the decode's own conditioning allows
    keypoints_total: int
    score_diff: float
    labels: list[str] = field(default_factory=list)
    reference_nonfinite: int = 0  # NaN / Inf values in PyTorch's own heatmaps: nothing to compare with

    @property
    def passed(self) -> bool:
        return (self.reference_nonfinite == 0 and bool(self.heatmap_diff <= self.tolerance)
                and self.keypoints_unexplained == 0)


@dataclass
class GateReport:
    """Everything the gate measured, and the verdict."""

    path: str
    format: str
    runtime: str
    precision: str
    source: str
    input_shape: list
    runs: list[GateRun]
    shape_problem: str | None = None
    keypoint_names: Sequence[str] = KEYPOINT_NAMES  # the model's skeleton's (COCO's by default)

    @property
    def passed(self) -> bool:
        return self.shape_problem is None and bool(self.runs) and all(run.passed for run in self.runs)

    @property
    def reference_nonfinite(self) -> bool:
        """PyTorch's own heatmaps held NaN / Inf: the model is broken, not the export."""
        return any(run.reference_nonfinite for run in self.runs)

    def lines(self) -> list[str]:
        out = [f"gate: {self.path} ({self.runtime}, {self.precision}, input {self.input_shape}) against "
               f"PyTorch eager on crops of {self.source}"]
        if self.shape_problem:
            out.append(f"  input shape: {self.shape_problem}")
        for run in self.runs:
            if run.reference_nonfinite:
                out.append(f"  batch {run.batch}: PyTorch's own heatmaps are not finite ({run.reference_nonfinite} "
                           f"NaN/Inf values): the model itself is broken (NaN/Inf weights or an overflow), so "
                           f"the exported file cannot be checked against it")
            item, k, y, x = run.heatmap_where
            verdict = "ok" if run.heatmap_diff <= run.tolerance else "FAILED"
            out.append(
                f"  batch {run.batch}: heatmaps max |diff| {run.heatmap_diff:.3g} (tolerance {run.tolerance:.3g}, "
                f"peak {run.peak:.3g}) {verdict}, at item {item} ({_label(run, item)}) keypoint {k} "
                f"({self.keypoint_name(k)}) pixel (y {y}, x {x})")
            item, k = run.keypoint_where
            moved = (f"{run.keypoints_moved} of {run.keypoints_total} "
                     f"moved > {KEYPOINT_FLOOR_PX} px")
            if run.keypoints_moved:
                moved += (f", {run.keypoints_unexplained} of them more than {KEYPOINT_SENSITIVITY_FACTOR:g}x what "
                          f"PyTorch's own decode moves under heatmap noise of {run.heatmap_diff:.3g}")
            verdict = "ok" if run.keypoints_unexplained == 0 else "FAILED"
            out.append(
                f"  batch {run.batch}: keypoints max {run.keypoint_diff:.3g} px (crop pixels) at item {item} "
                f"keypoint {k} ({self.keypoint_name(k)}); {moved}: {verdict}; scores max |diff| {run.score_diff:.3g}")
        out.append("gate passed" if self.passed else "gate FAILED: PyTorch's own output is not finite"
                   if self.reference_nonfinite else "gate FAILED")
        return out

    def keypoint_name(self, k: int) -> str:
        return self.keypoint_names[k] if k < len(self.keypoint_names) else f"#{k}"


def _label(run: GateRun, item: int) -> str:
    return run.labels[item] if item < len(run.labels) else f"crop {item}"


def _decode_sensitivity(codec, heatmaps: np.ndarray, amplitude: float) -> np.ndarray:
    """(B, K) crop pixels: how far each keypoint's decode moves under heatmap noise of +-amplitude."""
    base, _ = codec.batch_decode(heatmaps)
    rng = np.random.default_rng(0)
    worst = np.zeros(base.shape[:2])
    for _ in range(SENSITIVITY_DRAWS):
        noise = rng.uniform(-amplitude, amplitude, heatmaps.shape).astype(np.float32)
        moved, _ = codec.batch_decode(heatmaps + noise)
        worst = np.maximum(worst, np.linalg.norm(moved - base, axis=-1))
    return worst


def _compare(reference: np.ndarray, exported: np.ndarray, codec, tolerance: float, labels) -> GateRun:
    if exported.shape != reference.shape:
        raise ValueError(f"exported heatmaps have shape {exported.shape}, PyTorch's {reference.shape}")
    reference_nonfinite = int((~np.isfinite(reference)).sum())
    diff = np.abs(exported.astype(np.float64) - reference)
    where = tuple(int(i) for i in np.unravel_index(np.nanargmax(diff) if np.isfinite(diff).any() else 0, diff.shape))
    heatmap_diff = float(diff.max())  # NaN stays NaN and fails the `<=` test
    ref_kpts, ref_scores = codec.batch_decode(reference)
    kpts, scores = codec.batch_decode(exported.astype(np.float32))
    moved = np.linalg.norm(kpts - ref_kpts, axis=-1)
    moved = np.where(np.isfinite(moved), moved, np.inf)
    beyond = moved > KEYPOINT_FLOOR_PX
    unexplained = 0
    if beyond.any() and np.isfinite(heatmap_diff):
        allowed = KEYPOINT_SENSITIVITY_FACTOR * _decode_sensitivity(codec, reference, max(heatmap_diff, 1e-7))
        unexplained = int((beyond & (moved > allowed)).sum())
    elif beyond.any():
        unexplained = int(beyond.sum())
    kp_where = tuple(int(i) for i in np.unravel_index(np.argmax(moved), moved.shape))
    return GateRun(
        batch=reference.shape[0], tolerance=tolerance, peak=float(np.abs(reference).max()),
        heatmap_diff=heatmap_diff, heatmap_where=where, keypoint_diff=float(moved.max()), keypoint_where=kp_where,
        keypoints_moved=int(beyond.sum()), keypoints_unexplained=unexplained, keypoints_total=int(moved.size),
        score_diff=float(np.abs(scores - ref_scores).max()), labels=list(labels),
        reference_nonfinite=reference_nonfinite)


def _onnx_runner(path: Path):
    """(run(x: np.ndarray) -> np.ndarray, runtime name, input shape) of an ONNX file on CPU."""
    require()
    import onnx
    import onnxruntime as ort

    onnx.checker.check_model(str(path))  # by path, so external weights are checked too
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    shape = list(session.get_inputs()[0].shape)

    def run(x: np.ndarray) -> np.ndarray:
        return session.run([OUTPUT_NAME], {INPUT_NAME: x})[0]

    return run, f"onnxruntime {ort.__version__} CPU", shape


def _openvino_runner(path: Path):
    """(run, runtime name, input shape) of an OpenVINO IR on OpenVINO's CPU plugin in fp32 (the
    runtime `OpenVinoPredictor` uses)."""
    require(("openvino",), "OpenVINO export", "openvino")
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(path))
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    shape = [d.get_length() if d.is_static else "?" for d in model.inputs[0].get_partial_shape()]

    def run(x: np.ndarray) -> np.ndarray:
        return np.asarray(compiled(x)[0])

    return run, f"OpenVINO {ov.__version__} CPU (f32)", shape

def _pt2_runner(path: Path):
    program = torch.export.load(str(path))
    module = program.module()
    spec = program.graph_signature.user_inputs[0]
    meta = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == spec).meta["val"]
    shape = [d if isinstance(d, int) else str(d) for d in meta.shape]

    def run(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(x)).numpy()

    return run, f"torch.export.load (torch {torch.__version__})", shape


def _shape_problem(shape: list, batch: str | int, input_size) -> str | None:
    """Whether the file's declared input shape is the one asked for."""
    w, h = input_size
    if len(shape) != 4 or list(shape[1:]) != [3, h, w]:
        return f"declared {shape}, expected [N, 3, {h}, {w}]"
    if batch == "dynamic" and isinstance(shape[0], int):
        return f"declared batch {shape[0]}, expected a dynamic batch axis"
    if batch != "dynamic" and shape[0] != batch:
        return f"declared batch {shape[0]}, expected {batch}"
    return None


def check_export(path, model: nn.Module, crops: torch.Tensor, *, format: str, batch: str | int = "dynamic",
                 flip_test: bool = False, flip_indices: Sequence[int] | None = None, fp16: bool = False,
                 codec=None, labels: Sequence[str] = (), source: str = "the given crops") -> GateReport:
    """Run the exported file at `path` on `crops` and compare it with `model` in PyTorch eager.

    Args:
        path: the .onnx / .pt2 file.
        model: the float32 model that was exported (run on CPU as the reference).
        crops: uint8 RGB crops (N, 3, h, w); reused in a cycle when a batch needs more.
        format: "onnx" | "pt2".
        batch: "dynamic" (checked at batches 1 and 5) or the file's fixed batch (checked at it).
        flip_test, flip_indices: whether the file has the flip test baked in, and the channel order.
        fp16: the file computes in float16: the tolerance is FP16_RELATIVE_TOLERANCE of the peak.
        codec: decodes both heatmaps for the keypoint comparison and says the flip test's shift
            (default: the model spec's codec).
        labels, source: names of the crops and of where they came from, for the report.
    Both sides get the crops normalised with the model spec's pixel mean/std.
    Returns a GateReport (check `.passed`); nothing is deleted here.
    """
    path = Path(path)
    batch = _check_batch(batch)
    if crops.dtype != torch.uint8 or crops.ndim != 4 or crops.shape[1] != 3 or len(crops) == 0:
        raise ValueError(f"crops must be uint8 (N, 3, h, w) with N >= 1, got {tuple(crops.shape)} {crops.dtype}")
    input_size = (int(crops.shape[3]), int(crops.shape[2]))
    if codec is None:
        codec = _model_spec(model).build_codec()
    pixels = model_input_spec(model)  # the mean/std forward_heatmaps normalises the reference with
    if format == "onnx":
        run, runtime, shape = _onnx_runner(path)
    elif format == "openvino":
        run, runtime, shape = _openvino_runner(path)
    elif format == "pt2":
        run, runtime, shape = _pt2_runner(path)
    else:
        raise ValueError(f"unknown export format {format!r}; choose one of {FORMATS}")
    reference_model = _plain_copy(model, fp16=False)
    # The reference is the model's own flip test: its skeleton's order when it records one, so a
    # graph baked with another order (e.g. COCO's on an AP-10K model) fails here.
    reference_flip = own_flip_indices(model) or flip_indices
    runs = []
    labels = list(labels)
    for size in (GATE_BATCHES if batch == "dynamic" else (batch,)):
        index = [i % len(crops) for i in range(size)]
        images = crops[index]
        with torch.no_grad():
            reference = forward_heatmaps(reference_model, images, flip_test, None, reference_flip,
                                         codec.flip_shift).numpy()
        exported = run(normalize_images(images, pixels.pixel_mean, pixels.pixel_std).numpy())
        tolerance = FP16_RELATIVE_TOLERANCE * float(np.abs(reference).max()) if fp16 else FP32_TOLERANCE
        run_labels = [labels[i] if i < len(labels) else f"crop {i}" for i in index]
        runs.append(_compare(reference, exported, codec, tolerance, run_labels))
    return GateReport(path=str(path), format=format, runtime=runtime, precision="float16" if fp16 else "float32",
                      source=source, input_shape=shape, runs=runs,
                      shape_problem=_shape_problem(shape, batch, input_size), keypoint_names=_keypoint_names(model))
