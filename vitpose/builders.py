"""Config -> objects: the model, the codec and the datasets, built the same way everywhere.

`train.py`, `evaluate.py`, `python -m vitpose.tune` and `Predictor.from_config` all call these, so
a config means the same network and the same crops in each of them.
"""

from __future__ import annotations

from pathlib import Path

from vitpose.codecs.udp import UDPHeatmap
from vitpose.config import Config, ConfigError, DataConfig, ModelConfig
from vitpose.data.coco import CocoKeypoints
from vitpose.models import build_model


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


def build_train_set(cfg: Config, root: str | Path | None = None) -> CocoKeypoints:
    """The training set: GT boxes, full ViTPose augmentation; targets on the device when configured."""
    root = Path(cfg.data.root if root is None else root)
    return CocoKeypoints(
        root / cfg.data.train_ann, root / cfg.data.train_images, train=True,
        input_size=cfg.model.input_size, heatmap_size=cfg.model.heatmap_size, sigma=cfg.model.sigma,
        seed=cfg.train.seed, encode_targets=not cfg.loader.targets_on_device,
        max_bad_images=cfg.data.max_bad_images, reduced_decode=cfg.data.reduced_decode,
        photometric=photometric_transforms(cfg.data),
        crop_cache=root / cfg.data.crop_cache if cfg.data.crop_cache else None,
        num_keypoints=cfg.model.num_keypoints,
    )


def val_bbox_path(cfg: Config, root: str | Path | None = None) -> Path | None:
    """The configured detection file (relative paths are under data.root), or None for GT boxes."""
    if not cfg.data.val_bbox_file:
        return None
    path = Path(cfg.data.val_bbox_file)
    return path if path.is_absolute() else Path(cfg.data.root if root is None else root) / path


def build_val_set(cfg: Config, root: str | Path | None = None, bbox_file: str | Path | None = "config"
                  ) -> CocoKeypoints:
    """The validation set: detected boxes (`data.val_bbox_file`, or `bbox_file`) or GT boxes (None)."""
    root = Path(cfg.data.root if root is None else root)
    if isinstance(bbox_file, str) and bbox_file == "config":
        bbox_file = val_bbox_path(cfg, root)
    return CocoKeypoints(
        root / cfg.data.val_ann, root / cfg.data.val_images, train=False, bbox_file=bbox_file,
        input_size=cfg.model.input_size, heatmap_size=cfg.model.heatmap_size, sigma=cfg.model.sigma,
        bbox_score_thr=cfg.data.bbox_score_thr, num_keypoints=cfg.model.num_keypoints,
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
