"""`vitpose distill` as a library call: the options, the student's config, then the one training loop.

`distill(options)` builds the run's config (`distill_config`: the student's model section, with the
teacher's skeleton, codec, input and heatmap sizes; the teacher's recorded data and recipe unless
a student config says otherwise; the `distill` section), finds the people of the unlabelled frames
(`vitpose.distill.unlabelled`), and runs `vitpose.engine.loop.train`, the loop `vitpose train`
runs: AMP, exact resume, SIGTERM's stop and resume, the tuned loaders and their one worker pool
hold as they do for training. `--resume auto` reopens the teacher the checkpoint records (its path;
the file must hash the same).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from vitpose.builders import load_model
from vitpose.config import Config, ConfigError, find_config, load_config
from vitpose.engine import checkpoint, runtime, session
from vitpose.engine.distill import RECORD_KEY
from vitpose.engine.loop import train
from vitpose.engine.workdir import check_fresh_start
from vitpose.errors import EXIT_USAGE, UsageError
from vitpose.models.vitpose import MODEL_SIZES

DEFAULT_STUDENT = "vitpose-t"
DEFAULT_WORK_DIR = "work_dirs/distill"
# What the student takes from the teacher's file, whatever its own config says.
INHERITED = ("num_keypoints", "input_size", "heatmap_size", "codec", "sigma")


@dataclass(frozen=True)
class DistillOptions:
    """What `vitpose distill` was asked (every field a plain value; None: the default)."""

    teacher: str | None = None
    student: str = DEFAULT_STUDENT  # a size name (vitpose-t, ...) or a run config (file or shipped name)
    data: str | None = None  # the labelled COCO root (default: what the teacher was trained on)
    labelled: bool = True  # False: the unlabelled frames only
    unlabeled: tuple[str, ...] = ()
    unlabeled_boxes: str | None = None
    epochs: int | None = None
    work_dir: str | None = None
    resume: str | None = None
    overwrite: bool = False
    seed: int | None = None
    amp: bool = False
    batch_size: int | None = None
    workers: int | None = None
    device: str | None = None
    init: str | None = None
    overrides: tuple[str, ...] = ()


def student_size(name: str) -> str | None:
    """The MODEL_SIZES name `name` means ("t", "vitpose-t", "ViTPose_T"), or None (a config)."""
    key = name.lower().replace("_", "-")
    for candidate in (key, f"vitpose-{key}"):
        if candidate in MODEL_SIZES:
            return candidate
    return None


def recorded_teacher(options: DistillOptions) -> str | None:
    """On `--resume`, the teacher the run's checkpoint records (None: no checkpoint yet)."""
    work_dir = Path(options.work_dir or DEFAULT_WORK_DIR)
    found = (checkpoint.find_resume_checkpoint(work_dir) if options.resume == "auto"
             else (Path(options.resume), checkpoint.load_checkpoint(options.resume)))
    if found is None:
        return None
    record = found[1].get(RECORD_KEY) or {}
    return record.get("teacher")


def distill_config(options: DistillOptions) -> Config:
    """The run's config: the student's model on the teacher's skeleton, codec and sizes."""
    teacher = options.teacher or (recorded_teacher(options) if options.resume else None)
    if teacher is None:
        raise UsageError("--teacher: required (the model file to distil from; a --resume of a run finds it in "
                         "the run's checkpoint)")
    loaded = load_model(teacher, device="cpu")
    spec = loaded.spec
    recorded = {k: v for k, v in (loaded.config or {}).items() if k != "distill"}
    size = student_size(options.student)
    if size is not None:  # a size: the teacher's recipe, the student's model, the simple decoder
        recorded["model"] = {"name": size, "decoder": "simple"}
        base = None
    else:
        try:
            base = find_config(options.student)
        except ConfigError:
            raise UsageError(f"--student {options.student}: neither a model size ({', '.join(MODEL_SIZES)}) nor a "
                             f"run config (a YAML file or a shipped config's name)") from None
        recorded = None
    codec = {"UDPHeatmap": "udp", "MSRAHeatmap": "msra"}[spec.codec]
    inherited = {"model.num_keypoints": spec.num_keypoints, "model.input_size": list(spec.input_size),
                 "model.heatmap_size": list(spec.heatmap_size), "model.codec": codec, "model.sigma": spec.sigma}
    if not (loaded.config or {}).get("data", {}).get("dataset_info") and spec.num_keypoints != 17:
        raise UsageError(f"--teacher {teacher}: it records no training config, and its {spec.num_keypoints} "
                         f"keypoints are not COCO's: give --student CONFIG naming data.dataset_info")
    sets = [f"{k}={json.dumps(v)}" for k, v in inherited.items()]
    cfg = load_config(base, sets + list(options.overrides) + flag_overrides(options, teacher), recorded=recorded,
                      recorded_in=f"--teacher {teacher}")
    expected = load_config(None, sets).model
    for field in INHERITED:  # an override of these would make a student that cannot learn from this teacher
        if getattr(cfg.model, field) != getattr(expected, field):
            raise ConfigError(f"model.{field}: the student inherits the teacher's; leave it unset")
    return cfg


def flag_overrides(options: DistillOptions, teacher: str) -> list[str]:
    """The command's flags as `--set` entries, applied last."""
    pairs = [("distill.teacher", teacher), ("distill.labelled", options.labelled),
             ("distill.unlabeled", list(options.unlabeled) or None),
             ("distill.unlabeled_boxes", options.unlabeled_boxes), ("distill.init", options.init),
             ("train.work_dir", options.work_dir or DEFAULT_WORK_DIR), ("schedule.epochs", options.epochs),
             ("train.seed", options.seed), ("train.amp", True if options.amp else None),
             ("loader.batch_size", options.batch_size), ("loader.num_workers", options.workers),
             ("train.device", options.device)]
    if options.data is not None:  # a COCO layout root: its files are read, never written
        pairs += [("data.root", options.data), ("data.synthetic_train_images", 0), ("data.synthetic_val_images", 0)]
    return [f"{key}={json.dumps(value)}" for key, value in pairs if value is not None]


def distill(options: DistillOptions) -> int:
    """The distillation run; returns its exit status (the training run's)."""
    from vitpose.distill.unlabelled import prepare_unlabelled

    cfg = distill_config(options)
    work_dir = Path(cfg.train.work_dir)
    check_fresh_start(work_dir, options.resume, options.overwrite)
    missing = session.missing_data_files(cfg) if cfg.data.synthetic_train_images == 0 else {}
    if not cfg.distill.labelled:  # only the validation split is read
        missing = {what: path for what, path in missing.items() if not what.startswith("training")}
    if missing:
        print(session.missing_data_message(cfg, missing, f"--teacher {cfg.distill.teacher}"), file=sys.stderr)
        return EXIT_USAGE
    prepare_unlabelled(cfg)
    with runtime.run_guard(work_dir / "train.log") as stop:
        # the config in force is written there at set-up (what `vitpose tune --config` and a report name)
        return train(cfg, work_dir / "config.yaml", options.resume, stop, overwrite=options.overwrite)


__all__ = ["DEFAULT_STUDENT", "DistillOptions", "distill", "distill_config", "flag_overrides", "student_size"]
