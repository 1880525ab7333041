"""vitpose: ViTPose in plain PyTorch.

The names here are the public API (see README.md); each lives in the module named below.
"""

import importlib

_LOCATIONS = {
    "build_model": "vitpose.models",
    "load_weights": "vitpose.models",
    "save_weights": "vitpose.models",
    "flip_test": "vitpose.models",
    "Predictor": "vitpose.inference",
    "OnnxPredictor": "vitpose.onnx_predictor",
    "draw_pose": "vitpose.visualize",
}
__version__ = "0.1.0"
_SUBPACKAGES = ("codecs", "data", "detect", "engine", "evaluation", "hub", "models")
__all__ = [*_LOCATIONS, *_SUBPACKAGES]


def __getattr__(name):
    # Imported on first use so that `import vitpose` stays light and each layer
    # loads only what it needs.
    if name in _SUBPACKAGES:
        return importlib.import_module(f"vitpose.{name}")
    if name in _LOCATIONS:
        return getattr(importlib.import_module(_LOCATIONS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
