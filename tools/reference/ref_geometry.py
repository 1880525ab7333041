"""affine.npz and pipeline_val.npz: MMPose's top-down crop and ViTPose val pipeline (tests/fixtures/README.md §2, §4.5)."""

import copy
import hashlib

import cases as case_recipes
import numpy as np
from common import FLIP_INDICES, IMAGE_FILES, IMAGE_IDS, INPUT_SIZE, load_cases, save_npz
from fixture_files import MEAN_RGB, STD_RGB
from mmpose.datasets import CocoDataset
from mmpose.datasets.transforms import LoadImage, TopdownAffine
from mmpose.structures.bbox import get_udp_warp_matrix, get_warp_matrix
from mmpose.utils import register_all_modules

# The committed affine.npz keeps the crops of the rotated samples only: UDP crops of samples 2
# (extreme aspect ratio, random rotation) and 5 (a multiple of 90 degrees) and plain crops of
# sample 2 of every image. Unrotated UDP crops of real boxes are checked by pipeline_val.npz's
# crop hashes (12 GT and 118 detection boxes); the matrices and points of all 24 samples stay.
COMPACT_UDP_SAMPLES, COMPACT_PLAIN_SAMPLES = (2, 5), (2,)

AFFINE_NOTES = (
    "center/scale_in are what is put in results[bbox_center]/[bbox_scale]; TopdownAffine first widens the "
    "scale to aspect 192/256 (scale_fixed: widen w or h, never shrink), then udp_matrix = get_udp_warp_matrix("
    "center, scale_fixed, rot, (192,256)) (float32), and warps with cv2.warpAffine(img, M, (192,256), "
    "INTER_LINEAR, constant 0 border). warped_udp: UDP crops (K,256,192,3) uint8 BGR of the samples "
    "warped_udp_index; warped_plain: TopdownAffine(use_udp=False) crops of the samples warped_plain_index. "
    "keypoints_udp / keypoints_plain_matrix = the TopdownAffine transformed_keypoints (cv2.transform) of "
    "keypoints_in (the 17 GT keypoints of the instance whose box is sample 0 of that image + 17 random "
    "points). plain_matrix = get_warp_matrix(center, scale_fixed, rot, (192,256)) (float64). The rotation "
    "enters as a float32 scalar, as TopdownAffine passes it. Images decoded by MMPose LoadImage (cv2, BGR); "
    "compare your decoder with decoded_image_md5_bgr_uint8 first. Made by tools/reference/make_fixtures.py "
    "(ref_geometry.py).")
PIPELINE_NOTES = (
    "GT mode arrays have N=12 rows in CocoDataset order. bbox_xyxy: GT xywh converted to xyxy and clipped to "
    "[0, w-1] x [0, h-1] (MMPose parse_data_info). bbox_center/bbox_scale: bbox_xyxy2cs(padding=1.25) then "
    "TopdownAffine's widening to 3:4. input_center/input_scale: the same, as metainfo. crop_md5: md5 of each "
    "(3,256,192) uint8 BGR CHW crop (the PackPoseInputs output, C order); crop_mean_bgr its channel means. "
    "The model input (PoseDataPreprocessor) is exactly (float32(x[::-1]) - mean_rgb) / std_rgb in float32. "
    "transformed_keypoints: GT keypoints mapped by the UDP warp matrix. det_*: the same pipeline with the 118 "
    "detection boxes (bbox_file), boxes NOT clipped. Made by tools/reference/make_fixtures.py "
    "(ref_geometry.py).")


def load_images(coco_mini):
    """{image id: HWC uint8 BGR image} decoded by MMPose's LoadImage."""
    loader = LoadImage()
    return {image_id: loader({"img_path": str(coco_mini / name)})["img"]
            for image_id, name in zip(IMAGE_IDS, IMAGE_FILES)}


def affine_cases(cases_dir, coco_mini):
    loaded = load_cases(cases_dir, "affine.npz")
    if loaded is None:
        return case_recipes.draw_affine_cases(coco_mini / "test_coco.json")
    arrays, info = loaded
    keys = ("image_id", "center", "scale_in", "rotation", "keypoints_in", "warped_plain_index")
    case = {key: arrays[key] for key in keys}
    case.update(seed=info.get("seed"), n_per_image=info["n_per_image"])
    if "warped_udp_index" not in arrays:  # a full set: the plain subset is part of the cases
        return case
    # a compact set keeps the plain crops of COMPACT_PLAIN_SAMPLES only; the full plain subset is
    # recorded in its info
    case["warped_plain_index"] = np.array(info["full_warped_plain_index"], np.int64)
    return case


