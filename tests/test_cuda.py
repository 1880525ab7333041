"""GPU paths: the same numbers on CUDA as on the CPU, and mixed precision that trains.

Skipped without a CUDA device (CI has none); `benchmarks/gpu_check.sh` runs these on a GPU machine.
"""

import numpy as np
import pytest
import torch
from test_evaluate import decode_sensitivity, tiny_model

from vitpose.codecs.udp import UDPHeatmap
from vitpose.engine.evaluate import predict
from vitpose.engine.precision import resolve_precision
from vitpose.engine.trainer import forward_backward, optimizer_step
from vitpose.models import build_model
from vitpose.topdown import forward_heatmaps

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
    """Keypoints and scores of the same crops on both devices, within what the heatmap differences allow.

    The model has clear per-crop peaks (test_evaluate's recipe; a default-initialised head gives flat
    maps whose scores are ~1e-6 and whose keypoints are noise). Scores are heatmap maxima, and a
    maximum moves by at most the largest heatmap difference; keypoints may move by 3x what the
    UDP decode does when the heatmaps are perturbed by that much (`decode_sensitivity`, as the
    MMPose parity tests bound theirs), or 1e-3 input px.
    """
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 on both devices
    torch.backends.cudnn.allow_tf32 = False
    model = tiny_model(seed=1).eval()
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (3, 3, 256, 192), dtype=torch.uint8, generator=g)
    batch = {"image": images, "id": torch.arange(3), "image_id": torch.arange(3),
             "center": torch.tensor([[100.0, 120.0]] * 3), "scale": torch.tensor([[150.0, 200.0]] * 3),
             "bbox_score": torch.ones(3, dtype=torch.float64)}
    codec = UDPHeatmap()
    with torch.no_grad():
        heatmaps_cpu = forward_heatmaps(model, images).numpy()
    cpu = predict(model, [batch], codec, device=torch.device("cpu"))
    model.cuda()
    with torch.no_grad():
        heatmaps_gpu = forward_heatmaps(model, images.cuda()).cpu().numpy()
    gpu = predict(model, [batch], codec, device=torch.device("cuda"))
    difference = float(np.abs(heatmaps_cpu - heatmaps_gpu).max())
    assert difference < 1e-4 * float(np.abs(heatmaps_cpu).max())  # fp32: rounding, not a different sum
    assert min(float(s.max()) for s in (p["keypoint_scores"] for p in cpu)) > 0.1  # real peaks
    input_px_to_image_px = 150.0 / 192  # scale (150, 200) has the input's aspect: no padding
    for i, (a, b) in enumerate(zip(cpu, gpu)):
        assert a["id"] == b["id"]
        np.testing.assert_allclose(a["keypoint_scores"], b["keypoint_scores"], rtol=0, atol=difference + 1e-7)
        sensitivity = decode_sensitivity(heatmaps_cpu[i:i + 1], amplitude=max(difference, 1e-7))
        allowed = np.maximum(1e-3, 3 * sensitivity) * input_px_to_image_px
        error = np.abs(np.asarray(a["keypoints"]) - np.asarray(b["keypoints"])).max(-1)
        assert np.all(error <= allowed), (i, error, allowed)
