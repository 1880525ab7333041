"""`vitpose export`: a model as an ONNX, OpenVINO or torch.export file, written only after it ran equal.

    vitpose export --model vitpose-s.pth --out vitpose-s.onnx          # dynamic batch (default)
    vitpose export --model best.pth --out pose.int8.onnx --precision int8   # gate: the recorded config's val set

The flags are checked here and become one `ExportOptions`; the work is the library's
(`vitpose.load_model`, `vitpose.inference.export_writers.export`, `vitpose.inference.quantize.to_int8_onnx`),
called with plain values. torch is imported only when an export runs.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from vitpose.errors import EXIT_OK
from vitpose.inference.export_errors import FORMATS, ExportUsageError, GateError, require

SUFFIXES = {".onnx": "onnx", ".pt2": "pt2", ".xml": "openvino"}
NO_GATE_SET = ("--precision int8 is gated on held-out COCO keypoint images: give --gate-data (a COCO folder or JSON) "
               "or --config (its validation set)")


@dataclass(frozen=True)
class ExportOptions:
    """`vitpose export`'s flags, checked: what to export, where, and how."""

    model: str
    out: Path
    format: str  # "onnx" | "pt2" | "openvino" (from --format or --out's suffix)
    precision: str  # "fp32" | "fp16" | "int8"
    config: str | None = None
    expert: str | None = None
    batch: str | int = "dynamic"
    flip_test: bool = False
    opset: int | None = None
    gate_data: str | None = None
    calibration: str | None = None
    quantization: str | None = None  # int8: "static" | "dynamic"

    @property
    def outputs(self) -> tuple[Path, ...]:
        """Every file the export may write: the file, an ONNX file's external weights, an IR's .bin."""
        return self.out, self.out.with_name(self.out.name + ".data"), self.out.with_suffix(".bin")


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
    parser.add_argument("--precision", default=None, metavar="fp32|fp16|int8",
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
                                            "its AP gate, default the validation set of --config or of the config "
                                            "the model file records)")
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


def _precision(precision: str | None, fp16: bool, calibration: str | None) -> str:
    precision = precision or ("fp16" if fp16 else "fp32")
    if precision not in ("fp32", "fp16", "int8"):
        raise ExportUsageError(f"--precision: {precision!r} is not one of fp32, fp16, int8")
    if fp16 and precision != "fp16":
        raise ExportUsageError(f"--fp16 and --precision {precision} both choose the precision; give one")
    if precision != "int8" and calibration:
        raise ExportUsageError("--calibration calibrates an int8 file; add --precision int8 or leave it out")
    return precision


def _check_combination(options: ExportOptions) -> None:
    """The flags that cannot go together, refused before any work."""
    if options.precision == "int8":
        if options.format != "onnx":
            # OpenVINO runs a static QDQ file in int8 (`onnx_to_openvino`), but on an AVX2 CPU it ran slower
            # than OpenVINO fp32 and ONNX Runtime int8 (BENCHMARKS.md "int8"): no OpenVINO int8 export
            raise ExportUsageError(f"--precision int8 writes an ONNX file (ONNX Runtime's quantization, the faster "
                                   f"int8 runtime measured); --format {options.format} has no int8 path here")
        if options.opset is not None:
            # the int8 graph's opset is its layout's (vitpose.inference.int8_graph: 23), not a choice
            raise ExportUsageError(f"--opset {options.opset}: --precision int8 writes the opset its quantized graph "
                                   f"needs; leave --opset out")
        if options.quantization == "dynamic" and options.calibration:
            raise ExportUsageError("--calibration: dynamic quantization takes the activations' ranges at run time; "
                                   "leave out --calibration or use --quantization static")
    elif options.quantization is not None:
        raise ExportUsageError(f"--quantization {options.quantization} quantizes an int8 file; add --precision int8 "
                               f"or leave it out")
    if options.format == "openvino" and options.precision == "fp16":
        raise ExportUsageError("--format openvino writes fp32 weights (OpenVINO picks its own arithmetic per "
                               "device); --precision fp16 is for ONNX files")


def export_options(args: argparse.Namespace) -> ExportOptions:
    """The parsed flags as `ExportOptions`, each checked (one line naming the flag when it cannot work)."""
    out = Path(args.out)
    precision = _precision(args.precision, args.fp16, args.calibration)
    quantization = args.quantization
    if precision == "int8" and quantization is None:
        quantization = "static" if args.calibration else "dynamic"
    options = ExportOptions(model=args.model, out=out, format=_resolve_format(args.format, out), precision=precision,
                            config=args.config, expert=args.expert, batch=args.batch, flip_test=args.flip_test,
                            opset=args.opset, gate_data=args.gate_data, calibration=args.calibration,
                            quantization=quantization)
    _check_combination(options)
    return options


