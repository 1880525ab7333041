"""Fine-tuning from a pose model (`--init` / model.init): the backbone from the source, the head by
keypoint name (vitpose/models/transfer.py, vitpose/engine/finetune.py), and the frozen backbone.

Every source here is a small random-weight model written to a file (or to a local HF cache): the
checks are bitwise equalities with the source's tensors, so a channel copied from the wrong
keypoint, a backbone tensor left fresh or a fresh channel that copied something all fail.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from vitpose_plus_recipe import CONFIG as PLUS_CONFIG
from vitpose_plus_recipe import hf_weights, official_from_hf

from vitpose.coco_meta import KEYPOINT_NAMES as COCO
from vitpose.config import ConfigError, load_config
from vitpose.data.metainfo import dataset_info
from vitpose.engine.finetune import TABLE_FILE, apply_backbone_freeze, init_from_source, read_init_source
from vitpose.hub import ModelInfo
from vitpose.models.checkpoint import CheckpointError, save_weights
from vitpose.models.loading import load_weights
from vitpose.models.transfer import BackboneMismatchError, head_channel_map, resample_pos_embed, transfer_weights
from vitpose.models.vit import resize_pos_embed
from vitpose.models.vitpose import build_model

REPO = Path(__file__).resolve().parents[1]
K7 = dataset_info(REPO / "configs" / "demo_k7_skeleton.yaml")
SHARED = ("nose", "left_wrist", "right_wrist", "left_ankle", "right_ankle")
TINY = dict(embed_dim=64, depth=2, num_heads=4, deconv_channels=(32, 32))


def tiny(num_keypoints, seed, img_size=(128, 96), **kwargs):
    torch.manual_seed(seed)
    return build_model("vitpose-s", "classic", num_keypoints, img_size=img_size, **{**TINY, **kwargs})


def randomise(model, seed):
    """Every tensor (BN statistics included) drawn afresh: a source unlike any fresh init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(torch.randn(tensor.shape, generator=g) * 0.1 + 0.5)
    return model


def cfg_for(source, **model):
    overrides = [f"model.init={json.dumps(str(source))}", "model.num_keypoints=7"]
    overrides += [f"model.{k}={json.dumps(v)}" for k, v in model.items()]
    return load_config(REPO / "configs" / "demo_k7.yaml", overrides)


def check_transfer(target, source_state, source_names, report):
    """Backbone and deconvs equal the source's bit for bit; each shared keypoint's channel is its
    source channel; every other channel is none of the source's channels."""
    state = target.state_dict()
    for name, tensor in state.items():
        if name.startswith(("backbone.", "head.deconv_layers.")):
            assert torch.equal(tensor, source_state[name]), name
    weight, bias = state["head.final_layer.weight"], state["head.final_layer.bias"]
    src_w, src_b = source_state["head.final_layer.weight"], source_state["head.final_layer.bias"]
    copied = {t: s for t, s, _ in report.copied}
    for k, name in enumerate(K7.keypoint_names):
        if name in copied:
            j = source_names.index(copied[name])
            assert torch.equal(weight[k], src_w[j]) and torch.equal(bias[k], src_b[j]), name
        else:
            assert not any(torch.equal(weight[k], src_w[j]) for j in range(src_w.shape[0])), name
    table = report.table()
    assert "fresh" in table and "copied from" in table
    return copied


def test_file_source_copies_shared_keypoints_bit_for_bit(tmp_path, capsys):
    source = randomise(tiny(17, 0), 1)
    path = save_weights(source, tmp_path / "coco17.safetensors")
    target = tiny(7, 2)
    (tmp_path / "work").mkdir()  # train.py has claimed it by then
    report = init_from_source(target, cfg_for(path), K7, tmp_path / "work")
    copied = check_transfer(target, source.state_dict(), COCO, report)
    assert copied == {n: n for n in SHARED} and report.fresh == ["neck", "mid_hip"]
    printed = capsys.readouterr().out
    written = (tmp_path / "work" / TABLE_FILE).read_text()
    assert printed == written and "neck" in written and "copied from 'left_wrist'" in written


