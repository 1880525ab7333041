"""Which codec a model uses, by name: the one place a config, a `ModelSpec` or an exported file's
spec turns into a codec object (`build_codec`).

Config spelling (`model.codec`): "udp" | "msra"; spec spelling (`ModelSpec.codec`, the class
name): "UDPHeatmap" | "MSRAHeatmap". Both are accepted everywhere.
"""

from .msra import MSRAHeatmap
from .udp import UDPHeatmap

__all__ = ["CODEC_CLASSES", "CONFIG_NAMES", "build_codec", "codec_class", "config_name"]

CODEC_CLASSES = {"UDPHeatmap": UDPHeatmap, "MSRAHeatmap": MSRAHeatmap}
CONFIG_NAMES = {"udp": "UDPHeatmap", "msra": "MSRAHeatmap"}


def codec_class(name: str):
    """The codec class of a config name ("udp" / "msra") or a spec name ("UDPHeatmap" / ...)."""
    key = CONFIG_NAMES.get(str(name).lower(), name) if isinstance(name, str) else name
    if key not in CODEC_CLASSES:
        raise ValueError(f"unknown codec {name!r}; choose one of {sorted(CONFIG_NAMES)} "
                         f"(or {sorted(CODEC_CLASSES)})")
    return CODEC_CLASSES[key]


def config_name(name: str) -> str:
    """"udp" / "msra" of either spelling."""
    cls = codec_class(name)
    return next(short for short, full in CONFIG_NAMES.items() if CODEC_CLASSES[full] is cls)


def build_codec(name: str, input_size=(192, 256), heatmap_size=(48, 64), sigma: float = 2.0):
    """The codec `name` (either spelling) for crops of `input_size` and heatmaps of `heatmap_size`
    ((w, h) each) with Gaussian `sigma` (heatmap cells). MSRA is the plain (not DARK) codec."""
    return codec_class(name)(tuple(input_size), tuple(heatmap_size), float(sigma))
