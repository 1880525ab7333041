"""Keypoint data: skeletons, geometry, augmentation, dataset, synthetic set and loaders."""

import importlib

_LOCATIONS = {
    "get_udp_warp_matrix": "vitpose.data.geometry",
    "get_warp_matrix": "vitpose.data.geometry",
    "bbox_xyxy2cs": "vitpose.data.geometry",
    "fix_aspect_ratio": "vitpose.data.geometry",
    "bbox_xywh2xyxy": "vitpose.data.geometry",
    "bbox_xyxy2xywh": "vitpose.data.geometry",
    "transform_points": "vitpose.data.geometry",
    "crop_to_image": "vitpose.data.geometry",
    "CocoKeypoints": "vitpose.data.coco",
    "CocoIndex": "vitpose.data.coco_index",
    "build_coco_index": "vitpose.data.coco_index",
    "DataError": "vitpose.data.errors",
    "build_loaders": "vitpose.data.loaders",
    "make_coco": "vitpose.data.synthetic",
    "CropCache": "vitpose.data.crop_cache",
    "build_crop_cache": "vitpose.data.crop_cache",
    "to_device": "vitpose.data.loaders",
    "normalize_images": "vitpose.data.pixels",
    "AUGMENTATION_LIMITS": "vitpose.data.transforms",
    "SyntheticCoco": "vitpose.data.synthetic",
    "dataset_info": "vitpose.data.metainfo",
    "DatasetInfo": "vitpose.data.metainfo",
    "BUILTIN_NAMES": "vitpose.data.metainfo",
}
__all__ = [*_LOCATIONS]


def __getattr__(name):
    # Imported on first use so that `import vitpose` stays light and each layer
    # loads only what it needs.
    if name in _LOCATIONS:
        return getattr(importlib.import_module(_LOCATIONS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
