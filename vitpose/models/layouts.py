"""Weights in every layout that is published, as this project's names (docs/model.md §3).

Layouts, detected from the key names:
- own      this project (timm names): `backbone.blocks.i.*`, `backbone.norm.*`, `head.*`
- mmpose1x MMPose 1.x / mmpretrain: `backbone.layers.i.ln1`, `ffn.layers.0.0`, `head.*`
- official ViTPose (mmpose 0.x): `backbone.blocks.i.*`, `backbone.last_norm.*`, `keypoint_head.*`,
           pos_embed with 193 rows whose row 0 is added to every token (folded in, never dropped)
- hf       transformers VitPose: `backbone.encoder.layer.i.*`, split query/key/value, 193 rows
- backbone-only files (MAE pre-training and the like): the same backbone names without the
           `backbone.` prefix. They initialise the backbone: the head keeps its init, the class
           token is skipped, the grid embedding is resized to the model's grid, a 14x14 patch
           kernel is zero-padded to 16x16, and MAE's final `norm` is not loaded (the official
           ViTPose repo does not load it either).
- ViTPose+ (official or HF `vitpose-plus-*`): the official or HF layout whose MLPs are a mixture of
           experts (`mlp.fc2` shared, `mlp.experts.{i}` per dataset) and, in the official files,
           one head per dataset (`keypoint_head` for COCO, `associate_keypoint_heads.{i-1}`).
           `expert=` picks one dataset: its expert rows are appended to each fc2 and its head is
           kept, which gives the plain model (docs/model.md §5).

Three parts: renaming a state dict of any layout to this project's names (`convert_state_dict`),
one ViTPose+ expert (`select_expert`), and the model a file's tensor shapes describe
(`infer_model_spec`, the one shape reader). Reading files is `vitpose.models.checkpoint`'s, fitting
a converted state dict into a model `vitpose.models.loading`'s.
"""

import math
import re
from collections import namedtuple

import torch
import torch.nn.functional as F

from vitpose.models.checkpoint import CheckpointError, read_state_dict
from vitpose.models.spec import EXPERTS, ModelSpec, SpecError, expert_name
from vitpose.models.vit import resize_pos_embed

__all__ = ["MMPOSE1X_NAMES", "VITPOSE_PLUS_EXPERTS", "ExpertChoice", "convert_layout", "convert_state_dict",
           "detect_layout", "expert_note", "infer_model_spec", "is_vitpose_plus", "own_layout_shapes", "rename_rules",
           "select_expert"]

# The one table of MMPose 1.x backbone names -> this project's, without the `backbone.` prefix
# (`{i}`: the block index). Loading MMPose files renames one way, `engine.optim.mmpose_name` the other.
MMPOSE1X_NAMES = [
    ("patch_embed.projection.", "patch_embed.proj."),
    ("layers.{i}.ln1.", "blocks.{i}.norm1."),
    ("layers.{i}.ln2.", "blocks.{i}.norm2."),
    ("layers.{i}.ffn.layers.0.0.", "blocks.{i}.mlp.fc1."),
    ("layers.{i}.ffn.layers.1.", "blocks.{i}.mlp.fc2."),
    ("layers.{i}.attn.", "blocks.{i}.attn."),
    ("ln1.", "norm."),
]


def rename_rules(names, prefix: str = "", reverse: bool = False) -> list[tuple[str, str]]:
    """(regex, replacement) rules, first match wins, from (from, to) name prefixes with `{i}`;
    `reverse` renames to -> from; `prefix` is put before both sides."""
    rules = []
    for source, target in names:
        if reverse:
            source, target = target, source
        pattern = "^" + re.escape(prefix + source).replace(re.escape("{i}"), r"(\d+)")
        rules.append((pattern, (prefix + target).replace("{i}", r"\1")))
    return rules


