"""Config -> objects: the model, the codec and the datasets, built the same way everywhere; and
`load_model`: the one way from a model name, an HF repo id or a weights file to (model, codec,
skeleton, spec).

`train.py`, `evaluate.py`, `vitpose tune`, `vitpose export` and `Predictor` all call these, so a
config or a file means the same network, the same crops and the same keypoints in each of them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from vitpose.codecs.choice import CONFIG_NAMES
from vitpose.config import Config, ConfigError, DataConfig, ModelConfig, load_config, shipped_config_dir
from vitpose.data.coco import CocoKeypoints
from vitpose.data.errors import DataError
from vitpose.data.metainfo import BUILTIN_NAMES, DatasetInfo, dataset_info
from vitpose.models import build_model, hub
from vitpose.models.checkpoint import (
    CheckpointError,
    WeightsNotFoundError,
    infer_model_spec,
    is_vitpose_plus,
    load_weights,
    read_weights,
    select_expert,
)
from vitpose.models.spec import SKELETON_FIELDS, ModelSpec, SpecError, spec_of_model

SKELETON_SUFFIXES = (".yaml", ".yml", ".json")  # the files data.dataset_info may name


def build_model_from_config(model_cfg: ModelConfig, skeleton: DatasetInfo | None = None):
    """The ViTPose of `model.*` (input size, drop path, grad checkpointing, extra build kwargs).

    The model carries its `ModelSpec` (`model.spec`: the architecture, codec and, when `skeleton`
    is given, the skeleton), which every file saved from it records."""
    w, h = model_cfg.input_size
    kwargs = dict(img_size=(h, w), **model_cfg.extra)
    if model_cfg.drop_path_rate is not None:
        kwargs["drop_path_rate"] = model_cfg.drop_path_rate
    model = build_model(model_cfg.name, model_cfg.decoder, model_cfg.num_keypoints, **kwargs)
    if model_cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    model.spec = spec_of_model(model, codec=CONFIG_NAMES[model_cfg.codec], sigma=model_cfg.sigma,
                               input_size=model_cfg.input_size,
                               heatmap_size=model_cfg.heatmap_size,
                               skeleton=None if skeleton is None else skeleton_data(skeleton))
    return model


def build_codec(model_cfg: ModelConfig):
    """The codec of `model.*` (`model.codec`, sizes, sigma): `vitpose.codecs.build_codec`, as every file's spec."""
    from vitpose.codecs.choice import build_codec as codec_of

    return codec_of(model_cfg.codec, model_cfg.input_size, model_cfg.heatmap_size, model_cfg.sigma)


def targets_on_device(cfg: Config) -> bool:
    """Whether the trainer draws the targets on the device: `loader.targets_on_device` with the UDP
    codec (the torch encode is UDP's); MSRA targets are drawn by the loader workers."""
    return cfg.loader.targets_on_device and cfg.model.codec == "udp"


def photometric_transforms(data_cfg: DataConfig):
    """The optional albumentations colour stage (`data.photometric`); the ViTPose recipe uses none."""
    if not data_cfg.photometric:
        return None
    import albumentations as A

    return [A.RandomBrightnessContrast(p=0.5), A.HueSaturationValue(p=0.3)]


def dataset_info_path(cfg: Config, root: str | Path | None = None) -> str | Path:
    """`data.dataset_info` as `vitpose.data.dataset_info` takes it: a built-in name as it is; a
    relative path under `data.root` when the file is there (like the annotation paths), else as
    given (relative to the working directory, e.g. a skeleton YAML next to the config); a shipped
    skeleton (`configs/NAME.yaml`) is found in an installed package too."""
    value = cfg.data.dataset_info
    if value in BUILTIN_NAMES or Path(value).is_absolute() or Path(value).suffix.lower() not in SKELETON_SUFFIXES:
        return value  # a name (an unknown one fails in dataset_info, listing the built-ins)
    under_root = Path(cfg.data.root if root is None else root) / value
    if under_root.is_file() or Path(value).is_file():
        return under_root if under_root.is_file() else Path(value)
    shipped = shipped_config_dir() / Path(value).name  # configs/demo_k5_skeleton.yaml after `pip install`
    return shipped if Path(value).parent.name == "configs" and shipped.is_file() else under_root


def build_dataset_info(cfg: Config, root: str | Path | None = None) -> DatasetInfo:
    """The skeleton of `data.dataset_info`, checked against `model.num_keypoints`.

    Raises:
        DataError: an unknown name or a bad skeleton file (named).
        ConfigError: the model's K differs from the skeleton's.
    """
    try:
        info = dataset_info(dataset_info_path(cfg, root))
    except DataError as e:
        raise DataError(f"data.dataset_info: {e}") from None
    check_num_keypoints(cfg.model, info)
    return info