def test_keypoint_map_covers_renamed_joints(tmp_path):
    source = randomise(tiny(17, 0), 1)
    path = save_weights(source, tmp_path / "coco17.safetensors")
    target = tiny(7, 2)
    report = init_from_source(target, cfg_for(path, init_keypoint_map={"neck": "left_shoulder"}), K7, None)
    assert ("neck", "left_shoulder", COCO.index("left_shoulder")) in report.copied
    check_transfer(target, source.state_dict(), COCO, report)
    with pytest.raises(ConfigError, match="'elbow' is not a keypoint of the source skeleton"):
        init_from_source(tiny(7, 2), cfg_for(path, init_keypoint_map={"neck": "elbow"}), K7, None)


def test_training_checkpoint_gives_its_skeleton_names(tmp_path):
    """A train.py checkpoint of a K=7 run initialises a K=5 model by the names in its config."""
    from vitpose.builders import skeleton_data
    from vitpose.models.spec import METADATA_KEY, spec_of_model

    source = randomise(tiny(7, 0), 3)
    payload = {"model": source.state_dict(), "epoch": 3,  # what train.py's checkpoint_payload records
               METADATA_KEY: spec_of_model(source, skeleton=skeleton_data(K7)).to_dict()}
    torch.save(payload, tmp_path / "last.pth")
    init = read_init_source(str(tmp_path / "last.pth"))
    assert init.keypoint_names == K7.keypoint_names and init.grid == (8, 6)
    k5 = dataset_info(REPO / "configs" / "demo_k5_skeleton.yaml")
    target = tiny(5, 4)
    report = transfer_weights(target, init.state_dict, init.keypoint_names, k5.keypoint_names)
    assert [t for t, _, _ in report.copied] == list(k5.keypoint_names) and not report.fresh
    for k, name in enumerate(k5.keypoint_names):
        j = K7.keypoint_names.index(name)
        assert torch.equal(target.head.final_layer.weight[k], source.head.final_layer.weight[j])


def test_backbone_that_does_not_fit_names_the_dimension(tmp_path):
    for kwargs, match in (({"embed_dim": 128}, r"embed dim 128 in the source, 64 in the model"),
                          ({"depth": 3}, r"depth \(transformer blocks\) 3 in the source, 2 in the model")):
        path = save_weights(tiny(17, 0, **kwargs), tmp_path / "other.safetensors")
        with pytest.raises(BackboneMismatchError, match=match) as error:
            init_from_source(tiny(7, 2), cfg_for(path), K7, None)
        assert "\n" not in str(error.value)


def test_position_embedding_of_another_grid_is_resampled(tmp_path):
    source = randomise(tiny(17, 0, img_size=(64, 48)), 1)  # a 4x3 grid; the target has 8x6
    path = save_weights(source, tmp_path / "small_input.safetensors")
    target = tiny(7, 2)
    report = init_from_source(target, cfg_for(path), K7, None)
    assert any("resampled from a 4x3 to a 8x6 patch grid" in n for n in report.notes)
    # timm's rule is bicubic with antialias=True, which in torch is PIL's resampling filter: each
    # channel resized by Pillow (float images) is the reference, up and down.
    expected = pil_resample(source.backbone.pos_embed.detach(), (4, 3), (8, 6))
    torch.testing.assert_close(target.backbone.pos_embed.detach(), expected, rtol=0, atol=1e-5)
    pos = torch.randn(1, 96, 8)
    torch.testing.assert_close(resample_pos_embed(pos, (12, 8), (6, 4)), pil_resample(pos, (12, 8), (6, 4)),
                               rtol=0, atol=1e-5)
    assert not torch.allclose(resample_pos_embed(pos, (12, 8), (6, 4)), resize_pos_embed(pos, (12, 8), (6, 4)))


