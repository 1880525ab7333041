"""COCO person keypoints as top-down instances, with MMPose 1.x filtering and pipelines.

`CocoKeypoints(ann_file, img_dir, train=False, bbox_file=None, ...)`: one item per person
instance. The index lives in a few numpy arrays (no per-instance dicts, so forked loader workers
share it without copy-on-write growth). `ds[i]` uses `ds.epoch`; `ds[(i, epoch)]` names the
epoch, and every random draw of a training sample comes from
`np.random.default_rng((seed, epoch, i))`, so a sample depends on nothing but those numbers.

Validation (train=False) is MMPose's val pipeline exactly: decode (OpenCV, full size) ->
box centre/scale (1.25) -> aspect fix -> UDP warp. Training is MMPose's train pipeline
(flip, half body, box shift/scale/rotation, UDP warp, UDP targets) with two speed-ups that are
on by default and can be switched off for bit-exact crops:
- `reduced_decode=True`: the geometry is settled before decoding, the flip is folded into the
  warp matrix, and large boxes are decoded at 1/2, 1/4 or 1/8 resolution (libjpeg DCT scaling)
  when the crop shrinks them at least that much anyway (tests/test_dataset.py bounds the pixel
  difference; keypoints and targets are identical).
- `encode_targets=False`: heatmaps are left to the trainer (`udp_encode_torch` on the device).
And one that is bit-exact but needs preparing once: `crop_cache=DIR` (built by
`python -m vitpose.data.crop_cache`) reads each crop's pixels from a memory-mapped file of
per-instance image regions instead of decoding the JPEG (see crop_cache.py).

Which annotations become instances (MMPose `parse_data_info` / `_is_valid_instance`): not crowd,
`num_keypoints > 0`, `max(keypoints x, y) > 0`, and a box of positive width and height after
clipping to the image (x1 = clip(x, 0, W-1), x2 = clip(x + w, 0, W-1), same for y). Dropped
records are counted per reason in `ds.dropped`. Malformed records raise `DataError`.
"""

import json
import logging
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..coco_meta import FLIP_INDICES, NUM_KEYPOINTS
from . import transforms as T
from .errors import DataError
from .image_io import load_image

log = logging.getLogger(__name__)

PERSON_CATEGORY_ID = 1


def _load_json(path, what):
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except FileNotFoundError:
        raise DataError(f"{what} not found", file=path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{what} is not valid JSON: {e}", file=path) from None


def _require(record, key, path, record_name, types):
    if not isinstance(record, dict) or key not in record:
        raise DataError("missing field", file=path, record=record_name, field=key)
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, types):
        raise DataError(f"has type {type(value).__name__}", file=path, record=record_name, field=key)
    return value