def check_num_keypoints(model_cfg: ModelConfig, info: DatasetInfo) -> None:
    """The model must predict one heatmap per keypoint of the skeleton."""
    if model_cfg.num_keypoints != info.num_keypoints:
        raise ConfigError(f"model.num_keypoints is {model_cfg.num_keypoints} but the skeleton {info.name!r} "
                          f"(data.dataset_info: {info.source}) has {info.num_keypoints} keypoints; set "
                          f"model.num_keypoints: {info.num_keypoints}")


def build_train_set(cfg: Config, root: str | Path | None = None, info: DatasetInfo | None = None) -> CocoKeypoints:
    """The training set: GT boxes, full ViTPose augmentation; targets on the device when configured.

    info: the skeleton (default: `build_dataset_info(cfg, root)`)."""
    root = Path(cfg.data.root if root is None else root)
    info = build_dataset_info(cfg, root) if info is None else info
    return CocoKeypoints(
        root / cfg.data.train_ann, root / cfg.data.train_images, train=True,
        input_size=cfg.model.input_size, heatmap_size=cfg.model.heatmap_size, sigma=cfg.model.sigma,
        codec=cfg.model.codec, seed=cfg.train.seed, encode_targets=not targets_on_device(cfg),
        max_bad_images=cfg.data.max_bad_images, reduced_decode=cfg.data.reduced_decode,
        photometric=photometric_transforms(cfg.data),
        crop_cache=root / cfg.data.crop_cache if cfg.data.crop_cache else None,
        dataset_info=info,
    )


def val_bbox_path(cfg: Config, root: str | Path | None = None) -> Path | None:
    """The configured detection file (relative paths are under data.root), or None for GT boxes."""
    if not cfg.data.val_bbox_file:
        return None
    path = Path(cfg.data.val_bbox_file)
    return path if path.is_absolute() else Path(cfg.data.root if root is None else root) / path


def build_val_set(cfg: Config, root: str | Path | None = None, bbox_file: str | Path | None = "config",
                  info: DatasetInfo | None = None) -> CocoKeypoints:
    """The validation set: detected boxes (`data.val_bbox_file`, or `bbox_file`) or GT boxes (None).

    info: the skeleton (default: `build_dataset_info(cfg, root)`)."""
    root = Path(cfg.data.root if root is None else root)
    info = build_dataset_info(cfg, root) if info is None else info
    if isinstance(bbox_file, str) and bbox_file == "config":
        bbox_file = val_bbox_path(cfg, root)
    return CocoKeypoints(
        root / cfg.data.val_ann, root / cfg.data.val_images, train=False, bbox_file=bbox_file,
        input_size=cfg.model.input_size, heatmap_size=cfg.model.heatmap_size, sigma=cfg.model.sigma,
        codec=cfg.model.codec, bbox_score_thr=cfg.data.bbox_score_thr, dataset_info=info,
    )


def _evaluation_kind(info) -> str:
    """'coco', 'coco_wholebody' or 'mpii': how a skeleton's data is scored (by its annotation
    format when it has one, else by its name)."""
    kind = getattr(info, "annotation_format", None) or getattr(info, "name", "coco")
    return kind if kind in ("coco_wholebody", "mpii") else "coco"


def build_evaluator(cfg: Config, info=None, root: str | Path | None = None):
    """The evaluator of the validation set, as MMPose scores its dataset (docs/evaluation.md §8).

    Args:
        cfg: the config (`data.val_ann`, `eval.*`).
        info: the skeleton of `data.dataset_info` (its `name`, `sigmas` and, when it has one,
            `annotation_format`). None: COCO's 17 keypoints, allowed only for `data.dataset_info: coco`.
        root: the data root (default `data.root`).

    COCO-WholeBody data gets a WholeBodyEvaluator, MPII data a PCKhEvaluator (`eval.headbox_file`),
    everything else (COCO, AIC, AP-10K, APT-36K, a user's own skeleton) a CocoEvaluator with the
    skeleton's OKS sigmas and `eval.use_area`.
    """
    from vitpose.evaluation.coco_evaluator import CocoEvaluator
    from vitpose.evaluation.pckh import PCKhEvaluator
    from vitpose.evaluation.wholebody import WholeBodyEvaluator

    root = Path(cfg.data.root if root is None else root)
    ann_file = root / cfg.data.val_ann
    if info is None and cfg.data.dataset_info != "coco":
        raise ConfigError(f"build_evaluator: data.dataset_info is {cfg.data.dataset_info!r}; pass its skeleton "
                          f"(info=) so that the evaluator gets its keypoints and sigmas")
    sigmas = getattr(info, "sigmas", None) or None
    kind = "coco" if info is None else _evaluation_kind(info)
    if kind == "mpii":
        if not cfg.eval.headbox_file:
            raise ConfigError("eval.headbox_file is not set: MPII's PCKh needs the head boxes of the validation "
                              "annotations (MPII's mpii_gt_val.mat, under data.root)")
        headbox = Path(cfg.eval.headbox_file)
        return PCKhEvaluator(ann_file, headbox if headbox.is_absolute() else root / headbox)
    protocol = dict(score_mode=cfg.eval.score_mode, keypoint_score_thr=cfg.eval.keypoint_score_thr,
                    nms_mode=cfg.eval.nms_mode, nms_thr=cfg.eval.nms_thr, sigmas=sigmas,
                    use_area=cfg.eval.use_area)
    if kind == "coco_wholebody":
        return WholeBodyEvaluator(ann_file, **protocol)
    return CocoEvaluator(ann_file, **protocol)


