"""Prepared crop regions: training without decoding a JPEG per sample, with bit-exact crops.

A training crop is a warp of a bounded part of its image. The augmentation limits
(`transforms.AUGMENTATION_LIMITS`, MMPose's defaults, the constant the transforms take their
defaults from) bound that part for each instance before any draw is made:
- RandomBBoxTransform moves the centre by at most `shift_factor` x the padded scale per axis,
  enlarges the scale at most `max(scale_factor)` times, and rotates by any angle up to 80 deg,
  so the crop's source rectangle (the aspect-fixed scale S around the centre) lies inside the
  circle of radius |S| / 2 around the shifted centre;
- RandomHalfBody replaces the box by one of a subset of the labelled keypoints: centre inside
  their extent, scale at most their extent x 1.5 (this can reach beyond the GT box);
- RandomFlip mirrors the centre and the keypoints, so in the original image the mirrored
  crop reads the mirror image of the same bounded region;
- bilinear interpolation reads pixels floor(x) and floor(x) + 1 (plus OpenCV's 1/32 px
  fixed-point rounding): a margin of a few pixels.
`build_crop_cache` stores, once, that region of every training instance (clipped to the image;
instances of one image share one region when that is smaller) as raw uint8 BGR at full
resolution in one memory-mapped file. A worker then slices the pixels the warp reads out of the
file (no decode), flips them if the sample is flipped, and warps with the inverse matrix shifted
by the slice's offset. Where the slice ends at the image border, warpAffine's constant-0 border
applies exactly as on the full image, so the crop equals the exact path's bit for bit
(tests/test_crop_cache.py checks thousands of samples). Each sample checks that the pixels it
reads lie inside the stored region; if not (a bug, or changed augmentation defaults), it falls
back to decoding the image (`CocoKeypoints.crop_cache_misses` counts these).

Disk cost: the stored regions are about as large as the decoded images (most of a COCO image
for a large person, a small window for a small one); `vitpose build-crop-cache`
prints the bytes per instance. The cache records a fingerprint of the `CocoIndex` it was built
for (instance ids, image names and sizes, boxes, keypoints, augmentation limits, aspect ratio)
and refuses to serve a dataset with another one; replacing image files needs a rebuild.

    vitpose build-crop-cache --config configs/vitpose_s.yaml   # writes data.crop_cache
"""

import hashlib
import json
import logging
import math
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import cv2
import numpy as np

from vitpose.files import readable_mode, replace_dir

from .coco_index import CocoIndex
from .errors import DataError
from .image_io import load_image
from .transforms import AUGMENTATION_LIMITS, AugmentationLimits

log = logging.getLogger(__name__)

CACHE_VERSION = 1
PIXELS_FILE = "pixels.npy"
INDEX_FILE = "index.npz"
REBUILD_HINT = "rebuild it with `vitpose build-crop-cache --config CFG`"
# Pixels bilinear warping may read around the exact footprint of the crop's pixel centres:
# floor(x) - 1 after fixed-point rounding, and floor(x) + 1 (+1 for an exclusive end).
_READ_BEFORE, _READ_AFTER = 1, 3
# The stored regions add one more pixel each side, and a relative slack for float32 matrices.
_REGION_BEFORE, _REGION_AFTER, _REL_SLACK = 2, 4, 1e-4


def region_limits(limits: AugmentationLimits = AUGMENTATION_LIMITS) -> dict:
    """The augmentation limits the regions depend on (recorded in the cache and its fingerprint,
    so a change of any of them invalidates old caches). Rotation needs no entry: the regions
    cover every angle."""
    return {
        "shift_factor": float(limits.shift_factor),
        "max_scale_factor": float(max(limits.scale_range)),
        "half_body_padding": float(limits.half_body_padding),
        "half_body_min_keypoints": int(limits.half_body_min_keypoints),
    }


# ------------------------------------------------------------------------------ bounds

def _reach(center_lo, center_hi, scale, aspect_ratio, limits: AugmentationLimits):
    """Image-space interval any crop can cover when its (padded) box has a centre in
    [center_lo, center_hi] and a scale of at most `scale` (all (N, 2))."""
    scale = np.asarray(scale, np.float64)
    shift = limits.shift_factor * scale
    largest = max(limits.scale_range) * scale
    # Aspect fix: the crop box height is max(w / aspect, h); any rotation stays inside the
    # circle around the centre through the corners of the box.
    height = np.maximum(largest[:, 0] / aspect_ratio, largest[:, 1])
    radius = 0.5 * height * math.sqrt(1.0 + aspect_ratio ** 2)
    radius = radius * (1.0 + _REL_SLACK) + 0.01
    lo = np.asarray(center_lo, np.float64) - shift - radius[:, None]
    hi = np.asarray(center_hi, np.float64) + shift + radius[:, None]
    return lo, hi


