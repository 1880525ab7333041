"""The export writers: a graph traced, written into a staging folder beside its path, gated, then moved.

`to_onnx(model, path)`, `to_exported_program(model, path)` and `to_openvino(model, path)` (or `export(model,
path, format)`) trace `ExportGraph` (`vitpose.inference.export_graph`), write the file with the model's spec
and the export facts, run it through `check_export` (`vitpose.inference.export_gate`) on real crops at
batch 1 and a larger batch, and move it to `path` only when it passes; otherwise the staged file is
deleted and `GateError` says by how much and where it differed. `read_export_spec` reads the spec back.

Which ONNX exporter: torch 2.14's `torch.onnx.export(..., dynamo=True)` (the default since 2.9),
which goes through `torch.export`. The TorchScript exporter (`dynamo=False`) also runs this ViT,
but it is deprecated (a DeprecationWarning: "will be removed"), it freezes Python-level shape
checks into constants (a TracerWarning on the position-embedding grid test) and its
`dynamic_axes` only label an axis; `torch.export` proves the batch axis symbolic or refuses
(it caught the flip test's `chunk(2)` specialising the batch, see `ExportGraph`). The price is
time: ViTPose-S takes ~25 s to export on 2 CPU cores against ~8 s for TorchScript.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from vitpose.coco_meta import FLIP_INDICES
from vitpose.files import staged_files
from vitpose.inference.export_data import gate_crops
from vitpose.inference.export_errors import FORMATS, ExportFileError, GateError, OpsetError, require
from vitpose.inference.export_gate import GateReport, check_export
from vitpose.inference.export_graph import (
    EXPORT_KEY,
    INPUT_NAME,
    OUTPUT_NAME,
    ExportGraph,
    _check_batch,
    _export_facts,
    _model_spec,
    _plain_copy,
    _recorded_spec,
    own_flip_indices,
    refuse_nonfinite_weights,
)
from vitpose.models.spec import METADATA_KEY, ModelSpec
from vitpose.models.wrappers import unwrap_model

__all__ = ["PT2_EXPORT_FILE", "PT2_SPEC_FILE", "export", "onnx_to_openvino", "read_export_spec", "to_exported_program",
           "to_onnx", "to_openvino"]

# Trace with 2 crops (torch.export treats sizes 0 and 1 as special); the gate checks at 1 and 5.
TRACE_BATCH = 2
# Protobuf caps one file at 2 GiB; heavier graphs (ViTPose-H in fp32) keep their weights beside
# the .onnx file in `<name>.data`.
SINGLE_FILE_LIMIT = 1.8 * 2**30


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


def _write_openvino(graph: ExportGraph, path: Path, batch, input_size, metadata: dict, opset: int | None) -> None:
    """The ONNX graph (`_write_onnx`, in a temporary folder) converted to an OpenVINO IR at `path`
    (.xml, and its weights in the .bin beside it), fp32 weights; the metadata in its rt_info."""
    require(("openvino",), "OpenVINO export", "openvino")
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
    require(("onnx", "openvino"), "OpenVINO conversion", "openvino")
    import onnx
    import openvino as ov

    from vitpose.inference.onnx import OPENVINO_RT_INFO

    source = onnx.load(str(metadata_from or onnx_path), load_external_data=False)
    metadata = {p.key: p.value for p in source.metadata_props if p.key in OPENVINO_RT_INFO}
    model = ov.convert_model(str(onnx_path))
    for key, value in metadata.items():
        model.set_rt_info(value, OPENVINO_RT_INFO[key])
    ov.save_model(model, str(xml_path), compress_to_fp16=False)


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

def _export(format: str, model: nn.Module, path, *, batch="dynamic", flip_test=False, fp16=False, codec=None,
            flip_indices=None, crops=None, labels=(), source=None, opset=None, int8_layout=False,
            log: Callable[[str], None] | None = print) -> GateReport:
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; choose one of {FORMATS}")
    if format in ("onnx", "openvino"):
        require()
    if format == "openvino":
        require(("openvino",), "OpenVINO export", "openvino")
    batch = _check_batch(batch)
    path = Path(path)
    num_keypoints = int(unwrap_model(model).head.final_layer.out_channels)
    if flip_indices is None:
        flip_indices = own_flip_indices(model)
    if flip_indices is None and num_keypoints != len(FLIP_INDICES) and flip_test:
        raise ValueError(f"flip test of a {num_keypoints}-keypoint model needs flip_indices (COCO's are for 17)")
    refuse_nonfinite_weights(model)
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
