"""Keypoint <-> heatmap codecs (numpy, plus a batched torch encode), the codec by name, the flip
test's average and the decode to image pixels. Knows nothing of models or files."""

from vitpose import lazy_exports

# Imported on first use, so that `import vitpose` stays light and each layer loads only what it needs.
__all__, __getattr__ = lazy_exports(__name__, {
    "vitpose.codecs.udp": ["UDPHeatmap"],
    "vitpose.codecs.msra": ["MSRAHeatmap"],
    "vitpose.codecs.udp_torch": ["udp_encode_torch"],
    "vitpose.codecs.flip": ["flip_heatmaps", "flip_average"],
    "vitpose.codecs.choice": ["build_codec", "codec_class"],
    "vitpose.codecs.decode": ["crop_to_image", "decode_to_image", "instance_scores"],
})
