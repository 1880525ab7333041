"""vitpose: ViTPose in plain PyTorch.

The names here are the public API (see README.md). `import vitpose` stays light: each name is
imported from the module below on first use (`lazy_exports`, which the subpackages use too), so
that e.g. the torch-free ONNX runtime path (`vitpose.OnnxPredictor`) never loads torch.
"""

import importlib

__version__ = "0.1.0"


def lazy_exports(package: str, modules: dict[str, list[str]]):
    """(`__all__`, module `__getattr__`) for `package`, whose public names live in its modules.

    modules: {module: [names]}; each name is imported from its module on first use. A name that
    is its module's last part (`vitpose.hub`) is the module itself.
    """
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(where[name])
        return module if module.__name__.rsplit(".", 1)[-1] == name else getattr(module, name)

    return list(where), __getattr__


__all__, __getattr__ = lazy_exports(__name__, {
    "vitpose.models": ["build_model", "load_weights", "save_weights", "flip_test", "models"],
    "vitpose.builders": ["load_model", "LoadedModel"],
    "vitpose.models.spec": ["ModelSpec"],
    "vitpose.inference.predictor": ["Predictor"],
    "vitpose.inference.onnx": ["OnnxPredictor"],
    "vitpose.inference.door": ["open_predictor"],
    "vitpose.inference.draw": ["draw_pose"],
    "vitpose.codecs": ["codecs"],
    "vitpose.data": ["data"],
    "vitpose.engine": ["engine"],
    "vitpose.evaluation": ["evaluation"],
    "vitpose.inference": ["inference"],
    "vitpose.hub": ["hub"],
    "vitpose.inference.detect": ["detect"],
})
