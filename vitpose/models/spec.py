"""`ModelSpec`: everything needed to rebuild a ViTPose and use it, as plain data.

One spec describes the network (ViT dims, decoder, K), what it eats and gives (input and heatmap
size, pixel normalisation, codec and sigma) and whose keypoints it predicts (the skeleton: names,
flip indices, limbs, sigmas, ... as a plain dict, so that this layer needs nothing of
`vitpose.data`; `vitpose.builders` turns it into a `DatasetInfo`). Every file this project writes
records it as JSON (`ModelSpec.to_json`): training checkpoints (`model_spec`), `save_weights`
safetensors (metadata key `vitpose.model_spec`), ONNX metadata and torch.export extra files.
Files made elsewhere (MMPose, the official release, HF, ViTPose+) get theirs from their tensor
shapes (`vitpose.models.layouts.infer_model_spec`), the HF `config.json`, the named-model table
(`vitpose.hub`) or the ViTPose+ expert.

The ViTPose+ experts (`EXPERTS`, `expert_name`) are listed here once for every caller.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from vitpose.coco_meta import PIXEL_MEAN, PIXEL_STD
from vitpose.codecs.choice import CODEC_CLASSES, build_codec, codec_class
from vitpose.codecs.confidence import CalibrationError, check_calibration
from vitpose.errors import UserError

__all__ = ["EXPERTS", "EXPERT_ALIASES", "METADATA_KEY", "SKELETON_FIELDS", "ModelSpec", "SpecError",
           "check_flip_indices", "expert_name", "spec_of_model"]

METADATA_KEY = "vitpose.model_spec"  # safetensors / ONNX metadata key and checkpoint entry name
FORMAT_VERSION = 1

# ViTPose+ experts in HF's `dataset_index` order (the official `dataset_idx` order too), and the
# other spellings users type for them.
EXPERTS = ("coco", "aic", "mpii", "ap10k", "apt36k", "coco_wholebody")
EXPERT_ALIASES = {"wholebody": "coco_wholebody", "coco-wholebody": "coco_wholebody", "ap-10k": "ap10k",
                  "apt-36k": "apt36k", "ai_challenger": "aic"}

# The fields of `vitpose.data.DatasetInfo` a spec records (its `source` and `defaulted` are not).
# Files written before a skeleton named its metric and detector classes lack those four; the
# DatasetInfo made from such a record fills them as a skeleton file without them does.
SKELETON_FIELDS = ("name", "keypoint_names", "flip_indices", "upper_body_ids", "lower_body_ids",
                   "joint_weights", "sigmas", "skeleton", "keypoint_colors", "link_colors", "annotation_format",
                   "metric", "pck_normalizer", "pck_threshold", "detector_classes")
CODECS = tuple(CODEC_CLASSES)  # "UDPHeatmap", "MSRAHeatmap" (`vitpose.codecs.choice`)


class SpecError(UserError, ValueError):
    """A recorded or given model spec that is malformed or does not describe a ViTPose."""


def expert_name(expert, num_experts: int = len(EXPERTS), origin: str = "expert") -> str:
    """The canonical ViTPose+ expert name of a name (any case, aliases) or an index 0..num_experts-1
    of a file with `num_experts` experts; SpecError names the choices (and the closest name)."""
    names = EXPERTS[:num_experts]
    choices = ", ".join(f"{name!r} ({i})" for i, name in enumerate(names))
    if isinstance(expert, str):
        key = expert.strip().lower()
        key = EXPERT_ALIASES.get(key, key)
        if key in names:
            return key
        close = difflib.get_close_matches(key, [*names, *EXPERT_ALIASES], n=1, cutoff=0.6)
        hint = f" (did you mean {EXPERT_ALIASES.get(close[0], close[0])!r}?)" if close else ""
        raise SpecError(f"{origin}: unknown ViTPose+ expert {expert!r}; the file's experts are {choices}{hint}")
    if isinstance(expert, numbers.Integral) and not isinstance(expert, bool) and 0 <= expert < num_experts:
        return names[int(expert)]
    raise SpecError(f"{origin}: expert={expert!r} is not one of the file's {num_experts} experts: {choices}")


def check_flip_indices(flip_indices, num_keypoints: int, where: str) -> list[int]:
    """The flip order as a list, checked: one entry per keypoint, a set of swaps (a permutation that
    is its own inverse). SpecError starting with `where` otherwise (the rule `DatasetInfo` applies
    to a skeleton file, here without `vitpose.data`, so that the ONNX runtime can use it)."""
    ok = isinstance(flip_indices, (list, tuple)) and all(
        isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in flip_indices)
    if not ok or len(flip_indices) != num_keypoints:
        raise SpecError(f"{where}: flip_indices must be {num_keypoints} keypoint indices, got {flip_indices!r}")
    order = [int(i) for i in flip_indices]
    if sorted(order) != list(range(num_keypoints)) or any(order[j] != i for i, j in enumerate(order)):
        raise SpecError(f"{where}: flip_indices is not a set of swaps (each keypoint mirrors to one whose mirror "
                        f"is it): {order}")
    return order


def _pair(value, what: str) -> tuple[int, int]:
    if not (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v == int(v)
                    and v > 0 for v in value)):
        raise SpecError(f"model spec: {what} must be (w, h), two positive integers, got {value!r}")
    return int(value[0]), int(value[1])


def _channels(value, what: str, positive: bool) -> tuple[float, float, float]:
    """Three finite per-channel numbers (RGB on the 0-255 scale); positive ones for a std."""
    ok = isinstance(value, (list, tuple)) and len(value) == 3 and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 or not positive)
        for v in value)
    if not ok:
        rule = "three positive finite numbers" if positive else "three finite numbers"
        raise SpecError(f"model spec: {what} must be {rule} (RGB, 0-255 scale), got {value!r}")
    return tuple(float(v) for v in value)


@dataclass(frozen=True)
class ModelSpec:
    """What a ViTPose file is: enough to rebuild the model, its codec and its skeleton.

    size: the nearest `MODEL_SIZES` name ("vitpose-s" ...; the build starts from its table).
    embed_dim, depth, num_heads, mlp_ratio, patch_size: the ViT. decoder: "classic" | "simple";
    deconv_channels: the classic head's widths. num_keypoints: K heatmaps.
    input_size, heatmap_size: (w, h). codec: "UDPHeatmap" | "MSRAHeatmap"; sigma: its Gaussian.
    pixel_mean, pixel_std: RGB normalisation on the 0-255 scale.
    skeleton: the DatasetInfo fields of SKELETON_FIELDS as plain lists, or None when the file does
    not say (the loader then picks one by expert or K, or asks for a config).
    calibration: what `vitpose calibrate` fitted (`vitpose.codecs.confidence`: per keypoint the
    probability of being right and the three-state visibility, and the data it was fitted on), or
    None; not part of what the model is (not compared), recorded only when present.
    expert: the ViTPose+ expert to take from a mixture-of-experts file (never recorded).
    origin: where the spec came from ("recorded", "shapes", "hf config", "config", ...; not recorded).
    """

    size: str = "vitpose-s"
    decoder: str = "classic"
    num_keypoints: int = 17
    embed_dim: int = 384
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    patch_size: int = 16
    deconv_channels: tuple[int, ...] = (256, 256)
    input_size: tuple[int, int] = (192, 256)
    heatmap_size: tuple[int, int] = (48, 64)
    codec: str = "UDPHeatmap"
    sigma: float = 2.0
    pixel_mean: tuple[float, float, float] = PIXEL_MEAN
    pixel_std: tuple[float, float, float] = PIXEL_STD
    skeleton: dict[str, Any] | None = field(default=None, hash=False)
    calibration: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    expert: str | None = None
    origin: str = field(default="", compare=False)

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "input_size", _pair(self.input_size, "input_size"))
        set_(self, "heatmap_size", _pair(self.heatmap_size, "heatmap_size"))
        set_(self, "deconv_channels", tuple(int(c) for c in self.deconv_channels))
        set_(self, "pixel_mean", _channels(self.pixel_mean, "pixel_mean", positive=False))
        set_(self, "pixel_std", _channels(self.pixel_std, "pixel_std", positive=True))
        for name in ("num_keypoints", "embed_dim", "depth", "num_heads", "patch_size"):
            set_(self, name, int(getattr(self, name)))
        set_(self, "mlp_ratio", float(self.mlp_ratio))
        set_(self, "sigma", float(self.sigma))
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise SpecError(f"model spec: sigma must be a positive number, got {self.sigma!r}")
        if self.decoder not in ("classic", "simple"):
            raise SpecError(f"model spec: decoder must be 'classic' or 'simple', got {self.decoder!r}")
        if self.codec not in CODECS:
            raise SpecError(f"model spec: codec must be one of {CODECS}, got {self.codec!r}")
        if self.skeleton is not None:
            self._check_skeleton()
        if self.calibration is not None:
            try:
                set_(self, "calibration", check_calibration(self.calibration, self.num_keypoints, "model spec: calibration"))
            except CalibrationError as e:
                raise SpecError(str(e)) from None

    def _check_skeleton(self) -> None:
        if not isinstance(self.skeleton, dict) or "keypoint_names" not in self.skeleton:
            raise SpecError("model spec: skeleton must be a mapping with keypoint_names")
        unknown = sorted(set(self.skeleton) - set(SKELETON_FIELDS))
        if unknown:
            raise SpecError(f"model spec: unknown skeleton fields {unknown}; known: {list(SKELETON_FIELDS)}")
        if len(self.skeleton["keypoint_names"]) != self.num_keypoints:
            raise SpecError(f"model spec: the skeleton {self.skeleton.get('name')!r} has "
                            f"{len(self.skeleton['keypoint_names'])} keypoints, the model {self.num_keypoints}")
        check_flip_indices(self.skeleton.get("flip_indices"), self.num_keypoints,
                           f"model spec: the skeleton {self.skeleton.get('name')!r}")

    # ------------------------------------------------------------------ plain data

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (lists, numbers, strings), without `expert` and `origin` (and
        `calibration` when there is none)."""
        out = {"format": FORMAT_VERSION}
        for f in dataclasses.fields(self):
            if f.name in ("expert", "origin"):
                continue
            value = getattr(self, f.name)
            if f.name == "calibration" and value is None:
                continue  # files without one read as before, by older versions too
            out[f.name] = json.loads(json.dumps(value)) if value is not None else None  # tuples -> lists
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], origin: str = "recorded") -> ModelSpec:
        if not isinstance(data, dict):
            raise SpecError(f"model spec ({origin}): expected a mapping, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("format", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise SpecError(f"model spec ({origin}): format {version!r}; this vitpose reads format "
                            f"{FORMAT_VERSION} (upgrade vitpose)")
        known = {f.name for f in dataclasses.fields(cls)} - {"origin"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"model spec ({origin}): unknown fields {unknown}")
        try:
            return cls(**data, origin=origin)
        except (TypeError, ValueError) as e:
            message = str(e).removeprefix("model spec: ")
            raise SpecError(f"model spec ({origin}): {message}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str, origin: str = "recorded") -> ModelSpec:
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as e:
            raise SpecError(f"model spec ({origin}): not valid JSON ({e})") from None
        return cls.from_dict(data, origin)

    def replace(self, **changes) -> ModelSpec:
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ objects

    def build_kwargs(self) -> dict[str, Any]:
        """`build_model(self.size, self.decoder, self.num_keypoints, **kwargs)` arguments."""
        w, h = self.input_size
        kwargs = dict(embed_dim=self.embed_dim, depth=self.depth, num_heads=self.num_heads, mlp_ratio=self.mlp_ratio,
                      patch_size=self.patch_size, img_size=(h, w))
        if self.decoder == "classic":
            kwargs["deconv_channels"] = self.deconv_channels
        return kwargs

    def build(self):
        """The ViTPose this spec describes (random weights until loaded), carrying `.spec`."""
        from vitpose.models.vitpose import build_model

        model = build_model(self.size, self.decoder, self.num_keypoints, **self.build_kwargs())
        model.spec = self
        return model

    def build_codec(self):
        """The heatmap codec of the spec (`vitpose.codecs.build_codec`, the one codec builder)."""
        return build_codec(self.codec, self.input_size, self.heatmap_size, self.sigma)

    @property
    def flip_shift(self) -> bool:
        """Whether the flip test shifts the flipped-back heatmaps one cell (the codec's rule)."""
        return bool(codec_class(self.codec).flip_shift)


def spec_of_model(model, **fields_) -> ModelSpec:
    """The spec of a built ViTPose, read from its modules (dims, decoder, K, input size); `fields_`
    (codec, sigma, skeleton, ...) fill the rest. A model built from a spec returns that spec
    (updated with `fields_`)."""
    from vitpose.models.heads import ClassicHead
    from vitpose.models.vitpose import MODEL_SIZES
    from vitpose.models.wrappers import unwrap_model

    model = unwrap_model(model)
    own = getattr(model, "spec", None)
    if isinstance(own, ModelSpec):
        return own.replace(**fields_) if fields_ else own
    backbone, head = model.backbone, model.head
    embed_dim, depth = int(backbone.embed_dim), len(backbone.blocks)
    size = next((n for n, s in MODEL_SIZES.items() if s["embed_dim"] == embed_dim), "vitpose-s")
    h, w = backbone.patch_embed.img_size
    patch = int(backbone.patch_embed.proj.kernel_size[0])
    classic = isinstance(head, ClassicHead)
    deconvs = [m.out_channels for m in head.deconv_layers if hasattr(m, "out_channels")] if classic else []
    upsample = 2 ** len(deconvs) if classic else int(getattr(head, "scale_factor", 4))
    rows, cols = backbone.patch_embed.grid_size
    read = dict(size=size, decoder="classic" if classic else "simple", num_keypoints=int(head.final_layer.out_channels),
                embed_dim=embed_dim, depth=depth, num_heads=int(backbone.blocks[0].attn.num_heads),
                mlp_ratio=backbone.blocks[0].mlp.fc1.out_features / embed_dim, patch_size=patch,
                deconv_channels=tuple(deconvs) if classic else (256, 256), input_size=(w, h),
                heatmap_size=(cols * upsample, rows * upsample), origin="model")
    return ModelSpec(**{**read, **fields_})
