"""Paths, file writing and library versions shared by the fixture generator's stages.

Runs in the MMPose reference venv (README.md in this folder). The fixtures are read back with
tests/fixture_files.py and the random weights come from tests/weights_recipe.py: the generator
imports both from tests/ so that writer, reader and tests share one definition of each.
"""

import importlib.metadata
import json
import platform
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
DEFAULT_OUT = TESTS / "fixtures"
DEFAULT_COCO_MINI = TESTS / "data" / "coco-mini"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from fixture_files import load_npz, normalize_crops  # noqa: E402, F401  (tests/ is on the path now)
from weights_recipe import derive, make_weights, spec_digest  # noqa: E402, F401

INPUT_SIZE = (192, 256)  # (w, h), as MMPose writes sizes
HEATMAP_SIZE = (48, 64)
FLIP_INDICES = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]
WEIGHTS_SEED = 7
IMAGE_FILES = ["000000000785.jpg", "000000040083.jpg", "000000196141.jpg", "000000197388.jpg"]
IMAGE_IDS = [785, 40083, 196141, 197388]
CONFIG_DIR = "body_2d_keypoint/topdown_heatmap/coco"
CONFIGS = {
    "classic": f"{CONFIG_DIR}/td-hm_ViTPose-small_8xb64-210e_coco-256x192.py",
    "simple": f"{CONFIG_DIR}/td-hm_ViTPose-small-simple_8xb64-210e_coco-256x192.py",
}

# info key -> (module whose __version__ to report, distribution name when it has none)
_LIBRARIES = [("numpy", "numpy", None), ("torch", "torch", None), ("opencv", "cv2", None),
              ("mmengine", "mmengine", None), ("mmcv", "mmcv", None), ("mmpose", "mmpose", None),
              ("mmpretrain", "mmpretrain", None), ("python", None, None), ("xtcocotools", None, "xtcocotools"),
              ("pycocotools", None, "pycocotools"), ("transformers", "transformers", None)]


def versions():
    """{library: version} of the venv that computes the references (stored in every file's info)."""
    found = {}
    for key, module, dist in _LIBRARIES:
        if key == "python":
            found[key] = platform.python_version()
        elif module is not None:
            found[key] = getattr(importlib.import_module(module), "__version__", None)
        else:
            found[key] = importlib.metadata.version(dist)
    try:  # CPU float results can depend on the thread count (summation order)
        import torch
        found["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return found


def save_npz(path, arrays, info):
    """Writes `arrays` and `info` (as the 0-d string `info_json`) to a compressed `.npz`.

    Args:
        path: the file to write.
        arrays: {key: array}; keys may contain '/'.
        info: JSON-serialisable notes, case names, seeds; `versions` is added.
    """
    if "info_json" in arrays:
        raise ValueError("'info_json' is reserved for the notes")
    payload = {key: np.asarray(value) for key, value in arrays.items()}
    payload["info_json"] = np.array(json.dumps({**info, "versions": versions()}))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **payload)


def read_info(arrays):
    """The decoded `info_json` of a loaded fixture file."""
    return json.loads(str(arrays["info_json"]))


def load_cases(cases_dir, name):
    """The arrays and info of fixture `name` in `cases_dir` (full or compact form), or None."""
    if cases_dir is None:
        return None
    path = Path(cases_dir) / name
    if not path.is_file():
        raise FileNotFoundError(f"--cases-from: {path} is missing")
    arrays = load_npz(path)
    return arrays, read_info(arrays)


def load_spec(fixtures_dir, decoder, layout):
    return json.loads((Path(fixtures_dir) / f"weights_spec_{decoder}_{layout}.json").read_text())


def write_json(path, obj, indent=None):
    """JSON without a final newline: compact separators, or `indent` spaces per level."""
    text = json.dumps(obj, indent=indent) if indent is not None else json.dumps(obj, separators=(",", ":"))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