def pil_resample(pos, old_grid, new_grid):
    from PIL import Image

    grid = pos[0].reshape(*old_grid, -1).numpy()
    channels = [np.asarray(Image.fromarray(grid[:, :, c], mode="F").resize(new_grid[::-1], Image.BICUBIC))
                for c in range(grid.shape[-1])]
    return torch.from_numpy(np.stack(channels, -1).reshape(1, -1, grid.shape[-1]))


def plus_model(num_keypoints):
    torch.manual_seed(9)
    return build_model("vitpose-s", num_keypoints=num_keypoints, img_size=tuple(PLUS_CONFIG["image_size"]),
                       embed_dim=PLUS_CONFIG["hidden_size"], depth=PLUS_CONFIG["num_hidden_layers"],
                       num_heads=PLUS_CONFIG["num_attention_heads"])


@pytest.mark.parametrize("layout, expert, names", [("hf", "ap10k", COCO), ("official", "aic", None)])
def test_vitpose_plus_file_with_an_expert(tmp_path, layout, expert, names):
    """HF files carry COCO's head whatever the expert; official files the expert's own head."""
    from safetensors.numpy import save_file

    info = json.loads((REPO / "tests" / "fixtures" / "vitpose_plus_tiny.json").read_text())
    hf = hf_weights(info["spec"], info["seed"])
    from vitpose.models.spec import METADATA_KEY, spec_of_model

    weights = hf if layout == "hf" else official_from_hf(hf)
    path = tmp_path / f"plus_{layout}.safetensors"
    names = names or dataset_info(expert).keypoint_names
    # A 64-d ViT is no published size, so the file says what it is (as this project's files do);
    # the mixture of experts, the expert's head and its skeleton are the loader's to find.
    spec = spec_of_model(plus_model(len(names))).to_json()
    save_file({n: v for n, v in weights.items()}, str(path), metadata={METADATA_KEY: spec})
    reference = plus_model(len(names))  # the expert as load_weights gives it
    load_weights(reference, path, expert=expert)
    target = plus_model(7)
    report = init_from_source(target, cfg_for(path, init_expert=expert), K7, None)
    check_transfer(target, reference.state_dict(), list(names), report)
    shared = {"neck"} if layout == "official" else set()  # AIC has a neck, COCO has not
    assert {t for t, _, _ in report.copied} == (set(SHARED) | shared) & set(names)
    with pytest.raises(CheckpointError, match="choose one dataset with expert="):
        init_from_source(plus_model(7), cfg_for(path), K7, None)


def test_published_name_and_hf_repo_id_from_an_offline_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants
    from test_hub import fill_hf_cache

    from vitpose import hub

    source = randomise(tiny(17, 0), 5)
    payload = save_weights(source, tmp_path / "w.safetensors").read_bytes()
    hf_cache = tmp_path / "hf"
    fill_hf_cache(hf_cache, "test-org/vitpose-tiny", payload)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hf_cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setitem(hub.MODELS, "test-tiny", ModelInfo("test-tiny", "vitpose-s", "classic", "coco",
                                                           "huggingface", "test-org/vitpose-tiny"))
    for name in ("test-tiny", "test-org/vitpose-tiny"):
        target = tiny(7, 2)
        report = init_from_source(target, cfg_for(name), K7, None)
        check_transfer(target, source.state_dict(), COCO, report)
    with pytest.raises(CheckpointError, match="model.init = 'test-org/absent'.*not in the Hugging Face cache"):
        init_from_source(tiny(7, 2), cfg_for("test-org/absent"), K7, None)
    with pytest.raises(CheckpointError, match="unknown model 'vitpose-q'"):
        init_from_source(tiny(7, 2), cfg_for("vitpose-q"), K7, None)


def test_head_channel_map_by_name():
    assert head_channel_map(COCO, ["neck", "nose", "right_ankle"]) == [None, 0, 16]
    assert head_channel_map(COCO, ["neck", "nose"], {"neck": "left_shoulder"}) == [5, 0]
    assert head_channel_map(None, ["nose"]) == [None]
    with pytest.raises(ValueError, match="'knee' is not a keypoint of the target skeleton"):
        head_channel_map(COCO, ["nose"], {"knee": "left_knee"})


