"""The same input gets the same answer on every path of `vitpose predict`.

- A `--boxes` file with a box far outside its image is refused the same way (exit 2, one line
  naming the file and the record) by a local run over images, a local run over a video, its
  `--segment` run, a `--shard` run and an `--engine ray` run.
- A disk that fills up mid-run (ENOSPC injected into the results file's writes) is one line, and
  every unit finished before it is kept, in a local (exit 2) and in a sharded run (exit 1: the run
  did part of its work, which --resume continues).
"""

import errno
import json

import cv2
import numpy as np
import pytest
from test_evaluate import tiny_model
from test_shard import COMMON, predict, records, write_images

import vitpose
from vitpose.inference.units import ShardFile, read_shard_file
from vitpose.inference.writers import ResultsFile

SIZE = (60, 48)  # width, height of every image and frame


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("one-way-model") / "tiny.safetensors"
    vitpose.save_weights(tiny_model(seed=11), path)
    return path


def write_video(path, frames=4):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, SIZE)
    rng = np.random.default_rng(3)
    for _ in range(frames):
        writer.write(rng.integers(0, 256, (SIZE[1], SIZE[0], 3), dtype=np.uint8))
    writer.release()
    return path


def write_same_size_images(folder, count):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    for i in range(count):
        cv2.imwrite(str(folder / f"{i}.png"), rng.integers(0, 256, (SIZE[1], SIZE[0], 3), dtype=np.uint8))


def far_boxes(path, count):
    """One record per image and frame (keyed by both), the second one's box far outside its image."""
    rows = [{"image_id": i, "frame": i, "bbox": [5, 5, 30, 30], "score": 0.9} for i in range(count)]
    rows[1]["bbox"] = [0, 0, 1e30, 1e30]
    path.write_text(json.dumps(rows))
    return path


def refusal(code, err, boxes):
    """The one line of a refused run (exit 2), else a description of what happened instead."""
    lines = [line for line in err.splitlines() if line.startswith("vitpose predict: error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert str(boxes) in lines[0] and "record [1]" in lines[0] and "far outside" in lines[0], lines[0]
    return lines[0].split("lies far outside", 1)[0]


def test_a_box_far_outside_gets_one_answer_on_every_path(tmp_path, weights, capsys):
    write_same_size_images(tmp_path / "imgs", 3)
    video = write_video(tmp_path / "clip.avi", frames=3)
    boxes = far_boxes(tmp_path / "boxes.json", 3)
    base = ["--model", weights, *COMMON[2:], "--boxes", boxes]  # no --detector: the boxes give the people
    runs = {
        "images": [tmp_path / "imgs", *base, "--json", tmp_path / "images.jsonl"],
        "shard": [tmp_path / "imgs", *base, "--shard", "0/1", "--json", tmp_path / "shards"],
        "video": [video, *base, "--json", tmp_path / "video.jsonl"],
        "segment": [video, *base, "--segment", "2", "--json", tmp_path / "segments"],
    }
    try:
        import ray  # noqa: F401

        runs["ray"] = [tmp_path / "imgs", *base, "--engine", "ray", "--workers", "1", "--json", tmp_path / "ray"]
    except ImportError:
        pass
    answers = {}
    for name, argv in runs.items():
        code, _, err = predict(argv, capsys)
        answers[name] = refusal(code, err, boxes)
    # the same record of the same file, named the same way (the key it was looked up by aside)
    assert len({a.replace("frame 1", "image_id 1") for a in answers.values()}) == 1, answers


class FullDisk:
    """A file whose writes fail with ENOSPC, as a full disk's do."""

    def __init__(self, file):
        self._file = file

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self._file, name)


@pytest.fixture
def disk_fills_at_unit_3(monkeypatch):
    """The results file's disk fills when the third unit (image) begins (the results file and the
    shard file alike)."""
    begun = []

    def counting(begin):
        def counting_begin(self, unit):
            begun.append(unit)
            if len(begun) == 3:
                self.file = FullDisk(self.file)
            return begin(self, unit)
        return counting_begin

    for cls in (ResultsFile, ShardFile):
        monkeypatch.setattr(cls, "begin", counting(cls.begin))
    return begun


@pytest.mark.parametrize("sharded", [False, True], ids=["local", "sharded"])
def test_a_full_disk_is_one_line_and_keeps_every_complete_unit(tmp_path, weights, capsys, disk_fills_at_unit_3,
                                                               sharded):
    write_images(tmp_path / "photos", [f"{i}.png" for i in range(5)])
    out = tmp_path / ("shards" if sharded else "poses.jsonl")
    argv = [tmp_path / "photos", "--model", weights, *COMMON, "--json", out] + (["--shard", "0/1"] if sharded else [])
    code, _, err = predict(argv, capsys)
    lines = [line for line in err.splitlines() if line.startswith("vitpose predict: error:")]
    assert code == (1 if sharded else 2) and len(lines) == 1 and "Traceback" not in err, err
    assert "disk full" in lines[0] and "--resume" in lines[0], lines[0]
    if sharded:
        contents = read_shard_file(out / "shard-0-of-1.jsonl")
        assert sorted(contents.units) == ["0.png", "1.png"] and contents.torn == 0
    else:
        assert sorted({r["file_name"] for r in records(out)}) == ["0.png", "1.png"]


def test_open_predictor_is_the_one_door(weights, tmp_path):
    """The public door: weights give a torch Predictor with the precision resolved once (its
    autocast dtype), an exported file its runtime's predictor; the user's mistakes are one line each."""
    from vitpose.errors import UsageError
    from vitpose.inference.onnx import OnnxPredictor
    from vitpose.inference.predictor import Predictor

    torch_predictor = vitpose.open_predictor(str(weights), device="cpu", precision="fp32", detector="full-frame")
    assert isinstance(torch_predictor, Predictor) and torch_predictor.amp_dtype is None
    pytest.importorskip("onnxruntime")
    from vitpose.inference.export import to_onnx

    onnx_path = tmp_path / "tiny.onnx"
    to_onnx(torch_predictor.model, onnx_path, codec=torch_predictor.codec, log=None)
    assert isinstance(vitpose.open_predictor(str(onnx_path), detector=None), OnnxPredictor)
    for kwargs, flag in ((dict(detector="typo"), "--detector"), (dict(precision="fp64"), "--precision"),
                         (dict(device="tpu"), "--device"), (dict(det_classes=("zebraz",)), "--det-classes")):
        with pytest.raises(UsageError) as refused:
            vitpose.open_predictor(str(weights), **kwargs)
        assert str(refused.value).startswith(flag) and "\n" not in str(refused.value), str(refused.value)
