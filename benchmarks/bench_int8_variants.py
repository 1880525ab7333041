"""Rewrites of the int8 file's graph, each timed against the file as `vitpose export --precision int8`
writes it: the candidates for a faster one-person pass of a small student.

    bash benchmarks/avx2.sh python benchmarks/bench_int8_variants.py --model vitpose-t --rounds 11

The shipped file (random weights: a forward pass costs the same whatever the weights) and three
rewrites of it, each an ONNX Runtime session with the same threads, alternating rounds at 1 and 8
crops (a round's figure the median of 8 and 1 runs); each variant's speed-up is the shipped file's
time over its own, round by round:
- `gelu-tanh`: GELU's tanh approximation in place of the exact (erf) GELU (another function: a
  speed-up here would still need the int8 AP gate to keep it);
- `skip-layernorm`: each residual Add feeding a LayerNorm fused into onnxruntime's
  SkipLayerNormalization, its sum kept as the op's fourth output;
- `explicit-attention`: onnxruntime's MultiHeadAttention unrolled into Reshape/Transpose, MatMul,
  Softmax, MatMul (the same arithmetic through ONNX Runtime's plain kernels).
The largest output difference from the shipped file is printed too (the quantizer's per-tensor
scales move with any change upstream, so it is not zero for the exact rewrites either).
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
from rounds import alternate, cpu_note, load_note, ratios, spread, warm_up

CROPS = (1, 8)


def gelu_tanh(model):
    """Every exact GELU as its tanh approximation."""
    for node in model.graph.node:
        if node.op_type == "Gelu":
            for attribute in node.attribute:
                if attribute.name == "approximate":
                    attribute.s = b"tanh"
    return model


def skip_layernorm(model):
    """Add(a, b) -> LayerNormalization becomes SkipLayerNormalization(b, a) with the sum as output 3."""
    from onnx import helper

    graph = model.graph
    produced_by = {out: node for node in graph.node for out in node.output}
    constants = {init.name for init in graph.initializer}
    fused, dropped = {}, set()
    for node in graph.node:
        if node.op_type != "LayerNormalization":
            continue
        add = produced_by.get(node.input[0])
        if add is None or add.op_type != "Add" or any(name in constants for name in add.input):
            continue
        epsilon = next(a.f for a in node.attribute if a.name == "epsilon")
        fused[id(node)] = helper.make_node(
            "SkipLayerNormalization", [add.input[1], add.input[0], node.input[1], node.input[2]],
            [node.output[0], "", "", add.output[0]], domain="com.microsoft", epsilon=epsilon, name=node.name + "/skip")
        dropped.add(id(add))
    nodes = [fused.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def explicit_attention(model, embed_dim: int, num_heads: int):
    """MultiHeadAttention(q, k, v) on (B, N, C) as the plain ops it computes."""
    from onnx import helper, numpy_helper

    graph = model.graph
    head = embed_dim // num_heads
    graph.initializer.extend([
        numpy_helper.from_array(np.array([0, 0, num_heads, head], np.int64), "attention/heads_shape"),
        numpy_helper.from_array(np.array([0, 0, embed_dim], np.int64), "attention/tokens_shape"),
        numpy_helper.from_array(np.array(head ** -0.5, np.float32), "attention/scale")])
    nodes = []
    for i, node in enumerate(graph.node):
        if node.op_type != "MultiHeadAttention":
            nodes.append(node)
            continue
        q, k, v = node.input[:3]
        p = f"attention{i}/"

        def split_heads(x, name, perm):
            return [helper.make_node("Reshape", [x, "attention/heads_shape"], [p + name + "4"]),
                    helper.make_node("Transpose", [p + name + "4"], [p + name], perm=perm)]

        nodes += split_heads(q, "q", [0, 2, 1, 3]) + split_heads(k, "kT", [0, 2, 3, 1]) + split_heads(v, "v", [0, 2, 1, 3])
        nodes += [helper.make_node("Mul", [p + "q", "attention/scale"], [p + "q_scaled"]),
                  helper.make_node("MatMul", [p + "q_scaled", p + "kT"], [p + "logits"]),
                  helper.make_node("Softmax", [p + "logits"], [p + "weights"], axis=-1),
                  helper.make_node("MatMul", [p + "weights", p + "v"], [p + "heads"]),
                  helper.make_node("Transpose", [p + "heads"], [p + "tokens4"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [p + "tokens4", "attention/tokens_shape"], [node.output[0]])]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def variants(path: Path, embed_dim: int, num_heads: int) -> dict:
    import onnx

    shipped = onnx.load(str(path))
    return {"shipped": shipped,
            "gelu-tanh": gelu_tanh(copy.deepcopy(shipped)),
            "skip-layernorm": skip_layernorm(copy.deepcopy(shipped)),
            "explicit-attention": explicit_attention(copy.deepcopy(shipped), embed_dim, num_heads)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="vitpose-t", help="a MODEL_SIZES name (simple decoder)")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import onnxruntime as ort
    import peer_speed
    from bench_predict import draw_weights

    from vitpose.models.vitpose import MODEL_SIZES

    size = MODEL_SIZES[args.model]
    print(f"int8 graph variants of {args.model}, {args.threads} threads, alternating rounds; {load_note()}\n{cpu_note()}",
          flush=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    with tempfile.TemporaryDirectory(prefix="vitpose-int8-variants-") as tmp:
        path = peer_speed.int8_file(peer_speed.build_ours(args.model, "simple", draw_weights), Path(tmp), args.model)
        sessions = {name: ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
                    for name, model in variants(path, size["embed_dim"], size["num_heads"]).items()}
    graph_input = sessions["shipped"].get_inputs()[0]
    input_name, crop_shape = graph_input.name, graph_input.shape[1:]
    rng = np.random.default_rng(0)
    for crops in CROPS:
        x = rng.standard_normal((crops, *crop_shape)).astype(np.float32)
        reference = sessions["shipped"].run(None, {input_name: x})[0]
        runs = {name: (lambda s=session: s.run(None, {input_name: x})) for name, session in sessions.items()}
        for run in runs.values():
            warm_up(run, max_steps=10)
        seconds = alternate(runs, args.rounds, repeats=max(CROPS) // crops)
        print(f"\n{crops} crop(s) | ms per run, median [min-max] | speed-up over shipped, per round | max |diff| "
              f"(output range {np.abs(reference).max():.3g})\n| --- | ---: | ---: | ---: |")
        for name, session in sessions.items():
            difference = float(np.abs(session.run(None, {input_name: x})[0] - reference).max())
            print(f"| {name} | {spread([1000 * s for s in seconds[name]])} | "
                  f"{spread(ratios(seconds, 'shipped', name))} | {difference:.3g} |", flush=True)
    print(f"\nafter: {load_note()}")


if __name__ == "__main__":
    sys.exit(main())
