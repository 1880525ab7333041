"""ViT backbone, heatmap heads, the ViTPose model, its spec, weight files in every layout, and the
one door from a model name, an HF repo id or a weights file to a loaded model (`loading`)."""

from vitpose import lazy_exports

# Imported on first use, so that `import vitpose` stays light and each layer loads only what it needs;
# the submodules by name too (`vitpose.models.loading`).
__all__, __getattr__ = lazy_exports(__name__, {
    "vitpose.models.vit": ["VisionTransformer", "vit"],
    "vitpose.models.heads": ["ClassicHead", "SimpleHead", "heads"],
    "vitpose.models.vitpose": ["ViTPose", "build_model", "flip_test", "MODEL_SIZES", "vitpose"],
    "vitpose.models.spec": ["ModelSpec", "spec"],
    "vitpose.models.checkpoint": ["save_weights", "read_weights", "checkpoint"],
    "vitpose.models.layouts": ["convert_state_dict", "infer_model_spec", "layouts"],
    "vitpose.models.wrappers": ["unwrap_model", "wrappers"],
    "vitpose.models.loading": ["load_weights", "open_model", "loading"],
    "vitpose.models.transfer": ["transfer"],
})