# ----------------------------------------------------------------------------------------------
# One way from a name to a model


@dataclass
class LoadedModel:
    """What `load_model` gives: the model (eval mode, weights loaded, `.spec` attached), its codec,
    its skeleton (`DatasetInfo`: K, flip indices, limbs, sigmas) and its `ModelSpec`; `path` is the
    local weights file, `report` what `load_weights` found (layout, notes)."""

    model: torch.nn.Module
    codec: object
    skeleton: DatasetInfo
    spec: ModelSpec
    path: Path | None = None
    report: object = None


# A head of this many keypoints, with no skeleton recorded, is this built-in dataset's (the
# published checkpoints of MMPose, the official release and HF; AP-10K's 17 need `expert=`).
SKELETON_BY_KEYPOINTS = {17: "coco", 133: "coco_wholebody", 14: "aic", 16: "mpii"}


def skeleton_data(info: DatasetInfo) -> dict:
    """A DatasetInfo as the plain data a ModelSpec records (SKELETON_FIELDS, lists for tuples)."""
    return json.loads(json.dumps({name: getattr(info, name) for name in SKELETON_FIELDS}))


def skeleton_of(spec: ModelSpec) -> DatasetInfo:
    """The DatasetInfo a spec records (checked as a skeleton file would be)."""
    if spec.skeleton is None:
        raise SpecError(f"model spec ({spec.origin}): no skeleton recorded")
    try:
        return DatasetInfo(**spec.skeleton, source=f"recorded in the weights ({spec.origin})")
    except DataError as e:
        raise SpecError(f"model spec ({spec.origin}): its skeleton is not valid: {e}") from None


def load_model(source, *, expert=None, config=None, device=None) -> LoadedModel:
    """A model with its weights, codec and skeleton, from anything that names one.

    Args:
        source: a name of `vitpose.models.hub.list_models()` (any case), an HF repo id `org/repo` or
            `org/repo@REVISION` (fetched through huggingface_hub: its cache, `HF_HUB_OFFLINE=1`), or a
            weights / checkpoint file in any layout `vitpose.load_weights` reads.
        expert: the ViTPose+ expert of a mixture-of-experts file (a name of
            `vitpose.models.spec.EXPERTS`, an alias such as "wholebody", or an index); names and repo
            ids of ViTPose+ models default to "coco", files must say.
        config: a training config (YAML path or `Config`): the model, codec and skeleton are built
            from it (the file's own record is not used).
        device: where the model goes (None/"auto": CUDA when available).
    What the file records (`ModelSpec`, written by this project) comes first; otherwise the spec is
    told from the tensor shapes, the head count from the HF `config.json` or the size table, and
    the skeleton from the expert, the checkpoint's training config or the keypoint count.
    """
    from vitpose.device import resolve_device

    path, named, repo = resolve_weights(source)
    weights = _read_cached(path, named)
    if (named is not None and named.plus) or (repo is not None and is_vitpose_plus(weights.state_dict)):
        expert = "coco" if expert is None else expert  # HF's dataset_index 0, as the name table says
    state, choice = select_expert(weights.state_dict, expert, weights.origin)
    with torch.device("meta"):  # no random init: every tensor is loaded below (strict)
        if config is not None:
            cfg = config if isinstance(config, Config) else load_config(config)
            skeleton = build_dataset_info(cfg)
            model = build_model_from_config(cfg.model, skeleton)
            spec = model.spec
        else:
            spec = weights.spec or _spec_from_recorded_config(weights) or _spec_from_shapes(state, weights, repo)
            if choice is not None:
                spec = spec.replace(expert=choice.name)
            skeleton = _skeleton(spec, choice, weights)
            spec = spec.replace(skeleton=skeleton_data(skeleton))
            model = spec.build()
    model = model.to_empty(device="cpu")
    for name, buffer in model.named_buffers():
        if name.endswith("num_batches_tracked"):
            buffer.zero_()  # the one entry strict loading lets older files lack
    report = load_weights(model, state, origin=weights.origin)
    model.to(resolve_device(device)).eval()
    return LoadedModel(model, spec.build_codec(), skeleton, spec, path, report)


