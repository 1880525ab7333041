"""The model flags of every command that loads a model for prediction, parsed one way.

`add_model_arguments(parser)` adds `--model --config --device --precision --detector
--detector-threshold --det-classes --no-flip --batch-size` (a command leaves out what it has no use
for); `model_options(args)` turns them into the typed `ModelOptions`; `open_model(options)`
opens the predictor through the one door (`vitpose.open_predictor`), which refuses a bad
`--detector`, `--precision` or `--device` with one line (exit 2) before any model loads
(`views=True`: also a model that cannot give the flip test's two views, which select and audit read).
predict, serve, select and audit use these three, so the same flags mean the same thing and fail
the same way on every command.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

DEFAULT_MODEL = "vitpose-b-simple"
MODEL_HELP = ("a published name (vitpose.hub.list_models()), an HF repo id (org/repo[@revision]), a weights or "
              "checkpoint file, an .onnx file from vitpose export or an OpenVINO IR (its .xml or folder)")
CONFIG_HELP = ("the run config the weights were trained with (a YAML file or a shipped config's name, as for vitpose "
               "train); its model section and skeleton describe them. Default: what the file records, or its tensor "
               "shapes")
PRECISION_HELP = ("auto | fp32 | bf16 | fp16. auto (default): fp16 on CUDA, bf16 on a CPU with AVX512-BF16 or AMX "
                  "where a short measurement of the model finds it faster (cached; the reason is printed once), else "
                  "fp32; what auto picks passed the accuracy gate, AP within 0.002 of fp32 (BENCHMARKS.md). fp32 "
                  "gives the reference numbers; an exported file runs in its own precision")


@dataclass(frozen=True)
class ModelOptions:
    """What a command line says about the model to open (`add_model_arguments` parses it for every
    command that loads one); `open()` goes through the one door, `vitpose.open_predictor`."""

    model: str
    config: str | None = None
    device: str | None = None
    precision: str = "auto"
    detector: str | None = "default"
    flip_test: bool = True
    batch_size: int | None = None
    detector_threshold: float | None = None
    det_classes: tuple[str, ...] | None = None

    def kwargs(self) -> dict:
        """The keyword arguments of `open_predictor` (and of Ray's `PosePredictor`) but `model`."""
        values = asdict(self)
        values.pop("model")
        return values

    def open(self):
        from vitpose.inference.door import open_predictor

        return open_predictor(self.model, **self.kwargs())


def add_model_arguments(parser: argparse.ArgumentParser, *, default_model: str | None = DEFAULT_MODEL,
                        detector: bool = True, detector_default: str | None = None, flip: bool = True,
                        batch_size: bool = True) -> None:
    """The model flags on `parser`. default_model None: `--model` is required. detector False: the
    command gives the boxes itself (audit); detector_default None: "default", or "none" with --boxes."""
    parser.add_argument("--model", default=default_model, required=default_model is None,
                        help=MODEL_HELP + (" (default: %(default)s)" if default_model else ""))
    parser.add_argument("--config", default=None, metavar="FILE|NAME", help=CONFIG_HELP)
    parser.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: CUDA when available)")
    parser.add_argument("--precision", default="auto", metavar="auto|fp32|bf16|fp16", help=PRECISION_HELP)
    if detector:
        parser.add_argument("--detector", default=detector_default,
                            help="default | none | full-frame | a name of vitpose.inference.detect.DETECTORS "
                                 "(default: 'default', or 'none' with --boxes)")
        parser.add_argument("--detector-threshold", type=float, default=None,
                            help="minimum person score (default 0.3)")
        parser.add_argument("--det-classes", nargs="+", default=None, metavar="CLASS",
                            help="COCO classes the detector keeps, names or ids (default: the model's skeleton's "
                                 "detector_classes: person for COCO, bird..giraffe for AP-10K / APT-36K; a skeleton "
                                 "that names none is cropped full-frame)")
    if flip:
        parser.add_argument("--no-flip", action="store_true", help="skip the flip test (about 2x faster)")
    if batch_size:
        parser.add_argument("--batch-size", type=int, default=None,
                            help="person boxes per forward pass, doubled by the flip test (default: 8 on a CPU, "
                                 "32 on a GPU)")


def model_options(args: argparse.Namespace, *, batch_size: int | None = None):
    """`ModelOptions` of the flags `add_model_arguments` added (checked here: thresholds and sizes;
    the door checks the detector, precision and device). batch_size: the command's own flag for it
    (`vitpose serve --max-batch`)."""

    detector = getattr(args, "detector", "none")
    if detector is None:
        detector = "none" if getattr(args, "boxes", None) is not None else "default"
    threshold = getattr(args, "detector_threshold", None)
    batch = batch_size if batch_size is not None else getattr(args, "batch_size", None)
    check_numbers(("--detector-threshold", threshold, 0.0, 1.0), ("--batch-size", batch, 1, None))
    classes = getattr(args, "det_classes", None)
    return ModelOptions(model=str(args.model), config=args.config, device=args.device, precision=args.precision,
                        detector=detector, flip_test=not getattr(args, "no_flip", False), batch_size=batch,
                        detector_threshold=threshold, det_classes=None if classes is None else tuple(classes))