class CocoKeypoints(Dataset):
    """Top-down COCO keypoint instances (see the module docstring).

    Args:
        ann_file: COCO keypoint annotation JSON (`person_keypoints_*.json`).
        img_dir: folder holding the images named by `file_name`.
        train: augment (MMPose's ViTPose train pipeline) and return targets.
        bbox_file: COCO detection results JSON; its person boxes replace the GT boxes
            (validation only). Boxes are kept in file order and not clipped, as in MMPose.
        input_size, heatmap_size: (w, h) of the crop and of the heatmaps.
        sigma: UDP Gaussian sigma (heatmap pixels).
        seed: base seed of the augmentation stream.
        encode_targets: add "heatmaps" to training samples (else the trainer encodes them).
        bbox_score_thr: drop detection boxes with a lower score (MMPose's ViTPose uses 0).
        max_bad_images: training only: unreadable images tolerated per process (logged and
            replaced by another instance, chosen deterministically) before DataError is raised.
            Validation always raises on the first one.
        reduced_decode: training only: decode large boxes at reduced resolution (see above).
        photometric: optional list of albumentations pixel-level transforms (training only).
        crop_cache: training only: directory of a crop cache built for this annotation file
            (or a `CropCache`); crops are read from it, bit-exact, instead of decoded. A cache
            built for other annotations raises DataError.
    """

    def __init__(self, ann_file, img_dir, train=False, bbox_file=None, input_size=(192, 256),
                 heatmap_size=(48, 64), sigma=2.0, seed=0, encode_targets=True,
                 bbox_score_thr=0.0, max_bad_images=10, reduced_decode=True, photometric=None,
                 num_keypoints=NUM_KEYPOINTS, flip_indices=FLIP_INDICES, crop_cache=None):
        if train and bbox_file is not None:
            raise ValueError("bbox_file is for validation; training uses the GT boxes")
        if crop_cache is not None and not train:
            raise ValueError("crop_cache is for training sets; validation decodes its images")
        self.ann_file = Path(ann_file)
        self.img_dir = Path(img_dir)
        self.train = bool(train)
        self.bbox_file = None if bbox_file is None else Path(bbox_file)
        self.input_size = (int(input_size[0]), int(input_size[1]))
        self.heatmap_size = (int(heatmap_size[0]), int(heatmap_size[1]))
        self.sigma = float(sigma)
        self.seed = int(seed)
        self.encode_targets = bool(encode_targets)
        self.bbox_score_thr = float(bbox_score_thr)
        self.max_bad_images = int(max_bad_images)
        self.reduced_decode = bool(reduced_decode)
        self.num_keypoints = int(num_keypoints)
        self.flip_indices = tuple(flip_indices)
        self.epoch = 0
        self.bad_images = 0  # per process: each loader worker counts its own
        self.crop_cache_misses = 0  # per process: crops the cache could not serve (decoded)
        self.dropped = {}
        self._photometric = T.build_photometric(photometric) if train else None
        self._codec = None
        if self.train and self.encode_targets:
            from ..codecs.udp import UDPHeatmap
            self._codec = UDPHeatmap(self.input_size, self.heatmap_size, self.sigma)

        data = _load_json(self.ann_file, "annotation file")
        self._index_images(data)
        if self.bbox_file is None:
            self._index_gt(data)
        else:
            self._index_detections(_load_json(self.bbox_file, "detection file"))
        del data
        if len(self) == 0:
            source = self.bbox_file or self.ann_file
            raise DataError(f"no usable person instances (dropped: {self.dropped or 'none'})",
                            file=source, field="annotations" if self.bbox_file is None else "bbox")
        # Box -> centre and scale (padding 1.25), MMPose's GetBBoxCenterScale, all at once.
        xyxy = self._bbox_xyxy
        self._center = ((xyxy[:, 2:] + xyxy[:, :2]) * np.float32(0.5)).astype(np.float32)
        self._scale = ((xyxy[:, 2:] - xyxy[:, :2]) * np.float32(1.25)).astype(np.float32)
        self._crop_cache = None
        if crop_cache is not None:
            from .crop_cache import CropCache
            self._crop_cache = crop_cache if isinstance(crop_cache, CropCache) else CropCache(crop_cache)
            self._crop_cache.check(self)

    # ------------------------------------------------------------------ index building

    def _index_images(self, data):
        path = self.ann_file
        if not isinstance(data, dict):
            raise DataError("top level must be an object", file=path, field="images")
        images = data.get("images")
        if not isinstance(images, list):
            raise DataError("missing or not a list", file=path, field="images")
        n = len(images)
        ids = np.empty(n, np.int64)
        wh = np.empty((n, 2), np.int64)
        names = []
        for j, img in enumerate(images):
            rec = f"images[{j}]"
            ids[j] = _require(img, "id", path, rec, int)
            rec = f"image id {ids[j]}"
            names.append(_require(img, "file_name", path, rec, str))
            for c, key in enumerate(("width", "height")):
                v = _require(img, key, path, rec, (int, float))
                if v <= 0:
                    raise DataError(f"must be positive, got {v}", file=path, record=rec, field=key)
                wh[j, c] = int(v)
        if len(np.unique(ids)) != n:
            dup = ids[np.flatnonzero(np.bincount(np.unique(ids, return_inverse=True)[1]) > 1)[0]]
            raise DataError("image id appears twice", file=path, record=f"image id {dup}", field="id")
        self._img_ids = ids
        self._img_wh = wh
        self._img_files = np.array(names, dtype=np.str_)
        order = np.argsort(ids, kind="stable")
        self._img_ids_sorted, self._img_pos_sorted = ids[order], order

    def _image_positions(self, image_ids, file, records, field="image_id"):
        """Row of each image id in `images`; DataError on an id with no image record."""
        image_ids = np.asarray(image_ids, np.int64)
        pos = np.searchsorted(self._img_ids_sorted, image_ids)
        pos = np.minimum(pos, len(self._img_ids_sorted) - 1)
        found = (len(self._img_ids_sorted) > 0) & (self._img_ids_sorted[pos] == image_ids)
        if not np.all(found):
            k = int(np.flatnonzero(~found)[0])
            raise DataError(f"image id {int(image_ids[k])} is not in the annotation file's images",
                            file=file, record=records(k), field=field)
        return self._img_pos_sorted[pos].astype(np.int32)

    def _drop(self, reason, count):
        if count:
            self.dropped[reason] = self.dropped.get(reason, 0) + int(count)

    def _index_gt(self, data):
        path, K = self.ann_file, self.num_keypoints
        anns = data.get("annotations")
        if not isinstance(anns, list):
            raise DataError("missing or not a list", file=path, field="annotations")
        n = len(anns)
        ann_ids = np.empty(n, np.int64)
        image_ids = np.empty(n, np.int64)
        crowd = np.zeros(n, bool)
        has_kpts = np.ones(n, bool)
        num_kpts = np.full(n, -1, np.int64)
        # Plain lists, converted once at the end: per-record numpy calls would dominate on
        # COCO train (260k records).
        box_rows, kpt_rows, rows_with_kpts = [], [], []
        for j, ann in enumerate(anns):
            ann_ids[j] = _require(ann, "id", path, f"annotations[{j}]", int)
            image_ids[j] = _require(ann, "image_id", path, f"annotation id {ann_ids[j]}", int)
            crowd[j] = bool(ann.get("iscrowd", 0))
            if "keypoints" not in ann or "bbox" not in ann:
                has_kpts[j] = False  # MMPose skips these records (not keypoint annotations)
                continue
            box, kp = ann["bbox"], ann["keypoints"]
            if not isinstance(box, (list, tuple)) or len(box) != 4:
                raise DataError("bbox must be [x, y, w, h]", file=path,
                                record=f"annotation id {ann_ids[j]}", field="bbox")
            if not isinstance(kp, (list, tuple)) or len(kp) != 3 * K:
                got = len(kp) if isinstance(kp, (list, tuple)) else type(kp).__name__
                raise DataError(f"keypoints must hold {3 * K} numbers (x, y, v for {K} keypoints), "
                                f"got {got}", file=path, record=f"annotation id {ann_ids[j]}",
                                field="keypoints")
            if "num_keypoints" in ann:
                num_kpts[j] = _require(ann, "num_keypoints", path, f"annotation id {ann_ids[j]}", (int, float))
            box_rows.append(box)
            kpt_rows.append(kp)
            rows_with_kpts.append(j)
        boxes = np.zeros((n, 4), np.float64)
        kpts = np.zeros((n, K, 3), np.float32)
        rows_with_kpts = np.asarray(rows_with_kpts, np.int64)
        for name, rows, dst, shape in (("bbox", box_rows, boxes, (-1, 4)), ("keypoints", kpt_rows, kpts, (-1, K, 3))):
            try:
                dst[rows_with_kpts] = np.array(rows, np.float64).reshape(shape)
            except (TypeError, ValueError):
                for j, row in zip(rows_with_kpts, rows):  # find the culprit for the message
                    try:
                        np.array(row, np.float64)
                    except (TypeError, ValueError):
                        raise DataError(f"{name} is not numeric: {row!r}", file=path,
                                        record=f"annotation id {ann_ids[j]}", field=name) from None
                raise
        bad_box = ~np.all(np.isfinite(boxes), axis=1) | (boxes[:, 2] < 0) | (boxes[:, 3] < 0)
        if np.any(bad_box):
            j = int(np.flatnonzero(bad_box)[0])
            raise DataError(f"bbox has a negative or non-finite size: {boxes[j].tolist()}",
                            file=path, record=f"annotation id {ann_ids[j]}", field="bbox")
        dup = np.unique(ann_ids, return_counts=True)
        if np.any(dup[1] > 1):
            raise DataError("annotation id appears twice", file=path,
                            record=f"annotation id {dup[0][np.argmax(dup[1] > 1)]}", field="id")
        img_pos = self._image_positions(image_ids, path, lambda k: f"annotation id {ann_ids[k]}")

        xy, vis = kpts[..., :2], np.minimum(1, kpts[..., 2])
        counted = np.count_nonzero(xy.max(axis=2), axis=1)
        num_kpts = np.where(num_kpts >= 0, num_kpts, counted)
        wh = self._img_wh[img_pos].astype(np.float64)
        x, y, w, h = boxes.T
        x1, y1 = np.clip(x, 0, wh[:, 0] - 1), np.clip(y, 0, wh[:, 1] - 1)
        x2, y2 = np.clip(x + w, 0, wh[:, 0] - 1), np.clip(y + h, 0, wh[:, 1] - 1)
        xyxy = np.stack([x1, y1, x2, y2], axis=1).astype(np.float32)
        box_ok = (xyxy[:, 2] - xyxy[:, 0] > 0) & (xyxy[:, 3] - xyxy[:, 1] > 0)
        keep = np.ones(n, bool)
        for reason, bad in (("no keypoints field", ~has_kpts), ("crowd", crowd),
                            ("num_keypoints == 0", num_kpts == 0),
                            ("box empty after clipping", ~box_ok),
                            ("max(keypoints) <= 0", xy.max(axis=(1, 2), initial=0) <= 0)):
            self._drop(reason, np.count_nonzero(keep & bad))
            keep &= ~bad
        # MMPose's order: images as listed, then their annotations as listed.
        rows = np.flatnonzero(keep)
        rows = rows[np.argsort(img_pos[rows], kind="stable")]
        self._ids = ann_ids[rows]
        self._inst_img = img_pos[rows]
        self._bbox_xyxy = xyxy[rows]
        self._bbox_score = np.ones(len(rows), np.float32)
        self._keypoints = np.ascontiguousarray(xy[rows])
        self._visible = np.ascontiguousarray(vis[rows])

    def _index_detections(self, dets):
        path = self.bbox_file
        if not isinstance(dets, list):
            raise DataError("a detection file must be a JSON list of "
                            "{image_id, category_id, bbox, score}", file=path, field="<top level>")
        n = len(dets)
        image_ids = np.empty(n, np.int64)
        cats = np.empty(n, np.int64)
        boxes = np.empty((n, 4), np.float32)
        scores = np.empty(n, np.float32)
        for j, det in enumerate(dets):
            rec = f"detection [{j}]"
            image_ids[j] = _require(det, "image_id", path, rec, int)
            cats[j] = _require(det, "category_id", path, rec, int)
            box = _require(det, "bbox", path, rec, (list, tuple))
            if len(box) < 4:
                raise DataError("bbox must be [x, y, w, h]", file=path, record=rec, field="bbox")
            try:
                boxes[j] = box[:4]
            except (TypeError, ValueError):
                raise DataError(f"bbox is not numeric: {box!r}", file=path, record=rec, field="bbox") from None
            if (not np.all(np.isfinite(boxes[j])) or boxes[j, 2] < 0 or boxes[j, 3] < 0
                    or (boxes[j, 2] == 0 and boxes[j, 3] == 0)):
                raise DataError(f"bbox has a negative, empty or non-finite size: {box}",
                                file=path, record=rec, field="bbox")
            scores[j] = _require(det, "score", path, rec, (int, float))
        keep = cats == PERSON_CATEGORY_ID
        self._drop("not a person", np.count_nonzero(~keep))
        low = keep & (scores < self.bbox_score_thr)
        self._drop(f"score < {self.bbox_score_thr}", np.count_nonzero(low))
        keep &= ~low
        rows = np.flatnonzero(keep)
        self._inst_img = self._image_positions(image_ids[rows], path, lambda k: f"detection [{rows[k]}]")
        # MMPose's bbox_xywh2xyxy in float32; detection boxes are not clipped.
        xyxy = boxes[rows].copy()
        xyxy[:, 2:] += xyxy[:, :2]
        self._bbox_xyxy = xyxy
        self._bbox_score = scores[rows]
        self._ids = np.arange(len(rows), dtype=np.int64)  # MMPose numbers detections 0, 1, ...
        self._keypoints = None
        self._visible = None

    # ------------------------------------------------------------------ access

    def __len__(self):
        return len(self._ids)

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    def index_nbytes(self):
        """Bytes held by the instance and image index arrays."""
        arrays = [v for v in vars(self).values() if isinstance(v, np.ndarray)]
        return int(sum(a.nbytes for a in arrays))

    def image_path(self, i):
        return self.img_dir / str(self._img_files[self._inst_img[i]])

    def instance_info(self, i):
        """Index metadata of instance i (copies; no pixels): ids, box, keypoints."""
        j = self._inst_img[i]
        info = {"id": int(self._ids[i]), "image_id": int(self._img_ids[j]),
                "file": str(self.image_path(i)), "image_size": tuple(int(v) for v in self._img_wh[j]),
                "bbox_xyxy": self._bbox_xyxy[i].copy(), "bbox_score": float(self._bbox_score[i]),
                "center": self._center[i].copy(), "scale": self._scale[i].copy()}
        if self._keypoints is not None:
            info["keypoints"] = self._keypoints[i].copy()
            info["keypoints_visible"] = self._visible[i].copy()
        return info

    def __getitem__(self, key):
        i, epoch = key if isinstance(key, tuple) else (key, self.epoch)
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"instance {i} out of range for {len(self)} instances")
        if not self.train:
            return self._val_sample(i)
        return self._train_sample_with_substitutes(i, int(epoch))

    # ------------------------------------------------------------------ samples

    def _record(self, i):
        kind = "detection" if self.bbox_file is not None else "annotation id"
        j = self._inst_img[i]
        return f"{kind} {int(self._ids[i])} (image id {int(self._img_ids[j])})"

    def _load(self, i, reduce=1):
        j = self._inst_img[i]
        return load_image(self.image_path(i), self._record(i), reduce, expected_size=self._img_wh[j])

    def _meta(self, i, center, scale_fixed):
        bbox = self._bbox_xyxy[i].copy()
        bbox[2:] -= bbox[:2]  # xywh (float32 subtraction rounds the exact difference, as before)
        return {
            "image_id": int(self._img_ids[self._inst_img[i]]),
            "id": int(self._ids[i]),
            "center": torch.from_numpy(np.asarray(center, np.float32).copy()),
            "scale": torch.from_numpy(np.asarray(scale_fixed, np.float32).copy()),
            "bbox_score": float(self._bbox_score[i]),
            "bbox": torch.from_numpy(bbox),
            "area": float(np.float32(scale_fixed[0]) * np.float32(scale_fixed[1])),
        }

    @staticmethod
    def _image_tensor(crop_bgr):
        return torch.from_numpy(np.ascontiguousarray(crop_bgr[:, :, ::-1].transpose(2, 0, 1)))

    def _val_sample(self, i):
        """MMPose val pipeline: exact crop (no reduced decoding, rotation 0)."""
        image, _ = self._load(i)
        center = self._center[i]
        crop, _, scale_fixed, _ = T.topdown_affine(image, center, self._scale[i], 0.0, self.input_size)
        sample = self._meta(i, center, scale_fixed)
        sample["image"] = self._image_tensor(crop)
        return sample

    def _train_sample_with_substitutes(self, i, epoch):
        # Attempt 0 is the instance itself; an unreadable image is replaced by another
        # instance chosen from (seed, epoch, i, attempt), so the substitute is reproducible.
        for attempt in range(self.max_bad_images + 1):
            if attempt == 0:
                j, rng = i, np.random.default_rng((self.seed, epoch, i))
            else:
                rng = np.random.default_rng((self.seed, epoch, i, attempt))
                j = int(rng.integers(len(self)))
            try:
                return self._train_sample(j, rng)
            except DataError as e:
                self.bad_images += 1
                if self.bad_images > self.max_bad_images:
                    raise DataError(f"{self.bad_images} unreadable images in this process, more than "
                                    f"max_bad_images={self.max_bad_images}; last: {e}",
                                    file=e.file, record=e.record, field=e.field) from e
                log.warning("skipping unreadable image (%d so far, limit %d): %s",
                            self.bad_images, self.max_bad_images, e)
        raise AssertionError("unreachable")

    def augment_geometry(self, i, rng):
        """The random part of the train pipeline for instance i, without pixels.

        Returns a dict: flipped, half_body (None/"upper"/"lower"), center, scale (padded,
        before the aspect fix), rotation (deg), scale_fixed, matrix (image -> crop, in the
        flipped image's frame), keypoints (image frame, after flip), keypoints_visible.
        """
        width = int(self._img_wh[self._inst_img[i]][0])
        center, scale = self._center[i].copy(), self._scale[i].copy()
        kpts, vis = self._keypoints[i].copy(), self._visible[i].copy()
        flipped, center, kpts, vis = T.random_flip(rng, center, kpts, vis, width,
                                                   flip_indices=self.flip_indices)
        center, scale, part = T.random_half_body(rng, center, scale, kpts, vis)
        center, scale, rotation = T.random_bbox_transform(rng, center, scale)
        scale_fixed, matrix = T.crop_geometry(center, scale, rotation, self.input_size)
        return {"flipped": flipped, "half_body": part, "center": center, "scale": scale,
                "rotation": rotation, "scale_fixed": scale_fixed, "matrix": matrix,
                "keypoints": kpts, "keypoints_visible": vis, "image_width": width}

    def render_crop(self, i, geo, reduced=None):
        """Warp instance i's image with the geometry of `augment_geometry` (uint8 BGR HWC).

        With a crop cache (and `reduced` not given) the pixels come from the cache; a crop it
        cannot serve is decoded on the exact path.
        """
        if self._crop_cache is not None and reduced is None:
            crop = self._crop_cache.render(i, geo["matrix"], geo["flipped"],
                                           self._img_wh[self._inst_img[i]], self.input_size)
            if crop is not None:
                return crop
            self.crop_cache_misses += 1
            if self.crop_cache_misses == 1:
                log.warning("crop cache %s does not hold the pixels of %s's crop; decoding "
                            "(counted in crop_cache_misses)", self._crop_cache.path, self._record(i))
            reduced = False
        reduced = self.reduced_decode if reduced is None else reduced
        if reduced:
            f = T.choose_reduction(geo["scale_fixed"], self.input_size)
            image, f = self._load(i, reduce=f)
            flip_width = geo["image_width"] if geo["flipped"] else None
            matrix = T.source_matrix(geo["matrix"], flip_width=flip_width, reduce=f)
            return T.warp_crop(image, matrix, self.input_size)
        image, _ = self._load(i)
        if geo["flipped"]:
            image = T.flip_image(image)
        return T.warp_crop(image, geo["matrix"], self.input_size)

    def _train_sample(self, i, rng):
        geo = self.augment_geometry(i, rng)
        crop = self.render_crop(i, geo)
        if self._photometric is not None:
            crop = self._photometric(crop)
        kpts = T.transform_points(geo["keypoints"], geo["matrix"])
        vis = geo["keypoints_visible"].astype(np.float32)
        sample = self._meta(i, geo["center"], geo["scale_fixed"])
        sample["image"] = self._image_tensor(crop)
        sample["rotation"] = float(geo["rotation"])
        sample["flipped"] = bool(geo["flipped"])
        sample["keypoints"] = torch.from_numpy(kpts)
        sample["keypoints_visible"] = torch.from_numpy(vis)
        if self._codec is not None:
            heatmaps, weights = self._codec.encode(kpts[None], vis[None])
            sample["heatmaps"] = torch.from_numpy(np.ascontiguousarray(heatmaps, np.float32))
            sample["keypoint_weights"] = torch.from_numpy(np.asarray(weights[0], np.float32))
        else:
            sample["keypoint_weights"] = torch.from_numpy(self._udp_weights(kpts, vis))
        return sample

    def _udp_weights(self, keypoints, visible):
        """UDPHeatmap's keypoint weights without the heatmaps (the trainer draws those):
        the visibility, or 0 when the 13x13 (3 sigma) window misses the heatmap entirely."""
        (w, h), size = self.input_size, np.array(self.heatmap_size)
        stride = np.array([(w - 1) / (size[0] - 1), (h - 1) / (size[1] - 1)], np.float32)
        mu = (keypoints / stride + 0.5).astype(np.int64)  # truncation toward zero, as MMPose
        r = int(self.sigma * 3)
        outside = ((mu - r >= size) | (mu + r + 1 < 0)).any(axis=1)
        # Keypoints with visibility < 0.5 are skipped before the window test and keep theirs.
        return np.where(outside & (visible >= 0.5), 0.0, visible).astype(np.float32)
