"""ViTPose-S against MMPose 1.3.2 and HF transformers outputs (tests/fixtures/README.md), with the
fixtures' random weights loaded through each checkpoint layout."""

import json

import numpy as np
import pytest
import torch
from fixture_files import load_npz
from weights_recipe import DIGESTS_SEED7, derive, load_spec, make_weights, spec_digest

from vitpose.engine.losses import KeypointMSELoss, pck_accuracy
from vitpose.engine.optim import mmpose_name
from vitpose.models.loading import load_weights
from vitpose.models.vitpose import build_model, flip_test

INPUTS = ("randn", "uniform_pixels", "real_coco")
LAYOUTS = ("mmpose1x", "official0x", "hf")
TOL = 1e-4


@pytest.fixture(scope="module")
def weights(fixtures_dir):
    """{decoder: MMPose 1.x weights of seed 7} (drawn once per module)."""
    return {dec: make_weights(load_spec(fixtures_dir, dec, "mmpose1x"), 7) for dec in ("classic", "simple")}


@pytest.fixture(scope="module")
def io(fixtures_dir):
    return load_npz(fixtures_dir / "model_vitpose_s_io.npz")


def _model(decoder, state, **kwargs):
    # Built on the meta device (no random init to pay for), then every tensor comes from
    # `state`: load_weights is strict, so nothing is left uninitialised.
    with torch.device("meta"):
        model = build_model("vitpose-s", decoder=decoder, **kwargs)
    model = model.to_empty(device="cpu")
    load_weights(model, state)
    return model


def _max_diff(a, b):
    return (a - torch.as_tensor(np.asarray(b))).abs().max().item()


def _stored_inputs(arrays, key):
    """The INPUTS whose `<input>/key` a fixture file holds (the committed files keep a subset of
    some outputs, tests/fixtures/README.md §2); never none."""
    names = [name for name in INPUTS if f"{name}/{key}" in arrays]
    assert names, f"the fixture holds no <input>/{key}"
    return names


@pytest.fixture(scope="module")
def models(weights):
    return {dec: _model(dec, weights[dec]).eval() for dec in ("classic", "simple")}


@pytest.fixture(scope="module")
def features(models, io):
    """Backbone features of the three fixture inputs and their mirrors (one forward)."""
    x = torch.cat([torch.from_numpy(io[f"{name}/input"]) for name in INPUTS])
    x2 = torch.cat([x, x.flip(-1)])
    with torch.no_grad():
        return x, x2, models["classic"].backbone(x2)


@pytest.mark.parametrize("decoder", ["classic", "simple"])
def test_recipe_reproduces_fixture_weights(fixtures_dir, weights, decoder):
    spec = load_spec(fixtures_dir, decoder, "mmpose1x")
    assert spec_digest(weights[decoder], spec) == DIGESTS_SEED7[decoder]


def test_backbone_features_match_mmpose(io, features):
    _, _, feats = features
    for name in _stored_inputs(io, "backbone_feat"):
        i = INPUTS.index(name)
        assert _max_diff(feats[i : i + 1], io[f"{name}/backbone_feat"]) < TOL, name


@pytest.mark.parametrize("decoder", ["classic", "simple"])
def test_heatmaps_and_flip_test_match_mmpose_and_hf(fixtures_dir, models, io, features, decoder):
    x, x2, feats = features
    model = models[decoder]
    # Both specs draw the backbone first with the same seed: the features are shared.
    for (n, a), (_, b) in zip(model.backbone.state_dict().items(), models["classic"].backbone.state_dict().items()):
        assert torch.equal(a, b), n
    with torch.no_grad():
        heatmaps2 = model.head(feats)

    def cached_model(inp):  # flip_test runs x and its mirror as one batch: reuse that forward
        assert torch.equal(inp, x2)
        return heatmaps2

    flipped = flip_test(cached_model, x)
    ref = load_npz(fixtures_dir / ("model_vitpose_s_io.npz" if decoder == "classic" else "model_vitpose_s_simple_io.npz"))
    hf = load_npz(fixtures_dir / ("hf_vitpose_s_io.npz" if decoder == "classic" else "hf_vitpose_s_simple_io.npz"))
    for name in _stored_inputs(ref, "heatmaps"):
        i = INPUTS.index(name)
        assert _max_diff(heatmaps2[i : i + 1], ref[f"{name}/heatmaps"]) < TOL, name
        assert _max_diff(flipped[i : i + 1], ref[f"{name}/flip_test_heatmaps"]) < TOL, name
    for name in _stored_inputs(hf, "heatmaps"):
        i = INPUTS.index(name)
        assert _max_diff(heatmaps2[i : i + 1], hf[f"{name}/heatmaps"]) < TOL, name


