"""One prediction pipeline (#17 Build 3) and what a `vitpose predict` run guarantees (#18).

- The same frames as images, as a video file and through OnnxPredictor give the same keypoints
  (exactly for images vs video: the same crops in the same batches; ONNX within the export gate's
  rule). The JSON's instance score is the evaluator's, also at a keypoint score of float32(0.2).
- Outputs are checked before any work and never replace an input; an existing --json is replaced
  only when the run completes; image ids follow one rule; one bad image or frame costs one input;
  SIGINT / SIGTERM finish the current item and leave parseable, resumable files (exit 130);
  non-finite values are null; messages name the flag.
"""

import json
import os
import signal

import cv2
import numpy as np
import pytest
import torch
from test_evaluate import tiny_model, write_tiny_model

from vitpose.cli import main
from vitpose.cli import predict as predict_cli
from vitpose.errors import UserError
from vitpose.evaluation.coco_evaluator import CocoEvaluator
from vitpose.inference import export as E
from vitpose.inference.pipeline import coco_records
from vitpose.inference.predictor import Predictor
from vitpose.inference.results import FullFrame, Poses

FRAMES, SIZE = 6, (96, 128)  # (w, h)


def strict_records(path):
    """JSON Lines parsed as strict JSON (NaN / Infinity are not JSON)."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, coco_mini_dir):
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), coco_mini_dir, seed=5)


def cli(tmp, tiny, *argv, capsys=None):
    config, checkpoint = tiny
    code = main(["predict", *map(str, argv), "--config", str(config), "--model", str(checkpoint), "--device", "cpu"])
    out, err = capsys.readouterr() if capsys is not None else ("", "")
    return code, out, err


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """An MJPG video of moving noise blobs and its decoded frames as PNG files (lossless)."""
    root = tmp_path_factory.mktemp("clip")
    rng = np.random.default_rng(0)
    writer = cv2.VideoWriter(str(root / "clip.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, SIZE)
    for f in range(FRAMES):
        frame = np.full((SIZE[1], SIZE[0], 3), 40, np.uint8)
        frame[20 + 5 * f:90 + 5 * f, 20:70] = rng.integers(0, 256, (70, 50, 3), dtype=np.uint8)
        writer.write(frame)
    writer.release()
    capture, decoded = cv2.VideoCapture(str(root / "clip.avi")), []
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        decoded.append(frame)
    capture.release()
    assert len(decoded) == FRAMES
    (root / "frames").mkdir()
    for f, frame in enumerate(decoded):
        cv2.imwrite(str(root / "frames" / f"frame_{f:03d}.png"), frame)
    return root / "clip.avi", root / "frames", decoded


def test_images_video_and_onnx_give_the_same_keypoints(tmp_path, tiny, clip, capsys):
    video, frames_dir, decoded = clip
    common = ["--detector", "full-frame", "--batch-images", 3, "--precision", "fp32"]  # fp32 as the ONNX graph
    assert cli(tmp_path, tiny, frames_dir, *common, "--json", tmp_path / "images.jsonl", capsys=capsys)[0] == 0
    assert cli(tmp_path, tiny, video, *common, "--json", tmp_path / "video.jsonl", capsys=capsys)[0] == 0
    images = strict_records(tmp_path / "images.jsonl")
    frames = strict_records(tmp_path / "video.jsonl")
    assert [r["file_name"] for r in images] == [f"frame_{f:03d}.png" for f in range(FRAMES)]
    assert [r["frame"] for r in frames] == list(range(FRAMES))
    for a, b in zip(images, frames):  # same pixels, same crops, same batches: the same numbers
        assert a["keypoints"] == b["keypoints"] and a["score"] == b["score"] and a["bbox"] == b["bbox"]

    config, checkpoint = tiny
    predictor = Predictor.from_config(config, checkpoint, device="cpu", detector=FullFrame())
    onnx_path = tmp_path / "tiny.onnx"
    E.to_onnx(predictor.model, onnx_path, codec=predictor.codec, log=None)
    from vitpose.inference.onnx import OnnxPredictor

    onnx = OnnxPredictor(onnx_path, detector=FullFrame())
    from vitpose.inference.runner import PredictOptions
    from vitpose.inference.video import run_video  # the video path runs the ONNX predictor too

    args = PredictOptions(json=tmp_path / "onnx.jsonl", progress=False, quiet=True, batch_frames=3)
    assert run_video(onnx, video, args).exit_status == 0
    through_onnx = strict_records(tmp_path / "onnx.jsonl")
    assert [r["frame"] for r in through_onnx] == list(range(FRAMES))
    # The export gate's rule: a keypoint may move KEYPOINT_SENSITIVITY_FACTOR times what the decode
    # moves under heatmap noise as large as the graph's difference, at least KEYPOINT_FLOOR_PX.
    crops, fixed = [], []
    for frame in decoded:
        center, scale = predictor.boxes_to_center_scale([[0, 0, *SIZE]])
        c, s = predictor.crops(frame[..., ::-1].copy(), center, scale)
        crops.append(c)
        fixed.append(s)
    crops, fixed = np.concatenate(crops), np.concatenate(fixed)
    reference, exported = predictor.run_network(crops), onnx.run_network(crops)
    heatmap_diff = float(np.abs(reference - exported).max())
    assert heatmap_diff <= E.FP32_TOLERANCE
    allowed = np.maximum(E.KEYPOINT_FLOOR_PX, E.KEYPOINT_SENSITIVITY_FACTOR
                         * E._decode_sensitivity(predictor.codec, reference, max(heatmap_diff, 1e-7)))
    allowed = allowed * fixed[:, None, 0] / predictor.codec.input_size[0]  # crop pixels -> image pixels
    mine = np.array([r["keypoints"] for r in frames]).reshape(FRAMES, -1, 3)
    theirs = np.array([r["keypoints"] for r in through_onnx]).reshape(FRAMES, -1, 3)
    assert np.all(np.linalg.norm(mine[..., :2] - theirs[..., :2], axis=-1) <= allowed + 1e-9)
    np.testing.assert_allclose(mine[..., 2], theirs[..., 2], rtol=0, atol=1e-4)


def test_instance_score_is_the_evaluators_at_float32_0_2(coco_mini_dir):
    """A keypoint score of exactly float32(0.2) is above 0.2 in float64 (MMPose under NumPy 1.x):
    the JSON's `score` counts it, as the evaluator does (a float32 comparison would not)."""
    scores = np.array([[np.float32(0.2), 0.9, 0.1] + [0.05] * 14, [np.float32(0.2)] * 17], np.float32)
    poses = Poses(np.array([[0, 0, 10, 20], [5, 5, 30, 40]], np.float32), np.array([0.8, 0.5], np.float32),
                  np.zeros((2, 17, 2)), scores)
    records, bad = coco_records(poses, image_id=1, file_name="1.jpg")
    evaluator = CocoEvaluator(coco_mini_dir / "test_coco.json")
    expected = evaluator.rescore(scores, poses.box_scores)
    assert bad == 0 and [r["score"] for r in records] == expected.tolist()
    assert records[1]["score"] == pytest.approx(0.5 * float(np.float32(0.2)), rel=1e-12)  # not 0
    np.testing.assert_array_equal(np.array([r["keypoints"] for r in records]).reshape(2, 17, 3)[..., 2],
                                  scores.astype(np.float64))


