"""Typed run configuration: dataclasses loaded from YAML.

A config file is a YAML mapping of sections (`model`, `data`, `loader`, `optim`, `schedule`,
`train`, `eval`, `distill`) to fields. An optional top-level `base: other.yaml` (relative to the file) is
loaded first and then updated, so size and decoder variants stay small. Unknown sections or
fields, in a file or in a `--set section.field=value` override, fail before any work starts,
naming the key and the closest valid one: a misspelled key must never silently do nothing.

A config is named by its path or by the name of a shipped config (`vitpose-s_coco_256x192`, `demo`):
the repository's `configs/` folder, installed with the package as `vitpose/configs/` (pyproject's
`package-dir`), so a `pip install`ed command finds them from any directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vitpose.errors import UserError


class ConfigError(UserError, ValueError):
    """A config file or override that does not fit the schema."""


def shipped_config_dir() -> Path:
    """The folder of the shipped configs: `vitpose/configs` when installed, else the checkout's `configs/`."""
    package = Path(__file__).resolve().parent
    installed = package / "configs"
    return installed if installed.is_dir() else package.parent / "configs"


def shipped_configs() -> list[str]:
    """The names of the shipped configs (file names without `.yaml`)."""
    folder = shipped_config_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def find_config(name_or_path: str | Path) -> Path:
    """The config file a `--config` value means: an existing path, else a shipped config's name.

    Raises ConfigError naming the closest shipped configs when it is neither.
    """
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    name = path.name.removesuffix(".yaml").removesuffix(".yml")
    shipped = shipped_config_dir() / f"{name}.yaml"
    if len(path.parts) <= 1 or path.parent.name == "configs":  # a bare name, or configs/NAME.yaml elsewhere
        if shipped.is_file():
            return shipped
    names = shipped_configs()
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.4)
    hint = f"closest shipped configs: {', '.join(close)}" if close else f"shipped configs: {', '.join(names)}"
    raise ConfigError(f"config file not found: {path} (give a YAML path or a shipped config's name; {hint})")


@dataclass
class ModelConfig:
    name: str = "vitpose-s"  # vitpose-s | vitpose-b | vitpose-l | vitpose-h
    decoder: str = "classic"  # classic | simple
    num_keypoints: int = 17
    input_size: tuple[int, int] = (192, 256)  # (w, h)
    heatmap_size: tuple[int, int] = (48, 64)  # (w, h)
    # The heatmap codec: udp (ViTPose's, MMPose's ViTPose configs) | msra (plain MSRA Gaussians,
    # the flip test shifted one cell); recorded in every file's ModelSpec (docs/model.md "Codec").
    codec: str = "udp"
    sigma: float = 2.0
    drop_path_rate: float | None = None  # None: the size's published value (S 0.1 ... H 0.55)
    grad_checkpointing: bool = False
    pretrained: str | None = None  # MAE or any file `load_weights` reads, to initialise from
    # Fine-tuning (docs/recipe.md §9): initialise from a published model name, an HF repo id, a
    # weights or checkpoint file; the backbone whole, the head by keypoint name (train.py --init).
    init: str | None = None
    init_expert: str | None = None  # the ViTPose+ expert (dataset) to take from a ViTPose+ source
    # {this skeleton's keypoint: the source's keypoint} for joints named differently in the two.
    init_keypoint_map: dict[str, str] = field(default_factory=dict)
    # Extra keyword arguments for build_model (e.g. {depth: 4, embed_dim: 192} for a tiny model).
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    root: str = "data/coco"
    train_ann: str = "annotations/person_keypoints_train2017.json"
    train_images: str = "train2017"
    val_ann: str = "annotations/person_keypoints_val2017.json"
    val_images: str = "val2017"
    # Detected person boxes for validation (the published AP uses them); null: GT boxes.
    val_bbox_file: str | None = "person_detection_results/COCO_val2017_detections_AP_H_56_person.json"
    bbox_score_thr: float = 0.0
    max_bad_images: int = 100  # unreadable training images skipped (logged) before the run stops
    # Training only: decode JPEGs at 1/2, 1/4 or 1/8 where the crop shrinks the image at least 2x.
    # Faster decoding but crops 2-5 grey levels off MMPose's there; off = the exact recipe (the
    # crop cache is the fast exact path).
    reduced_decode: bool = False
    # Training only: crop cache directory under `root` (built once by
    # `vitpose build-crop-cache --config CFG`); bit-exact crops without JPEG decoding.
    crop_cache: str | None = None
    photometric: bool = False  # optional albumentations colour stage (the ViTPose recipe uses none)
    # Synthetic set for the demo: images per split (0 = use the files under `root`).
    synthetic_train_images: int = 0
    synthetic_val_images: int = 0
    synthetic_seed: int = 0
    # Before the first training step every validation box is checked and the validation images
    # are opened: "sample" (a spread-out sample, seconds), "all" (every image), "off".
    check_val_images: str = "sample"
    dataset_info: str = "coco"  # skeleton: built-in name, a skeleton YAML or a COCO annotation file