@pytest.mark.parametrize("layout", ["official0x", "hf"])
@pytest.mark.parametrize("decoder", ["classic", "simple"])
def test_other_layouts_load_the_same_model(fixtures_dir, weights, models, decoder, layout):
    # Same tensors as the MMPose 1.x load => same outputs as checked above (row 0 is zero here,
    # q/k/v concatenate back exactly), so a tensor comparison stands in for three more forwards.
    state = derive(weights[decoder], load_spec(fixtures_dir, decoder, layout))
    loaded = _model(decoder, state).state_dict()
    reference = models[decoder].state_dict()
    assert loaded.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(loaded[name], tensor), name


def test_official_pos_embed_row0_is_folded_not_dropped(fixtures_dir, weights, models):
    # The fixtures' official row 0 is zero, so dropping it would pass too. Move part of the
    # embedding into row 0 (the official ViT adds it to every token): the model must not change.
    state = derive(weights["simple"], load_spec(fixtures_dir, "simple", "official0x"))
    pos = state["backbone.pos_embed"]
    shift = np.random.default_rng(0).standard_normal((1, 1, pos.shape[-1])).astype(np.float32)
    state["backbone.pos_embed"] = np.concatenate([shift, pos[:, 1:] - shift], axis=1)
    loaded = _model("simple", state).backbone.pos_embed
    reference = models["simple"].backbone.pos_embed
    assert (loaded - reference).abs().max().item() < 1e-5


def test_eval_loss_and_accuracy_match_mmpose(io):
    heatmaps = torch.from_numpy(io["real_coco/heatmaps"])
    target = torch.from_numpy(io["loss/target_heatmaps"])[None]
    kw = torch.from_numpy(io["loss/keypoint_weights"])
    loss = KeypointMSELoss()(heatmaps, target, kw)
    assert abs(loss.item() - float(io["loss/loss_kpt"])) < 1e-5 * max(1.0, float(io["loss/loss_kpt"]))
    assert abs(pck_accuracy(heatmaps, target, kw).item() - float(io["loss/acc_pose"])) < 1e-6


def test_loss_weight_is_not_squared():
    pred, target = torch.ones(1, 2, 4, 4), torch.zeros(1, 2, 4, 4)
    w = torch.tensor([[0.5, 0.0]])
    # mean over B*K*H*W of w*(p-t)^2 = (16 * 0.5) / 32
    assert KeypointMSELoss()(pred, target, w).item() == pytest.approx(0.25)


def test_train_step_matches_mmpose(fixtures_dir, weights):
    ref = load_npz(fixtures_dir / "model_vitpose_s_train.npz")
    model = _model("classic", weights["classic"], drop_path_rate=0.0).train()
    torch.manual_seed(0)
    heatmaps = model(torch.from_numpy(ref["inputs"]))
    target = torch.from_numpy(ref["target_heatmaps"])
    kw = torch.from_numpy(ref["keypoint_weights"])
    loss = KeypointMSELoss()(heatmaps, target, kw)
    loss.backward()

    # the file keeps the heatmaps of the first instance(s) only; loss and gradients cover all three
    assert _max_diff(heatmaps.detach()[: len(ref["heatmaps"])], ref["heatmaps"]) < TOL
    assert abs(loss.item() - float(ref["loss_kpt"])) < 1e-5 * max(1.0, float(ref["loss_kpt"]))
    assert abs(pck_accuracy(heatmaps.detach(), target, kw).item() - float(ref["acc_pose"])) < 1e-6

    ref_norms = json.loads(str(ref["grad_norms_json"]))
    ours = {mmpose_name(n): p.grad for n, p in model.named_parameters()}
    assert set(ours) == set(ref_norms)
    for name, norm in ref_norms.items():
        got = ours[name].norm().item()
        assert abs(got - norm) <= 1e-3 * norm + 1e-12, f"{name}: {got} vs {norm}"
    for key in ref:
        if key.startswith("grad/"):
            name = key[len("grad/"):]
            g, r = ours[name], torch.from_numpy(ref[key])
            assert (g - r).abs().max().item() <= 1e-3 * r.abs().max().item(), name

    buffers = dict(model.named_buffers())
    for key in ref:
        if key.startswith("bn_after/"):
            name = key[len("bn_after/"):]
            assert _max_diff(buffers[name].double(), ref[key].astype(np.float64)) < 1e-5, name