# Backbone renames, applied to names without the `backbone.` prefix, first match wins.
MMPOSE1X_BACKBONE = rename_rules(MMPOSE1X_NAMES)
OFFICIAL_BACKBONE = [(r"^last_norm\.", "norm.")]
HF_BACKBONE = [
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^encoder\.layer\.(\d+)\.layernorm_before\.", r"blocks.\1.norm1."),
    (r"^encoder\.layer\.(\d+)\.layernorm_after\.", r"blocks.\1.norm2."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"blocks.\1.attn.proj."),
    # query/key/value are renamed here and concatenated into qkv afterwards
    (r"^encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.", r"blocks.\1.attn.\2."),
    (r"^encoder\.layer\.(\d+)\.mlp\.", r"blocks.\1.mlp."),
    (r"^layernorm\.", "norm."),
]
HF_HEAD = [
    (r"^deconv1\.", "deconv_layers.0."),
    (r"^batchnorm1\.", "deconv_layers.1."),
    (r"^deconv2\.", "deconv_layers.3."),
    (r"^batchnorm2\.", "deconv_layers.4."),
    (r"^conv\.", "final_layer."),
]
VITPOSE_PLUS_EXPERTS = EXPERTS  # the one list (vitpose.models.spec), under its old name
MOE_EXPERT_KEY = re.compile(r"\.mlp\.experts\.(\d+)\.(weight|bias)$")
MOE_SHARED_KEY = re.compile(r"\.mlp\.fc2\.(weight|bias)$")
OFFICIAL_HEAD, OFFICIAL_EXTRA_HEADS = "keypoint_head.", "associate_keypoint_heads."

# Keys with no counterpart in this model: skipped and reported, never an error.
SKIPPED_BACKBONE = re.compile(r"^(cls_token|mask_token|dist_token|fc_norm\.|decoder.*|head\.)")


# ----------------------------------------------------------------------------------------------
# ViTPose+ (mixture of experts): one dataset's expert and head


ExpertChoice = namedtuple("ExpertChoice", "name index num_experts heads")


def is_vitpose_plus(state_dict) -> bool:
    """Whether a state dict holds ViTPose+ mixture-of-experts MLPs (official or HF names)."""
    return any(MOE_EXPERT_KEY.search(n) for n in state_dict)


def _expert_choices(num_experts: int) -> str:
    names = VITPOSE_PLUS_EXPERTS[:num_experts]
    return ", ".join(f"{name!r} ({i})" for i, name in enumerate(names))


def _expert_index(expert, num_experts: int, origin: str) -> int:
    """The expert's index from a dataset name (any case, aliases) or an index (0..num_experts-1)."""
    try:
        return EXPERTS.index(expert_name(expert, num_experts, origin))
    except SpecError as e:
        raise CheckpointError(str(e)) from None


def select_expert(state_dict, expert, origin="weights mapping"):
    """(plain state dict, ExpertChoice or None): one dataset's weights of a ViTPose+ state dict.

    Each MLP's output layer becomes `fc2` (the shared rows) followed by the chosen expert's rows,
    as the mixture computes it for that dataset (docs/model.md §5); the other experts are dropped.
    Official files keep the chosen dataset's head as `keypoint_head` (index 0: COCO's own
    `keypoint_head`, index i > 0: `associate_keypoint_heads.{i-1}`); HF files have one head, which
    stays. A state dict without experts is returned as it is when `expert` is None.
    """
    expert_keys = sorted(n for n in state_dict if MOE_EXPERT_KEY.search(n))
    extra_heads = sorted(n for n in state_dict if n.startswith(OFFICIAL_EXTRA_HEADS))
    if not expert_keys:
        if expert is not None:
            raise CheckpointError(f"{origin}: expert={expert!r} was given, but this is not a ViTPose+ "
                                  f"(mixture-of-experts) checkpoint: no `mlp.experts.*` weights in it")
        return state_dict, None
    num_experts = 1 + max(int(MOE_EXPERT_KEY.search(n).group(1)) for n in expert_keys)
    heads = "official" if extra_heads else "single"
    if expert is None:
        example = ", ".join([expert_keys[0]] + extra_heads[:1])
        raise CheckpointError(
            f"{origin} is a ViTPose+ multi-dataset checkpoint ({num_experts} mixture-of-experts MLPs per block, "
            f"e.g. {example}); choose one dataset with expert=: {_expert_choices(num_experts)}")
    index = _expert_index(expert, num_experts, origin)
    out = {n: v for n, v in state_dict.items() if not MOE_EXPERT_KEY.search(n) and not n.startswith(OFFICIAL_EXTRA_HEADS)}
    for name in [n for n in out if MOE_SHARED_KEY.search(n)]:
        part = name.replace(".mlp.fc2.", f".mlp.experts.{index}.")
        if part not in state_dict:
            raise CheckpointError(f"{origin}: {name} has no expert {index} ({part} is missing)")
        out[name] = torch.cat([state_dict[name], state_dict[part]], dim=0)
    if heads == "official" and index > 0:
        prefix = f"{OFFICIAL_EXTRA_HEADS}{index - 1}."
        chosen = {n[len(prefix):]: v for n, v in state_dict.items() if n.startswith(prefix)}
        if not chosen:
            raise CheckpointError(f"{origin}: no head for expert {VITPOSE_PLUS_EXPERTS[index]!r} "
                                  f"(no {prefix}* weights)")
        out = {n: v for n, v in out.items() if not n.startswith(OFFICIAL_HEAD)}
        out.update({OFFICIAL_HEAD + n: v for n, v in chosen.items()})
    return out, ExpertChoice(VITPOSE_PLUS_EXPERTS[index], index, num_experts, heads)