@dataclass
class LoaderConfig:
    batch_size: int = 64  # per process
    val_batch_size: int = 32
    num_workers: int | None = None  # None: half the logical cores, capped by available RAM
    pin_memory: bool = True
    prefetch_factor: int = 2
    drop_last: bool = False
    targets_on_device: bool = True  # heatmaps made on the training device from keypoints


@dataclass
class OptimConfig:
    lr: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.1
    layer_decay: float = 0.8
    clip_grad: float | None = 1.0
    accum_steps: int = 1
    scale_lr: bool = False  # linear scaling by global batch / base_batch_size
    base_batch_size: int = 512


@dataclass
class ScheduleConfig:
    epochs: int = 210
    warmup_iters: int = 500
    warmup_ratio: float = 0.001
    milestones: tuple[int, ...] = (170, 200)
    gamma: float = 0.1


@dataclass
class TrainConfig:
    work_dir: str = "work_dirs/vitpose-s_coco_256x192"
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: bool = False
    amp_dtype: str = "float16"  # float16 (with GradScaler) | bfloat16 (no scaler)
    compile: bool = False
    log_every: int = 50
    checkpoint_minutes: float = 30.0  # rolling `last` checkpoint period
    keep_every: int = 10  # keep every k-th epoch's checkpoint
    keep_last: int | None = None  # of those epoch_N.pth, keep only the newest N (None: all)
    val_every: int = 10
    max_nonfinite: int = 5  # non-finite losses in a row before saving and stopping
    # Save and stop (as on SIGTERM) once this many optimizer steps are done: time-boxed runs, tests.
    stop_at_iteration: int | None = None
    thermal_limit_c: int = 85
    thermal_guard: bool = False  # pause while the GPU is above the limit
    tensorboard: bool = True
    # Fine-tuning: the backbone gets no updates during the first N epochs (only the head trains).
    freeze_backbone_epochs: int = 0
    # Seconds a rank waits for the others to arrive at MASTER_ADDR:MASTER_PORT (null: the environment
    # variable VITPOSE_RENDEZVOUS_TIMEOUT, else 600; vitpose.engine.rendezvous).
    rendezvous_timeout: float | None = None


@dataclass
class EvalConfig:
    flip_test: bool = True
    score_mode: str = "bbox_keypoint"
    keypoint_score_thr: float = 0.2
    nms_mode: str = "oks_nms"
    nms_thr: float = 0.9
    # False: each GT's area is 0.53 x its box (xtcocotools' use_area=False, MMPose's AIC config).
    use_area: bool = True
    # MPII PCKh: the head boxes, MPII's mpii_gt_val.mat (or an .npz of its headboxes_src), under data.root.
    headbox_file: str | None = None


