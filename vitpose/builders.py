"""Config -> objects: the model, the codec and the datasets, built the same way everywhere; and
`load_model`: the one way from a model name, an HF repo id or a weights file to (model, codec,
skeleton, spec). The models layer finds, reads, builds and loads (`vitpose.models.loading`); here
the skeleton becomes a `DatasetInfo` and a training config says what to build.

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
from vitpose.config import Config, ConfigError, DataConfig, ModelConfig, load_config
from vitpose.data.coco import CocoKeypoints
from vitpose.data.errors import DataError
from vitpose.data.metainfo import (  # noqa: F401 - dataset_info_path and SKELETON_SUFFIXES: public here too
    BUILTIN_NAMES,
    SKELETON_SUFFIXES,
    DatasetInfo,
    dataset_info,
    dataset_info_path,
)
from vitpose.models import build_model
from vitpose.models.loading import SKELETON_BY_KEYPOINTS, ModelFile, open_model
from vitpose.models.spec import SKELETON_FIELDS, ModelSpec, SpecError, spec_of_model


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


def build_evaluator(cfg: Config, info=None, root: str | Path | None = None):
    """The evaluator of the validation set: the skeleton's `metric`, as MMPose scores such data
    (docs/evaluation.md §8).

    Args:
        cfg: the config (`data.val_ann`, `data.val_bbox_file`, `eval.*`).
        info: the skeleton of `data.dataset_info` (its `metric`, `sigmas`, `annotation_format`,
            PCK settings). None: COCO's 17 keypoints, allowed only for `data.dataset_info: coco`.
        root: the data root (default `data.root`).

    metric "pckh": a PCKhEvaluator (MPII, `eval.headbox_file`); "pck": a PCKEvaluator (MMPose's
    PCKAccuracy by box size, AUC, EPE; ground-truth boxes only); "coco-oks": a WholeBodyEvaluator
    for COCO-WholeBody's format, else a CocoEvaluator with the skeleton's OKS sigmas and `eval.use_area`.
    """
    from vitpose.evaluation.coco_evaluator import CocoEvaluator
    from vitpose.evaluation.pck import PCKEvaluator
    from vitpose.evaluation.pckh import PCKhEvaluator
    from vitpose.evaluation.wholebody import WholeBodyEvaluator

    root = Path(cfg.data.root if root is None else root)
    ann_file = root / cfg.data.val_ann
    if info is None and cfg.data.dataset_info != "coco":
        raise ConfigError(f"build_evaluator: data.dataset_info is {cfg.data.dataset_info!r}; pass its skeleton "
                          f"(info=) so that the evaluator gets its keypoints and sigmas")
    info = dataset_info("coco") if info is None else info
    if info.metric == "pckh":
        if not cfg.eval.headbox_file:
            raise ConfigError("eval.headbox_file is not set: MPII's PCKh needs the head boxes of the validation "
                              "annotations (MPII's mpii_gt_val.mat, under data.root)")
        headbox = Path(cfg.eval.headbox_file)
        return PCKhEvaluator(ann_file, headbox if headbox.is_absolute() else root / headbox)
    if info.metric == "pck":
        if cfg.data.val_bbox_file:
            raise ConfigError(f"data.val_bbox_file is set, but the skeleton {info.name!r} is scored with PCK "
                              "(its metric), which compares each annotated instance with its prediction on the "
                              "ground-truth box: set data.val_bbox_file: null")
        return PCKEvaluator(ann_file, info.num_keypoints, threshold=info.pck_threshold,
                            normalizer=info.pck_normalizer)
    protocol = dict(score_mode=cfg.eval.score_mode, keypoint_score_thr=cfg.eval.keypoint_score_thr,
                    nms_mode=cfg.eval.nms_mode, nms_thr=cfg.eval.nms_thr, sigmas=info.sigmas,
                    use_area=cfg.eval.use_area)
    if info.annotation_format == "coco_wholebody":
        return WholeBodyEvaluator(ann_file, **protocol)
    return CocoEvaluator(ann_file, **protocol)


# ----------------------------------------------------------------------------------------------
# One way from a name to a model


@dataclass
class LoadedModel:
    """What `load_model` gives: the model (eval mode, weights loaded, `.spec` attached), its codec,
    its skeleton (`DatasetInfo`: K, flip indices, limbs, sigmas) and its `ModelSpec`; `path` is the
    local weights file, `report` what `load_weights` found (layout, notes), `config` the training
    config the file records (a dict as a checkpoint stores it, `load_config(recorded=)` reads it; None
    for weights that record none)."""

    model: torch.nn.Module
    codec: object
    skeleton: DatasetInfo
    spec: ModelSpec
    path: Path | None = None
    report: object = None
    config: dict | None = None


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
        source: a name of `vitpose.hub.list_models()` (any case), an HF repo id `org/repo` or
            `org/repo@REVISION` (fetched through huggingface_hub: its cache, `HF_HUB_OFFLINE=1`), or a
            weights / checkpoint file in any layout `vitpose.load_weights` reads (a path that exists
            is a path, never a repo id). An exported `.onnx` is refused with the way to run it.
        expert: the ViTPose+ expert of a mixture-of-experts file (a name of
            `vitpose.models.spec.EXPERTS`, an alias such as "wholebody", or an index); names and repo
            ids of ViTPose+ models default to "coco", files must say.
        config: a training config (YAML path or `Config`): the model, codec and skeleton are built
            from it (the file's own record is not used).
        device: where the model goes (None/"auto": CUDA when available).
    What the file records (`ModelSpec`, written by this project) comes first; otherwise the spec is
    told from the tensor shapes, the head count from the HF `config.json` or the size table, and
    the skeleton from the expert, the checkpoint's training config or the keypoint count.
    Finding, reading, building and loading are `vitpose.models.loading`'s (`open_model`,
    `ModelFile.build`); the skeleton's `DatasetInfo` and the training config are this layer's.
    """
    found = open_model(source, expert=expert)
    skeleton = None
    if config is not None:
        cfg = config if isinstance(config, Config) else load_config(config)
        skeleton = build_dataset_info(cfg)
        with torch.device("meta"):  # built as training builds it; the weights are loaded into it
            wanted = build_model_from_config(cfg.model, skeleton)
    else:
        # None: what the file records (checked against its tensors), else what its tensors tell
        wanted = None if found.weights.spec is not None else _spec_from_recorded_config(found.weights)
    model, spec, report = found.build(wanted, device)
    recorded = found.weights.spec
    if (spec.calibration is None and recorded is not None and recorded.calibration is not None
            and recorded.num_keypoints == spec.num_keypoints):  # a config rebuilds the model, the fit stays the file's
        spec = spec.replace(calibration=recorded.calibration)
    if skeleton is None:
        skeleton = _skeleton(spec, found)
    spec = spec.replace(skeleton=skeleton_data(skeleton))
    model.spec = spec
    return LoadedModel(model, spec.build_codec(), skeleton, spec, found.path, report, found.weights.config)


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


def _skeleton(spec: ModelSpec, found: ModelFile) -> DatasetInfo:
    """The skeleton: recorded; else the ViTPose+ expert's (when the head is that expert's); else the
    training config's built-in dataset; else the built-in dataset of that many keypoints."""
    if spec.skeleton is not None:
        return skeleton_of(spec)
    weights = found.weights
    name = found.expert_skeleton()
    data = (weights.config or {}).get("data")
    configured = data.get("dataset_info") if isinstance(data, dict) else None
    if name is None and isinstance(configured, str) and configured in BUILTIN_NAMES:
        name = configured
    if name is None:
        name = SKELETON_BY_KEYPOINTS.get(spec.num_keypoints)
    if name is None or dataset_info(name).num_keypoints != spec.num_keypoints:
        raise SpecError(f"{weights.origin}: a {spec.num_keypoints}-keypoint model that does not say which "
                        f"keypoints it predicts (no skeleton recorded); give its training config "
                        f"(config= / --config), whose data.dataset_info names them")
    return dataset_info(name)
