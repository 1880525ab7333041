"""Training and evaluation loops, the recipe (optimizer groups, schedule) and run plumbing."""

import importlib

_LOCATIONS = {
    "param_groups": "vitpose.engine.optim",
    "mmpose_name": "vitpose.engine.optim",
    "load_config": "vitpose.config",
    "Config": "vitpose.config",
    "ConfigError": "vitpose.config",
    "predict": "vitpose.engine.evaluate",
    "evaluate_model": "vitpose.engine.evaluate",
    "Telemetry": "vitpose.engine.telemetry",
    "init_distributed": "vitpose.engine.distributed",
}
__all__ = [*_LOCATIONS]


def __getattr__(name):
    # Imported on first use so that `import vitpose` stays light and each layer
    # loads only what it needs.
    if name in _LOCATIONS:
        return getattr(importlib.import_module(_LOCATIONS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