def _topdown_affine(image, center, scale, rotation, keypoints, use_udp):
    results = {"img": image.copy(), "bbox_center": center[None].copy(), "bbox_scale": scale[None].copy(),
               "bbox_rotation": np.array([rotation], np.float32), "keypoints": keypoints[None].copy()}
    return TopdownAffine(input_size=INPUT_SIZE, use_udp=use_udp)(results)


def make_affine(case, images, compact):
    n = len(case["image_id"])
    rows = {key: [] for key in ("scale_fixed", "udp_matrix", "plain_matrix", "warped_udp", "warped_plain",
                                "keypoints_udp", "keypoints_plain_matrix")}
    for i in range(n):
        image = images[int(case["image_id"][i])]
        center, scale, rotation = case["center"][i], case["scale_in"][i], case["rotation"][i]
        udp = _topdown_affine(image, center, scale, rotation, case["keypoints_in"][i], use_udp=True)
        plain = _topdown_affine(image, center, scale, rotation, case["keypoints_in"][i], use_udp=False)
        scale_fixed = udp["bbox_scale"][0]
        rows["scale_fixed"].append(scale_fixed)
        rows["udp_matrix"].append(get_udp_warp_matrix(center, scale_fixed, rotation, output_size=INPUT_SIZE))
        rows["plain_matrix"].append(get_warp_matrix(center, scale_fixed, rotation, output_size=INPUT_SIZE))
        rows["warped_udp"].append(udp["img"])
        rows["warped_plain"].append(plain["img"])
        rows["keypoints_udp"].append(udp["transformed_keypoints"][0])
        rows["keypoints_plain_matrix"].append(plain["transformed_keypoints"][0])
    per_image = case["n_per_image"]
    if compact:
        udp_index = np.array([i for i in range(n) if i % per_image in COMPACT_UDP_SAMPLES], np.int64)
        plain_index = np.array([i for i in case["warped_plain_index"] if i % per_image in COMPACT_PLAIN_SAMPLES],
                               np.int64)
    else:
        udp_index, plain_index = np.arange(n, dtype=np.int64), case["warped_plain_index"]
    arrays = {
        "image_id": case["image_id"], "center": case["center"], "scale_in": case["scale_in"],
        "scale_fixed": np.stack(rows["scale_fixed"]), "rotation": case["rotation"],
        "udp_matrix": np.stack(rows["udp_matrix"]), "plain_matrix": np.stack(rows["plain_matrix"]),
        "warped_udp": np.stack(rows["warped_udp"])[udp_index], "keypoints_in": case["keypoints_in"],
        "keypoints_udp": np.stack(rows["keypoints_udp"]),
        "keypoints_plain_matrix": np.stack(rows["keypoints_plain_matrix"]),
        "warped_plain": np.stack(rows["warped_plain"])[plain_index], "warped_plain_index": plain_index,
    }
    if compact:
        arrays["warped_udp_index"] = udp_index
    shapes = [list(images[image_id].shape[:2]) for image_id in IMAGE_IDS]
    info = {"input_size": list(INPUT_SIZE), "n_per_image": per_image, "seed": case["seed"],
            "gt_instance_of_sample0": "last", "image_file_names": IMAGE_FILES, "image_ids": IMAGE_IDS,
            "image_shapes_hw": shapes,
            "decoded_image_md5_bgr_uint8": [hashlib.md5(images[i].tobytes()).hexdigest() for i in IMAGE_IDS],
            "full_warped_plain_index": case["warped_plain_index"].tolist(), "notes": AFFINE_NOTES}
    return arrays, info


def _val_dataset(coco_mini, val_pipeline, bbox_file=None):
    return CocoDataset(data_root=str(coco_mini), ann_file="test_coco.json", data_mode="topdown",
                       data_prefix={"img": ""}, bbox_file=bbox_file, test_mode=True,
                       pipeline=copy.deepcopy(val_pipeline))


def _run_pipeline(dataset, index):
    """(results just before PackPoseInputs, packed output) of one val sample."""
    results = dataset.get_data_info(index)
    transforms = dataset.pipeline.transforms
    for transform in transforms[:-1]:
        results = transform(results)
    packed = transforms[-1](copy.deepcopy(results))
    return results, packed


def _crop_facts(packed):
    crop = np.ascontiguousarray(packed["inputs"].numpy())
    return crop, hashlib.md5(crop.tobytes()).hexdigest(), crop.reshape(3, -1).mean(axis=1).astype(np.float64)


