"""Exports that prove themselves: ONNX and `torch.export` files written only after they ran equal.

`to_onnx(model, path)` and `to_exported_program(model, path)` trace the model, write the file into
a staging folder beside `path`, run that file (onnxruntime on CPU; `torch.export.load` for .pt2)
on real crops at batch 1 and a larger batch, and compare its heatmaps and decoded keypoints with
PyTorch eager on the same crops (`vitpose.topdown.forward_heatmaps`, the steps `Predictor` and
evaluation run). Only a file that passes is moved to `path`; otherwise the staged file is deleted
and `GateError` says by how much and where (batch item, keypoint, heatmap pixel) it differed.

The exported graph: normalised float32 RGB crops (N, 3, h, w) named `input` -> float32 heatmaps
(N, K, h/4, w/4) named `heatmaps`. Normalisation stays outside the graph (the same
`vitpose.data.pixels.normalize_images` with the spec's mean/std on every runtime); the flip test can
be baked in (`flip_test=True`: `vitpose.flip_test` itself, with the codec's shift); with
`fp16=True` the weights and the arithmetic are float16 while the graph's input and output stay float32.

What the file records: the model's `ModelSpec` (ONNX metadata / `.pt2` extra file
`vitpose.model_spec`: sizes, codec, pixel mean/std, skeleton and flip order), the only description
of the model, and `vitpose.export`, how the graph itself was made (flip test inside, precision,
batch, vitpose version). Files of earlier versions also carry nine loose keys (`vitpose.pixel_mean`,
`vitpose.codec`, `vitpose.flip_indices`, ...); `OnnxPredictor` still reads those when a file has no spec.

Which ONNX exporter: torch 2.14's `torch.onnx.export(..., dynamo=True)` (the default since 2.9),
which goes through `torch.export`. The TorchScript exporter (`dynamo=False`) also runs this ViT,
but it is deprecated (a DeprecationWarning: "will be removed"), it freezes Python-level shape
checks into constants (a TracerWarning on the position-embedding grid test) and its
`dynamic_axes` only label an axis; `torch.export` proves the batch axis symbolic or refuses
(it caught the flip test's `chunk(2)` specialising the batch, see `ExportGraph`). The price is
time: ViTPose-S takes ~25 s to export on 2 CPU cores against ~8 s for TorchScript.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from vitpose.coco_meta import FLIP_INDICES, KEYPOINT_NAMES
from vitpose.data.pixels import normalize_images
from vitpose.errors import EXIT_FAILED, EXIT_OK, UserError
from vitpose.files import staged_files
from vitpose.models.spec import METADATA_KEY, ModelSpec, spec_of_model
from vitpose.models.vitpose import flip_test as run_flip_test
from vitpose.models.wrappers import unwrap_model
from vitpose.topdown import forward_heatmaps, model_input_spec

if TYPE_CHECKING:
    from vitpose.inference.quantize import Int8Report

__all__ = ["EXPORT_KEY", "FORMATS", "ExportFileError", "ExportGraph", "ExportUsageError", "GateDataError", "GateError",
           "GateReport", "GateRun", "MissingDependencyError", "OpsetError", "check_export", "export", "gate_crops",
           "onnx_to_openvino",
           "own_flip_indices", "read_export_spec", "to_exported_program", "to_int8_onnx", "to_onnx", "to_openvino"]

FORMATS = ("onnx", "pt2", "openvino")
EXTRA_HINT = 'pip install "vitpose[export]"'
ONNX_MODULES = ("onnx", "onnxscript", "onnxruntime")
INPUT_NAME, OUTPUT_NAME = "input", "heatmaps"
EXPORT_KEY = "vitpose.export"  # how the graph was made: {"flip_test", "precision", "batch", "version"}

# The gate. float32: the bound; measured 7.6e-6 (classic) and 1.3e-5 (simple) for
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
# Trace with 2 crops (torch.export treats sizes 0 and 1 as special); check at 1 and at 5, a size
# the trace never saw.
TRACE_BATCH = 2
GATE_BATCHES = (1, 5)
# Protobuf caps one file at 2 GiB; heavier graphs (ViTPose-H in fp32) keep their weights beside
# the .onnx file in `<name>.data`.
SINGLE_FILE_LIMIT = 1.8 * 2**30


class MissingDependencyError(UserError, ImportError):
    """An optional package of the `export` extra is not installed."""


class ExportFileError(UserError, ValueError):
    """An exported file's recorded spec or export facts that cannot be read (names the file and key)."""


class GateError(UserError, RuntimeError):
    """The exported file did not run equal to PyTorch; it was deleted. `.report` has the figures
    (the message too, unless `message` says it in one line: `vitpose export`, which printed them)."""

    exit_status = EXIT_FAILED  # the input was fine; the export is what failed

    def __init__(self, report: GateReport, message: str | None = None):
        super().__init__("\n".join(report.lines()) if message is None else message)
        self.report = report