def write_images(folder, names, seed=0, size=(60, 50)):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in names:
        cv2.imwrite(str(folder / name), rng.integers(0, 256, (size[0], size[1], 3), dtype=np.uint8))
    return [folder / name for name in names]


# ------------------------------------------------------------------------------ #18 item 2 and 7


def test_outputs_that_would_replace_an_input_are_refused_before_any_work(tmp_path, tiny, clip, capsys, monkeypatch):
    video, _, _ = clip
    clips = tmp_path / "clips"
    clips.mkdir()
    source = clips / "clip.mp4"  # `--out .` names the drawn video <stem>.mp4: this very file
    source.write_bytes(video.read_bytes())
    before = source.read_bytes()
    monkeypatch.chdir(clips)
    for extra in (["--out", "."], ["--out", "clip.mp4"], ["--json", "clip.mp4"]):
        code, _, err = cli(tmp_path, tiny, "clip.mp4", "--detector", "full-frame", *extra, capsys=capsys)
        assert code == 2 and "would replace the input" in err and extra[0] in err, err
        assert source.read_bytes() == before
    photo = write_images(tmp_path / "photos", ["a.png"])[0]
    photo_bytes = photo.read_bytes()
    code, _, err = cli(tmp_path, tiny, photo, "--detector", "full-frame", "--json", photo, capsys=capsys)
    assert code == 2 and "--json" in err and "would replace the input" in err and photo.read_bytes() == photo_bytes


