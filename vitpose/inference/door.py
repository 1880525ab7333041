"""The one door from a model reference to a predictor: `open_predictor`.

    predictor = vitpose.open_predictor("vitpose-b-simple")                 # a published name
    predictor = vitpose.open_predictor("org/repo@rev", device="cuda")      # an HF repo id
    predictor = vitpose.open_predictor("work_dirs/demo/best.pth", detector="full-frame")
    predictor = vitpose.open_predictor("pose.onnx", detector=None)         # an exported file, an OpenVINO IR

Every command that loads a model for prediction (`predict`, `serve`, `select`, `audit`,
`predict --engine ray`'s actors) comes through here, so one input gets one answer on every path:
the runtime is picked from what `model` names (an `.onnx` file or an OpenVINO IR runs on its own
runtime, anything else is weights for `Predictor`), and the choices a user makes are checked here,
before any model loads, each refused with one line naming its flag (`UsageError`, exit 2 / HTTP
4xx): an unknown detector or detector class, a precision the device cannot run, a device that does
not exist, a runtime's missing package. A model that cannot be found or read is refused by the
loader underneath (`vitpose.load_model`, `vitpose.inference.onnx`) in the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from vitpose.errors import UsageError

__all__ = ["DETECTOR_CHOICES", "check_detector", "open_predictor"]

# What `detector=` takes besides a name of `vitpose.inference.detect.DETECTORS` (or a callable).
DETECTOR_CHOICES = ("default", "none", "full-frame")


def check_detector(detector) -> str | None:
    """`detector` as the predictors take it: None for "none" (boxes come from the caller), the name
    otherwise; an unknown name is one line naming `--detector` and the choices."""
    from vitpose.inference.detect import DETECTORS

    if detector is None or callable(detector):
        return detector
    if detector == "none":
        return None
    if detector not in (*DETECTOR_CHOICES, *DETECTORS):
        raise UsageError(f"--detector: unknown detector {detector!r}; choose {', '.join(DETECTOR_CHOICES)} or one of "
                         f"{', '.join(DETECTORS)}")
    return detector


def _check_det_classes(det_classes) -> None:
    from vitpose.inference.detect import parse_det_classes

    if det_classes is not None:  # a misspelt class stops before any model loads
        try:
            parse_det_classes(det_classes)
        except ValueError as e:
            message = str(e)
            raise UsageError(message if message.startswith("--det-classes") else f"--det-classes: {message}") from None


def _device(model, device, exported: bool):
    """The torch device of the run (an exported file's runtime checks its own device first: its
    package, not torch's CUDA, is what is missing); a device that cannot be had names `--device`."""
    from vitpose.device import resolve_device
    from vitpose.inference.onnx import exported_device

    try:
        return exported_device(model, device) if exported else resolve_device(device)
    except ValueError as e:
        raise UsageError(f"--device: {e}") from None


def open_predictor(model, *, config=None, device=None, precision: str = "auto", detector="default",
                   flip_test: bool = True, batch_size: int | None = None, detector_threshold: float | None = None,
                   det_classes: Sequence[str | int] | None = None, expert: str | None = None):
    """A predictor (`Predictor`, `OnnxPredictor` or `OpenVinoPredictor`) for `model`.

    Args:
        model: a published name (`vitpose.hub.list_models()`), an HF repo id (`org/repo[@revision]`),
            a weights or checkpoint file, an `.onnx` file or an OpenVINO IR (its `.xml` or folder).
        config: the training config the weights were trained with (weights only; an exported file
            carries its model).
        device: None / "auto" / "cpu" / "cuda[:N]" (an OpenVINO IR: "cpu" / "gpu").
        precision: "auto" | "fp32" | "bf16" | "fp16" (an exported file: its own, so auto or fp32).
        detector: "default", "full-frame", a name of `vitpose.inference.detect.DETECTORS`, "none" or
            None (the caller gives the boxes), or a detector callable.
        flip_test, batch_size, detector_threshold, det_classes, expert: as `Predictor.from_pretrained`.
    Raises `UsageError` (one line naming the flag) for the user's choices; the loaders' own
    `UserError`s for a model that cannot be found or read.
    """
    from vitpose.device import PRECISIONS, resolve_precision
    from vitpose.inference.onnx import is_exported, load_exported
    from vitpose.inference.predictor import Predictor

    if precision not in PRECISIONS:
        raise UsageError(f"--precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    detector = check_detector(detector)
    _check_det_classes(det_classes)
    exported = is_exported(model)
    torch_device = _device(model, device, exported)
    amp_dtype = None
    if not exported and precision != "auto":  # auto always resolves (and may time the model: done by the predictor)
        try:  # an impossible precision is the user's choice, refused before the model loads
            amp_dtype = resolve_precision(precision, torch_device)
        except ValueError as e:
            raise UsageError(f"--precision: {e}") from None
    common = dict(flip_test=flip_test, batch_size=batch_size, detector=detector,
                  detector_threshold=detector_threshold, det_classes=det_classes)
    if exported:
        if expert is not None:
            raise UsageError(f"--expert: {model} is an exported file of one model; the expert was chosen at export")
        return load_exported(model, torch_device, requested_device=device, config=config, precision=precision,
                             **common)
    # the precision resolved once, here: the predictor takes its autocast dtype as it is
    chosen = {"precision": "auto"} if precision == "auto" else {"amp_dtype": amp_dtype}
    return Predictor.from_pretrained(model, device=torch_device, config=config, expert=expert, **chosen, **common)