def resolve_weights(source) -> tuple[Path, hub.ModelInfo | None, tuple[str, str | None] | None]:
    """(local weights file, the named model or None, (HF repo id, revision) or None) of a source."""
    if not isinstance(source, (str, Path)):
        raise TypeError(f"source must be a model name, an HF repo id or a path, got {type(source).__name__}")
    path = Path(source).expanduser()
    if path.is_file():
        return path, None, None
    text = str(source).strip()
    if text.lower() in hub.MODELS:
        info = hub.lookup(text)
        return hub.download(info.name), info, None
    repo = hub.parse_repo_id(text)
    if repo is not None and not path.parent.is_dir():
        return hub.download_hf(*repo), None, repo
    if path.suffix or path.parent.is_dir() and str(path.parent) != ".":
        raise WeightsNotFoundError(f"weights file not found: {text}")
    hub.lookup(text)  # an unknown name: one line with the closest names
    raise AssertionError("unreachable")


def _read_cached(path: Path, named):
    """read_weights; a cached download that cannot be read is fetched again when its hash is known
    and does not match (a truncated or damaged file), else named with the fix."""
    try:
        return read_weights(path)
    except CheckpointError as e:
        if not hub.is_cached_download(path):
            raise
        if named is not None and named.sha256_prefix and not hub.is_offline() and not hub.matches_hash(
                path, named.sha256_prefix):
            path.unlink()
            return read_weights(hub.download(named.name))
        raise CheckpointError(f"{e} -- it is a cached download that did not survive: delete {path} "
                              f"and run again to fetch it anew") from None


def _spec_from_recorded_config(weights) -> ModelSpec | None:
    """The spec of a training checkpoint that records its config but no spec (written before specs
    were): the config's model, codec and, when it can still be read, its skeleton."""
    recorded = weights.config or {}
    if not isinstance(recorded.get("model"), dict):
        return None
    sections = {}
    for name, section_type in (("model", ModelConfig), ("data", DataConfig)):
        known = {f.name for f in dataclasses.fields(section_type)}
        body = recorded.get(name) if isinstance(recorded.get(name), dict) else {}
        sections[name] = section_type(**{k: v for k, v in body.items() if k in known})
    cfg = Config(**sections)
    try:
        skeleton = build_dataset_info(cfg)
    except (DataError, ConfigError):  # a skeleton file that is not here any more: K and the rules decide
        skeleton = None
    with torch.device("meta"):
        spec = build_model_from_config(cfg.model, skeleton).spec
    return spec.replace(origin=f"the training config recorded in {weights.origin}")


def _spec_from_shapes(state, weights, repo) -> ModelSpec:
    """A spec for a file made elsewhere: its shapes, plus the head count of an HF config.json (no
    shape holds it)."""
    spec = infer_model_spec(state, origin=weights.origin)
    if repo is not None:
        hf = hub.hf_config(*repo) or {}
        backbone = hf.get("backbone_config") or {}
        if backbone.get("num_attention_heads"):
            spec = spec.replace(num_heads=int(backbone["num_attention_heads"]), origin=spec.origin + " + HF config.json")
    return spec


def _skeleton(spec: ModelSpec, choice, weights) -> DatasetInfo:
    """The skeleton: recorded; else the ViTPose+ expert's (when the head is that expert's); else the
    training config's built-in dataset; else the built-in dataset of that many keypoints."""
    if spec.skeleton is not None:
        return skeleton_of(spec)
    name = None
    if choice is not None and (choice.heads == "official" or choice.index == 0):
        name = choice.name
    configured = ((weights.config or {}).get("data") or {}).get("dataset_info")
    if name is None and configured in BUILTIN_NAMES:
        name = configured
    if name is None:
        name = SKELETON_BY_KEYPOINTS.get(spec.num_keypoints)
    if name is None or dataset_info(name).num_keypoints != spec.num_keypoints:
        raise SpecError(f"{weights.origin}: a {spec.num_keypoints}-keypoint model that does not say which "
                        f"keypoints it predicts (no skeleton recorded); give its training config "
                        f"(config= / --config), whose data.dataset_info names them")
    return dataset_info(name)
