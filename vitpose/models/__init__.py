"""ViT backbone, heatmap heads, the ViTPose model and checkpoint interop."""

import importlib

_LOCATIONS = {
    "VisionTransformer": "vitpose.models.vit",
    "ClassicHead": "vitpose.models.heads",
    "SimpleHead": "vitpose.models.heads",
    "ViTPose": "vitpose.models.vitpose",
    "build_model": "vitpose.models.vitpose",
    "flip_test": "vitpose.models.vitpose",
    "MODEL_SIZES": "vitpose.models.vitpose",
    "load_weights": "vitpose.models.checkpoint",
    "save_weights": "vitpose.models.checkpoint",
    "convert_state_dict": "vitpose.models.checkpoint",
    "ModelSpec": "vitpose.models.spec",
}
SUBMODULES = ("checkpoint", "heads", "hub", "spec", "vit", "vitpose")
__all__ = [*_LOCATIONS]


def __getattr__(name):
    # Imported on first use so that `import vitpose` stays light and each layer
    # loads only what it needs.
    if name in _LOCATIONS:
        return getattr(importlib.import_module(_LOCATIONS[name]), name)
    if name in SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