def test_config_fields():
    with pytest.raises(ConfigError, match="set one"):
        load_config(None, ["model.init=vitpose-b", "model.pretrained=mae.pth"])
    with pytest.raises(ConfigError, match="model.init_expert is set but model.init is not"):
        load_config(None, ["model.init_expert=aic"])
    with pytest.raises(ConfigError, match="train.freeze_backbone_epochs = -1"):
        load_config(None, ["train.freeze_backbone_epochs=-1"])
    with pytest.raises(ConfigError, match="unknown config key 'model.init_keypoints_map'"):
        load_config(None, ["model.init_keypoints_map={a: b}"])
    cfg = load_config(REPO / "configs" / "finetune.yaml")
    assert cfg.model.init and cfg.schedule.epochs < 210


def test_frozen_backbone_gets_no_update_and_the_epoch_decides(tmp_path):
    """The freeze is a function of the epoch alone, so a resumed run freezes (or not) the same way;
    an AdamW step with weight decay leaves a frozen backbone bit for bit unchanged."""
    from vitpose.engine.optim import param_groups

    cfg = load_config(None, ["train.freeze_backbone_epochs=2"])
    model = tiny(7, 0)
    optimizer = torch.optim.AdamW(param_groups(model, 1e-2, 0.1, 0.9))
    before = {n: t.clone() for n, t in model.state_dict().items()}
    messages = []
    for epoch, frozen in ((0, True), (1, True), (2, False), (3, False)):
        changed = apply_backbone_freeze(model, epoch, cfg, say=messages.append)
        assert changed == (epoch in (0, 2))
        assert all(p.requires_grad != frozen for p in model.backbone.parameters())
        assert all(p.requires_grad for p in model.head.parameters())
    assert messages == ["epoch 0: backbone frozen (train.freeze_backbone_epochs=2); only the head trains",
                        "epoch 2: backbone unfrozen"]
    resumed = tiny(7, 0)  # a run resumed in epoch 1 starts frozen
    assert apply_backbone_freeze(resumed, 1, cfg, say=messages.append)
    assert not any(p.requires_grad for p in resumed.backbone.parameters())

    apply_backbone_freeze(model, 0, cfg, say=messages.append)
    model.train()
    loss = model(torch.randn(2, 3, 128, 96)).square().mean()
    loss.backward()
    optimizer.step()
    after = model.state_dict()
    assert all(torch.equal(after[n], before[n]) for n in after if n.startswith("backbone."))
    assert not torch.equal(after["head.final_layer.weight"], before["head.final_layer.weight"])


