"""ViT backbone, heatmap heads, the ViTPose model and checkpoint interop."""

from vitpose import lazy_exports

# Imported on first use, so that `import vitpose` stays light and each layer loads only what it needs;
# the submodules by name too (`vitpose.models.hub`).
__all__, __getattr__ = lazy_exports(__name__, {
    "vitpose.models.vit": ["VisionTransformer", "vit"],
    "vitpose.models.heads": ["ClassicHead", "SimpleHead", "heads"],
    "vitpose.models.vitpose": ["ViTPose", "build_model", "flip_test", "MODEL_SIZES", "vitpose"],
    "vitpose.models.checkpoint": ["load_weights", "save_weights", "convert_state_dict", "checkpoint"],
    "vitpose.models.spec": ["ModelSpec", "spec"],
    "vitpose.models.hub": ["hub"],
})