@pytest.mark.parametrize("flag, target, message", [
    ("--json", "{tmp}", "is a folder"),
    ("--json", "{tmp}/file.txt/r.jsonl", "is a file, not a folder"),
    ("--out", "{tmp}/file.txt/drawn", "is a file, not a folder"),
    ("--out", "{tmp}/file.txt", "is a file; --out takes a folder"),
])
def test_outputs_are_checked_before_the_model_loads(tmp_path, capsys, flag, target, message):
    write_images(tmp_path / "imgs", ["a.png"])
    (tmp_path / "file.txt").write_text("x")
    # an unknown model: the output is refused first, so nothing was computed or downloaded
    code = main(["predict", str(tmp_path / "imgs"), "--model", "no-such-model", flag, target.format(tmp=tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"error: {flag} " in err and message in err, err


def test_an_existing_json_is_replaced_only_when_the_run_completes(tmp_path, tiny, capsys, monkeypatch):
    old = tmp_path / "poses.jsonl"
    old.write_text('{"kept": true}\n')
    code, _, err = cli(tmp_path, tiny, tmp_path / "typo.png", "--detector", "full-frame", "--json", old, capsys=capsys)
    assert code == 2 and "source not found" in err and old.read_text() == '{"kept": true}\n'
    write_images(tmp_path / "imgs", ["a.png", "b.png"])
    with_detector(tiny, SignalOnCall(signal.SIGINT, 1), monkeypatch)
    code, _, err = cli(tmp_path, tiny, tmp_path / "imgs", "--json", old, "--batch-images", 1, capsys=capsys)
    assert code == 130 and old.read_text() == '{"kept": true}\n' and "poses.jsonl is unchanged" in err, err
    partial, = tmp_path.glob(".poses.jsonl.*.partial")  # a new file with a random name (vitpose.files)
    assert str(partial) in err
    assert [r["file_name"] for r in strict_records(partial)] == ["a.png"]
    monkeypatch.undo()
    code, _, _ = cli(tmp_path, tiny, tmp_path / "imgs", "--detector", "full-frame", "--json", old, "--resume",
                     capsys=capsys)
    assert code == 0 and [r["file_name"] for r in strict_records(old)] == ["a.png", "b.png"]
    assert not partial.exists()


# ------------------------------------------------------------------------------ #18 item 5


def test_image_ids_one_rule(tmp_path, tiny, capsys):
    folder = tmp_path / "mixed"
    write_images(folder, ["000000000007.png", "000000000009.png", "holiday.png"])
    dets = tmp_path / "dets.json"
    dets.write_text(json.dumps([{"image_id": 7, "bbox": [1, 2, 30, 40], "score": 0.9}]))
    code, _, err = cli(tmp_path, tiny, folder, "--boxes", dets, capsys=capsys)
    assert code == 2 and "not all COCO ids (e.g. 'holiday.png')" in err and "add 'file_name'" in err, err
    dets.write_text(json.dumps([{"file_name": "000000000009.png", "bbox": [1, 2, 30, 40], "score": 0.9}]))
    out = tmp_path / "r.jsonl"
    assert cli(tmp_path, tiny, folder, "--boxes", dets, "--json", out, capsys=capsys)[0] == 0
    records = strict_records(out)
    assert [(r["file_name"], r["image_id"], r["bbox"]) for r in records] == [("000000000009.png", 1, [1, 2, 30, 40])]

    write_images(tmp_path / "dup", ["1.png", "001.png"])
    code, _, err = cli(tmp_path, tiny, tmp_path / "dup", "--detector", "full-frame", capsys=capsys)
    assert code == 2 and "001.png and 1.png both have the COCO image id 1" in err, err
    write_images(tmp_path / "sup", ["².png", "3.png"])
    out = tmp_path / "sup.jsonl"
    code, _, err = cli(tmp_path, tiny, tmp_path / "sup", "--detector", "full-frame", "--json", out, capsys=capsys)
    assert code == 0, err
    assert [(r["file_name"], r["image_id"]) for r in strict_records(out)] == [("3.png", 0), ("².png", 1)]


# ------------------------------------------------------------------------------ #18 items 6, 8, 9


class SignalOnCall:
    """FullFrame that sends `signum` to this process on call number `when` (a real signal, at a
    known point of the run: the handler of `vitpose predict` catches it)."""

    def __init__(self, signum, when):
        self.signum, self.when, self.calls = signum, when, 0

    def __call__(self, images, channels="rgb"):
        self.calls += 1
        if self.calls == self.when:
            os.kill(os.getpid(), self.signum)
        return FullFrame()(images, channels)


def with_detector(tiny, detector, monkeypatch):
    config, checkpoint = tiny
    monkeypatch.setattr(predict_cli, "build_predictor",
                        lambda options, mark_by="auto": Predictor.from_config(config, checkpoint, device="cpu", detector=detector))


def test_sigint_on_a_folder_leaves_parseable_json_and_resume_completes_it(tmp_path, tiny, capsys, monkeypatch):
    names = [f"{i:02d}.png" for i in range(7)]
    write_images(tmp_path / "imgs", names)
    out = tmp_path / "r.jsonl"
    with_detector(tiny, SignalOnCall(signal.SIGINT, 3), monkeypatch)
    code, _, err = cli(tmp_path, tiny, tmp_path / "imgs", "--json", out, "--batch-images", 2, capsys=capsys)
    assert code == 130 and "interrupted by SIGINT after 6 images" in err and "--resume" in err, err
    assert [r["file_name"] for r in strict_records(out)] == names[:6]  # the third chunk was finished
    with_detector(tiny, FullFrame(), monkeypatch)
    code, printed, _ = cli(tmp_path, tiny, tmp_path / "imgs", "--json", out, "--resume", "--batch-images", 2,
                           capsys=capsys)
    assert code == 0 and "(5 already in" in printed  # the last image in the file is done again
    assert [r["file_name"] for r in strict_records(out)] == names  # each exactly once


def test_sigterm_on_a_video_closes_a_playable_file(tmp_path, tiny, clip, capsys, monkeypatch):
    video, _, _ = clip
    with_detector(tiny, SignalOnCall(signal.SIGTERM, 2), monkeypatch)
    out, drawn = tmp_path / "v.jsonl", tmp_path / "drawn.avi"
    code, _, err = cli(tmp_path, tiny, video, "--json", out, "--out", drawn, "--batch-images", 2, capsys=capsys)
    assert code == 130 and "interrupted: stopped by the user after 4 frames" in err and "ended early" not in err
    assert [r["frame"] for r in strict_records(out)] == [0, 1, 2, 3]
    capture = cv2.VideoCapture(str(drawn))
    count = 0
    while capture.read()[0]:
        count += 1
    capture.release()
    assert count == 4
    with_detector(tiny, FullFrame(), monkeypatch)
    assert cli(tmp_path, tiny, video, "--json", out, "--resume", "--batch-images", 2, capsys=capsys)[0] == 0
    assert [r["frame"] for r in strict_records(out)] == list(range(FRAMES))


def test_one_bad_image_costs_one_image(tmp_path, tiny, capsys, monkeypatch):
    """A 1x2000 strip among photos (#18 item 8): torchvision's detector (random weights: nothing downloads)
    raises on it (its resize to 1333 px makes the height 0); the other images are done, the strip is
    named, exit 1. (A strip over twice the detector's working side is shrunk before it and passes.)"""
    from vitpose.inference.detect import build_detector

    write_images(tmp_path / "imgs", ["a.png", "c.png"])
    cv2.imwrite(str(tmp_path / "imgs" / "b.png"), np.zeros((1, 2000, 3), np.uint8))
    torch.manual_seed(0)
    with_detector(tiny, build_detector("fasterrcnn-mobilenet-v3-large-fpn", pretrained=False), monkeypatch)
    out = tmp_path / "r.jsonl"
    code, printed, err = cli(tmp_path, tiny, tmp_path / "imgs", "--json", out, capsys=capsys)
    assert code == 1 and printed.startswith("2 images, "), printed
    assert "1 images skipped" in err and "b.png: RuntimeError: " in err, err
    assert {r["file_name"] for r in strict_records(out)} <= {"a.png", "c.png"}


def test_video_inputs_are_one_line(tmp_path, tiny, clip, capsys):
    video, _, _ = clip
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "text.mp4").write_text("not a video")
    cut = tmp_path / "cut.avi"
    cut.write_bytes(video.read_bytes()[:len(video.read_bytes()) // 2])
    for source, message in (("empty.mp4", "the file is empty"), ("text.mp4", "cannot open this file as a video"),
                            ("99", "webcam 99: the camera could not be opened")):
        code, _, err = cli(tmp_path, tiny, tmp_path / source if source != "99" else source, "--detector",
                           "full-frame", capsys=capsys)
        assert code == 2 and err.count("\n") == 1 and message in err, err
    code, _, err = cli(tmp_path, tiny, cut, "--detector", "full-frame", capsys=capsys)
    assert code == 1 and "the video ended early" in err
    boxes = tmp_path / "boxes.json"
    boxes.write_text(json.dumps([{"frame": 2, "bbox": [10, 20, 40, 60], "score": 0.7}]))
    out = tmp_path / "f.jsonl"
    assert cli(tmp_path, tiny, video, "--boxes", boxes, "--json", out, capsys=capsys)[0] == 0
    assert [(r["frame"], r["bbox"], r["bbox_score"]) for r in strict_records(out)] == [(2, [10, 20, 40, 60],
                                                                                        pytest.approx(0.7))]


# ------------------------------------------------------------------------------ #18 items 11 and 13


def test_non_finite_values_are_null_with_a_warning(tmp_path, capsys, monkeypatch):
    model = tiny_model(seed=1)
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if n.endswith("bias")).fill_(float("nan"))
    monkeypatch.setattr(predict_cli, "build_predictor",
                        lambda options, mark_by="auto": Predictor(model, device="cpu", detector=FullFrame()))
    write_images(tmp_path / "imgs", ["a.png"])
    out = tmp_path / "r.jsonl"
    code, _, err = cli(tmp_path, (tmp_path, tmp_path), tmp_path / "imgs", "--json", out, capsys=capsys)
    assert code == 0 and "not finite and are written as null" in err
    record = strict_records(out)[0]
    assert record["keypoints"].count(None) > 0 and all(v is None or np.isfinite(v) for v in record["keypoints"])


def test_api_conveniences_and_flag_names(tmp_path, tiny, capsys):
    from PIL import Image

    predictor = Predictor(tiny_model(seed=2), device="cpu", detector=FullFrame())
    image = np.random.default_rng(0).integers(0, 256, (70, 50, 3), dtype=np.uint8)
    keypoints, scores = predictor.predict(image, [])
    assert keypoints.shape == (0, 17, 2) and scores.shape == (0, 17)
    from_pil = predictor(Image.fromarray(image))
    direct = predictor(image)
    np.testing.assert_array_equal(from_pil.keypoints, direct.keypoints)
    write_images(tmp_path / "imgs", ["a.png"])
    code, _, err = cli(tmp_path, tiny, tmp_path / "imgs", "--detector-threshold", 1.5, capsys=capsys)
    assert code == 2 and "--detector-threshold must be in [0, 1], got 1.5" in err


def test_results_file_keeps_nothing_in_memory_and_resumes_after_a_torn_line(tmp_path):
    """JSON Lines: records go to the file, not to memory (a webcam runs for hours); a run killed
    in the middle of a line is continued from the last whole item, which is done again."""
    from vitpose.inference.writers import ResultsFile

    path = tmp_path / "r.jsonl"
    results = ResultsFile(path, "frame")
    for f in range(1000):
        results.write([{"frame": f, "person": 0}, {"frame": f, "person": 1}])
    assert results.records == [] and results.count == 2000
    results.close(completed=False)
    with open(path, "a") as f:
        f.write('{"frame": 1000, "per')  # killed mid-write
    again = ResultsFile(path, "frame", resume=True)
    assert again.done == set(range(999))  # frame 999 may have been incomplete: done again
    again.write([{"frame": 999, "person": 0}, {"frame": 999, "person": 1}])
    again.close(completed=True)
    frames = [r["frame"] for r in strict_records(path)]
    assert len(frames) == 2000 and frames[-4:] == [998, 998, 999, 999]
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"frame": 0}]))
    with pytest.raises(UserError, match="is one JSON list; --resume continues JSON Lines"):
        ResultsFile(listed, "frame", resume=True)
    assert json.loads(listed.read_text()) == [{"frame": 0}]  # untouched