@dataclass
class DistillConfig:
    """Distillation onto this config's model from a teacher model file (`vitpose distill`,
    docs/distill.md). No teacher: plain training."""

    teacher: str | None = None  # the teacher's model file (a training checkpoint or weights)
    teacher_sha256: str | None = None  # its hash when the run started: a resume refuses another file
    labelled: bool = True  # False: no ground truth at all, the unlabelled frames only
    unlabeled: tuple[str, ...] = ()  # folders of images or video files
    unlabeled_boxes: str = "full-frame"  # full-frame | a detector name | a COCO detection results file
    frame_step: int = 10  # every N-th frame of an unlabelled video
    gt_weight: float = 1.0  # the ground-truth heatmap loss (labelled crops)
    heatmap_weight: float = 1.0  # the teacher's heatmaps as the target (every crop)
    # The feature loss through a learned projector (student width -> teacher width), its weight
    # falling linearly from this value to 0 over the first stage (DWPose's first stage).
    feature_weight: float = 0.01
    head_epochs: int = 0  # a last, head-only stage of N epochs (teacher heatmaps and ground truth)
    init: str = "auto"  # auto: the teacher's blocks where the widths allow | teacher | random


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def _plain(value):
    # Tuples become lists so that YAML and JSON writers need no Python tags.
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _hint(key: str, valid) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else f" (valid: {', '.join(sorted(valid))})"


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check (and gently convert) one value against a field's type annotation."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: null is not allowed")
    if tp is Any:
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{where}: expected {len(args)} values, got {list(value)!r}")
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    raise ConfigError(f"{where}: unsupported field type {tp!r}")


def _section_types(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _apply(cfg: Config, section: str, key: str, value: Any, source: str) -> None:
    sections = _section_types(Config)
    if section not in sections:
        raise ConfigError(f"{source}: unknown config section {section!r}{_hint(section, sections)}")
    obj = getattr(cfg, section)
    fields = _section_types(type(obj))
    if key not in fields:
        raise ConfigError(f"{source}: unknown config key '{section}.{key}'{_hint(key, fields)}")
    setattr(obj, key, _coerce(value, fields[key], f"{source}: {section}.{key}"))


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[str, dict, Path]]:
    """The file's sections, after those of its `base` chain (base first)."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: `base` loops back to itself")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: {_yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    layers = []
    base = data.pop("base", None)
    if base is not None:  # relative to this file, else a shipped config's name
        base_path = path.parent / base
        layers += _read_yaml(base_path if base_path.is_file() else find_config(base), seen + (path,))
    for section, body in data.items():
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: section {section!r} must be a mapping, got {body!r}")
        layers.append((section, body, path))
    return layers


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's error as one line with the (1-based) line and column it points at."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"YAML syntax error at {where}{problem}"


def parse_override(text: str) -> tuple[str, str, Any]:
    """`section.key=value` -> (section, key, value); the value is read as YAML (1e-4, true, [1, 2])."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"--set {text!r}: expected section.key=value, e.g. optim.lr=1e-3")
    dotted, raw = text.split("=", 1)
    section, key = dotted.strip().split(".", 1)
    try:
        return section, key, yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {text!r}: the value is not valid YAML ({_yaml_problem(e)})") from None


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                recorded: dict | None = None, recorded_in: str = "the checkpoint") -> Config:
    """Defaults, then the YAML file (and its `base` chain) or a `recorded` config (`Config.to_dict()`
    as a checkpoint stores it; `recorded_in` names where it came from), then `--set` overrides."""
    cfg = Config()
    layers = _read_yaml(find_config(path)) if path is not None else []
    if recorded is not None:
        if not isinstance(recorded, dict):
            raise ConfigError(f"{recorded_in}: the recorded config is a {type(recorded).__name__}, not a mapping")
        layers += [(section, body, Path(recorded_in)) for section, body in recorded.items()]
    for section, body, source in layers:
        if not isinstance(body, dict):
            raise ConfigError(f"{source}: section {section!r} must be a mapping, got {body!r}")
        for key, value in body.items():
            _apply(cfg, section, key, value, str(source))
    for text in overrides:
        section, key, value = parse_override(text)
        _apply(cfg, section, key, value, f"--set {text}")
    check_ranges(cfg)
    return cfg