class GateDataError(UserError, FileNotFoundError):
    """`--gate-data` (gate_crops' `data`) is not a COCO keypoint folder with person instances."""


class ExportUsageError(UserError, ValueError):
    """A flag of `vitpose export` that cannot work as given (format and suffix)."""


class OpsetError(ExportUsageError):
    """An ONNX opset (`opset=`, `--opset`) the exporter cannot write the model in."""


def require(modules: Sequence[str] = ONNX_MODULES, what: str = "ONNX export") -> None:
    """Import check for the optional dependencies; the error names the extra to install."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingDependencyError(f"{what} needs {', '.join(missing)}, not installed: {EXTRA_HINT}")


# ----------------------------------------------------------------------------------------------
# What the graph computes


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


def _rewrite_onnx(path: Path, rewrite: Callable) -> int:
    """Apply an in-place graph rewrite (`vitpose.inference.int8_graph`) to the ONNX file at `path`.
    The weights are not loaded: a model written with external data (over 2 GB) keeps its `.data`
    file, which the rewritten graph still names."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    count = rewrite(model)
    if count:
        onnx.save(model, str(path))
        onnx.checker.check_model(str(path))
    return count


# ----------------------------------------------------------------------------------------------
# Crops for the gate


def _coco_files(data: Path) -> tuple[Path, Path]:
    """(annotation file, image folder) of MMPose's layout, or of one COCO JSON beside its images."""
    mmpose = data / "annotations" / "person_keypoints_val2017.json"
    if mmpose.is_file():
        return mmpose, data / "val2017"
    # A COCO annotation file is a JSON object; detection results beside it (coco-mini's) are a list.
    objects = [p for p in sorted(data.glob("*.json")) if _first_char(p) == "{"]
    if len(objects) == 1:
        return objects[0], data
    raise GateDataError(
        f"--gate-data {data}: expected annotations/person_keypoints_val2017.json (+ val2017/) or one "
        f"COCO annotation JSON beside its images; found {len(objects)} JSON objects: {[p.name for p in objects]}")