def eval_aps(work_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (work_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["AP"] for r in records if r.get("kind") == "eval"]


@pytest.mark.slow
def test_fine_tuning_beats_random_init_at_equal_epochs(tmp_path):
    """BENCHMARKS.md "Fine-tuning", shortened: the COCO-17 demo model (4 of its 10 epochs; the
    benchmark's source had 3), then the
    7-keypoint synthetic set (5 keypoints named as COCO's, 2 new) for 2 epochs from it and from
    random weights, with the same recipe and seed. Fine-tuning must lead after each epoch."""
    import sys

    sys.path.insert(0, str(REPO))
    import train

    source = tmp_path / "coco_demo"
    assert train.main(["--demo", "--work-dir", str(source), "--data-root", str(tmp_path / "coco_data"),
                       "--epochs", "4"]) == 0
    runs = {}
    for name, extra in (("init", ["--init", str(source / "best.pth")]), ("scratch", [])):
        work_dir = tmp_path / name
        args = ["--config", str(REPO / "configs" / "demo_k7.yaml"), "--work-dir", str(work_dir), "--epochs", "2",
                "--data-root", str(tmp_path / "k7_data"), *extra,
                "--set", f"data.dataset_info={REPO / 'configs' / 'demo_k7_skeleton.yaml'}"]
        assert train.main(args) == 0
        runs[name] = eval_aps(work_dir)
    table = (tmp_path / "init" / TABLE_FILE).read_text()
    assert "5 keypoint(s) copied, 2 fresh" in table
    assert len(runs["init"]) == len(runs["scratch"]) == 2
    for epoch, (ft, scratch) in enumerate(zip(runs["init"], runs["scratch"]), 1):
        assert ft > scratch + 0.05, (epoch, runs)  # measured: +0.09 and more (BENCHMARKS.md)


def test_synthetic_midpoint_keypoints(tmp_path):
    """configs/demo_k7.yaml's new joints are the midpoints of COCO's shoulders / hips of the same
    people (the COCO-17 set of the same seed), labelled only where both ends are."""
    from vitpose.data.synthetic import make_coco

    k7 = json.loads(make_coco(tmp_path / "k7", 3, seed=4, dataset_info=K7).ann_file.read_text())
    coco = json.loads(make_coco(tmp_path / "coco", 3, seed=4).ann_file.read_text())
    assert k7["categories"][0]["keypoints"] == list(K7.keypoint_names)
    assert len(k7["annotations"]) == len(coco["annotations"]) > 0
    for a, b in zip(k7["annotations"], coco["annotations"]):
        ours, full = np.array(a["keypoints"]).reshape(7, 3), np.array(b["keypoints"]).reshape(17, 3)
        for j, (left, right) in ((1, (5, 6)), (4, (11, 12))):
            v = min(full[left, 2], full[right, 2])
            assert ours[j, 2] == v
            if v > 0:  # the COCO file rounds each end to 0.01 px
                np.testing.assert_allclose(ours[j, :2], (full[left, :2] + full[right, :2]) / 2, atol=0.011)
        for j, name in ((0, 0), (2, 9), (3, 10), (5, 15), (6, 16)):
            np.testing.assert_array_equal(ours[j], full[name])


def test_train_py_init_and_frozen_backbone_across_a_resume(tmp_path, capsys):
    """train.py --init with train.freeze_backbone_epochs=1: the backbone is the source's after
    steps of epoch 0, also after a stop and `--resume auto` inside epoch 0; it trains in epoch 1."""
    import sys

    sys.path.insert(0, str(REPO))
    from test_train_resume import tiny_args

    import train
    from vitpose.engine.checkpoint import load_checkpoint

    source_dir, work = tmp_path / "source", tmp_path / "k5"
    assert train.main(tiny_args(tmp_path / "coco", source_dir, "--set", "train.stop_at_iteration=1")) == 0
    k5 = ["--set", f"data.dataset_info={REPO / 'configs' / 'demo_k5_skeleton.yaml'}", "--set", "model.num_keypoints=5",
          "--init", str(source_dir / "last.pth"), "--set", "train.freeze_backbone_epochs=1", "--epochs", "2"]
    source = load_checkpoint(source_dir / "last.pth")["model"]

    def backbone_is_the_sources():
        model = load_checkpoint(work / "last.pth")["model"]
        return all(torch.equal(model[n], source[n]) for n in model if n.startswith("backbone."))

    assert train.main(tiny_args(tmp_path / "k5data", work, *k5, "--set", "train.stop_at_iteration=1")) == 0
    assert backbone_is_the_sources() and (work / TABLE_FILE).is_file()
    assert train.main(tiny_args(tmp_path / "k5data", work, *k5, "--resume", "auto",
                                "--set", "train.stop_at_iteration=2")) == 0
    assert load_checkpoint(work / "last.pth")["epoch"] == 0 and backbone_is_the_sources()
    assert train.main(tiny_args(tmp_path / "k5data", work, *k5, "--resume", "auto")) == 0
    assert load_checkpoint(work / "last.pth")["epoch"] == 2 and not backbone_is_the_sources()
    out = capsys.readouterr().out
    assert "epoch 0: backbone frozen" in out and "epoch 1: backbone unfrozen" in out
