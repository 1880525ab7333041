"""benchmarks/bench_int8_variants.py's rewrites: the exact ones compute the graph they replace (checked
on the fp32 file of the int8 layout, where no quantization scale moves), the GELU one does not."""

from __future__ import annotations

import copy
import sys

import numpy as np
import pytest
import torch
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_int8_variants as V  # noqa: E402

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def layout_graph(tmp_path_factory):
    import onnx

    import vitpose.inference.export as E
    from vitpose.inference import int8_graph
    from vitpose.models.vitpose import build_model

    if not int8_graph.available():
        pytest.skip("this onnxruntime runs no opset-23 graph (the int8 layout)")
    torch.manual_seed(0)
    model = build_model("vitpose-s", "simple", embed_dim=64, depth=2, num_heads=2).eval()
    path = tmp_path_factory.mktemp("variants") / "small.fp32.onnx"
    E.to_onnx(model, path, int8_layout=True, log=None)
    return onnx.load(str(path))


def _run(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def test_the_exact_rewrites_keep_the_function_and_replace_their_ops(layout_graph):
    x = np.random.default_rng(0).standard_normal((2, 3, 256, 192)).astype(np.float32)
    reference = _run(layout_graph, x)
    skip = V.skip_layernorm(copy.deepcopy(layout_graph))
    ops = [n.op_type for n in skip.graph.node]
    assert ops.count("SkipLayerNormalization") >= 3 and ops.count("LayerNormalization") < \
        [n.op_type for n in layout_graph.graph.node].count("LayerNormalization")
    np.testing.assert_allclose(_run(skip, x), reference, rtol=0, atol=1e-4)
    explicit = V.explicit_attention(copy.deepcopy(layout_graph), 64, 2)
    ops = [n.op_type for n in explicit.graph.node]
    assert "MultiHeadAttention" not in ops and ops.count("Softmax") == 2
    np.testing.assert_allclose(_run(explicit, x), reference, rtol=0, atol=1e-4)


def test_the_gelu_rewrite_is_another_function(layout_graph):
    x = np.random.default_rng(1).standard_normal((1, 3, 256, 192)).astype(np.float32)
    tanh = V.gelu_tanh(copy.deepcopy(layout_graph))
    assert {a.s for n in tanh.graph.node if n.op_type == "Gelu" for a in n.attribute if a.name == "approximate"} == {b"tanh"}
    difference = np.abs(_run(tanh, x) - _run(layout_graph, x)).max()
    assert 0 < difference < 0.05