def expert_note(choice: ExpertChoice) -> str:
    head = {"official": "its own head", "single": "the file's only head (an HF vitpose-plus file: COCO's)"}
    return (f"ViTPose+ expert {choice.name!r} ({choice.index} of {choice.num_experts}) merged into each MLP, "
            f"with {head[choice.heads]}")


# ----------------------------------------------------------------------------------------------
# Layout detection and conversion


def detect_layout(state_dict):
    """('own' | 'mmpose1x' | 'official' | 'hf' | 'mae', prefixed): prefixed=False for
    backbone-only files whose keys lack the `backbone.` prefix."""
    names = list(state_dict)
    prefixed = any(n.startswith(("backbone.", "keypoint_head.")) for n in names)
    body = [n[len("backbone."):] for n in names if n.startswith("backbone.")] if prefixed else names
    if any(n.startswith(("encoder.layer.", "embeddings.")) for n in body):
        return "hf", prefixed
    if any(n.startswith(("layers.", "patch_embed.projection.", "ln1.")) for n in body):
        return "mmpose1x", prefixed
    if any(n.startswith("last_norm.") for n in body) or any(n.startswith("keypoint_head.") for n in names):
        return "official", prefixed
    if not prefixed and ("cls_token" in state_dict or _has_token_row(state_dict.get("pos_embed"))):
        return "mae", prefixed  # MAE / timm ViT: class token, square grid, encoder `norm`
    return "own", prefixed


def _has_token_row(pos):
    return pos is not None and pos.ndim == 3 and math.isqrt(pos.shape[1] - 1) ** 2 == pos.shape[1] - 1


def _rename(name, rules):
    for pattern, repl in rules:
        new, n = re.subn(pattern, repl, name)
        if n:
            return new
    return name


def _merge_hf_qkv(backbone):
    for name in [n for n in backbone if re.search(r"\.attn\.query\.(weight|bias)$", n)]:
        stem, kind = name.rsplit(".attn.query.", 1)
        parts = [f"{stem}.attn.{p}.{kind}" for p in ("query", "key", "value")]
        if all(p in backbone for p in parts):
            backbone[f"{stem}.attn.qkv.{kind}"] = torch.cat([backbone.pop(p) for p in parts], 0)


