"""The graph of a dynamic int8 file (vitpose.inference.int8_graph): the same arithmetic as the plain
model, laid out for ONNX Runtime's integer kernels. The head's phase form is checked against the
transposed convolutions it replaces in float64 (only summation order differs), the ONNX rewrites
against the graphs they rewrite, run by onnxruntime."""

import copy
import json

import numpy as np
import pytest
import torch
from test_evaluate import tiny_model
from torch import nn

import vitpose
from vitpose.inference import int8_graph
from vitpose.models.heads import ClassicHead, SimpleHead

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
needs_layout = pytest.mark.skipif(not int8_graph.available(), reason="onnxruntime without ONNX Attention (< 1.23)")


def _random_head(in_channels, deconv_channels, keypoints=5, seed=0):
    """A classic head with every weight and BatchNorm statistic drawn (eval mode), float64."""
    torch.manual_seed(seed)
    head = ClassicHead(in_channels, keypoints, deconv_channels).double().eval()
    with torch.no_grad():
        for module in head.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.5)
                module.running_var.uniform_(0.2, 3.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.3)
            elif isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
                module.weight.normal_(0, 0.2)
                if module.bias is not None:
                    module.bias.normal_(0, 0.1)
    return head


@pytest.mark.parametrize(("in_channels", "deconv_channels", "grid"), [
    (8, (6, 4), (5, 4)),  # two stages, as every released ViTPose classic head
    (6, (5,), (3, 7)),  # one stage, odd sizes
    (4, (3, 3, 2), (2, 2)),  # three stages
])
def test_the_phase_head_is_the_transposed_convolution(in_channels, deconv_channels, grid):
    head = _random_head(in_channels, deconv_channels)
    phase = int8_graph.PhaseDeconvHead(head).double()
    x = torch.randn(3, in_channels, *grid, dtype=torch.float64)
    with torch.no_grad():
        expected, got = head(x), phase(x)
    assert got.shape == expected.shape == (3, 5, grid[0] * 2 ** len(deconv_channels), grid[1] * 2 ** len(deconv_channels))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_a_wrong_tap_table_is_caught(monkeypatch):
    """The check above can fail: the two taps of phase 1 swapped is another convolution."""
    monkeypatch.setitem(int8_graph.PHASE_TAPS, 1, ((1, 0), (2, 2)))
    head = _random_head(4, (3,))
    x = torch.randn(2, 4, 3, 3, dtype=torch.float64)
    with torch.no_grad():
        assert (int8_graph.PhaseDeconvHead(head).double()(x) - head(x)).abs().max() > 1e-3


def test_the_layout_keeps_the_model_and_leaves_other_heads_alone():
    model = tiny_model().eval()
    laid_out = int8_graph.int8_layout(copy.deepcopy(model))
    assert isinstance(laid_out.head, int8_graph.PhaseDeconvHead) and isinstance(model.head, ClassicHead)
    x = torch.randn(2, 3, 256, 192)
    with torch.no_grad():
        torch.testing.assert_close(laid_out(x), model(x), rtol=0, atol=1e-5 * model(x).abs().max().item())
    simple = vitpose.build_model("vitpose-s", depth=1, embed_dim=96, num_heads=3, decoder="simple").eval()
    laid_out = int8_graph.int8_layout(copy.deepcopy(simple))
    assert isinstance(laid_out.head, int8_graph.LowResSimpleHead) and isinstance(simple.head, SimpleHead)


@pytest.mark.parametrize("img_size", [(256, 192), (96, 112)], ids=["coco", "odd-grid"])
def test_the_low_resolution_simple_head_is_the_simple_head(img_size):
    """ReLU -> bilinear x4 -> 3x3 conv against the channel product first, then the fixed upsampling
    products with each tap's shift and the zero padding (float64: only summation order differs)."""
    torch.manual_seed(0)
    model = vitpose.build_model("vitpose-s", depth=1, embed_dim=24, num_heads=2, decoder="simple",
                                img_size=img_size).double().eval()
    with torch.no_grad():
        model.head.final_layer.weight.normal_(0, 0.3)
        model.head.final_layer.bias.normal_(0, 0.3)
        x = torch.randn(2, 3, *img_size, dtype=torch.float64)
        expected = model(x)
        laid_out = int8_graph.int8_layout(copy.deepcopy(model))
        assert isinstance(laid_out.head, int8_graph.LowResSimpleHead)
        torch.testing.assert_close(laid_out(x), expected, rtol=0, atol=1e-12)
        # the shifts matter: without them (every tap at the centre) it is another function
        laid_out.head.rows.copy_(laid_out.head.rows[1:2].expand_as(laid_out.head.rows))
        assert (laid_out(x) - expected).abs().max() > 1e-3


class _HeadOnly(nn.Module):
    """A model that is its head alone: what `int8_layout` looks at, without a backbone."""

    def __init__(self, head):
        super().__init__()
        self.head = head

    def forward(self, x):
        return self.head(x)


