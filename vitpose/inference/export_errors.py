"""How an export fails, and the formats it writes: no torch here, so that `vitpose export`'s parser
(`vitpose.cli.export`) and its flag checks load without it.

Every class is a `vitpose.errors.UserError` (one line naming the flag or file and the fix); a gate
that fails is exit status 1 (the input was fine, the exported file is what failed), the others 2.
"""

from __future__ import annotations

from collections.abc import Sequence

from vitpose.errors import EXIT_FAILED, MissingExtraError, UsageError, UserError, require_extra

__all__ = ["FORMATS", "ONNX_MODULES", "ExportFileError", "ExportUsageError", "GateDataError", "GateError",
           "MissingDependencyError", "NonFiniteWeightsError", "OpsetError", "require"]

FORMATS = ("onnx", "pt2", "openvino")
ONNX_MODULES = ("onnx", "onnxscript", "onnxruntime")

# The one "install the extra" error (`vitpose.errors.missing_extra`), under the name this module
# gave it before there was one.
MissingDependencyError = MissingExtraError


def require(modules: Sequence[str] = ONNX_MODULES, what: str = "ONNX export", extra: str = "export") -> None:
    """The optional packages an export needs, imported; the first missing one is a MissingExtraError
    naming the extra to install (`export`: onnx, onnxscript, onnxruntime; `openvino`)."""
    require_extra(what, tuple(modules), extra)


class ExportFileError(UserError, ValueError):
    """An exported file's recorded spec or export facts that cannot be read (names the file and key)."""


class GateError(UserError, RuntimeError):
    """The exported file did not run equal to PyTorch (or, `Int8GateError`, lost more AP than the
    bound); it was deleted. `.report` has the figures (`export_gate.GateReport`, `quantize.Int8Report`:
    anything with `.lines()`; the message too, unless `message` says it in one line: `vitpose
    export`, which printed them)."""

    exit_status = EXIT_FAILED  # the input was fine; the export is what failed

    def __init__(self, report, message: str | None = None):
        super().__init__("\n".join(report.lines()) if message is None else message)
        self.report = report


class GateDataError(UserError, FileNotFoundError, ValueError):
    """A COCO set a gate or the int8 calibration was given (`--gate-data`, `--calibration`, a
    config's validation set) that is not there or cannot be used: one line naming the flag and the
    path. The one error class of `vitpose.inference.export_data.coco_set` and of the int8 path
    (`vitpose.inference.quantize.CalibrationError` is this class)."""


class ExportUsageError(UsageError, ValueError):
    """A flag of `vitpose export` that cannot work as given (format and suffix, precision)."""


class OpsetError(ExportUsageError):
    """An ONNX opset (`opset=`, `--opset`) the exporter cannot write the model in."""


class NonFiniteWeightsError(UserError, ValueError):
    """The model to export holds NaN / Inf weights: PyTorch's own output would not be finite."""