def run(args: argparse.Namespace) -> int:
    """`vitpose export`: 0 written; a failed gate (no file) is GateError, exit status 1; bad input
    a UserError, 2 (vitpose.cli's one handler prints them)."""
    from vitpose.files import check_output
    from vitpose.inference.export_data import coco_set, existing_path

    options = export_options(args)
    inputs = (options.model, options.config, options.gate_data, options.calibration)
    for target in options.outputs:  # before the work; never over an input
        check_output(target, "--out", inputs=inputs)
    if options.format in ("onnx", "openvino"):
        require()
    if options.format == "openvino":
        require(("openvino",), "OpenVINO export", "openvino")
    if options.gate_data is not None:
        coco_set(options.gate_data, "--gate-data")  # a set that is not there: one line now, not after the model
    if options.calibration is not None:
        existing_path(options.calibration, "--calibration")
    if options.precision == "int8":
        return export_int8(options)  # a failed AP gate is Int8GateError: one line, exit status 1
    return export_float(options)


def _load(options: ExportOptions):
    from vitpose.builders import load_model
    from vitpose.inference.export_graph import refuse_nonfinite_weights

    loaded = load_model(options.model, expert=options.expert, config=options.config, device="cpu")
    refuse_nonfinite_weights(loaded.model)  # before the gate's crops and the trace
    return loaded


def export_float(options: ExportOptions) -> int:
    """An fp32 / fp16 file, gated equal to PyTorch on `--gate-data`'s crops (default the synthetic set)."""
    from vitpose.inference.export_data import gate_crops
    from vitpose.inference.export_writers import export

    loaded = _load(options)
    crops, labels, source = gate_crops(options.gate_data, loaded.codec.input_size)
    kwargs = dict(batch=options.batch, flip_test=options.flip_test, fp16=options.precision == "fp16",
                  codec=loaded.codec, flip_indices=loaded.skeleton.flip_indices, crops=crops, labels=labels,
                  source=source)
    if options.format in ("onnx", "openvino"):
        kwargs["opset"] = options.opset
    try:
        export(loaded.model, options.out, options.format, **kwargs)
    except GateError as e:  # its figures are printed above: the error line says what it means
        what = ("PyTorch's own heatmaps of the model are not finite (NaN/Inf weights or an overflow; figures "
                "above)" if e.report.reference_nonfinite else "the exported file differs from PyTorch (figures above)")
        raise GateError(e.report, f"{what}; nothing was written to {options.out}") from None
    return _written(options)


def int8_gate_set(options: ExportOptions, recorded_config: dict | None) -> tuple[Path, Path]:
    """The int8 AP gate's held-out COCO set: --gate-data; else the validation set of --config; else
    that of the training config the model file records; else the refusal naming --gate-data."""
    from vitpose.config import load_config
    from vitpose.inference.export_data import coco_set, validation_set

    if options.gate_data is not None:
        return coco_set(options.gate_data, "--gate-data")
    if options.config is not None:
        return validation_set(load_config(options.config), f"--config {options.config}")
    if recorded_config is not None:
        where = f"--model {options.model} (the training config it records)"
        return validation_set(load_config(None, recorded=recorded_config, recorded_in=where), where)
    raise ExportUsageError(NO_GATE_SET)


def export_int8(options: ExportOptions) -> int:
    """`--precision int8`: the fp32 graph, quantized, written after the AP gate on the held-out set."""
    from vitpose.inference.quantize import Int8GateError, to_int8_onnx

    loaded = _load(options)
    gate_set = int8_gate_set(options, loaded.config)
    try:
        to_int8_onnx(loaded.model, options.out, gate_data=gate_set, calibration=options.calibration,
                     quantization=options.quantization, codec=loaded.codec,
                     flip_indices=loaded.skeleton.flip_indices, flip_test=options.flip_test, batch=options.batch,
                     sigmas=getattr(loaded.skeleton, "sigmas", None))
    except Int8GateError as e:  # its figures are printed above: the error line says what it means
        raise Int8GateError(e.report, f"the int8 file did not pass the AP gate (figures above); nothing was "
                                      f"written to {options.out}") from None
    return _written(options)


def _written(options: ExportOptions) -> int:
    size = sum(p.stat().st_size for p in options.outputs if p.is_file())
    print(f"wrote {options.out} ({size / 2**20:.1f} MiB)")
    return EXIT_OK