def open_model(options, *, views: bool = False, mark_by: str = "auto"):
    """The predictor of `options` through the one door; on a CPU, glibc's allocator tuned for a
    process that runs the model pass after pass (`vitpose.device.tune_cpu_allocator`). views: the
    command reads the flip test's two views apart and the skeleton's details (select, audit), so a
    model that cannot give them is refused here, in one line, before any work. mark_by: the
    command's `--mark-below-by` (`check_mark_by`), checked against the opened model here too."""
    from vitpose.device import tune_cpu_allocator
    from vitpose.errors import UsageError

    predictor = options.open()
    if views and getattr(predictor, "graph_flips", False):  # one graph computes the average of the two
        raise UsageError(f"--model {options.model}: the flip test is inside its graph (vitpose export --flip-test), "
                         f"which gives the average of the plain and mirrored views, not each; export it again "
                         f"without --flip-test")
    if views and getattr(predictor, "skeleton", None) is None:
        raise UsageError(f"--model {options.model} records no skeleton (keypoint names, flip pairs, sigmas), which "
                         f"this command needs: export it again with vitpose export --config (the training config)")
    check_mark_by(predictor, mark_by)
    tune_cpu_allocator(getattr(predictor, "device", "cpu"))
    return predictor


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of a training run that `vitpose train` and `vitpose distill` share (one loop, one set
    of names): precision, loader, length, work dir, resume, seed."""
    parser.add_argument("--amp", action="store_true",
                        help="mixed precision: fp16 autocast + GradScaler on CUDA, bf16 autocast on CPU")
    parser.add_argument("--batch-size", type=int, default=None, help="per-process batch size (loader.batch_size)")
    parser.add_argument("--workers", type=int, default=None, help="loader worker processes (loader.num_workers)")
    parser.add_argument("--epochs", type=int, default=None, help="schedule.epochs")
    parser.add_argument("--work-dir", default=None, help="checkpoints, logs and the resolved config go here")
    parser.add_argument("--resume", default=None, metavar="auto|PATH",
                        help="auto: the valid checkpoint in the work dir that records the most progress (fresh "
                             "start if none); or a file")
    parser.add_argument("--overwrite", action="store_true",
                        help="start from scratch in a work dir that holds an earlier run's checkpoints (overwriting "
                             "them)")
    parser.add_argument("--seed", type=int, default=None, help="train.seed")


def add_mark_by_argument(parser: argparse.ArgumentParser) -> None:
    """`--mark-below-by`: what `--mark-below` compares in the pre-annotations (predict, serve, select)."""
    from vitpose.data.annotation_draft import MARK_BY

    parser.add_argument("--mark-below-by", choices=MARK_BY, default="auto",
                        help="what --mark-below compares: the calibrated probability p of a model with a calibration "
                             "(`vitpose calibrate`), else the raw score (auto), or one of them (p: refused for a "
                             "model without a calibration; default: %(default)s)")


def check_mark_by(predictor, mark_by: str, flag: str = "--mark-below-by") -> None:
    """`--mark-below-by p` only for a model with a calibration, refused from the opened model's
    recorded calibration before any image is predicted (not when the pre-annotations are written)."""
    from vitpose.errors import UsageError

    if mark_by == "p" and getattr(predictor, "calibration", None) is None:
        raise UsageError(f"{flag} p: the model records no calibration, so it gives no calibrated 'p'; run `vitpose "
                         f"calibrate` on it, or mark by the raw score ({flag} score, or auto)")


def check_numbers(*rules) -> None:
    """Numeric flags inside their ranges, each rule `(flag, value, low, high[, note])` (None: no
    bound; a value None: not given); the first outside is one line naming it: `--flag must be >= LOW`
    or `--flag must be in [LOW, HIGH]`, with the note after the bound."""
    from vitpose.errors import UsageError

    for flag, value, low, high, *note in rules:
        if value is not None and value in (float("inf"), float("-inf")):  # no bound of a flag is infinite
            raise UsageError(f"{flag} must be a finite number, got {value}")
        if value is None or (low is None or value >= low) and (high is None or value <= high):
            continue
        bound = f"in [{low:g}, {high:g}]" if low is not None and high is not None else (
            f">= {low}" if low is not None else f"<= {high}")
        raise UsageError(f"{flag} must be {bound}{''.join(note)}, got {value}")
