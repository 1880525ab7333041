"""Keypoint instances (COCO person keypoints by default) as top-down samples, with MMPose 1.x's pipelines.

`CocoKeypoints(ann_file, img_dir, train=False, bbox_file=None, ..., dataset_info=None)`: one item
per instance of its `CocoIndex` (coco_index.py: which annotations or detections become instances,
their validation, and the arrays they live in). The skeleton (`dataset_info`, see
metainfo.py; COCO-17 by default) gives K, the annotation format, the flip indices and the
half-body sets. `ds[i]` uses `ds.epoch`; `ds[(i, epoch)]` names
the epoch, and every random draw of a training sample comes from
`np.random.default_rng((seed, epoch, i))`, so a sample depends on nothing but those numbers.

Validation (train=False) is MMPose's val pipeline exactly: decode (OpenCV, full size) ->
box centre/scale (1.25) -> aspect fix -> UDP warp. Training is MMPose's train pipeline
(flip, half body, box shift/scale/rotation, UDP warp, UDP targets), bit-exact by default.
Options:
- `crop_cache=DIR` (built once by `vitpose build-crop-cache --config CFG`): bit-exact
  crops read from a memory-mapped file of per-instance image regions instead of decoding the
  JPEG (see crop_cache.py): the fast exact path.
- `encode_targets=False`: heatmaps are left to the trainer (`udp_encode_torch` on the device);
  the sample carries the keypoints and their weights.
- `reduced_decode=True` (opt-in, not exact): the geometry is settled before decoding, the flip
  is folded into the warp matrix, and large boxes are decoded at 1/2, 1/4 or 1/8 resolution
  (libjpeg DCT scaling) when the crop shrinks them at least that much anyway. Keypoints and
  targets are identical; where it applies (crops that shrink the box >= 2x), pixels differ
  from MMPose's (tests/test_dataset.py bounds it), for the speed-up benchmarks/bench_data.py
  measures (BENCHMARKS.md, "Data pipeline").
"""

import logging
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..codecs.choice import build_codec
from . import transforms as T
from .coco_index import CocoIndex, build_coco_index
from .errors import DataError
from .geometry import bbox_xyxy2xywh
from .image_io import load_image
from .metainfo import DatasetInfo
from .metainfo import dataset_info as load_dataset_info

log = logging.getLogger(__name__)


