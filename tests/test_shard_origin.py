"""Shard files that must not merge, and the faults of a sharded run (CI tier, no model runs twice
where once does).

- every shard file's header records the model (its file's SHA-256) and the source; `vitpose merge`
  refuses shard files of two models or of two sources (one line naming both files), `--resume`
  refuses to continue another model's file; a header of an older vitpose (neither) still merges;
- `merge` passes over what is not a regular file (a FIFO must not block it) and names the file
  and line of a NaN;
- the shard file's own checks: an end line whose count is wrong, a unit written twice (the first
  copy), `merge --format coco` of a video's segments (the frame is the image_id);
- `--nproc-per-node` exits 1 when a shard was killed by SIGKILL (fake children: no model loads);
- launcher variables: `WORLD_SIZE=1` is one process, not a shard.
"""

import json
import os
import signal
import sys
import threading

import pytest
from test_evaluate import tiny_model
from test_shard import COMMON, merge, predict, write_images

import vitpose
from vitpose.inference import sharded
from vitpose.inference.units import (
    ShardError,
    ShardFile,
    WorkUnit,
    merge_shards,
    model_identity,
    read_shard_file,
    shard_files,
    shard_from_environment,
    write_manifest,
)

NAMES = [f"{stem}.png" for stem in ("walk", "run", "jump", "sit", "stand", "lie")]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two-models")
    paths = []
    for seed in (11, 12):
        paths.append(folder / f"tiny{seed}.safetensors")
        vitpose.save_weights(tiny_model(seed=seed), paths[-1])
    return paths


