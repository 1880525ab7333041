"""Exports that prove themselves: ONNX, OpenVINO and `torch.export` files written only after they ran equal.

The public face of the export: every name below is importable from here. The work is done by one
module per job:

- `vitpose.inference.export_graph`: what the graph computes (`ExportGraph`: normalised float32 RGB
  crops `input` -> float32 heatmaps `heatmaps`, the flip test optionally inside, fp16 optionally)
  and what the file records (the model's `ModelSpec` and `EXPORT_KEY`, how the graph was made);
  NaN/Inf weights refused before the work.
- `vitpose.inference.export_data`: the COCO sets the gates run on (`coco_set`, the one resolver of
  `--gate-data` and `--calibration`; `validation_set`, a config's; `gate_crops`).
- `vitpose.inference.export_gate`: the numeric gate (`check_export`: the file run on real crops at
  batch 1 and a larger batch, its heatmaps and decoded keypoints compared with PyTorch eager;
  `GateRun`, `GateReport`, the tolerances).
- `vitpose.inference.export_writers`: `to_onnx`, `to_exported_program`, `to_openvino`, `export`:
  trace, write into a staging folder beside the path, gate, move into place (or delete and raise
  `GateError`); `read_export_spec`, `onnx_to_openvino`.
- `vitpose.inference.quantize`: int8 (`to_int8_onnx`: the fp32 graph, ONNX Runtime's quantization,
  the AP gate on held-out images).
- `vitpose.inference.export_errors`: the errors (torch-free, for the command's parser).
The `vitpose export` command is `vitpose.cli.export`.
"""

from vitpose.inference.export_data import coco_set, gate_crops, validation_set
from vitpose.inference.export_errors import (
    FORMATS,
    ONNX_MODULES,
    ExportFileError,
    ExportUsageError,
    GateDataError,
    GateError,
    MissingDependencyError,
    NonFiniteWeightsError,
    OpsetError,
    require,
)
from vitpose.inference.export_gate import (
    FP16_RELATIVE_TOLERANCE,
    FP32_TOLERANCE,
    GATE_BATCHES,
    KEYPOINT_FLOOR_PX,
    KEYPOINT_SENSITIVITY_FACTOR,
    SENSITIVITY_DRAWS,
    GateReport,
    GateRun,
    check_export,
)
from vitpose.inference.export_graph import (
    EXPORT_KEY,
    INPUT_NAME,
    OUTPUT_NAME,
    ExportGraph,
    own_flip_indices,
    refuse_nonfinite_weights,
)
from vitpose.inference.export_writers import (
    PT2_EXPORT_FILE,
    PT2_SPEC_FILE,
    SINGLE_FILE_LIMIT,
    TRACE_BATCH,
    export,
    onnx_to_openvino,
    read_export_spec,
    to_exported_program,
    to_onnx,
    to_openvino,
)
from vitpose.inference.quantize import Int8GateError, Int8Report, to_int8_onnx

__all__ = ["EXPORT_KEY", "FORMATS", "FP16_RELATIVE_TOLERANCE", "FP32_TOLERANCE", "GATE_BATCHES", "INPUT_NAME",
           "KEYPOINT_FLOOR_PX", "KEYPOINT_SENSITIVITY_FACTOR", "ONNX_MODULES", "OUTPUT_NAME", "PT2_EXPORT_FILE",
           "PT2_SPEC_FILE", "SENSITIVITY_DRAWS", "SINGLE_FILE_LIMIT", "TRACE_BATCH", "ExportFileError", "ExportGraph",
           "ExportUsageError", "GateDataError", "GateError", "GateReport", "GateRun", "Int8GateError", "Int8Report",
           "MissingDependencyError", "NonFiniteWeightsError", "OpsetError", "check_export", "coco_set", "export",
           "gate_crops", "onnx_to_openvino", "own_flip_indices", "read_export_spec", "refuse_nonfinite_weights",
           "require", "to_exported_program", "to_int8_onnx", "to_onnx", "to_openvino", "validation_set"]

# Private helpers that tests and benchmarks reach through this module (monkeypatch them where they live).
from vitpose.inference.export_gate import _compare, _decode_sensitivity  # noqa: E402, F401, I001
from vitpose.inference.export_graph import _export_facts, _model_spec, _recorded_spec  # noqa: E402, F401
from vitpose.inference.export_writers import _write_onnx  # noqa: E402, F401
