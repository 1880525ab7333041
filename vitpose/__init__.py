"""vitpose: ViTPose in plain PyTorch.

The names here are the public API (see README.md). `import vitpose` stays light: each name is
imported from the module below on first use, so that e.g. the torch-free ONNX runtime path
(`vitpose.OnnxPredictor`) never loads torch.
"""

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it (a subpackage when the name is the module itself)
_PUBLIC = {
    "build_model": "vitpose.models",
    "load_weights": "vitpose.models",
    "save_weights": "vitpose.models",
    "flip_test": "vitpose.models",
    "load_model": "vitpose.builders",
    "LoadedModel": "vitpose.builders",
    "ModelSpec": "vitpose.models.spec",
    "Predictor": "vitpose.inference.predictor",
    "OnnxPredictor": "vitpose.inference.onnx",
    "draw_pose": "vitpose.inference.draw",
    "codecs": "vitpose.codecs",
    "data": "vitpose.data",
    "engine": "vitpose.engine",
    "evaluation": "vitpose.evaluation",
    "models": "vitpose.models",
    "inference": "vitpose.inference",
    "hub": "vitpose.models.hub",
    "detect": "vitpose.inference.detect",
}
__all__ = list(_PUBLIC)


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(_PUBLIC[name])
    return module if module.__name__.rsplit(".", 1)[-1] == name else getattr(module, name)
