"""Keypoint data: skeletons, geometry, augmentation, dataset, synthetic set and loaders."""

from vitpose import lazy_exports

# Imported on first use, so that `import vitpose` stays light and each layer loads only what it needs.
__all__, __getattr__ = lazy_exports(__name__, {
    "vitpose.data.geometry": ["get_udp_warp_matrix", "get_warp_matrix", "bbox_xyxy2cs", "fix_aspect_ratio", "bbox_xywh2xyxy", "bbox_xyxy2xywh", "transform_points", "crop_to_image"],
    "vitpose.data.coco": ["CocoKeypoints"],
    "vitpose.data.coco_index": ["CocoIndex", "build_coco_index"],
    "vitpose.data.errors": ["DataError"],
    "vitpose.data.loaders": ["build_loaders", "to_device"],
    "vitpose.data.synthetic": ["make_coco", "SyntheticCoco"],
    "vitpose.data.crop_cache": ["CropCache", "build_crop_cache"],
    "vitpose.data.pixels": ["normalize_images"],
    "vitpose.data.transforms": ["AUGMENTATION_LIMITS"],
    "vitpose.data.metainfo": ["dataset_info", "DatasetInfo", "BUILTIN_NAMES"],
})
