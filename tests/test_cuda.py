"""GPU paths: the same numbers on CUDA as on the CPU, and mixed precision that trains.

Skipped without a CUDA device (CI has none); `benchmarks/gpu_check.sh` runs these on a GPU machine.
"""

import numpy as np
import pytest
import torch

from vitpose.codecs.udp import UDPHeatmap
from vitpose.engine.evaluate import predict
from vitpose.engine.precision import resolve_precision
from vitpose.engine.trainer import forward_backward, optimizer_step
from vitpose.models import build_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _tiny(seed=0, **kw):
    torch.manual_seed(seed)
    return build_model("vitpose-s", "classic", depth=2, drop_path_rate=0.0, **kw)


def test_fp32_forward_matches_cpu():
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here (TF32 would round to 10 bits)
    torch.backends.cudnn.allow_tf32 = False
    model = _tiny().eval()
    x = torch.randn(2, 3, 256, 192)
    with torch.no_grad():
        cpu = model(x)
        gpu = model.cuda()(x.cuda()).cpu()
    assert (cpu - gpu).abs().max().item() < 1e-3 * cpu.abs().max().item()


@pytest.mark.parametrize("amp_dtype", ["float16", "bfloat16"])
def test_mixed_precision_steps_lower_the_loss(amp_dtype):
    if amp_dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    device = torch.device("cuda")
    model = _tiny().to(device).train()
    precision = resolve_precision(device, amp=True, amp_dtype=amp_dtype)
    assert (precision.scaler is not None) == (amp_dtype == "float16")  # a scaler only for fp16
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(4, 3, 256, 192, generator=g).to(device)
    target = torch.rand(4, 17, 64, 48, generator=g).to(device) * 0.1
    weights = torch.ones(4, 17, device=device)
    losses = []
    for _ in range(8):
        loss = forward_backward(model, x, target, weights, precision)
        assert loss.dtype == torch.float32  # the loss is computed in fp32 outside autocast
        optimizer_step(model, opt, precision, clip_grad=1.0, loss_finite=bool(torch.isfinite(loss)))
        losses.append(float(loss))
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_predict_on_cuda_matches_cpu():
    model = _tiny().eval()
    g = torch.Generator().manual_seed(1)
    batch = {"image": torch.randint(0, 256, (3, 3, 256, 192), dtype=torch.uint8, generator=g),
             "id": torch.arange(3), "image_id": torch.arange(3),
             "center": torch.tensor([[100.0, 120.0]] * 3), "scale": torch.tensor([[150.0, 200.0]] * 3),
             "bbox_score": torch.ones(3, dtype=torch.float64)}
    codec = UDPHeatmap()
    cpu = predict(model, [batch], codec, device=torch.device("cpu"))
    gpu = predict(model.cuda(), [batch], codec, device=torch.device("cuda"))
    for a, b in zip(cpu, gpu):
        assert a["id"] == b["id"]
        np.testing.assert_allclose(a["keypoint_scores"], b["keypoint_scores"], atol=1e-3)