def make_pipeline_val(coco_mini, val_pipeline, compact):
    gt = _val_dataset(coco_mini, val_pipeline)
    rows = {key: [] for key in ("id", "img_id", "bbox_xyxy", "bbox_score", "bbox_center", "bbox_scale",
                                "input_center", "input_scale", "input_size", "ori_shape", "keypoints",
                                "keypoints_visible", "transformed_keypoints", "crop", "crop_md5",
                                "crop_mean_bgr")}
    img_files = []
    for i in range(len(gt)):
        results, packed = _run_pipeline(gt, i)
        meta = packed["data_samples"].metainfo
        crop, md5, mean = _crop_facts(packed)
        for key, value in (("id", results["id"]), ("img_id", results["img_id"]), ("bbox_xyxy", results["bbox"][0]),
                           ("bbox_score", results["bbox_score"][0]), ("bbox_center", results["bbox_center"][0]),
                           ("bbox_scale", results["bbox_scale"][0]), ("input_center", meta["input_center"]),
                           ("input_scale", meta["input_scale"]), ("input_size", meta["input_size"]),
                           ("ori_shape", meta["ori_shape"]), ("keypoints", results["keypoints"][0]),
                           ("keypoints_visible", results["keypoints_visible"][0]),
                           ("transformed_keypoints", results["transformed_keypoints"][0]),
                           ("crop", crop), ("crop_md5", md5), ("crop_mean_bgr", mean)):
            rows[key].append(value)
        img_files.append(results["img_path"].rsplit("/", 1)[-1])
    arrays = {key: np.stack([np.asarray(v) for v in values]) for key, values in rows.items() if key != "crop"}
    arrays["id"], arrays["img_id"] = arrays["id"].astype(np.int64), arrays["img_id"].astype(np.int64)
    arrays["input_size"], arrays["ori_shape"] = arrays["input_size"].astype(np.int64), arrays["ori_shape"].astype(np.int64)
    if not compact:
        arrays["inputs_uint8_bgr"] = np.stack(rows["crop"])
    crops_by_id = dict(zip(arrays["id"].tolist(), rows["crop"]))

    det = _val_dataset(coco_mini, val_pipeline, bbox_file=str(coco_mini / "test_coco_det_AP_H_56.json"))
    det_rows = {key: [] for key in ("img_id", "bbox_xyxy", "bbox_score", "bbox_center", "bbox_scale",
                                    "input_center", "input_scale", "crop_md5", "crop_mean_bgr")}
    for i in range(len(det)):
        results, packed = _run_pipeline(det, i)
        meta = packed["data_samples"].metainfo
        _, md5, mean = _crop_facts(packed)
        for key, value in (("img_id", results["img_id"]), ("bbox_xyxy", results["bbox"][0]),
                           ("bbox_score", results["bbox_score"][0]), ("bbox_center", results["bbox_center"][0]),
                           ("bbox_scale", results["bbox_scale"][0]), ("input_center", meta["input_center"]),
                           ("input_scale", meta["input_scale"]), ("crop_md5", md5), ("crop_mean_bgr", mean)):
            det_rows[key].append(value)
    for key, values in det_rows.items():
        arrays[f"det_{key}"] = np.stack([np.asarray(v) for v in values])
    arrays["det_img_id"] = arrays["det_img_id"].astype(np.int64)
    info = {"mean_rgb": MEAN_RGB.astype(float).round(3).tolist(), "std_rgb": STD_RGB.astype(float).round(3).tolist(),
            "flip_indices": FLIP_INDICES, "img_files": img_files, "notes": PIPELINE_NOTES}
    return arrays, info, crops_by_id


def val_pipeline_config():
    """The `val_pipeline` of the ViTPose-S config (the same in every ViTPose COCO config)."""
    import os.path as osp

    import mmpose
    from common import CONFIGS
    from mmengine.config import Config
    register_all_modules()
    cfg = Config.fromfile(osp.join(osp.dirname(mmpose.__file__), ".mim", "configs", CONFIGS["classic"]))
    return cfg.val_pipeline


def write(out_dir, cases_dir, coco_mini, compact):
    images = load_images(coco_mini)
    arrays, info = make_affine(affine_cases(cases_dir, coco_mini), images, compact)
    save_npz(out_dir / "affine.npz", arrays, info)
    arrays, info, _ = make_pipeline_val(coco_mini, val_pipeline_config(), compact)
    save_npz(out_dir / "pipeline_val.npz", arrays, info)
    return ["affine.npz", "pipeline_val.npz"]

