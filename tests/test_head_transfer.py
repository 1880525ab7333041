"""Fine-tuning from a source with another decoder (vitpose/models/transfer.py's final-layer guard).

The classic decoder ends in a 1x1 convolution over its last deconvolution's channels, the simple
decoder in a 3x3 convolution over the backbone's: a source final layer of the other decoder has
another input width or kernel, so no channel of it can seed the model's. The backbone still
transfers whole; every heatmap channel keeps the model's own initialisation, and the report says
why. Without the shape guard the copy either crashes (a 3x3 kernel into a 1x1 one) or, worse,
broadcasts a 1x1 kernel over a 3x3 one when the widths happen to agree: a silent wrong init.
"""

import pytest
import torch
from test_finetune import K7, cfg_for, randomise

from vitpose.coco_meta import KEYPOINT_NAMES as COCO
from vitpose.engine.finetune import init_from_source
from vitpose.models.checkpoint import save_weights
from vitpose.models.transfer import transfer_weights
from vitpose.models.vitpose import build_model

EMBED = 64


def tiny(decoder, num_keypoints, seed, deconv_channels=(32, 32)):
    torch.manual_seed(seed)
    extra = {"deconv_channels": deconv_channels} if decoder == "classic" else {}
    return build_model("vitpose-s", decoder, num_keypoints, img_size=(128, 96), embed_dim=EMBED, depth=2,
                       num_heads=4, **extra)


def check_backbone_whole_and_head_fresh(target, fresh_head, source_state, report):
    for name, tensor in target.state_dict().items():
        if name.startswith("backbone."):
            assert torch.equal(tensor, source_state[name]), name
    for name, tensor in fresh_head.items():  # the whole final layer is the model's own initialisation
        assert torch.equal(target.state_dict()[name], tensor), name
    assert report.copied == [] and report.fresh == list(K7.keypoint_names)
    assert any("another decoder" in note for note in report.notes)


@pytest.mark.parametrize(("source_decoder", "target_decoder", "deconv"), [
    ("simple", "classic", (32, 32)),   # a 3x3 kernel over 64 channels into a 1x1 over 32: crashes unguarded
    ("classic", "simple", (32, 32)),   # a 1x1 kernel over 32 channels into a 3x3 over 64: crashes unguarded
    ("classic", "simple", (EMBED, EMBED)),  # 1x1 over 64 into 3x3 over 64: broadcasts silently unguarded
], ids=["simple-into-classic", "classic-into-simple", "classic-into-simple-same-width"])
def test_a_source_of_another_decoder_seeds_the_backbone_and_no_heatmap_channel(tmp_path, source_decoder,
                                                                               target_decoder, deconv):
    source = randomise(tiny(source_decoder, 17, 0, deconv), 1)
    path = save_weights(source, tmp_path / f"{source_decoder}.safetensors")
    target = tiny(target_decoder, 7, 2, deconv)
    fresh_head = {n: t.clone() for n, t in target.state_dict().items() if n.startswith("head.final_layer.")}
    # the fine-tuning door (train.py's --init): the source read back from its file
    report = init_from_source(target, cfg_for(path, decoder=target_decoder), K7, None, is_main=False)
    check_backbone_whole_and_head_fresh(target, fresh_head, source.state_dict(), report)


def test_transfer_weights_alone_keeps_the_guard():
    """The same rule at the function the door calls (names known, shared keypoints present)."""
    source = randomise(tiny("simple", 17, 0), 1)
    target = tiny("classic", 7, 2)
    fresh_head = {n: t.clone() for n, t in target.state_dict().items() if n.startswith("head.final_layer.")}
    report = transfer_weights(target, source.state_dict(), COCO, K7.keypoint_names)
    check_backbone_whole_and_head_fresh(target, fresh_head, source.state_dict(), report)
