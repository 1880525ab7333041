"""The graph of a dynamic int8 file: the fp32 model's arithmetic, laid out so that ONNX Runtime's
integer kernels do the heavy products (`vitpose export --precision int8`, the default "dynamic").

Why a layout of its own (measured with ONNX Runtime 1.32 on an AVX2-only AMD EPYC, ViTPose-S,
16 crops, 2 threads, op by op with ONNX Runtime's profiler; BENCHMARKS.md "int8 on an AVX2-only CPU"):
- The classic head's two 4x4 stride-2 transposed convolutions took a quarter of the int8 file's
  time, all of it in float: ONNX Runtime's dynamic quantization has no integer ConvTranspose, and its
  integer Conv (ConvInteger) ran slower than float Conv. `PhaseDeconvHead` computes the same
  transposed convolution as four matrix products, one per output phase (which of the 2x2 output
  pixels an input pixel feeds), each over the 2x2 input neighbourhood that phase reads; those are
  MatMuls, which the quantizer makes integer. BatchNorm (eval) is folded into them.
- The simple head (ReLU -> bilinear x4 -> 3x3 conv) ran its convolution in float on the upsampled
  map: 90 million multiply-adds per crop at 192 channels, with the upsampled C-channel map written
  and read, a fifth of a small student's int8 pass (`vitpose-t`, ONNX Runtime's profiler, AVX512
  EPYC, 8 crops). Both steps are linear, so `LowResSimpleHead` mixes the channels first, on the
  backbone's grid (one MatMul to 9K channels, which the quantizer makes integer), and then applies
  the upsampling with each tap's shift as two fixed products (Einsum, float): the same function,
  1.27x [1.14-1.57] faster per session run of `vitpose-t` (8 crops, 7 alternating rounds).
- The exporter writes attention (at opset 23) as Reshape -> Transpose -> 3x Slice -> Attention (4-D)
  -> Transpose -> Reshape: about 50 Transposes and copies per pass. `attention_3d` rewrites each
  block's pattern into Split -> onnxruntime's MultiHeadAttention on 3-D (B, N, C) inputs, without
  the copies; its CPU kernel also ran 1.07x [1.02-1.13] faster per pass than ONNX's Attention on the
  same 3-D inputs (the int8 file is onnxruntime's anyway: its integer products are contrib operators).
- `quantized_gather`: the head's phase products gather their 2x2 neighbourhoods (Pad, Slice,
  Concat) in float and then quantize each gathered tensor; after it, the input is quantized once and
  the gather moves uint8 (a quarter of the bytes), with the same per-tensor scale for all four phases.

`PhaseDeconvHead` and `LowResSimpleHead` equal the heads they replace up to float rounding, and
the fp32 file is gated equal to PyTorch like every export (`vitpose.inference.export.check_export`); only quantization then
changes the numbers, and the int8 AP gate judges that (`vitpose.inference.quantize.int8_gate`).
The pattern is found in the exporter's opset-23 graph (where attention is one Attention node), so the
layout needs an onnxruntime that runs opset 23 (1.23, microsoft/onnxruntime#25156); `available()` says
whether this install has it, and without it the int8 file keeps the plain graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_weights

from vitpose.models.heads import ClassicHead, SimpleHead
from vitpose.models.wrappers import unwrap_model

__all__ = ["ATTENTION_OPSET", "LowResSimpleHead", "PhaseDeconvHead", "attention_3d", "available", "int8_layout",
           "quantized_gather"]

ATTENTION_OPSET = 23  # the first opset with ONNX's Attention operator
MIN_ONNXRUNTIME = (1, 23)  # its CPU kernel

# A 4x4 transposed convolution with stride 2 and padding 1: output row 2m + a reads the zero-padded
# input rows m + offset, offset in {a, a + 1}, through kernel row `tap` (the same for columns).
# Derived from y[p] = sum_i x[i] * w[p + 1 - 2i]: for p = 2m, taps 3 (input m-1) and 1 (input m);
# for p = 2m + 1, taps 2 (input m) and 0 (input m+1); +1 for the padding's shift.
PHASE_TAPS = {0: ((0, 3), (1, 1)), 1: ((1, 2), (2, 0))}  # phase -> ((offset, tap), (offset, tap))


def _supported_deconv(layer) -> bool:
    return (isinstance(layer, nn.ConvTranspose2d) and tuple(layer.kernel_size) == (4, 4)
            and tuple(layer.stride) == (2, 2) and tuple(layer.padding) == (1, 1)
            and tuple(layer.output_padding) == (0, 0) and tuple(layer.dilation) == (1, 1)
            and layer.groups == 1 and layer.bias is None)


class PhaseDeconvHead(nn.Module):
    """`ClassicHead` (eval mode) as matrix products over channels-last tensors.

    Each stage Deconv(4x4, s2, p1) -> BN -> ReLU becomes, per output phase (a, b), the product of
    the four padded-input views that phase reads (concatenated on channels: (N, H, W, 4*Cin)) with
    the matching kernel taps scaled by BN's factor (4*Cin, Cout), plus BN's shift; the four phase
    outputs interleave into (N, 2H, 2W, Cout). The 1x1 final conv is a product with its (Cin, K)
    weight, on the last stage's phases before they interleave. Input (N, C, H, W) as the backbone
    gives it, output (N, K, H * 2**stages, W * 2**stages) heatmaps.
    """

    def __init__(self, head: ClassicHead):
        super().__init__()
        layers = list(head.deconv_layers)
        self.stage_weights = nn.ParameterList()
        self.stage_shifts = nn.ParameterList()
        for deconv, norm in zip(layers[0::3], layers[1::3]):
            # BN (eval) folded into the transposed convolution's output channels (dim 1 of its weight)
            kernel, shift = fuse_conv_bn_weights(deconv.weight.detach(), None, norm.running_mean, norm.running_var,
                                                 norm.eps, norm.weight.detach(), norm.bias.detach(), transpose=True)
            kernel, shift = kernel.detach(), shift.detach()  # (Cin, Cout, 4, 4), (Cout,)
            phases = [torch.cat([kernel[:, :, ky, kx] for _, ky in PHASE_TAPS[a] for _, kx in PHASE_TAPS[b]])
                      for a in (0, 1) for b in (0, 1)]  # each (4*Cin, Cout)
            self.stage_weights.append(nn.Parameter(torch.stack(phases), requires_grad=False))
            self.stage_shifts.append(nn.Parameter(shift, requires_grad=False))
        final = head.final_layer
        self.final_weight = nn.Parameter(final.weight.detach().flatten(1).t().contiguous(), requires_grad=False)
        self.final_bias = nn.Parameter(final.bias.detach().clone(), requires_grad=False)

    @staticmethod
    def _stage(x, weights, shift, after=None):
        """One stage on (N, H, W, Cin): (N, 2H, 2W, Cout). `after` (the final 1x1 conv) runs on each
        phase before they interleave: it is per pixel, so this is the same, and the interleave then
        moves K channels instead of Cout."""
        n, h, w, _ = x.shape
        padded = F.pad(x, (0, 0, 1, 1, 1, 1))
        rows = []
        for a in (0, 1):
            row = []
            for b in (0, 1):
                views = [padded[:, dy:dy + h, dx:dx + w] for dy, _ in PHASE_TAPS[a] for dx, _ in PHASE_TAPS[b]]
                phase = F.relu(torch.cat(views, -1) @ weights[2 * a + b] + shift)
                row.append(phase if after is None else after(phase))
            rows.append(torch.stack(row, 3))  # (N, H, W, 2, C): column phases
        out = torch.stack(rows, 2)  # (N, H, 2, W, 2, C): row phases
        return out.reshape(n, 2 * h, 2 * w, -1)

    def _final(self, x):
        return x @ self.final_weight + self.final_bias

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        last = len(self.stage_weights) - 1
        for i, (weights, shift) in enumerate(zip(self.stage_weights, self.stage_shifts)):
            x = self._stage(x, weights, shift, self._final if i == last else None)
        if last < 0:  # a head without deconvolutions: the 1x1 conv alone
            x = self._final(x)
        return x.permute(0, 3, 1, 2)


def _upsampling_rows(size: int, scale: int) -> torch.Tensor:
    """(3, scale * size, size): row t is bilinear upsampling by `scale` (align_corners=False, as
    F.interpolate) followed by a shift of t - 1 output pixels, zero where the shift leaves the output
    (a 3x3 convolution's zero padding). Made by upsampling the identity, so it is F.interpolate's."""
    eye = torch.eye(size, dtype=torch.float64)[:, None, :, None]
    rows = F.interpolate(eye, scale_factor=(scale, 1), mode="bilinear", align_corners=False)[:, 0, :, 0].t()
    padded = F.pad(rows, (0, 0, 1, 1))
    return torch.stack([padded[t:t + scale * size] for t in range(3)])


class LowResSimpleHead(nn.Module):
    """`SimpleHead` (ReLU -> bilinear x4 -> 3x3 conv) with the convolution's channel mixing moved
    before the upsampling. Both are linear, so conv3x3(up(r)) = sum over the 9 taps (ty, tx) of
    Rows[ty] @ (W[:, :, ty, tx] r) @ Cols[tx]^T, where Rows / Cols are the upsampling with the tap's
    shift and zero padding (`_upsampling_rows`). The channel product then runs on the backbone's
    grid (16x fewer pixels) as one MatMul the quantizer makes integer (C -> 9K), and only the two
    small fixed products (Einsum, left in float) see the heatmap's resolution: about 6 + 8 million
    multiply-adds per 256x192 crop at C = 192 where the plain head's float convolution takes 90
    million, and no C-channel map at the heatmap's resolution."""

    def __init__(self, head: SimpleHead, grid: tuple[int, int]):
        super().__init__()
        weight = head.final_layer.weight.detach()  # (K, C, 3, 3)
        self.keypoints = weight.shape[0]
        # (C, 9K): output column k * 9 + 3 * ty + tx
        self.mix = nn.Parameter(weight.flatten(2).permute(1, 0, 2).reshape(weight.shape[1], -1).contiguous(),
                                requires_grad=False)
        self.bias = nn.Parameter(head.final_layer.bias.detach().clone(), requires_grad=False)
        dtype = weight.dtype
        self.register_buffer("rows", _upsampling_rows(grid[0], head.scale_factor).to(dtype), persistent=False)
        self.register_buffer("cols", _upsampling_rows(grid[1], head.scale_factor).to(dtype), persistent=False)

    def forward(self, x):
        n, _, h, w = x.shape
        z = (F.relu(x).permute(0, 2, 3, 1) @ self.mix).reshape(n, h, w, self.keypoints, 3, 3)
        out = torch.einsum("ayh,nhwkab,bxw->nkyx", self.rows, z, self.cols)
        return out + self.bias[:, None, None]


def _simple_head_grid(model: nn.Module):
    """The backbone's (rows, columns) of patches, which `LowResSimpleHead`'s fixed products are made
    for; None when the model does not say it."""
    backbone = getattr(model, "backbone", None)
    embed = getattr(backbone, "patch_embed", None)
    grid = getattr(embed, "grid_size", None) or getattr(embed, "patch_shape", None)
    return tuple(int(g) for g in grid) if grid is not None and len(grid) == 2 else None


def int8_layout(model: nn.Module) -> nn.Module:
    """`model` (in eval mode) with its classic head replaced, in place, by a `PhaseDeconvHead`, and its
    simple head by a `LowResSimpleHead`; a model whose head is neither a classic head of 4x4 stride-2
    deconvs nor a simple head of a known grid keeps it. Give it a copy (the export does:
    `_plain_copy`), the model is changed."""
    model = unwrap_model(model).eval()
    head = getattr(model, "head", None)
    if isinstance(head, ClassicHead) and all(_supported_deconv(layer) for layer in list(head.deconv_layers)[0::3]):
        model.head = PhaseDeconvHead(head)
    elif isinstance(head, SimpleHead) and _simple_head_grid(model) is not None:
        model.head = LowResSimpleHead(head, _simple_head_grid(model))
    return model


def available() -> bool:
    """Whether this install's onnxruntime runs the layout's opset 23 (the exporter writes the
    pattern `attention_3d` rewrites only at opset 23)."""
    try:
        import onnxruntime
    except ImportError:
        return False
    version = tuple(int(part) for part in onnxruntime.__version__.split(".")[:2] if part.isdigit())
    return version >= MIN_ONNXRUNTIME


# ------------------------------------------------------------------------------ ONNX rewrites


def _graph_maps(graph):
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return producer, consumers


def _constant(graph, producer, name):
    from onnx import numpy_helper

    for tensor in graph.initializer:
        if tensor.name == name:
            return numpy_helper.to_array(tensor)
    node = producer.get(name)
    if node is not None and node.op_type == "Constant":
        return numpy_helper.to_array(node.attribute[0].t)
    return None


def _perm(node):
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def attention_3d(model) -> int:
    """Rewrite, in place, each block's Reshape(B, N, 3, H, D) -> Transpose(2, 0, 3, 1, 4) -> Slice+Squeeze
    x3 -> Attention -> Transpose(0, 2, 1, 3) -> Reshape(B, N, C) into Split(last axis, 3) ->
    onnxruntime's MultiHeadAttention (com.microsoft, 3-D inputs (B, N, C), `num_heads` = H).
    Returns how many blocks were rewritten (a pattern that differs in any way is left as it is)."""
    from onnx import helper

    graph = model.graph
    producer, consumers = _graph_maps(graph)
    replaced, dropped = {}, set()
    for attention in [n for n in graph.node if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]:
        if len(attention.input) != 3 or len(attention.output) != 1:
            continue
        squeezes = [producer.get(name) for name in attention.input]
        if any(node is None or node.op_type != "Squeeze" for node in squeezes):
            continue
        slices = [producer.get(node.input[0]) for node in squeezes]
        if any(node is None or node.op_type != "Slice" for node in slices):
            continue
        if len({node.input[0] for node in slices}) != 1 or [
                int(_constant(graph, producer, node.input[1])[0]) for node in slices] != [0, 1, 2]:
            continue
        transpose = producer.get(slices[0].input[0])
        if transpose is None or transpose.op_type != "Transpose" or _perm(transpose) != [2, 0, 3, 1, 4]:
            continue
        reshape = producer.get(transpose.input[0])
        shape = None if reshape is None or reshape.op_type != "Reshape" else _constant(graph, producer, reshape.input[1])
        if shape is None or len(shape) != 5 or int(shape[2]) != 3 or int(shape[3]) < 1:
            continue
        users = consumers.get(attention.output[0], [])
        if len(users) != 1 or users[0].op_type != "Transpose" or _perm(users[0]) != [0, 2, 1, 3]:
            continue
        back = users[0]
        merge = consumers.get(back.output[0], [])
        if len(merge) != 1 or merge[0].op_type != "Reshape":
            continue
        merge = merge[0]
        if len(consumers.get(reshape.output[0], [])) != 1 or len(consumers.get(transpose.output[0], [])) != 3:
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in attention.attribute}
        if attributes.get("is_causal", 0) or attributes.get("softcap", 0.0) or attributes.get("qk_matmul_output_mode", 0):
            continue  # plain softmax attention only, as ViTPose's
        heads = int(shape[3])
        base = attention.name or attention.output[0]
        q, k, v = f"{base}/q", f"{base}/k", f"{base}/v"
        scale = {"scale": attributes["scale"]} if "scale" in attributes else {}  # default 1/sqrt(head size) on both
        replaced[id(reshape)] = [
            helper.make_node("Split", [reshape.input[0]], [q, k, v], name=f"{base}/split", axis=-1, num_outputs=3),
            helper.make_node("MultiHeadAttention", [q, k, v], [merge.output[0]], name=f"{base}/3d",
                             domain="com.microsoft", num_heads=heads, **scale)]
        dropped.update(id(node) for node in (transpose, *slices, *squeezes, attention, back, merge))
    nodes = []
    for node in graph.node:
        if id(node) in replaced:
            nodes.extend(replaced[id(node)])
        elif id(node) not in dropped:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_unused_initializers(graph)
    if replaced and not any(opset.domain == "com.microsoft" for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return len(replaced)


def quantized_gather(model) -> int:
    """Rewrite, in place, DynamicQuantizeLinear(Concat(Slice...(Pad(x)))) (the quantizer's view of a
    `PhaseDeconvHead` product) into Concat(Slice...(Pad(DynamicQuantizeLinear(x), zero point))): x
    quantized once per stage, the gather in uint8. The zero padding stays exact (padding with the
    zero point is padding with 0). Returns how many quantized gathers were rewritten."""
    from onnx import helper

    graph = model.graph
    producer, _ = _graph_maps(graph)

    def root(name):
        node = producer.get(name)
        while node is not None and node.op_type == "Slice":
            node = producer.get(node.input[0])
        return node

    after: dict[int, list] = {}
    dropped, quantized_pads, uint8_twins = set(), {}, {}

    def twin(name, pad):
        """The uint8 copy of the Slice chain that makes `name` from `pad`'s output."""
        if name == pad.output[0]:
            return quantized_pads[id(pad)][0]
        if name not in uint8_twins:
            node = producer[name]
            source = twin(node.input[0], pad)
            uint8_twins[name] = f"{name}/u8"
            after.setdefault(id(node), []).append(
                helper.make_node("Slice", [source, *node.input[1:]], [uint8_twins[name]], name=f"{node.name or name}/u8"))
        return uint8_twins[name]

    count = 0
    for quantize in [n for n in graph.node if n.op_type == "DynamicQuantizeLinear"]:
        concat = producer.get(quantize.input[0])
        if concat is None or concat.op_type != "Concat":
            continue
        if any(producer.get(name) is None or producer[name].op_type != "Slice" for name in concat.input):
            continue
        roots = {id(root(name)): root(name) for name in concat.input}
        pad = next(iter(roots.values()))
        if len(roots) != 1 or pad is None or pad.op_type != "Pad" or len(pad.input) > 2 and pad.input[2]:
            continue  # a Pad with its own constant value is not the zero padding this relies on
        if id(pad) not in quantized_pads:
            base = f"{pad.name or pad.output[0]}/u8"
            after.setdefault(id(pad), []).extend([
                helper.make_node("DynamicQuantizeLinear", [pad.input[0]], [f"{base}/x", f"{base}/scale", f"{base}/zero"],
                                 name=f"{base}/quantize"),
                helper.make_node("Pad", [f"{base}/x", pad.input[1], f"{base}/zero", *pad.input[3:4]], [base],
                                 name=base, **{a.name: helper.get_attribute_value(a) for a in pad.attribute})])
            quantized_pads[id(pad)] = (base, f"{base}/scale", f"{base}/zero")
        _, scale, zero = quantized_pads[id(pad)]
        parts = [twin(name, pad) for name in concat.input]
        axis = [a.i for a in concat.attribute if a.name == "axis"][0]
        after.setdefault(id(quantize), []).extend([
            helper.make_node("Concat", parts, [quantize.output[0]], name=f"{concat.name or concat.output[0]}/u8", axis=axis),
            helper.make_node("Identity", [scale], [quantize.output[1]], name=f"{quantize.output[1]}/shared"),
            helper.make_node("Identity", [zero], [quantize.output[2]], name=f"{quantize.output[2]}/shared")])
        dropped.update((id(quantize), id(concat)))
        count += 1
    nodes = []
    for node in graph.node:
        if id(node) not in dropped:
            nodes.append(node)
        nodes.extend(after.get(id(node), []))
    while True:  # the float Slices / Pads nothing reads any more
        read = {name for node in nodes for name in node.input} | {out.name for out in graph.output}
        kept = [n for n in nodes if not (n.op_type in ("Slice", "Pad") and n.output[0] not in read)]
        if len(kept) == len(nodes):
            break
        nodes = kept
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_unused_initializers(graph)
    return count


def _drop_unused_initializers(graph) -> None:
    read = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
