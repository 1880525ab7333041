"""Exported runtimes on the CPUs people have (issue 31): the provider guard (a GPU asked of a CPU-only
runtime is one line naming the package, never a silent CPU run), int8 ONNX files written only after
the AP gate passes, and OpenVINO IR gated the same way.

The guard tests fake onnxruntime's list of providers so they say the same on a GPU machine.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from test_evaluate import tiny_model

import vitpose.inference.export as E
from vitpose.inference.onnx import OnnxPredictor, ProviderError

REPO = Path(__file__).resolve().parents[1]
ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    """A 96-channel one-block ViTPose (recipe weights) exported to ONNX (the guard needs any file)."""
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    E.to_onnx(tiny_model(3).eval(), path, log=None)
    return path


CPU_ONLY = ["AzureExecutionProvider", "CPUExecutionProvider"]  # what the plain onnxruntime wheel offers


def test_cuda_on_a_cpu_only_onnxruntime_names_the_gpu_package(tiny_onnx, monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: list(CPU_ONLY))
    with pytest.raises(ProviderError, match=r"^CUDAExecutionProvider was asked for, but the installed onnxruntime"
                                            r".*pip install onnxruntime-gpu") as caught:
        OnnxPredictor(tiny_onnx, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert "\n" not in str(caught.value)
    assert OnnxPredictor(tiny_onnx, providers=["CPUExecutionProvider"]).session.get_providers() == [
        "CPUExecutionProvider"]


def test_a_session_that_fell_back_to_the_cpu_is_refused(tiny_onnx, monkeypatch):
    """onnxruntime builds the session on the CPU alone (a warning only) when the accelerator does not
    start: the build claims CUDA here, the real session cannot have it."""
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime really has CUDA")
    monkeypatch.setattr(ort, "get_available_providers", lambda: [*CPU_ONLY, "CUDAExecutionProvider"])
    with pytest.raises(ProviderError, match="could not start.*session would run on the CPU alone"):
        OnnxPredictor(tiny_onnx, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])


def test_predict_device_cuda_with_an_onnx_file_exits_2_in_one_line(tiny_onnx, monkeypatch, tmp_path, capsys,
                                                                    coco_mini_dir):
    from vitpose.cli import main

    monkeypatch.setattr(ort, "get_available_providers", lambda: list(CPU_ONLY))
    image = next(coco_mini_dir.glob("*.jpg"))
    code = main(["predict", str(image), "--model", str(tiny_onnx), "--device", "cuda", "--detector", "full-frame",
                 "--json", str(tmp_path / "out.json")])
    out, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "pip install onnxruntime-gpu" in lines[0], err
    assert not (tmp_path / "out.json").exists()