class CocoKeypoints(Dataset):
    """Top-down COCO keypoint instances (see the module docstring).

    Args:
        ann_file: COCO keypoint annotation JSON (`person_keypoints_*.json`).
        img_dir: folder holding the images named by `file_name`.
        train: augment (MMPose's ViTPose train pipeline) and return targets.
        bbox_file: COCO detection results JSON; its person boxes replace the GT boxes
            (validation only). Boxes are kept in file order and not clipped, as in MMPose.
        input_size, heatmap_size: (w, h) of the crop and of the heatmaps.
        sigma: the targets' Gaussian sigma (heatmap pixels).
        codec: the heatmap codec of the targets, "udp" (default) or "msra" (`model.codec`).
        seed: base seed of the augmentation stream.
        encode_targets: add "heatmaps" to training samples (else the trainer encodes them).
        bbox_score_thr: drop detection boxes with a lower score (MMPose's ViTPose uses 0).
        max_bad_images: training only: unreadable images tolerated per process (logged and
            replaced by another instance, chosen deterministically) before DataError is raised.
            Validation always raises on the first one.
        reduced_decode: training only: decode large boxes at reduced resolution (off by
            default: not bit-exact, see above).
        photometric: optional list of albumentations pixel-level transforms (training only).
        crop_cache: training only: directory of a crop cache built for this annotation file
            (or a `CropCache`); crops are read from it, bit-exact, instead of decoded. A cache
            built for other annotations raises DataError.
        index: a `CocoIndex` already built from these files (`build_coco_index`), to share one
            between datasets; it must match ann_file, bbox_file, num_keypoints and
            bbox_score_thr (ValueError otherwise).
        dataset_info: the skeleton: a `DatasetInfo` or anything `vitpose.data.dataset_info`
            reads (a built-in name, a skeleton YAML, a COCO annotation file). None: COCO-17.
            K, the annotation format, the flip indices and the half-body sets come from it.
        num_keypoints, flip_indices: older spellings of the skeleton's K and flip indices; when
            given they must agree with the skeleton (ValueError otherwise).
    """

    def __init__(self, ann_file, img_dir, train=False, bbox_file=None, input_size=(192, 256),
                 heatmap_size=(48, 64), sigma=2.0, seed=0, encode_targets=True, codec="udp",
                 bbox_score_thr=0.0, max_bad_images=10, reduced_decode=False, photometric=None,
                 num_keypoints=None, flip_indices=None, crop_cache=None,
                 index: CocoIndex | None = None, dataset_info: DatasetInfo | str | None = None):
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
        self.dataset_info = resolve_skeleton(dataset_info, num_keypoints, flip_indices)
        self.num_keypoints = self.dataset_info.num_keypoints
        self.flip_indices = self.dataset_info.flip_indices
        self.epoch = 0
        self.bad_images = 0  # per process: each loader worker counts its own
        self.crop_cache_misses = 0  # per process: crops the cache could not serve (decoded)
        self._photometric = T.build_photometric(photometric) if train else None
        # The codec draws the heatmaps (encode_targets) or, without them, gives the weights.
        self._codec = build_codec(codec, self.input_size, self.heatmap_size, self.sigma)
        if index is None:
            index = build_coco_index(self.ann_file, self.bbox_file, self.num_keypoints, self.bbox_score_thr,
                                     dataset_info=self.dataset_info, img_dir=self.img_dir)
        else:
            self._check_index(index)
        self.index = index
        self._crop_cache = None
        if crop_cache is not None:
            from .crop_cache import CropCache
            self._crop_cache = crop_cache if isinstance(crop_cache, CropCache) else CropCache(crop_cache)
            self._crop_cache.check(self.index, self.input_size)

    def _check_index(self, index):
        """A prebuilt index must be the one these arguments would build."""
        def same(a, b):
            return (a is None) == (b is None) and (a is None or Path(a).resolve() == Path(b).resolve())

        want_thr = 0.0 if self.bbox_file is None else self.bbox_score_thr
        if not (same(index.ann_file, self.ann_file) and same(index.bbox_file, self.bbox_file)
                and index.num_keypoints == self.num_keypoints and index.bbox_score_thr == want_thr
                and index.annotation_format == self.dataset_info.annotation_format):
            raise ValueError(
                f"the index was built from {index.ann_file} (bbox_file={index.bbox_file}, "
                f"K={index.num_keypoints}, bbox_score_thr={index.bbox_score_thr}), not from "
                f"{self.ann_file} (bbox_file={self.bbox_file}, K={self.num_keypoints}, "
                f"bbox_score_thr={want_thr})")

    # ------------------------------------------------------------------ access

    @property
    def dropped(self):
        """Annotation or detection records left out, counted per reason."""
        return dict(self.index.dropped)

    @property
    def crop_cache(self):
        """The `CropCache` crops are read from, or None."""
        return self._crop_cache

    def __len__(self):
        return len(self.index)

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    def index_nbytes(self):
        """Bytes held by the instance and image index arrays."""
        return self.index.nbytes()

    def image_path(self, i):
        return self.img_dir / self.index.image_file(i)

    def instance_info(self, i):
        """Index metadata of instance i (copies; no pixels): ids, box, keypoints."""
        ix = self.index
        info = {"id": int(ix.ids[i]), "image_id": ix.image_id(i), "file": str(self.image_path(i)),
                "image_size": ix.image_size(i), "bbox_xyxy": ix.bbox_xyxy[i].copy(),
                "bbox_score": float(ix.bbox_score[i]), "center": ix.center[i].copy(),
                "scale": ix.scale[i].copy()}
        if ix.has_keypoints:
            info["keypoints"] = ix.keypoints[i].copy()
            info["keypoints_visible"] = ix.keypoints_visible[i].copy()
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

    def read_image(self, i, reduce=1):
        """Decode instance i's image: (uint8 BGR (H, W, 3), the reduction actually used)."""
        return load_image(self.image_path(i), self.index.record(i), reduce,
                          expected_size=self.index.image_size(i))

    def sample_meta(self, i, center, scale_fixed):
        """The sample fields besides pixels and targets: ids, crop box, detection box and score."""
        ix = self.index
        return {
            "image_id": ix.image_id(i),
            "id": int(ix.ids[i]),
            "center": torch.from_numpy(np.asarray(center, np.float32).copy()),
            "scale": torch.from_numpy(np.asarray(scale_fixed, np.float32).copy()),
            "bbox_score": float(ix.bbox_score[i]),
            "category_id": int(ix.category_ids[i]),
            "bbox": torch.from_numpy(bbox_xyxy2xywh(ix.bbox_xyxy[i])),
            "area": float(np.float32(scale_fixed[0]) * np.float32(scale_fixed[1])),
        }

    def target_weights(self, keypoints, keypoints_visible):
        """(K,) keypoint weights of the targets of crop keypoints (K, 2), without heatmaps."""
        return self._codec.keypoint_weights(np.asarray(keypoints)[None],
                                            np.asarray(keypoints_visible, np.float32)[None])[0]

    def targets(self, keypoints, keypoints_visible):
        """The codec's targets of crop keypoints (K, 2): "keypoint_weights" (K,), and "heatmaps"
        (K, H, W) unless `encode_targets=False` (then the trainer draws them on the device)."""
        if not self.encode_targets:
            return {"keypoint_weights": torch.from_numpy(self._codec.keypoint_weights(
                keypoints[None], keypoints_visible[None])[0])}
        heatmaps, weights = self._codec.encode(keypoints[None], keypoints_visible[None])
        return {"heatmaps": torch.from_numpy(heatmaps), "keypoint_weights": torch.from_numpy(weights[0])}

    def _val_sample(self, i):
        """MMPose val pipeline: exact crop (no reduced decoding, rotation 0)."""
        image, _ = self.read_image(i)
        center = self.index.center[i]
        crop, _, scale_fixed, _ = T.topdown_affine(image, center, self.index.scale[i], 0.0, self.input_size)
        sample = self.sample_meta(i, center, scale_fixed)
        sample["image"] = image_tensor(crop)
        # (w, h): where a keypoint lies in its image is a feature of a calibrated model's p
        sample["image_size"] = torch.tensor(self.index.image_size(i), dtype=torch.int64)
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
                sample = self._train_sample(j, rng)
                # How many unreadable images this sample stands in for: the training loop adds
                # these up into a per-epoch summary (the warnings come from worker processes).
                sample["skipped_images"] = attempt
                return sample
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
        ix = self.index
        if not ix.has_keypoints:
            raise ValueError("augmentation needs GT keypoints; this index holds detected boxes")
        width = ix.image_size(i)[0]
        center, scale = ix.center[i].copy(), ix.scale[i].copy()
        kpts, vis = ix.keypoints[i].copy(), ix.keypoints_visible[i].copy()
        flipped, center, kpts, vis = T.random_flip(rng, center, kpts, vis, width,
                                                   flip_indices=self.flip_indices)
        info = self.dataset_info
        center, scale, part = T.random_half_body(rng, center, scale, kpts, vis, upper_body_ids=info.upper_body_ids,
                                                 lower_body_ids=info.lower_body_ids)
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
            crop = self._crop_cache.render(i, geo["matrix"], geo["flipped"], self.index.image_size(i),
                                           self.input_size)
            if crop is not None:
                return crop
            self.crop_cache_misses += 1
            if self.crop_cache_misses == 1:
                log.warning("crop cache %s does not hold the pixels of %s's crop; decoding "
                            "(counted in crop_cache_misses)", self._crop_cache.path, self.index.record(i))
            reduced = False
        reduced = self.reduced_decode if reduced is None else reduced
        if reduced:
            f = T.choose_reduction(geo["scale_fixed"], self.input_size)
            image, f = self.read_image(i, reduce=f)
            flip_width = geo["image_width"] if geo["flipped"] else None
            matrix = T.source_matrix(geo["matrix"], flip_width=flip_width, reduce=f)
            return T.warp_crop(image, matrix, self.input_size)
        image, _ = self.read_image(i)
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
        sample = self.sample_meta(i, geo["center"], geo["scale_fixed"])
        sample["image"] = image_tensor(crop)
        sample["rotation"] = float(geo["rotation"])
        sample["flipped"] = bool(geo["flipped"])
        sample["keypoints"] = torch.from_numpy(kpts)
        sample["keypoints_visible"] = torch.from_numpy(vis)
        sample.update(self.targets(kpts, vis))
        return sample


