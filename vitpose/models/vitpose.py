"""ViTPose = ViT backbone + heatmap head; the size table, `build_model` and `flip_test`."""

import torch
from torch import nn

from vitpose.coco_meta import FLIP_INDICES
from vitpose.codecs.flip import flip_average, flip_heatmaps
from vitpose.models.heads import ClassicHead, SimpleHead
from vitpose.models.vit import VisionTransformer

# docs/model.md §1.1. drop_path_rate is the training default of each size's config.
MODEL_SIZES = {
    # The distillation student (docs/distill.md): half of S's width (a quarter of its compute per block), no drop path.
    "vitpose-t": dict(embed_dim=192, depth=12, num_heads=3, drop_path_rate=0.0),
    "vitpose-s": dict(embed_dim=384, depth=12, num_heads=12, drop_path_rate=0.1),
    "vitpose-b": dict(embed_dim=768, depth=12, num_heads=12, drop_path_rate=0.3),
    "vitpose-l": dict(embed_dim=1024, depth=24, num_heads=16, drop_path_rate=0.5),
    "vitpose-h": dict(embed_dim=1280, depth=32, num_heads=16, drop_path_rate=0.55),
    # The smallest student (simple decoder, int8 without the flip test): the size that kept RTMPose-t's
    # people/s through rtmlib with a margin at 1 and 8 people on 2 threads, where the fixed costs of a
    # one-person pass weigh most (benchmarks/bench_predict.py --speed-peers; against RTMPose-t with 1 /
    # 8 people: 96 wide x 8 deep 1.65x / 1.9x, 128 x 6 1.12x / 1.7x, 128 x 8 0.88x / 1.59x). About 0.29 G
    # multiply-adds a crop (RTMPose-t: 0.36 G).
    "vitpose-n": dict(embed_dim=96, depth=8, num_heads=2, drop_path_rate=0.1),
}
DECODERS = ("classic", "simple")


class ViTPose(nn.Module):
    """Top-down pose model: normalised RGB crops (N, 3, 256, 192) -> heatmaps (N, K, 64, 48)."""

    def __init__(self, backbone: VisionTransformer, head: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward_features(self, x):
        return self.backbone(x)

    def forward_head(self, features):
        return self.head(features)

    def forward(self, x):
        return self.forward_head(self.forward_features(x))

    @torch.jit.ignore
    def no_weight_decay(self):
        return {"backbone." + name for name in self.backbone.no_weight_decay()}

    @torch.jit.ignore
    def group_matcher(self, coarse=False):
        # timm semantics: stem first, then one group per block (or all blocks together when
        # coarse); the final norm after the last block; anything unmatched (the head) goes last.
        return dict(
            stem=r"^backbone\.(?:pos_embed|patch_embed)",  # no capture: timm reads captures as numbers
            blocks=r"^backbone\.blocks\.(\d+)" if coarse else [
                (r"^backbone\.blocks\.(\d+)", None),
                (r"^backbone\.norm", (99999,)),
            ],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable=True):
        self.backbone.set_grad_checkpointing(enable)


def _canonical_name(name):
    key = name.lower().replace("_", "-")
    if key in MODEL_SIZES:
        return key
    if "vitpose-" + key in MODEL_SIZES:  # "s", "b", ...
        return "vitpose-" + key
    raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODEL_SIZES)}")


def build_model(name, decoder="classic", num_keypoints=17, **kwargs):
    """Build `vitpose-t|s|b|l|h` with the `classic` or `simple` decoder.

    Extra keyword arguments go to the backbone (drop_path_rate, grad_checkpointing, img_size,
    depth, embed_dim, num_heads, mlp_ratio, ...) except `deconv_channels`, which goes to the
    classic head.
    """
    cfg = dict(MODEL_SIZES[_canonical_name(name)])
    deconv_channels = kwargs.pop("deconv_channels", (256, 256))
    cfg.update(kwargs)
    backbone = VisionTransformer(**cfg)
    if decoder == "classic":
        head = ClassicHead(backbone.embed_dim, num_keypoints, deconv_channels=deconv_channels)
    elif decoder == "simple":
        head = SimpleHead(backbone.embed_dim, num_keypoints)
    else:
        raise ValueError(f"unknown decoder {decoder!r}; choose one of {DECODERS}")
    return ViTPose(backbone, head)


def _flip_batch(model, x, flip_indices, caller):
    """model(x) and model(mirrored x) as one batch of 2N, with the flip order checked against K."""
    flip_indices = list(FLIP_INDICES if flip_indices is None else flip_indices)
    n = x.shape[0]
    both = model(torch.cat([x, x.flip(-1)]))
    if len(flip_indices) != both.shape[1]:
        raise ValueError(f"{caller}: the model predicts {both.shape[1]} heatmaps but {len(flip_indices)} flip "
                         "indices were given (None means COCO's 17): pass the skeleton's, e.g. "
                         "vitpose.data.dataset_info(name).flip_indices")
    # Slices, not `chunk(2)`: torch.export proves `chunk` of 2N rows specialises N.
    return both[:n], both[n:], flip_indices


def flip_test(model, x, flip_indices=None, shift=False):
    """Average of model(x) and the heatmaps of the mirrored crop flipped back.

    Both crops run as one batch; `flip_indices` (None: COCO-17) reorders left/right channels:
    one entry per heatmap channel (a dataset's `DatasetInfo.flip_indices`). `shift`: move the
    flipped-back maps one cell right (the MSRA codec's alignment, `codec.flip_shift`; UDP: no
    shift). The average is `vitpose.codecs.flip_average`, the one definition the ONNX runtime
    and exported graphs use too; this function is itself what `vitpose export --flip-test` bakes in.
    """
    plain, mirrored, flip_indices = _flip_batch(model, x, flip_indices, "flip_test")
    return flip_average(plain, mirrored, flip_indices, shift)


def flip_views(model, x, flip_indices=None, shift=False):
    """The flip test and its two views from one batch of 2N, as (averaged, plain, flipped_back).

    averaged: exactly `flip_test(model, x, flip_indices, shift)` (`flip_average` of the same two
    halves); plain: model(x); flipped_back: the mirrored crops' heatmaps turned back by
    `vitpose.codecs.flip_heatmaps` (the flip test's own step). Where plain and flipped_back
    disagree the model is unsure of left and right (`vitpose select` ranks frames by it).
    """
    plain, mirrored, flip_indices = _flip_batch(model, x, flip_indices, "flip_views")
    return flip_average(plain, mirrored, flip_indices, shift), plain, flip_heatmaps(mirrored, flip_indices, shift)


__all__ = ["DECODERS", "MODEL_SIZES", "ViTPose", "build_model", "flip_test", "flip_views"]