def test_boxes_per_forward_pass_default_by_device_and_as_given(tiny):
    """Without --batch-size a CPU predictor runs 8 boxes (16 crops with the flip test) per forward
    pass (BENCHMARKS.md: per crop a CPU forward is slowest at 64-128 crops); 20 boxes are then 3
    passes, and a given batch_size is kept (20 boxes at 32: one pass)."""
    from vitpose.device import default_batch_size

    assert default_batch_size("cpu") == 8 and default_batch_size(torch.device("cuda", 0)) == 32
    boxes = np.array([[10.0 + i, 5.0, 40.0 + i, 45.0] for i in range(20)])
    image = np.zeros((60, 80, 3), np.uint8)
    for given, passes in ((None, 3), (32, 1)):
        predictor = Predictor(str(tiny[1]), device="cpu", batch_size=given)
        assert predictor.batch_size == (8 if given is None else given)
        sizes = []
        run = predictor.run_network
        predictor.run_network = lambda crops: (sizes.append(len(crops)), run(crops))[1]
        predictor.predict(image, boxes)
        assert len(sizes) == passes and sum(sizes) == 20
    from vitpose.cli import build_parser

    # the CLI leaves the choice to the predictor's device rule
    assert build_parser().parse_args(["predict", "x.jpg"]).batch_size is None