def one_error_line(err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_merge_refuses_shards_of_two_models_and_resume_onto_another_models_file(tmp_path, two_models, capsys):
    first, second = two_models
    write_images(tmp_path / "photos", NAMES)
    shards = tmp_path / "shards"
    assert predict([tmp_path / "photos", "--model", first, *COMMON, "--shard", "0/2", "--json", shards], capsys)[0] == 0
    header = json.loads((shards / "shard-0-of-2.jsonl").read_text().splitlines()[0])
    assert header == {"vitpose_shard": "0/2", "model": str(first), "model_sha256": model_identity(first)["model_sha256"],
                      "source": str(tmp_path / "photos")}
    assert predict([tmp_path / "photos", "--model", second, *COMMON, "--shard", "1/2", "--json", shards], capsys)[0] == 0
    code, printed, err = merge(shards, tmp_path / "merged.jsonl", capsys)
    line = one_error_line(err)
    assert code == 2 and not (tmp_path / "merged.jsonl").exists(), (printed, err)
    assert "shard-0-of-2.jsonl and shard-1-of-2.jsonl" in line and "different models" in line
    assert str(first) in line and str(second) in line
    # --resume of shard 0 with the second model: refused, the file untouched
    before = (shards / "shard-0-of-2.jsonl").read_bytes()
    code, _, err = predict([tmp_path / "photos", "--model", second, *COMMON, "--shard", "0/2", "--json", shards,
                            "--resume"], capsys)
    line = [x for x in err.splitlines() if "error:" in x]
    assert code == 2 and len(line) == 1 and "--resume" in line[0] and str(first) in line[0] and str(second) in line[0]
    assert (shards / "shard-0-of-2.jsonl").read_bytes() == before
    # the same weights under another path are the same model (compared by hash)
    copy = tmp_path / "elsewhere" / "same.safetensors"
    copy.parent.mkdir()
    copy.write_bytes(second.read_bytes())
    assert predict([tmp_path / "photos", "--model", copy, *COMMON, "--shard", "0/2", "--json", shards], capsys)[0] == 0
    code, printed, err = merge(shards, tmp_path / "merged.jsonl", capsys)
    assert code == 0 and "6 of 6 units complete" in printed, err
    # a header written by an older vitpose (no model, no source) is accepted as unknown
    path = shards / "shard-0-of-2.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text('{"vitpose_shard": "0/2"}\n' + "".join(lines[1:]))
    assert read_shard_file(path).origin == {}
    code, printed, err = merge(shards, tmp_path / "merged.jsonl", capsys)
    assert code == 0 and "6 of 6 units complete" in printed, err


def test_merge_refuses_shards_of_two_sources_with_the_same_names(tmp_path, two_models, capsys):
    write_images(tmp_path / "a", NAMES, seed=0)
    write_images(tmp_path / "b", NAMES, seed=1)  # same names, other pixels
    shards = tmp_path / "shards"
    for k, folder in ((0, "a"), (1, "b")):
        code, _, err = predict([tmp_path / folder, "--model", two_models[0], *COMMON, "--shard", f"{k}/2", "--json",
                                shards], capsys)
        assert code == 0, err
    code, _, err = merge(shards, tmp_path / "merged.jsonl", capsys)
    line = one_error_line(err)
    assert code == 2 and "different sources" in line and str(tmp_path / "a") in line and str(tmp_path / "b") in line
    assert not (tmp_path / "merged.jsonl").exists()


def shard_of(tmp_path, units, records_of, name="shard-0-of-1.jsonl"):
    """A shard file written through ShardFile, and its folder's manifest."""
    write_manifest(tmp_path, units, tmp_path)
    path = tmp_path / name
    writer = ShardFile(path, 0, 1, units, origin={"model": "m.pth", "model_sha256": "ab" * 32,
                                                   "source": str(tmp_path)})
    for unit in units:
        writer.begin(unit)
        writer.add(records_of(unit))
        writer.end()
    writer.close(completed=True)
    return path


def image_units(names):
    return [WorkUnit(name, name, file_name=name, image_id=i) for i, name in enumerate(names)]


def record(score, frame=None):
    r = {"bbox": [0, 0, 1, 1], "keypoints": [1.0, 2.0, score], "score": score, "category_id": 1}
    return r if frame is None else dict(r, frame=frame)


def test_merge_passes_over_a_fifo_and_names_the_line_of_a_nan(tmp_path, capsys):
    path = shard_of(tmp_path, image_units(["a.png", "b.png"]), lambda u: [record(0.5)])
    os.mkfifo(tmp_path / "zz.jsonl")
    os.symlink("/dev/zero", tmp_path / "dev.jsonl")
    found = []
    lister = threading.Thread(target=lambda: found.append(shard_files(tmp_path)), daemon=True)
    lister.start()
    lister.join(timeout=20)
    if lister.is_alive():  # unblock the thread before failing: a writer opens the FIFO once
        os.close(os.open(tmp_path / "zz.jsonl", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("listing the shard files blocked on a FIFO")
    assert found == [[path]]
    code, printed, err = merge(tmp_path, tmp_path / "merged.jsonl", capsys)
    assert code == 0 and "2 of 2 units complete" in printed, err
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = lines[3].replace("0.5", "NaN", 1)  # the second unit's record
    path.write_text("".join(lines))
    code, _, err = merge(tmp_path, tmp_path / "merged2.jsonl", capsys)
    line = one_error_line(err)
    assert code == 2 and str(path) in line and "line 4" in line and "NaN" in line
    assert not (tmp_path / "merged2.jsonl").exists()


def test_an_end_line_with_a_wrong_count_is_refused_and_a_unit_twice_keeps_its_first_copy(tmp_path):
    path = shard_of(tmp_path, image_units(["a.png"]), lambda u: [record(0.1)])
    with open(path, "a") as f:  # the same unit again, another score: the first complete copy counts
        f.write(json.dumps(dict(record(0.9), unit="a.png")) + "\n" + json.dumps({"unit_done": "a.png", "records": 1})
                + "\n")
    assert read_shard_file(path).units["a.png"][0]["score"] == 0.1
    assert merge_shards(tmp_path).records[0]["score"] == 0.1
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = json.dumps({"unit_done": "a.png", "records": 2}) + "\n"  # says 2, the file has 1
    path.write_text("".join(lines))
    with pytest.raises(ShardError, match="says 2 records, the file has 1"):
        read_shard_file(path)


def test_merge_format_coco_of_a_segmented_video_gives_each_record_its_frame_as_image_id(tmp_path, capsys):
    units = [WorkUnit(f"clip.avi#{s}-{s + 2}", tmp_path / "clip.avi", start=s, stop=s + 2) for s in (0, 2)]
    shard_of(tmp_path, units, lambda u: [record(0.5, frame=u.start), record(0.5, frame=u.start + 1)])
    code, _, err = merge(tmp_path, tmp_path / "merged.json", capsys, "--format", "coco")
    assert code == 0, err
    results = json.loads((tmp_path / "merged.json").read_text())
    assert [r["image_id"] for r in results] == [0, 1, 2, 3] == [r["frame"] for r in results]


def test_world_size_one_is_not_a_shard():
    assert shard_from_environment({"RANK": "0", "WORLD_SIZE": "1"}) is None  # torchrun --nproc-per-node 1
    assert shard_from_environment({"RANK": "1", "WORLD_SIZE": "2"})[:2] == (1, 2)


KILL_SELF = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


@pytest.mark.parametrize("fate", ["sigkill", "ok"])
def test_nproc_per_node_exits_1_when_a_shard_is_killed(tmp_path, two_models, capsys, monkeypatch, fate):
    """The children are stand-ins (no model loads): shard 1 kills itself with SIGKILL, as the OOM
    killer or a `kill -9` would; the launcher must not report success with a shard missing."""
    started = []
    real_popen = sharded.subprocess.Popen

    def fake_popen(command, env=None, **kwargs):
        started.append(command)
        shard = command[command.index("--shard") + 1]
        code = KILL_SELF if shard == "1/2" and fate == "sigkill" else "pass"
        return real_popen([sys.executable, "-c", code], env=env, **kwargs)

    monkeypatch.setattr(sharded.subprocess, "Popen", fake_popen)
    write_images(tmp_path / "photos", NAMES[:2])
    code, _, err = predict([tmp_path / "photos", "--model", two_models[0], *COMMON, "--nproc-per-node", "2",
                            "--json", tmp_path / "shards"], capsys)
    assert [c[c.index("--shard") + 1] for c in started] == ["0/2", "1/2"]
    assert all("--nproc-per-node" not in c for c in started)
    if fate == "ok":
        assert code == 0 and "vitpose merge" in err, err
        return
    assert code == 1, err
    assert "shard 1/2 was killed by SIGKILL" in err and "--shard 1/2 --resume" in err
    assert sharded.shards_status([0, -signal.SIGKILL], "d") == 1
    assert sharded.shards_status([-signal.SIGTERM, 0], "d") == 130


@pytest.mark.parametrize("damage", ["id a list", "no file_name", "image_id a string"])
def test_a_damaged_manifest_entry_is_one_line(tmp_path, capsys, damage):
    shard_of(tmp_path, image_units(["a.png", "b.png"]), lambda u: [record(0.5)])
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    unit = manifest["units"][1]
    if damage == "id a list":
        unit["id"] = ["b.png"]
    elif damage == "no file_name":
        del unit["file_name"]
    else:
        unit["image_id"] = "x"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = merge(tmp_path, tmp_path / "merged.jsonl", capsys)
    line = one_error_line(err)
    assert code == 2 and "manifest.json: unit [1]" in line, err


def test_a_refused_resume_leaves_the_manifest_as_it_was(tmp_path, two_models, capsys):
    write_images(tmp_path / "a", NAMES[:3], seed=0)
    write_images(tmp_path / "b", NAMES[:3], seed=1)
    shards = tmp_path / "shards"
    assert predict([tmp_path / "a", "--model", two_models[0], *COMMON, "--shard", "0/1", "--json", shards], capsys)[0] == 0
    manifest = (shards / "manifest.json").read_bytes()
    code, _, err = predict([tmp_path / "b", "--model", two_models[0], *COMMON, "--shard", "0/1", "--json", shards,
                            "--resume"], capsys)
    assert code == 2 and "the source" in err and str(tmp_path / "b") in err, err
    assert (shards / "manifest.json").read_bytes() == manifest
    code, printed, err = merge(shards, tmp_path / "merged.jsonl", capsys)
    assert code == 0 and "3 of 3 units complete" in printed, err