def resolve_skeleton(dataset_info=None, num_keypoints=None, flip_indices=None) -> DatasetInfo:
    """The dataset's skeleton from `dataset_info` (None: COCO-17), checked against the older
    `num_keypoints` / `flip_indices` arguments when those are given."""
    info = load_dataset_info("coco" if dataset_info is None else dataset_info)
    if num_keypoints is not None and int(num_keypoints) != info.num_keypoints:
        if dataset_info is None:
            raise ValueError(f"num_keypoints={num_keypoints}: a dataset of other than COCO's 17 keypoints needs "
                             "dataset_info= (its flip pairs and half-body sets; see vitpose.data.dataset_info)")
        raise ValueError(f"num_keypoints={num_keypoints} but the skeleton {info.name!r} ({info.source}) has "
                         f"{info.num_keypoints} keypoints")
    if flip_indices is not None and tuple(int(i) for i in flip_indices) != info.flip_indices:
        raise ValueError(f"flip_indices={list(flip_indices)} differ from the skeleton {info.name!r}'s "
                         f"{list(info.flip_indices)}; give the skeleton through dataset_info=")
    return info


def image_tensor(crop_bgr):
    """uint8 BGR (H, W, 3) crop -> uint8 RGB (3, H, W) tensor (a sample's "image")."""
    return torch.from_numpy(np.ascontiguousarray(crop_bgr[:, :, ::-1].transpose(2, 0, 1)))