@pytest.mark.parametrize("deconv_options", [{"groups": 2}, {"bias": True}], ids=["grouped", "with-bias"])
def test_the_layout_keeps_a_classic_head_it_cannot_decompose(deconv_options):
    """The phase decomposition holds for a plain 4x4 stride-2 deconv only: a classic head altered
    through the Python API (a grouped first deconv, or one with a bias) must stay the module it is,
    with the same output, rather than fail to load its weights or silently drop the bias."""
    head = _random_head(4, (6, 4))
    altered = nn.ConvTranspose2d(4, 6, 4, stride=2, padding=1, **{"bias": False, **deconv_options}).double()
    with torch.no_grad():
        altered.weight.normal_(0, 0.2)
        if altered.bias is not None:
            altered.bias.normal_(0, 0.5)
    head.deconv_layers[0] = altered
    model = _HeadOnly(head).eval()
    x = torch.randn(2, 4, 3, 5, dtype=torch.float64)
    with torch.no_grad():
        expected = model(x)
        laid_out = int8_graph.int8_layout(model)
        assert laid_out.head is head
        torch.testing.assert_close(laid_out(x), expected, rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def laid_out_files(tmp_path_factory):
    """A 2-block tiny ViTPose exported with the int8 layout (gated equal to PyTorch by to_onnx), then
    quantized dynamically."""
    import vitpose.inference.export as E
    from vitpose.inference import quantize as Q

    folder = tmp_path_factory.mktemp("int8-layout")
    model = tiny_model(3, depth=2).eval()
    laid_out = folder / "layout.onnx"
    E.to_onnx(model, laid_out, int8_layout=True, log=None)
    quantized = folder / "layout.int8.onnx"
    Q.quantize_onnx(laid_out, quantized, "dynamic")
    return model, laid_out, quantized


def _run(path, x):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


@needs_layout
def test_attention_is_rewritten_to_three_d_in_every_block_and_keeps_the_numbers(laid_out_files):
    model, laid_out, _ = laid_out_files
    nodes = onnx.load(str(laid_out)).graph.node
    assert not [n for n in nodes if n.op_type == "Attention"]
    attention = [n for n in nodes if n.op_type == "MultiHeadAttention" and n.domain == "com.microsoft"]
    assert len(attention) == 2
    assert all({a.name: a.i for a in n.attribute}.get("num_heads") == 3 for n in attention)
    assert not [n for n in nodes if n.op_type in ("ConvTranspose", "Transpose") and
                [list(a.ints) for a in n.attribute if a.name == "perm"] == [[2, 0, 3, 1, 4]]]
    facts = json.loads({p.key: p.value for p in onnx.load(str(laid_out), load_external_data=False).metadata_props}
                       ["vitpose.export"])
    assert facts["layout"] == "int8" and facts["precision"] == "float32"
    x = np.random.default_rng(0).standard_normal((3, 3, 256, 192)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_run(laid_out, x), expected, rtol=0, atol=2e-5 * np.abs(expected).max())


def test_the_rewrite_leaves_a_graph_it_does_not_know_alone():
    """A pattern that differs (here: attention fed by the wrong Transpose) is not touched."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Attention", ["t", "t", "t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 2, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    before = model.SerializeToString()
    assert int8_graph.attention_3d(model) == 0 and int8_graph.quantized_gather(model) == 0
    assert model.SerializeToString() == before


@needs_layout
def test_the_head_gathers_uint8_and_stays_as_close_to_fp32(laid_out_files, tmp_path, monkeypatch):
    """After quantization the head's neighbourhoods are gathered in uint8 (one quantization per
    stage); the result is as close to the fp32 graph as the float gather it replaces."""
    from vitpose.inference import quantize as Q

    _, laid_out, quantized = laid_out_files
    nodes = onnx.load(str(quantized)).graph.node
    producer = {out: n for n in nodes for out in n.output}
    quantizers = [n for n in nodes if n.op_type == "DynamicQuantizeLinear"]
    assert not [n for n in quantizers if producer.get(n.input[0]) is not None and producer[n.input[0]].op_type == "Concat"]
    uint8_concats = [n for n in nodes if n.op_type == "Concat" and n.name.endswith("/u8")]
    assert len(uint8_concats) == 8  # 2 stages x 4 phases
    monkeypatch.setattr(int8_graph, "quantized_gather", lambda model: 0)
    float_gather = tmp_path / "float-gather.int8.onnx"
    Q.quantize_onnx(laid_out, float_gather, "dynamic")
    x = np.random.default_rng(1).standard_normal((4, 3, 256, 192)).astype(np.float32)
    fp32 = _run(laid_out, x)
    error_uint8, error_float = np.abs(_run(quantized, x) - fp32).max(), np.abs(_run(float_gather, x) - fp32).max()
    assert 0 < error_uint8 <= 1.5 * error_float


@needs_layout
def test_the_rewrite_keeps_the_weights_of_a_file_with_external_data(tmp_path, monkeypatch):
    """A model over 2 GB (ViTPose-H in fp32) is written with its weights in `<file>.data`; the
    attention rewrite reads the graph only and the file still runs, gated equal to PyTorch."""
    import vitpose.inference.export as E
    import vitpose.inference.export_writers as W

    monkeypatch.setattr(W, "SINGLE_FILE_LIMIT", 0)  # every model "large": external data
    model = tiny_model(3).eval()
    path = tmp_path / "layout.onnx"
    E.to_onnx(model, path, int8_layout=True, log=None)
    data = tmp_path / "layout.onnx.data"
    assert data.is_file() and path.stat().st_size < data.stat().st_size / 2  # the weights stayed outside
    assert [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node].count("MultiHeadAttention") == 1
    x = np.random.default_rng(2).standard_normal((2, 3, 256, 192)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_run(path, x), expected, rtol=0, atol=2e-5 * np.abs(expected).max())