def _first_char(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(4096).lstrip()[:1].decode("ascii", errors="replace")


def _crops_from(ann_file: Path, img_dir: Path, input_size, count: int, source: str):
    from vitpose.data.coco import CocoKeypoints

    dataset = CocoKeypoints(ann_file, img_dir, train=False, input_size=input_size,
                            heatmap_size=(input_size[0] // 4, input_size[1] // 4))
    if len(dataset) == 0:
        raise GateDataError(f"--gate-data {source}: no person instances with keypoints in {ann_file}")
    samples = [dataset[i] for i in range(min(count, len(dataset)))]
    crops = torch.stack([s["image"] for s in samples])
    labels = [f"image {s['image_id']} instance {s['id']}" for s in samples]
    return crops, labels


def gate_crops(data: str | Path | None = None, input_size: Sequence[int] = (192, 256), count: int = 8):
    """Real crops for the gate: (uint8 RGB crops (N, 3, h, w), one label per crop, source name).

    The validation pipeline (`CocoKeypoints(train=False)`: GT boxes, padding 1.25, UDP warp) on
    `data`, a COCO keypoint set in MMPose's layout or a folder with one COCO JSON beside its
    images (coco-mini); None: 6 images of the synthetic set (`make_coco`, seed 0) in a temporary
    folder. At most `count` crops.
    """
    input_size = (int(input_size[0]), int(input_size[1]))
    if data is not None:
        data = Path(data)
        if not data.is_dir():
            raise GateDataError(f"--gate-data: gate data folder not found: {data}")
        ann_file, img_dir = _coco_files(data)
        crops, labels = _crops_from(ann_file, img_dir, input_size, count, str(data))
        return crops, labels, str(data)
    from vitpose.data.synthetic import make_coco

    with tempfile.TemporaryDirectory(prefix="vitpose-gate-") as tmp:
        synthetic = make_coco(tmp, num_images=6, seed=0, split="val")
        crops, labels = _crops_from(synthetic.ann_file, synthetic.img_dir, input_size, count, "synthetic set")
    return crops, labels, "the synthetic set (make_coco seed 0)"


# ----------------------------------------------------------------------------------------------
# The gate


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
    require(("openvino",), "OpenVINO export")
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(path))
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    shape = [d.get_length() if d.is_static else "?" for d in model.inputs[0].get_partial_shape()]

    def run(x: np.ndarray) -> np.ndarray:
        return np.asarray(compiled(x)[0])

    return run, f"OpenVINO {ov.__version__} CPU (f32)", shape


def _write_openvino(graph: ExportGraph, path: Path, batch, input_size, metadata: dict, opset: int | None) -> None:
    """The ONNX graph (`_write_onnx`, in a temporary folder) converted to an OpenVINO IR at `path`
    (.xml, and its weights in the .bin beside it), fp32 weights; the metadata in its rt_info."""
    require(("openvino",), "OpenVINO export")
    import openvino as ov

    from vitpose.inference.onnx import OPENVINO_RT_INFO

    with tempfile.TemporaryDirectory(prefix="vitpose-openvino-") as tmp:
        onnx_path = Path(tmp) / "graph.onnx"
        _write_onnx(graph, onnx_path, batch, input_size, metadata, opset)
        model = ov.convert_model(str(onnx_path))
    for key, value in metadata.items():
        model.set_rt_info(value, OPENVINO_RT_INFO[key])
    ov.save_model(model, str(path), compress_to_fp16=False)


def onnx_to_openvino(onnx_path, xml_path, metadata_from=None) -> None:
    """An ONNX file (e.g. a static QDQ int8 one: OpenVINO reads its QuantizeLinear/DequantizeLinear
    pairs as FakeQuantize and runs the matrix products in int8) as an OpenVINO IR at `xml_path`,
    with the vitpose metadata of `metadata_from` (an ONNX file; default: `onnx_path` itself) in its
    rt_info. No gate here: callers gate what they ship."""
    require(("onnx", "openvino"), "OpenVINO conversion")
    import onnx
    import openvino as ov

    from vitpose.inference.onnx import OPENVINO_RT_INFO

    source = onnx.load(str(metadata_from or onnx_path), load_external_data=False)
    metadata = {p.key: p.value for p in source.metadata_props if p.key in OPENVINO_RT_INFO}
    model = ov.convert_model(str(onnx_path))
    for key, value in metadata.items():
        model.set_rt_info(value, OPENVINO_RT_INFO[key])
    ov.save_model(model, str(xml_path), compress_to_fp16=False)


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


# ----------------------------------------------------------------------------------------------
# Writing


def _example(batch: str | int, input_size) -> tuple[torch.Tensor, dict | None]:
    w, h = input_size
    size = TRACE_BATCH if batch == "dynamic" else batch
    example = torch.zeros(size, 3, h, w)
    dynamic = {"images": {0: torch.export.Dim("batch", min=1)}} if batch == "dynamic" else None
    return example, dynamic


def _write_onnx(graph: ExportGraph, path: Path, batch, input_size, metadata: dict, opset: int | None) -> None:
    example, dynamic = _example(batch, input_size)
    with torch.no_grad(), contextlib.redirect_stdout(sys.stderr):  # the exporter prints its progress
        program = torch.onnx.export(graph, (example,), None, dynamo=True, input_names=[INPUT_NAME],
                                    output_names=[OUTPUT_NAME], dynamic_shapes=dynamic, opset_version=opset,
                                    verbose=False)
    weight_bytes = sum(t.numel() * t.element_size() for t in graph.state_dict().values())
    if opset is not None and weight_bytes <= SINGLE_FILE_LIMIT:  # (a larger model: the gate's check says it)
        # An opset the exporter cannot convert the graph to is only warned about, and the file
        # it then writes fails onnx's checker (e.g. opset 26+ for attention with onnx 1.20): the
        # opset is the user's choice, so this is the user's error, named before the gate runs.
        import onnx

        try:
            onnx.checker.check_model(program.model_proto)
        except onnx.checker.ValidationError as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise OpsetError(f"--opset {opset}: torch's ONNX exporter cannot write this model in opset {opset} "
                             f"({first[:160]}); leave --opset out for the exporter's default, or choose a lower "
                             f"one") from e
    program.model.metadata_props.update(metadata)
    program.save(str(path), external_data=weight_bytes > SINGLE_FILE_LIMIT)


PT2_SPEC_FILE = METADATA_KEY + ".json"  # the extra file of a .pt2 that holds the ModelSpec
PT2_EXPORT_FILE = EXPORT_KEY + ".json"  # ... and the one that says how the graph was made


def _write_pt2(graph: ExportGraph, path: Path, batch, input_size, spec_json: str, facts: str) -> None:
    example, dynamic = _example(batch, input_size)
    with torch.no_grad():
        program = torch.export.export(graph, (example,), dynamic_shapes=dynamic, strict=False)
    torch.export.save(program, str(path), extra_files={PT2_SPEC_FILE: spec_json, PT2_EXPORT_FILE: facts})


def read_export_spec(path) -> dict:
    """The ModelSpec (as a dict, checked as a weights file's spec is) recorded in an exported .onnx
    (metadata) or .pt2 (extra file); {} for a file that records none. A spec that is not JSON or
    not a valid spec: `SpecError` naming the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"exported file not found: {path}")
    if path.suffix.lower() == ".pt2":
        extra = {PT2_SPEC_FILE: ""}
        try:
            torch.export.load(str(path), extra_files=extra)
        except Exception as e:  # torch raises several kinds for a file that is not a .pt2 archive
            raise ExportFileError(f"{path}: not a readable torch.export file ({type(e).__name__}: {e})") from None
        text, where = extra[PT2_SPEC_FILE], f"{path} (extra file {PT2_SPEC_FILE})"
    else:
        require(("onnx",), "reading an ONNX file")
        import onnx

        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as e:  # protobuf's DecodeError and friends
            raise ExportFileError(f"{path}: not a readable ONNX file ({type(e).__name__}: {e})") from None
        text = next((p.value for p in model.metadata_props if p.key == METADATA_KEY), "")
        where = f"{path} (metadata {METADATA_KEY})"
    if not text:
        return {}
    return ModelSpec.from_json(text, origin=where).to_dict()


class NonFiniteWeightsError(UserError, ValueError):
    """The model to export holds NaN / Inf weights: PyTorch's own output would not be finite."""


def _refuse_nonfinite_weights(model: nn.Module) -> None:
    """Before the export's work: a model with NaN / Inf parameters or buffers cannot be exported
    meaningfully (nothing finite to compare the file with); one line naming the first tensor."""
    bad = [(name, int((~torch.isfinite(t)).sum())) for name, t in unwrap_model(model).state_dict().items()
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        total = sum(count for _, count in bad)
        raise NonFiniteWeightsError(f"the model's weights hold {total} NaN/Inf values (first in {bad[0][0]}, "
                                    f"{len(bad)} tensors in all): PyTorch's own heatmaps would not be finite, so "
                                    f"there is nothing to export; use weights from before the run diverged")


def _export(format: str, model: nn.Module, path, *, batch="dynamic", flip_test=False, fp16=False, codec=None,
            flip_indices=None, crops=None, labels=(), source=None, opset=None, int8_layout=False,
            log: Callable[[str], None] | None = print) -> GateReport:
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; choose one of {FORMATS}")
    if format in ("onnx", "openvino"):
        require()
    if format == "openvino":
        require(("openvino",), "OpenVINO export")
    batch = _check_batch(batch)
    path = Path(path)
    num_keypoints = int(unwrap_model(model).head.final_layer.out_channels)
    if flip_indices is None:
        flip_indices = own_flip_indices(model)
    if flip_indices is None and num_keypoints != len(FLIP_INDICES) and flip_test:
        raise ValueError(f"flip test of a {num_keypoints}-keypoint model needs flip_indices (COCO's are for 17)")
    _refuse_nonfinite_weights(model)
    spec = _model_spec(model, codec)  # the codec given, else the model's own (its spec's)
    codec = spec.build_codec() if codec is None else codec
    input_size = tuple(codec.input_size)
    if crops is None:
        crops, labels, source = gate_crops(None, input_size)
    if tuple(crops.shape[2:]) != (input_size[1], input_size[0]):
        raise ValueError(f"gate crops are {tuple(crops.shape[2:])} (h, w), the model takes {input_size[::-1]}")
    traced = _plain_copy(model, fp16)
    if int8_layout:  # the same arithmetic laid out for integer kernels (vitpose.inference.int8_graph)
        from vitpose.inference import int8_graph

        if format != "onnx" or fp16:
            raise ValueError("int8_layout is a float32 ONNX graph (the input of dynamic int8 quantization)")
        traced, opset = int8_graph.int8_layout(traced), int8_graph.ATTENTION_OPSET
    graph = ExportGraph(traced, flip_test, flip_indices, fp16, codec.flip_shift).eval()
    spec_json = _recorded_spec(spec, flip_indices, num_keypoints).to_json()
    facts = _export_facts(flip_test, fp16, batch, "int8" if int8_layout else None)
    with staged_files(path) as staged:
        if format == "onnx":
            _write_onnx(graph, staged, batch, input_size, {METADATA_KEY: spec_json, EXPORT_KEY: facts}, opset)
            if int8_layout:
                _rewrite_onnx(staged, int8_graph.attention_3d)
        elif format == "openvino":
            _write_openvino(graph, staged, batch, input_size, {METADATA_KEY: spec_json, EXPORT_KEY: facts}, opset)
        else:
            _write_pt2(graph, staged, batch, input_size, spec_json, facts)
        report = check_export(staged, model, crops, format=format, batch=batch, flip_test=flip_test,
                              flip_indices=flip_indices, fp16=fp16, codec=codec, labels=labels,
                              source=source or "the given crops")
        report.path = str(path)
        if log is not None:
            for line in report.lines():
                log(line)
        if not report.passed:
            raise GateError(report)
    return report


def to_onnx(model: nn.Module, path, *, batch: str | int = "dynamic", flip_test: bool = False, fp16: bool = False,
            codec=None, flip_indices: Sequence[int] | None = None, crops: torch.Tensor | None = None,
            labels: Sequence[str] = (), source: str | None = None, opset: int | None = None,
            int8_layout: bool = False, log: Callable[[str], None] | None = print) -> GateReport:
    """Export `model` to ONNX at `path`, written only if it passes the gate (`check_export`).

    Args:
        model: a ViTPose with its weights (left unchanged: a CPU copy is exported).
        path: the .onnx file (ViTPose-H in fp32 also writes `<path>.data`, its weights).
        batch: "dynamic" (a `batch` axis) or a fixed batch size.
        flip_test: bake the flip test into the graph (2N crops run inside; N heatmaps out).
        fp16: float16 weights and arithmetic (for GPU runtimes), float32 input and output; the
            gate's bound is then FP16_RELATIVE_TOLERANCE of the heatmap peak.
        codec: the model's codec (default: the model spec's, `model.spec.build_codec()`); recorded in
            the file's spec and used for the flip test's shift and to decode keypoints in the gate.
        flip_indices: left/right keypoint order for the flip test (None: COCO-17).
        crops, labels, source: the gate's uint8 RGB crops (default: `gate_crops()`, the synthetic set).
        opset: ONNX opset (None: the exporter's default, 20 with torch 2.14).
        int8_layout: write the graph laid out for dynamic int8 quantization
            (`vitpose.inference.int8_graph`: the classic head as matrix products, 3-D attention, opset
            23; the same numbers, gated alike), the input of `vitpose export --precision int8`.
        log: where the gate's figures go (None: silent).
    Returns the GateReport. Raises GateError (file deleted) if the gate fails, MissingDependencyError
    without onnx / onnxscript / onnxruntime.
    """
    return _export("onnx", model, path, batch=batch, flip_test=flip_test, fp16=fp16, codec=codec,
                   flip_indices=flip_indices, crops=crops, labels=labels, source=source, opset=opset,
                   int8_layout=int8_layout, log=log)


def to_exported_program(model: nn.Module, path, *, batch: str | int = "dynamic", flip_test: bool = False,
                        fp16: bool = False, codec=None, flip_indices: Sequence[int] | None = None,
                        crops: torch.Tensor | None = None, labels: Sequence[str] = (), source: str | None = None,
                        log: Callable[[str], None] | None = print) -> GateReport:
    """Export `model` as a `torch.export` program (`torch.export.save`, a .pt2 file), gated like
    `to_onnx` (run through `torch.export.load(path).module()`). Same arguments as `to_onnx`."""
    return _export("pt2", model, path, batch=batch, flip_test=flip_test, fp16=fp16, codec=codec,
                   flip_indices=flip_indices, crops=crops, labels=labels, source=source, log=log)


def to_openvino(model: nn.Module, path, *, batch: str | int = "dynamic", flip_test: bool = False,
                codec=None, flip_indices: Sequence[int] | None = None, crops: torch.Tensor | None = None,
                labels: Sequence[str] = (), source: str | None = None, opset: int | None = None,
                log: Callable[[str], None] | None = print) -> GateReport:
    """Export `model` as an OpenVINO IR (`path`: the .xml; its .bin beside it), through the ONNX
    graph, gated like `to_onnx` (run by OpenVINO's CPU plugin in fp32, the same 1e-4 bound), the
    ModelSpec and export facts in its rt_info (`vitpose.inference.onnx.OPENVINO_RT_INFO`)."""
    return _export("openvino", model, path, batch=batch, flip_test=flip_test, codec=codec,
                   flip_indices=flip_indices, crops=crops, labels=labels, source=source, opset=opset, log=log)


def export(model: nn.Module, path, format: str, **kwargs) -> GateReport:
    """`to_onnx`, `to_exported_program` or `to_openvino` by name ("onnx" | "pt2" | "openvino")."""
    if format == "onnx":
        return to_onnx(model, path, **kwargs)
    if format == "openvino":
        return to_openvino(model, path, **{k: v for k, v in kwargs.items() if k != "fp16"})
    if format == "pt2":
        return to_exported_program(model, path, **kwargs)
    raise ValueError(f"unknown export format {format!r}; choose one of {FORMATS}")


# ----------------------------------------------------------------------------------------------
# int8


def to_int8_onnx(model: nn.Module, path, *, gate_data, calibration=None, quantization: str = "dynamic",
                 codec=None, flip_indices: Sequence[int] | None = None, flip_test: bool = False,
                 batch="dynamic", sigmas=None, bootstrap: int | None = None, bound: float | None = None,
                 calibration_crops_override=None, log: Callable[[str], None] | None = print) -> Int8Report:
    """Write `model` as an int8 ONNX file at `path`, only if it passes the AP gate (`vitpose.inference.quantize`):
    the fp32 graph (`to_onnx`, gated equal to PyTorch), ONNX Runtime's quantization calibrated on
    `calibration`, the AP of the int8 file against the PyTorch model at fp32 on the held-out images
    of `gate_data` with the paired bootstrap interval; the gate's figures in `EXPORT_KEY` ("gate").

    gate_data: the held-out COCO keypoint set (a .json or a folder, `coco_set`).
    calibration: `--calibration` (a folder of images or a COCO set); None: 1 in CALIBRATION_SHARE
        images of `gate_data` (at most CALIBRATION_IMAGES), which the gate then leaves out.
    bootstrap, bound: the gate's resamples and bound (None: GATE_BOOTSTRAP, INT8_MAX_AP_DIFFERENCE).
    calibration_crops_override: uint8 crops to calibrate on instead (tests: a deliberately bad set).
    Returns the Int8Report; raises Int8GateError (nothing written) when the gate fails.
    """
    import onnx

    from vitpose.inference import int8_graph
    from vitpose.inference import quantize as Q

    path = Path(path)
    spec = _model_spec(model, codec)
    codec = spec.build_codec() if codec is None else codec
    if flip_indices is None:
        flip_indices = own_flip_indices(model)
    ann_file, img_dir = Q.coco_set(gate_data)
    if quantization == "dynamic":  # ranges taken at run time: nothing to calibrate, every image gates
        if calibration is not None or calibration_crops_override is not None:
            raise ValueError("--calibration: dynamic quantization takes the activations' ranges at run time; "
                             "leave out --calibration or use --quantization static")
        crops, used, label = np.zeros((0, 3, *codec.input_size[::-1]), np.uint8), set(), "nothing"
    elif calibration is not None:
        crops, used, label = Q.calibration_crops(calibration, codec.input_size)
    else:
        crops, used, label = Q.calibration_split(ann_file, img_dir, codec.input_size)
    if calibration_crops_override is not None:
        crops = np.asarray(calibration_crops_override)
        label = "the given crops"
    calibration_x = (normalize_images(crops, spec.pixel_mean, spec.pixel_std).astype(np.float32) if len(crops)
                     else None)
    with tempfile.TemporaryDirectory(prefix="vitpose-int8-") as tmp:
        tmp = Path(tmp)
        held_out, count = Q.held_out_set(Path(ann_file), Path(img_dir), used, tmp)
        if count < Q.MIN_GATE_IMAGES:
            raise Q.CalibrationError(f"--gate-data {gate_data}: {count} images are left once the calibration images "
                                   f"are taken out; the gate needs at least {Q.MIN_GATE_IMAGES} (and more to resolve it)")
        fp32 = tmp / "fp32.onnx"
        gate_uint8, labels, source = gate_crops(None, codec.input_size)  # the fp32 graph's equality gate
        # dynamic: the graph laid out for the integer kernels (vitpose.inference.int8_graph), where
        # this install can run it; static QDQ keeps the plain graph (its quantizer reads ONNX's
        # Attention as its own contrib operator)
        layout = quantization == "dynamic" and int8_graph.available()
        to_onnx(model, fp32, batch=batch, flip_test=flip_test, codec=codec, flip_indices=flip_indices,
                crops=gate_uint8, labels=labels, source=source, int8_layout=layout,
                log=None)  # the fp32 graph equals PyTorch
        recorded = {p.key: p.value for p in onnx.load(str(fp32), load_external_data=False).metadata_props}
        with staged_files(path) as staged:
            Q.quantize_onnx(fp32, staged, quantization, calibration_x)
            report = Q.int8_gate(model, staged, held_out, img_dir, codec, flip_indices, quantization=quantization,
                               calibration=label, calibration_count=len(crops), held_out=str(ann_file), sigmas=sigmas,
                                 bootstrap=Q.GATE_BOOTSTRAP if bootstrap is None else bootstrap)
            report.bound = Q.INT8_MAX_AP_DIFFERENCE if bound is None else float(bound)
            report.path = str(path)
            if log is not None:
                for line in report.lines():
                    log(line)
            if not report.passed:
                raise Q.Int8GateError(report)
            facts = {**json.loads(recorded[EXPORT_KEY]), "precision": "int8", "quantization": quantization,
                     "gate": report.metadata()}
            Q.set_metadata(staged, {**recorded, EXPORT_KEY: json.dumps(facts, sort_keys=True)})
    return report


# ----------------------------------------------------------------------------------------------
# `vitpose export`

SUFFIXES = {".onnx": "onnx", ".pt2": "pt2", ".xml": "openvino"}


def _batch_arg(text: str) -> str | int:
    if text == "dynamic":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'dynamic' or a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 'dynamic' or a positive integer, got {text!r}")
    return value


def add_parser(subparsers) -> argparse.ArgumentParser:
    """The `export` subcommand on `vitpose`'s subparsers."""
    parser = subparsers.add_parser(
        "export", help="write an ONNX, OpenVINO or torch.export file, only after it ran equal to PyTorch",
        shared=("--config", "--debug"),  # vitpose.cli.CommandParser: no --set or --device here
        description="Export a ViTPose checkpoint. The file is written only after it has been run "
                    "(onnxruntime CPU / torch.export.load) on real crops at batch 1 and a larger batch "
                    "and found equal to PyTorch (heatmaps within 1e-4; fp16: 1e-2 of the peak). "
                    "Exit status 1 and no file otherwise.")
    parser.add_argument("--model", required=True, help="a weights or checkpoint file (any layout load_weights "
                                                       "reads), a model name or an HF repo id (vitpose.load_model)")
    parser.add_argument("--config", default=None, metavar="FILE|NAME",
                        help="the run config the weights were trained with (a YAML file or a shipped config's name, "
                             "as for vitpose train); its model section and skeleton describe them. Default: what the "
                             "file records, or its tensor shapes")
    parser.add_argument("--expert", help="the ViTPose+ expert of a mixture-of-experts file (coco, aic, mpii, "
                                         "ap10k, apt36k, coco_wholebody / wholebody)")
    parser.add_argument("--format", choices=FORMATS, help="default: from --out's suffix (.onnx / .pt2 / .xml: "
                                                          "an OpenVINO IR, its weights in the .bin beside it)")
    parser.add_argument("--out", required=True, help="the file to write")
    parser.add_argument("--batch", type=_batch_arg, default="dynamic", help="'dynamic' (default) or a fixed size")
    parser.add_argument("--flip-test", action="store_true", help="bake the flip test into the graph")
    parser.add_argument("--fp16", action="store_true", help="float16 weights (GPU runtimes); float32 input/output")
    parser.add_argument("--precision", choices=("fp32", "fp16", "int8"), default=None,
                        help="fp32 (default); fp16 (= --fp16); int8: ONNX Runtime quantization, written only when "
                             "its COCO AP on held-out images is within 0.005 of fp32's (vitpose.inference.quantize)")
    parser.add_argument("--calibration", help="int8 static: the images to calibrate on: a folder of images or a "
                                              "COCO keypoint JSON/folder (with --quantization static and no "
                                              "--calibration: a quarter of the gate's images, left out of the gate)")
    parser.add_argument("--quantization", choices=("static", "dynamic"), default=None,
                        help="int8: dynamic (default: int8 weights, activation ranges at run time; the faster "
                             "here, BENCHMARKS.md) or static (QDQ calibrated on --calibration; the default when "
                             "--calibration is given)")
    parser.add_argument("--opset", type=int, help="ONNX opset (default: the exporter's)")
    parser.add_argument("--gate-data", help="COCO keypoint folder for the gate's crops (MMPose layout with "
                                            "annotations/ and val2017/, or one COCO JSON beside its images); "
                                            "default: a synthetic set made on the fly; int8: the held-out set of "
                                            "its AP gate, default the config's validation set)")
    parser.set_defaults(run=run)
    return parser


def _resolve_format(fmt: str | None, out: Path) -> str:
    by_suffix = SUFFIXES.get(out.suffix.lower())
    if fmt is None:
        if by_suffix is None:
            raise ExportUsageError(f"--out {out}: cannot tell the format from suffix {out.suffix!r}; "
                             f"pass --format ({' or '.join(FORMATS)})")
        return by_suffix
    if by_suffix is not None and by_suffix != fmt:
        raise ExportUsageError(f"--format {fmt} but --out {out} has the suffix of {by_suffix}")
    return fmt


def _precision(args) -> str:
    precision = getattr(args, "precision", None) or ("fp16" if args.fp16 else "fp32")
    if args.fp16 and precision != "fp16":
        raise ExportUsageError(f"--fp16 and --precision {precision} both choose the precision; give one")
    if precision != "int8" and getattr(args, "calibration", None):
        raise ExportUsageError("--calibration calibrates an int8 file; add --precision int8 or leave it out")
    return precision


def _run_int8(args, out: Path, fmt: str) -> int:
    """`vitpose export --precision int8`: the fp32 graph, quantized, written after the AP gate."""
    from vitpose.builders import load_model
    from vitpose.inference.quantize import Int8GateError

    if fmt != "onnx":
        # OpenVINO runs a static QDQ file in int8 (`onnx_to_openvino`), but on an AVX2 CPU it ran slower
        # than OpenVINO fp32 and ONNX Runtime int8 (BENCHMARKS.md, issue 31): no OpenVINO int8 export.
        raise ExportUsageError(f"--precision int8 writes an ONNX file (ONNX Runtime's quantization, the faster int8 "
                               f"runtime measured); --format {fmt} has no int8 path here")
    if getattr(args, "opset", None) is not None:
        # the int8 graph's opset is its layout's (vitpose.inference.int8_graph: 23), not a choice
        raise ExportUsageError(f"--opset {args.opset}: --precision int8 writes the opset its quantized graph needs; "
                               f"leave --opset out")
    gate_data = args.gate_data
    if gate_data is None and args.config is not None:
        from vitpose.config import load_config

        cfg = load_config(args.config)
        gate_data = (Path(cfg.data.root) / cfg.data.val_ann, Path(cfg.data.root) / cfg.data.val_images)
        if not gate_data[0].is_file():
            raise GateDataError(f"--config {args.config}: its validation annotations {gate_data[0]} do not exist; "
                                    f"give the held-out set with --gate-data")
    if gate_data is None:
        raise ExportUsageError("--precision int8 is gated on held-out COCO keypoint images: give --gate-data (a COCO "
                         "folder or JSON) or --config (its validation set)")
    loaded = load_model(args.model, expert=getattr(args, "expert", None), config=args.config, device="cpu")
    _refuse_nonfinite_weights(loaded.model)
    sigmas = getattr(loaded.skeleton, "sigmas", None)
    try:
        quantization = args.quantization or ("static" if args.calibration else "dynamic")
        to_int8_onnx(loaded.model, out, gate_data=gate_data, calibration=args.calibration,
                     quantization=quantization, codec=loaded.codec, flip_indices=loaded.skeleton.flip_indices,
                     flip_test=args.flip_test, batch=args.batch, sigmas=sigmas)
    except Int8GateError as e:  # its figures are printed above: the error line says what it means
        raise Int8GateError(e.report, f"the int8 file did not pass the AP gate (figures above); nothing was "
                                      f"written to {out}") from None
    size = out.stat().st_size
    print(f"wrote {out} ({size / 2**20:.1f} MiB)")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """`vitpose export`: 0 written; a failed gate (no file) is GateError, exit status 1; bad input
    a UserError, 2 (vitpose.cli's one handler prints them)."""
    from vitpose.builders import load_model
    from vitpose.files import check_output

    out = Path(args.out)
    fmt = _resolve_format(args.format, out)
    inputs = (args.model, args.config, args.gate_data, getattr(args, "calibration", None))
    for target in (out, out.with_name(out.name + ".data"), out.with_suffix(".bin")):  # before the work; never over an input
        check_output(target, "--out", inputs=inputs)
    precision = _precision(args)
    if fmt == "onnx":
        require()
    if precision == "int8":
        return _run_int8(args, out, fmt)  # a failed AP gate is Int8GateError: one line, exit status 1
    if fmt == "openvino" and precision != "fp32":
        raise ExportUsageError(f"--format openvino writes fp32 weights (OpenVINO picks its own arithmetic per "
                               f"device); --precision {precision} is for ONNX files")
    loaded = load_model(args.model, expert=getattr(args, "expert", None), config=args.config, device="cpu")
    _refuse_nonfinite_weights(loaded.model)  # before the gate crops and the trace
    crops, labels, source = gate_crops(args.gate_data, loaded.codec.input_size)
    kwargs = dict(batch=args.batch, flip_test=args.flip_test, fp16=precision == "fp16", codec=loaded.codec,
                  flip_indices=loaded.skeleton.flip_indices, crops=crops, labels=labels, source=source)
    if fmt in ("onnx", "openvino"):
        kwargs["opset"] = args.opset
    try:
        export(loaded.model, out, fmt, **kwargs)
    except GateError as e:  # its figures are printed above: the error line says what it means
        what = ("PyTorch's own heatmaps of the model are not finite (NaN/Inf weights or an overflow; figures "
                "above)" if e.report.reference_nonfinite else "the exported file differs from PyTorch (figures above)")
        raise GateError(e.report, f"{what}; nothing was written to {args.out}") from None
    size = sum(p.stat().st_size for p in (out, out.with_name(out.name + ".data"), out.with_suffix(".bin"))
               if p.is_file())
    print(f"wrote {out} ({size / 2**20:.1f} MiB)")
    return EXIT_OK