def instance_regions(center, scale, keypoints, visible, image_wh, aspect_ratio=0.75,
                     limits: AugmentationLimits = AUGMENTATION_LIMITS):
    """Every image pixel any training augmentation of each instance can read.

    center, scale (N, 2): the padded box (1.25) before augmentation; keypoints (N, K, 2) and
    visible (N, K) in the image; image_wh (N, 2). Returns (N, 4) int64 [x0, y0, x1, y1) with
    exclusive ends, clipped to the image (so a region edge that is not an image edge is
    never reached).
    """
    lo, hi = _reach(center, center, scale, aspect_ratio, limits)
    labelled = np.asarray(visible) > 0
    if keypoints is not None and labelled.any():
        pts = np.asarray(keypoints, np.float64)
        k_lo = np.where(labelled[..., None], pts, np.inf).min(axis=1)
        k_hi = np.where(labelled[..., None], pts, -np.inf).max(axis=1)
        half_body = labelled.sum(axis=1) >= limits.half_body_min_keypoints
        extent = np.where(half_body[:, None], k_hi - k_lo, 0.0) * limits.half_body_padding
        h_lo, h_hi = _reach(np.where(half_body[:, None], k_lo, 0.0), np.where(half_body[:, None], k_hi, 0.0),
                            extent, aspect_ratio, limits)
        lo = np.where(half_body[:, None], np.minimum(lo, h_lo), lo)
        hi = np.where(half_body[:, None], np.maximum(hi, h_hi), hi)
    wh = np.asarray(image_wh, np.int64)
    start = np.clip(np.floor(lo).astype(np.int64) - _REGION_BEFORE, 0, wh)
    end = np.clip(np.floor(hi).astype(np.int64) + _REGION_AFTER, 0, wh)
    end = np.maximum(end, start)
    return np.concatenate([start, end], axis=1)


def inverse_affine(matrix):
    """(a, b, c, d, e, f) of the crop -> image map, computed as cv2.warpAffine inverts a
    forward matrix (double precision, same operation order), so that warping with it and
    WARP_INVERSE_MAP gives the same pixels as warping with `matrix`."""
    a, b, c, d, e, f = (float(v) for v in np.asarray(matrix).reshape(6))
    det = a * e - b * d
    det = 1.0 / det if det != 0 else 0.0
    a2, e2 = e * det, a * det
    b2, d2 = b * -det, d * -det
    return a2, b2, -a2 * c - b2 * f, d2, e2, -d2 * c - e2 * f


def read_window(inverse, input_size, image_wh):
    """[x0, y0, x1, y1) of the image pixels cv2.warpAffine reads for this crop (clipped to
    the image; empty when the crop misses the image)."""
    a, b, c, d, e, f = inverse
    w, h = input_size[0] - 1, input_size[1] - 1
    xs = (c, a * w + c, b * h + c, a * w + b * h + c)
    ys = (f, d * w + f, e * h + f, d * w + e * h + f)
    width, height = int(image_wh[0]), int(image_wh[1])
    x0 = min(max(math.floor(min(xs)) - _READ_BEFORE, 0), width)
    y0 = min(max(math.floor(min(ys)) - _READ_BEFORE, 0), height)
    x1 = min(max(math.floor(max(xs)) + _READ_AFTER, x0), width)
    y1 = min(max(math.floor(max(ys)) + _READ_AFTER, y0), height)
    return x0, y0, x1, y1


def warp_window(pixels, window, inverse, input_size):
    """Warp `pixels` (the image's [x0, y0, x1, y1) window) with the image's inverse matrix."""
    x0, y0 = window[0], window[1]
    a, b, c, d, e, f = inverse
    shifted = np.array([[a, b, c - x0], [d, e, f - y0]], np.float64)
    return cv2.warpAffine(pixels, shifted, (int(input_size[0]), int(input_size[1])),
                          flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=0)


# ----------------------------------------------------------------------------- fingerprint

