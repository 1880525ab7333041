"""Config -> objects: the model, the codec and the datasets, built the same way everywhere.

`train.py`, `evaluate.py`, `vitpose tune` and `Predictor.from_config` all call these, so
a config means the same network and the same crops in each of them.
"""

from __future__ import annotations

from pathlib import Path

from vitpose.codecs.udp import UDPHeatmap
from vitpose.config import Config, ConfigError, DataConfig, ModelConfig, shipped_config_dir
from vitpose.data.coco import CocoKeypoints
from vitpose.data.errors import DataError
from vitpose.data.metainfo import BUILTIN_NAMES, DatasetInfo, dataset_info
from vitpose.models import build_model

SKELETON_SUFFIXES = (".yaml", ".yml", ".json")  # the files data.dataset_info may name


def build_model_from_config(model_cfg: ModelConfig):
    """The ViTPose of `model.*` (input size, drop path, grad checkpointing, extra build kwargs)."""
    w, h = model_cfg.input_size
    kwargs = dict(img_size=(h, w), **model_cfg.extra)
    if model_cfg.drop_path_rate is not None:
        kwargs["drop_path_rate"] = model_cfg.drop_path_rate
    model = build_model(model_cfg.name, model_cfg.decoder, model_cfg.num_keypoints, **kwargs)
    if model_cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    return model


def build_codec(model_cfg: ModelConfig) -> UDPHeatmap:
    return UDPHeatmap(model_cfg.input_size, model_cfg.heatmap_size, model_cfg.sigma)


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
        seed=cfg.train.seed, encode_targets=not cfg.loader.targets_on_device,
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
        bbox_score_thr=cfg.data.bbox_score_thr, dataset_info=info,
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
