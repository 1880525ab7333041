"""Reads the compact `.npz` fixtures (tests/fixtures/README.md §2, "Storage") as full arrays.

Two storage forms keep the files small without losing a bit of what the tests compare:

* a float16 array is widened to float32 (only arrays whose values are float16 numbers are stored
  this way, e.g. the `randn` model input, whose values are multiples of 1/64 below 2048/64);
* an entry `<key>_uint8_bgr` (uint8 (N, 3, H, W) BGR crops) also yields `<key>`: the float32 RGB
  model input that MMPose's `PoseDataPreprocessor` makes from it,
  `(float32(crop[:, ::-1]) - MEAN_RGB) / STD_RGB` in float32, which is bit-identical to it.

`tools/reference/make_fixtures.py` writes these forms and reads its cases back through here.
"""

from pathlib import Path

import numpy as np

MEAN_RGB = np.array([123.675, 116.28, 103.53], np.float32)
STD_RGB = np.array([58.395, 57.12, 57.375], np.float32)
CROP_SUFFIX = "_uint8_bgr"


def normalize_crops(crops_bgr):
    """uint8 (N, 3, H, W) BGR crops -> float32 (N, 3, H, W) normalised RGB, as MMPose does it.

    Args:
        crops_bgr: uint8 array (N, 3, H, W), channels in BGR order.
    """
    crops_bgr = np.asarray(crops_bgr)
    if crops_bgr.dtype != np.uint8 or crops_bgr.ndim != 4 or crops_bgr.shape[1] != 3:
        raise ValueError(f"expected uint8 (N, 3, H, W) BGR crops, got {crops_bgr.dtype} {crops_bgr.shape}")
    rgb = crops_bgr[:, ::-1].astype(np.float32)
    return (rgb - MEAN_RGB[:, None, None]) / STD_RGB[:, None, None]


def load_npz(path):
    """{key: array} of one fixture file, with the storage forms above expanded.

    Args:
        path: the `.npz` file.
    """
    path = Path(path)
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    for key in list(arrays):
        if arrays[key].dtype == np.float16:
            arrays[key] = arrays[key].astype(np.float32)
        if key.endswith(CROP_SUFFIX):
            model_key = key[: -len(CROP_SUFFIX)]
            if model_key in arrays:
                raise ValueError(f"{path}: both {key!r} and {model_key!r} are stored")
            arrays[model_key] = normalize_crops(arrays[key])
    return arrays
