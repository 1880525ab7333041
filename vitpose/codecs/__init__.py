"""Keypoint <-> heatmap codecs (numpy, plus a batched torch encode). Knows nothing of models or files."""

import importlib

_LOCATIONS = {
    "UDPHeatmap": "vitpose.codecs.udp",
    "MSRAHeatmap": "vitpose.codecs.msra",
    "udp_encode_torch": "vitpose.codecs.udp_torch",
    "flip_heatmaps": "vitpose.codecs.flip",
}
__all__ = [*_LOCATIONS]


def __getattr__(name):
    # Imported on first use so that `import vitpose` stays light and each layer
    # loads only what it needs.
    if name in _LOCATIONS:
        return getattr(importlib.import_module(_LOCATIONS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
