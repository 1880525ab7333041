"""Training and evaluation loops, the recipe (optimizer groups, schedule) and run plumbing."""

from vitpose import lazy_exports

# Imported on first use, so that `import vitpose` stays light and each layer loads only what it needs.
__all__, __getattr__ = lazy_exports(__name__, {
    "vitpose.engine.optim": ["param_groups", "mmpose_name"],
    "vitpose.config": ["load_config", "Config", "ConfigError"],
    "vitpose.engine.evaluate": ["predict", "evaluate_model"],
    "vitpose.engine.telemetry": ["Telemetry"],
    "vitpose.engine.distributed": ["init_distributed"],
})