def _grid_of(num_tokens, model_grid):
    """Guess the (h, w) patch grid of N tokens: the model's aspect ratio if it fits, else square."""
    mh, mw = model_grid
    h = math.isqrt(round(num_tokens * mh / mw))
    for cand in (h, h + 1):
        if cand > 0 and num_tokens % cand == 0 and cand * mw == (num_tokens // cand) * mh:
            return cand, num_tokens // cand
    side = math.isqrt(num_tokens)
    return (side, side) if side * side == num_tokens else None


def _adapt_pos_embed(pos, model_tokens, model_grid, notes):
    """Fold an extra leading (class-token) row into the grid rows, then resize the grid."""
    n = pos.shape[1]
    if pos.ndim != 3 or n == model_tokens:
        return pos
    if n - 1 == model_tokens or (_grid_of(n, model_grid) is None and _grid_of(n - 1, model_grid) is not None):
        # The official ViT and HF add row 0 to every patch token; MMPose's loader drops it
        # instead, which silently changes a fine-tuned model. Fold it in.
        pos = pos[:, 1:] + pos[:, :1]
        notes.append(f"pos_embed: extra row 0 of {n} folded into the other {n - 1}")
        n -= 1
    src_grid = _grid_of(n, model_grid)
    if n != model_tokens and src_grid is not None:
        pos = resize_pos_embed(pos, src_grid, model_grid)
        notes.append(f"pos_embed: grid {src_grid[0]}x{src_grid[1]} resized (bicubic) to "
                     f"{model_grid[0]}x{model_grid[1]}")
    return pos


def _adapt_patch_kernel(weight, model_weight, notes):
    k, mk = weight.shape[-1], model_weight.shape[-1]
    if weight.ndim != 4 or weight.shape[:2] != model_weight.shape[:2] or k >= mk or (mk - k) % 2:
        return weight
    p = (mk - k) // 2
    notes.append(f"patch_embed: {k}x{k} kernel zero-padded to {mk}x{mk} ({p} px each side)")
    return F.pad(weight, (p, p, p, p))


def _split_backbone_head(state_dict, prefixed):
    backbone, head, other = {}, {}, {}
    for name, value in state_dict.items():
        if not prefixed:
            backbone[name] = value
        elif name.startswith("backbone."):
            backbone[name[len("backbone."):]] = value
        elif name.startswith(("head.", "keypoint_head.")):
            head[name.split(".", 1)[1]] = value
        else:
            other[name] = value
    return backbone, head, other


def convert_layout(state_dict, model):
    """(own-layout state dict for `model`, layout, skipped names, notes, backbone_only)."""
    layout, prefixed = detect_layout(state_dict)
    backbone, head, other = _split_backbone_head(state_dict, prefixed)
    # Top-level keys outside backbone/head: MMPose's preprocessor constants are harmless;
    # anything else (e.g. ViTPose+'s extra dataset heads) stays, to be reported as unexpected.
    skipped = sorted(n for n in other if n.startswith("data_preprocessor."))
    notes = []
    rules = {"mmpose1x": MMPOSE1X_BACKBONE, "official": OFFICIAL_BACKBONE, "hf": HF_BACKBONE}.get(layout, [])
    backbone = {_rename(n, rules): v for n, v in backbone.items()}
    if layout == "hf":
        _merge_hf_qkv(backbone)
        head = {_rename(n, HF_HEAD): v for n, v in head.items()}
    for name in [n for n in backbone if SKIPPED_BACKBONE.match(n)]:
        backbone.pop(name)
        skipped.append(("backbone." if prefixed else "") + name)
    if layout == "mae":
        # MAE's encoder `norm` is not ViTPose's last norm: the official repo does not load it
        # (the names differ there), so the final LayerNorm keeps its (1, 0) init.
        for name in [n for n in backbone if n.startswith("norm.")]:
            backbone.pop(name)
            skipped.append(name)

    own_backbone = _model_backbone(model)
    if own_backbone is not None:
        if "pos_embed" in backbone:
            backbone["pos_embed"] = _adapt_pos_embed(
                backbone["pos_embed"], own_backbone.pos_embed.shape[1], own_backbone.patch_embed.grid_size, notes
            )
        if "patch_embed.proj.weight" in backbone:
            backbone["patch_embed.proj.weight"] = _adapt_patch_kernel(
                backbone["patch_embed.proj.weight"], own_backbone.patch_embed.proj.weight, notes
            )

    if hasattr(model, "backbone"):
        converted = {"backbone." + n: v for n, v in backbone.items()}
        converted.update({"head." + n: v for n, v in head.items()})
        converted.update({n: v for n, v in other.items() if n not in skipped})
    else:
        converted = dict(backbone)
        skipped += ["head." + n for n in head]
    return converted, layout, sorted(skipped), notes, not prefixed


def _model_backbone(model):
    if hasattr(model, "backbone"):
        return model.backbone
    if hasattr(model, "patch_embed") and hasattr(model, "pos_embed"):
        return model
    return None


def convert_state_dict(state_dict, model, expert=None):
    """Map a state dict of any supported layout onto `model`'s own parameter names.

    Wrappers are unwrapped, a ViTPose+ file is reduced to `expert`'s weights, the layout is
    detected, names are translated, HF's q/k/v are concatenated, a 193-row pos_embed is folded to
    192 rows (and a backbone-only grid resized), and keys without a counterpart (class token, MAE's
    norm and decoder) are dropped. Shapes are not checked here; `load_weights` does that.
    """
    state_dict, origin = read_state_dict(state_dict)
    return convert_layout(select_expert(state_dict, expert, origin)[0], model)[0]


# ----------------------------------------------------------------------------------------------
# Telling the model from the file: size, decoder and keypoints from tensor shapes

PATCH_SIZE = 16  # every published ViTPose; the grid below assumes it with 2 px padding
DEFAULT_GRID = (16, 12)  # (rows, columns) of a 256x192 input


def own_layout_shapes(state_dict, layout=None, prefixed=None):
    """{own parameter name: shape} of a file of any layout (names translated, HF q/k/v merged);
    layout and prefixed: `detect_layout`'s answer (found here when not given)."""
    if layout is None:
        layout, prefixed = detect_layout(state_dict)
    backbone, head, _ = _split_backbone_head(state_dict, prefixed)
    rules = {"mmpose1x": MMPOSE1X_BACKBONE, "official": OFFICIAL_BACKBONE, "hf": HF_BACKBONE}.get(layout, [])
    backbone = {_rename(n, rules): v for n, v in backbone.items()}
    if layout == "hf":
        _merge_hf_qkv(backbone)
        head = {_rename(n, HF_HEAD): v for n, v in head.items()}
    shapes = {"backbone." + n: tuple(v.shape) for n, v in backbone.items()}
    shapes.update({"head." + n: tuple(v.shape) for n, v in head.items()})
    return shapes


def _size_of(embed_dim, origin):
    from vitpose.models.vitpose import MODEL_SIZES

    for name, size in MODEL_SIZES.items():
        if size["embed_dim"] == embed_dim:
            return name, size
    known = ", ".join(f"{s['embed_dim']} ({n})" for n, s in MODEL_SIZES.items())
    raise CheckpointError(f"{origin}: cannot tell the model size: embed dim {embed_dim} is none of "
                          f"ViTPose's ({known}); give the training config instead")


def _img_size_of(num_tokens, origin):
    """(h, w) input size of a grid of `num_tokens` patches (the 4:3 aspect of 256x192 if it fits)."""
    grid = _grid_of(num_tokens, DEFAULT_GRID)
    if grid is None:
        grid = _grid_of(num_tokens - 1, DEFAULT_GRID)  # official / HF: a leading class-token row
    if grid is None:
        raise CheckpointError(f"{origin}: cannot tell the input size from a position embedding of "
                              f"{num_tokens} tokens; give the training config instead")
    return grid[0] * PATCH_SIZE, grid[1] * PATCH_SIZE


def infer_model_spec(source, origin: str | None = None) -> ModelSpec:
    """The ModelSpec of a ViTPose weights file told from its tensor shapes (the one shape reader).

    `source`: a path or a mapping, of any layout `load_weights` reads (a ViTPose+ file after
    `select_expert`). The embed dim names the size (S/B/L/H) and with it the head count (no shape
    holds it: S and B 12, L and H 16); block count, MLP width, deconv widths, the position-embedding
    grid (input size) and K are read; `head.deconv_layers.*` means the classic decoder. Codec,
    normalisation and sigma are ViTPose's (UDP, sigma 2); the skeleton is not in the shapes (None).
    Raises CheckpointError for a backbone-only file (no head) or shapes no ViTPose has.
    """
    state_dict, read_origin = read_state_dict(source)
    origin = origin or read_origin
    layout, prefixed = detect_layout(state_dict)
    if not prefixed or layout == "mae":
        raise CheckpointError(f"{origin}: a backbone-only file ({layout} layout, no keypoint head): "
                              f"the decoder and keypoint count are not in it; give the training config")
    shapes = own_layout_shapes(state_dict, layout, prefixed)
    patch = shapes.get("backbone.patch_embed.proj.weight")
    final = shapes.get("head.final_layer.weight")
    if patch is None or final is None:
        missing = "backbone.patch_embed.proj.weight" if patch is None else "head.final_layer.weight"
        raise CheckpointError(f"{origin} ({layout} layout): no {missing} (after renaming to this "
                              f"project's names); this is not a ViTPose checkpoint")
    name, size = _size_of(patch[0], origin)
    depth = len({m.group(1) for n in shapes for m in [re.match(r"backbone\.blocks\.(\d+)\.", n)] if m})
    fc1 = shapes.get("backbone.blocks.0.mlp.fc1.weight")
    h, w = DEFAULT_GRID[0] * PATCH_SIZE, DEFAULT_GRID[1] * PATCH_SIZE
    if "backbone.pos_embed" in shapes:
        h, w = _img_size_of(shapes["backbone.pos_embed"][1], origin)
    deconvs = sorted((int(m.group(1)), s) for n, s in shapes.items()
                     for m in [re.match(r"head\.deconv_layers\.(\d+)\.weight$", n)] if m and len(s) == 4)
    decoder = "classic" if deconvs else "simple"
    channels = tuple(s[1] for _, s in deconvs) or (256, 256)  # ConvTranspose2d weight: (in, out, kh, kw)
    # Heatmaps: the patch grid times the head's upsampling (2 per deconv; the simple head's x4).
    factor = 2 ** len(channels) if decoder == "classic" else 4
    return ModelSpec(size=name, decoder=decoder, num_keypoints=int(final[0]), embed_dim=int(patch[0]), depth=depth,
                     num_heads=size["num_heads"], mlp_ratio=fc1[0] / patch[0] if fc1 is not None else 4.0,
                     patch_size=PATCH_SIZE, deconv_channels=channels, input_size=(w, h),
                     heatmap_size=(w // PATCH_SIZE * factor, h // PATCH_SIZE * factor), origin=f"shapes ({layout} layout)")