# (section.key, test, what the value must be): checked after every file and override is applied,
# so a value that would crash hours later (val_every=0) or do nothing (epochs=0) stops the run now.
_RANGES = [
    ("schedule.epochs", lambda v: v >= 1, "at least 1"),
    ("schedule.warmup_iters", lambda v: v >= 0, ">= 0"),
    ("schedule.warmup_ratio", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("schedule.gamma", lambda v: v > 0, "> 0"),
    ("loader.batch_size", lambda v: v >= 1, "at least 1"),
    ("loader.val_batch_size", lambda v: v >= 1, "at least 1"),
    ("loader.num_workers", lambda v: v is None or v >= 0, ">= 0 (or null for automatic)"),
    ("loader.prefetch_factor", lambda v: v >= 1, "at least 1"),
    ("optim.lr", lambda v: v > 0 and v == v and v != float("inf"), "a positive finite number"),
    ("optim.weight_decay", lambda v: v >= 0, ">= 0"),
    ("optim.layer_decay", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("optim.accum_steps", lambda v: v >= 1, "at least 1"),
    ("optim.clip_grad", lambda v: v is None or v >= 0, ">= 0 (or null for no clipping)"),
    ("optim.base_batch_size", lambda v: v >= 1, "at least 1"),
    ("train.log_every", lambda v: v >= 1, "at least 1"),
    ("train.val_every", lambda v: v >= 1, "at least 1 (validation every N epochs; the last epoch always validates)"),
    ("train.keep_every", lambda v: v >= 0, ">= 0 (0: keep no epoch_N.pth)"),
    ("train.keep_last", lambda v: v is None or v >= 1, "at least 1 (or null to keep all)"),
    ("train.max_nonfinite", lambda v: v >= 1, "at least 1"),
    ("train.checkpoint_minutes", lambda v: v >= 0, ">= 0 (0: only at epoch ends)"),
    ("train.stop_at_iteration", lambda v: v is None or v >= 1, "at least 1 (or null)"),
    ("train.rendezvous_timeout", lambda v: v is None or 0 < v < float("inf"), "> 0 seconds (or null)"),
    ("train.freeze_backbone_epochs", lambda v: v >= 0, ">= 0 (0: the backbone trains from the start)"),
    ("model.init_keypoint_map", lambda v: all(isinstance(k, str) and isinstance(t, str) for k, t in v.items()),
     "a mapping of keypoint names to keypoint names ({this skeleton's name: the source's name})"),
    ("data.bbox_score_thr", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("data.max_bad_images", lambda v: v >= 0, ">= 0"),
    ("data.check_val_images", lambda v: v in ("sample", "all", "off"), "one of sample, all, off"),
    ("model.codec", lambda v: v in ("udp", "msra"), "one of udp, msra"),
    ("model.sigma", lambda v: v > 0, "> 0"),
    ("model.num_keypoints", lambda v: v >= 1, "at least 1"),
    ("model.input_size", lambda v: min(v) >= 1, "two positive sizes (w, h)"),
    ("model.heatmap_size", lambda v: min(v) >= 1, "two positive sizes (w, h)"),
    ("eval.keypoint_score_thr", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("eval.nms_thr", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("distill.gt_weight", lambda v: v >= 0, ">= 0"),
    ("distill.heatmap_weight", lambda v: v >= 0, ">= 0"),
    ("distill.feature_weight", lambda v: v >= 0, ">= 0"),
    ("distill.head_epochs", lambda v: v >= 0, ">= 0 (0: no head-only stage)"),
    ("distill.frame_step", lambda v: v >= 1, "at least 1"),
    ("distill.init", lambda v: v in ("auto", "teacher", "random"), "one of auto, teacher, random"),
]


def check_ranges(cfg: Config) -> None:
    """ConfigError naming the first field whose value is of the right type but out of range."""
    for dotted, ok, must in _RANGES:
        section, key = dotted.split(".")
        value = getattr(getattr(cfg, section), key)
        if not ok(value):
            raise ConfigError(f"{dotted} = {value!r}: must be {must}")
    if cfg.model.init and cfg.model.pretrained:
        raise ConfigError(f"model.init = {cfg.model.init!r} and model.pretrained = {cfg.model.pretrained!r}: "
                          f"set one (init: a whole pose model, head by keypoint name; pretrained: a backbone)")
    if (cfg.model.init_expert or cfg.model.init_keypoint_map) and not cfg.model.init:
        what = "model.init_expert" if cfg.model.init_expert else "model.init_keypoint_map"
        raise ConfigError(f"{what} is set but model.init is not: name the model to initialise from (--init)")