def index_fingerprint(index: CocoIndex, input_size) -> str:
    """sha256 of what the regions depend on: the instances, their images, boxes, keypoints,
    the augmentation limits and the crop's aspect ratio (input_size (w, h))."""
    h = hashlib.sha256()
    meta = {"version": CACHE_VERSION, "limits": region_limits(),
            "aspect_ratio": input_size[0] / input_size[1]}
    h.update(json.dumps(meta, sort_keys=True).encode())
    for a in (index.ids, index.image_sizes[index.image_index], index.center, index.scale,
              index.keypoints, index.keypoints_visible):
        h.update(np.ascontiguousarray(a).tobytes())
    h.update("\n".join(map(str, index.image_files[index.image_index])).encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------------- reading

class CropCache:
    """A built cache (directory with pixels.npy and index.npz), opened lazily per process.

    `render(i, matrix, flipped, image_wh, input_size)` returns the crop of instance i with the
    forward warp matrix of the (possibly flipped) image, or None when the crop would read
    pixels outside the stored region (the caller then decodes the image).
    """

    def __init__(self, path):
        self.path = Path(path)
        index_path = self.path / INDEX_FILE
        if not index_path.is_file():
            raise DataError("crop cache not found; build it with "
                            "`vitpose build-crop-cache --config CFG`", file=index_path)
        with np.load(index_path) as index:
            self.meta = json.loads(str(index["meta"]))
            self._boxes = index["region_boxes"]
            self._offsets = index["region_offsets"]
            self._instance_region = index["instance_region"]
        if self.meta.get("version") != CACHE_VERSION:
            raise DataError(f"crop cache version {self.meta.get('version')} is not {CACHE_VERSION}; "
                            f"{REBUILD_HINT}", file=index_path, field="version")
        self._pixels = None

    def __getstate__(self):
        # Loader workers open their own memory map instead of receiving a pickled copy.
        state = dict(self.__dict__)
        state["_pixels"] = None
        return state

    def check(self, index: CocoIndex, input_size):
        """Raise DataError unless this cache was built for `index` and crops of input_size's aspect."""
        if self.meta.get("fingerprint") != index_fingerprint(index, input_size) or len(self) != len(index):
            raise DataError(
                f"crop cache was built for another annotation index (built from "
                f"{self.meta.get('ann_file')} with {len(self)} instances; the dataset has "
                f"{len(index)} from {index.ann_file}, or a different input aspect or augmentation "
                f"limits); {REBUILD_HINT}", file=self.path / INDEX_FILE, field="fingerprint")

    def __len__(self):
        return len(self._instance_region)

    def nbytes(self):
        return int(self.meta["bytes"])

    def region(self, i):
        """Instance i's stored region: (pixels (h, w, 3) uint8 view into the memory map,
        [x0, y0, x1, y1) in the image), or None when its image was left out."""
        r = int(self._instance_region[i])
        if r < 0:
            return None
        if self._pixels is None:
            # A plain ndarray over the map: np.memmap's slicing overhead is per sample.
            self._pixels = np.load(self.path / PIXELS_FILE, mmap_mode="r").view(np.ndarray)
        x0, y0, x1, y1 = (int(v) for v in self._boxes[r])
        start = int(self._offsets[r])
        size = (y1 - y0) * (x1 - x0) * 3
        return self._pixels[start:start + size].reshape(y1 - y0, x1 - x0, 3), (x0, y0, x1, y1)

    def render(self, i, matrix, flipped, image_wh, input_size):
        found = self.region(i)
        if found is None:
            return None
        pixels, (rx0, ry0, rx1, ry1) = found
        inverse = inverse_affine(matrix)
        x0, y0, x1, y1 = read_window(inverse, input_size, image_wh)
        if x1 <= x0 or y1 <= y0:  # the crop misses the image: all border
            return np.zeros((input_size[1], input_size[0], 3), np.uint8)
        # In the original image a flipped window [x0, x1) is [W - x1, W - x0).
        ox0, ox1 = (int(image_wh[0]) - x1, int(image_wh[0]) - x0) if flipped else (x0, x1)
        if ox0 < rx0 or ox1 > rx1 or y0 < ry0 or y1 > ry1:
            return None
        window = pixels[y0 - ry0:y1 - ry0, ox0 - rx0:ox1 - rx0]
        if flipped:
            window = cv2.flip(window, 1)
        return warp_window(window, (x0, y0), inverse, input_size)


# --------------------------------------------------------------------------------- building

def _plan(index: CocoIndex, aspect_ratio, share_regions=True):
    """Regions to store: per image, one union region when it is no larger than the instances'
    regions apart (and `share_regions`). Returns (boxes (R, 4), image row of each (R,), instance_region (N,))."""
    img = index.image_index
    boxes = instance_regions(index.center, index.scale, index.keypoints, index.keypoints_visible,
                             index.image_sizes[img], aspect_ratio)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    order = np.argsort(img, kind="stable")
    starts = np.flatnonzero(np.r_[True, img[order][1:] != img[order][:-1]])
    out_boxes, out_images = [], []
    instance_region = np.empty(len(img), np.int64)
    for group in np.split(order, starts[1:]):
        union = np.concatenate([boxes[group, :2].min(axis=0), boxes[group, 2:].max(axis=0)])
        if share_regions and (union[2] - union[0]) * (union[3] - union[1]) <= area[group].sum():
            instance_region[group] = len(out_boxes)
            out_boxes.append(union)
            out_images.append(img[group[0]])
        else:
            for k in group:
                instance_region[k] = len(out_boxes)
                out_boxes.append(boxes[k])
                out_images.append(img[k])
    return np.asarray(out_boxes, np.int64).reshape(-1, 4), np.asarray(out_images, np.int64), instance_region


def _fill(job):
    """Worker: decode each image once and copy its regions into the memory-mapped file."""
    pixels_path, items = job
    pixels = np.load(pixels_path, mmap_mode="r+")
    failed = []
    for image_path, record, wh, regions in items:
        try:
            image, _ = load_image(image_path, record, expected_size=wh)
        except DataError as e:
            failed.append((str(e), [r for r, _, _ in regions]))
            continue
        for _, offset, (x0, y0, x1, y1) in regions:
            pixels[offset:offset + (y1 - y0) * (x1 - x0) * 3] = image[y0:y1, x0:x1].reshape(-1)
    pixels.flush()
    return failed


def build_crop_cache(index: CocoIndex, img_dir, path, input_size=(192, 256), num_workers=None,
                     images_per_job=64, share_regions=True):
    """Store the region every augmentation of each of `index`'s instances can read.

    Args:
        index: the training set's `CocoIndex` (GT boxes with keypoints).
        img_dir: folder holding the images named by the index.
        path: the cache directory to write (pixels.npy, index.npz), through a temporary
            directory, replacing an existing cache.
        input_size: (w, h) of the training crops (their aspect bounds the regions).
        num_workers: decoding processes (default: cores, at most 8).
        images_per_job: images per worker task.
        share_regions: False stores every instance's region apart (more bytes; for tests).

    Images that cannot be read are left out (their instances decode, and fail, on the exact
    path). Returns a dict of figures.
    """
    if not index.has_keypoints:
        raise ValueError("a crop cache is for training sets (GT boxes with keypoints)")
    img_dir = Path(img_dir)
    t0 = time.perf_counter()
    path = Path(path)
    boxes, images, instance_region = _plan(index, input_size[0] / input_size[1], share_regions)
    sizes = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) * 3
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    total = int(sizes.sum())
    path.parent.mkdir(parents=True, exist_ok=True)  # a new, private folder with a random name (never a planted one)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, readable_mode() | (readable_mode() & 0o444) >> 2)  # mkdtemp's 0700 -> what mkdir gives (0755)
    pixels = np.lib.format.open_memmap(tmp / PIXELS_FILE, mode="w+", dtype=np.uint8, shape=(max(total, 1),))
    del pixels

    # One job per group of images; each decodes its images once and writes its regions.
    by_image = {}
    for r, j in enumerate(images):
        by_image.setdefault(int(j), []).append((r, int(offsets[r]), tuple(int(v) for v in boxes[r])))
    first = {}
    for i, j in enumerate(index.image_index):
        first.setdefault(int(j), i)
    items = [(str(img_dir / index.image_file(first[j])), index.record(first[j]), index.image_size(first[j]),
              regions) for j, regions in by_image.items()]
    jobs = [(str(tmp / PIXELS_FILE), items[k:k + images_per_job]) for k in range(0, len(items), images_per_job)]
    num_workers = min(os.cpu_count() or 1, 8) if num_workers is None else int(num_workers)
    if num_workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(num_workers) as pool:
            results = list(pool.map(_fill, jobs))
    else:
        results = [_fill(job) for job in jobs]
    missing = []
    for failed in results:
        for message, regions in failed:
            log.warning("crop cache: image left out: %s", message)
            missing.extend(regions)
    if missing:
        instance_region[np.isin(instance_region, missing)] = -1

    meta = {"version": CACHE_VERSION, "fingerprint": index_fingerprint(index, input_size),
            "ann_file": str(index.ann_file), "img_dir": str(img_dir), "instances": len(index),
            "regions": len(boxes), "bytes": total, "limits": region_limits(),
            "input_size": [int(v) for v in input_size],
            "images_left_out": len({int(images[r]) for r in missing})}
    np.savez(tmp / INDEX_FILE, meta=np.array(json.dumps(meta)), region_boxes=boxes.astype(np.int32),
             region_offsets=offsets, instance_region=instance_region.astype(np.int32))
    replace_dir(tmp, path)
    meta["bytes_per_instance"] = total / max(len(index), 1)
    meta["seconds"] = time.perf_counter() - t0
    return meta
