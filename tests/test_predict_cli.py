"""`vitpose predict` on images and directories (the video path belongs to vitpose.inference.video).

- On coco-mini with its detection file, the command's keypoints equal evaluate.py's predictions
  and `Predictor.predict` on the same boxes and weights, bit for bit (one crop per forward pass
  everywhere, so no batching difference can hide).
- A directory: COCO results JSON, drawn images, `--model PATH` without `--config`.
- Bad input: unreadable and missing images are counted, skipped, named, and the exit status is 1;
  unknown models, bad boxes files and contradictory options exit 2 with one line; a detector that
  finds nobody gives no entry and no crash.
"""

import json
import subprocess
import sys
import types

import cv2
import numpy as np
import pytest
import torch
from conftest import REPO
from test_evaluate import load_cli, tiny_model, write_tiny_model

import vitpose
from vitpose.cli import build_parser, main
from vitpose.cli import predict as predict_cli
from vitpose.data.metainfo import dataset_info
from vitpose.evaluation.coco_evaluator import load_predictions
from vitpose.inference.draw import draw_people
from vitpose.inference.pipeline import read_records
from vitpose.inference.predictor import Predictor

DETECTIONS = "test_coco_det_AP_H_56.json"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, coco_mini_dir):
    """A tiny model's config (the project's config format) and random weights."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), coco_mini_dir, seed=11)


def run_cli(argv, capsys):
    code = main(["predict", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_predict_equals_evaluate_and_predictor_on_the_same_boxes(tmp_path, coco_mini_dir, tiny, capsys):
    config, checkpoint = tiny
    # The first three detections of every image (12 of 118): one crop per pass is slow on CPU.
    counts, subset = {}, []
    for det in json.loads((coco_mini_dir / DETECTIONS).read_text()):
        counts[det["image_id"]] = counts.get(det["image_id"], 0) + 1
        if counts[det["image_id"]] <= 3:
            subset.append(det)
    dets = tmp_path / "dets.json"
    dets.write_text(json.dumps(subset))
    out = tmp_path / "results.json"
    code, printed, _ = run_cli([coco_mini_dir, "--config", config, "--model", checkpoint, "--boxes", dets,
                                "--json", out, "--device", "cpu", "--batch-size", 1, "--precision", "fp32"], capsys)
    assert code == 0
    assert "4 images, 12 people" in printed
    for stage in ("decode", "crop", "pose", "decode heatmaps", "write", "total"):
        assert f"\n{stage} " in printed
    results = read_records(out)

    evaluate = load_cli()
    evaluate.main(["--config", str(config), "--checkpoint", str(checkpoint), "--bbox-file", str(dets),
                   "--workers", "0", "--batch-size", "1", "--device", "cpu", "--out", str(tmp_path / "eval.json")])
    capsys.readouterr()
    # Both keep the detection file's order within an image; the command goes image by image.
    reference = sorted(load_predictions(tmp_path / "eval.json"), key=lambda p: p["image_id"])
    assert [r["image_id"] for r in results] == [p["image_id"] for p in reference] and len(results) == 12

    detections = json.loads(dets.read_text())
    by_image = {}
    for det in detections:
        by_image.setdefault(det["image_id"], []).append(det)
    predictor = Predictor.from_config(config, checkpoint, device="cpu", batch_size=1)
    direct = {}
    for image_id, dets_of_image in by_image.items():
        image = cv2.imread(str(coco_mini_dir / f"{image_id:012d}.jpg"))
        boxes = np.array([d["bbox"] for d in dets_of_image], np.float32)
        direct[image_id] = predictor.predict(image, boxes, box_format="xywh", channels="bgr")
    seen = {}
    for result, ref in zip(results, reference):
        flat = np.asarray(result["keypoints"]).reshape(17, 3)
        np.testing.assert_array_equal(flat[:, :2], ref["keypoints"])
        np.testing.assert_array_equal(flat[:, 2].astype(np.float32), ref["keypoint_scores"])
        k = seen[result["image_id"]] = seen.get(result["image_id"], -1) + 1
        keypoints, scores = direct[result["image_id"]]
        np.testing.assert_array_equal(flat[:, :2], keypoints[k])
        np.testing.assert_array_equal(flat[:, 2].astype(np.float32), scores[k])
        det = by_image[result["image_id"]][k]
        np.testing.assert_allclose(result["bbox"], det["bbox"], atol=1e-3)
        assert result["bbox_score"] == pytest.approx(det["score"], rel=1e-6)
        confident = flat[flat[:, 2] > 0.2, 2]
        expected = det["score"] * (confident.mean() if len(confident) else 0.0)
        assert result["score"] == pytest.approx(expected, rel=1e-6)
        assert result["category_id"] == 1 and result["file_name"] == f"{result['image_id']:012d}.jpg"


@pytest.fixture(scope="module")
def small_weights(tmp_path_factory):
    """Random ViT-S simple-decoder weights in HF's layout: the size and decoder come from the file."""
    torch.manual_seed(3)
    model = vitpose.build_model("vitpose-s", decoder="simple")
    path = tmp_path_factory.mktemp("small") / "mine.pth"
    torch.save({"state_dict": model.state_dict()}, path)
    return path, model


def write_images(folder, names, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    images = {}
    for name in names:
        images[name] = rng.integers(0, 256, (90 + 10 * len(images), 70, 3), dtype=np.uint8)
        cv2.imwrite(str(folder / name), images[name])
    return images


def test_directory_with_drawings_and_model_path(tmp_path, small_weights, capsys):
    path, model = small_weights
    images = write_images(tmp_path / "photos", ["b.png", "a.png"])
    (tmp_path / "photos" / "notes.txt").write_text("not an image")
    out_dir, out_json = tmp_path / "drawn", tmp_path / "poses.json"
    code, printed, err = run_cli([tmp_path / "photos", "--model", path, "--detector", "full-frame", "--no-flip",
                                  "--out", out_dir, "--json", out_json, "--device", "cpu", "--precision", "fp32"],
                                 capsys)  # both images in one model call (--batch-images 8): see the reference
    assert code == 0, err
    assert "2 images, 2 people" in printed and "predict" in err and "img/s" in err  # the progress bar
    results = read_records(out_json)
    # Not COCO-named: running ids in sorted-name order.
    assert [(r["image_id"], r["file_name"]) for r in results] == [(0, "a.png"), (1, "b.png")]
    # The reference gets the command's batching (both images' crops in one model call, in name
    # order): on AVX-512/AMX CPUs MKL's GEMM sums a crop differently in a batch of 1 and of 2
    # (keypoints of these flat random-model heatmaps move ~1e-3 px), so equality needs equal batches.
    reference = Predictor(model, device="cpu", flip_test=False)
    in_order = [images[r["file_name"]] for r in results]
    full_frames = [[[0, 0, image.shape[1], image.shape[0]]] for image in in_order]
    reference_poses = reference(in_order, boxes=full_frames, channels="bgr")
    for result, reference_pose in zip(results, reference_poses):
        image = images[result["file_name"]]
        h, w = image.shape[:2]
        assert result["bbox"] == [0.0, 0.0, w, h] and result["bbox_score"] == 1.0
        keypoints, scores = reference_pose.keypoints, reference_pose.keypoint_scores
        flat = np.asarray(result["keypoints"]).reshape(17, 3)
        np.testing.assert_array_equal(flat[:, :2], keypoints[0])
        np.testing.assert_array_equal(flat[:, 2].astype(np.float32), scores[0])
        poses = vitpose.inference.predictor.Poses(np.array([[0, 0, w, h]], np.float32), np.ones(1, np.float32),
                                                  keypoints, scores)
        drawn = cv2.imread(str(out_dir / result["file_name"]))
        np.testing.assert_array_equal(drawn, draw_people(image, poses, dataset_info("coco"), 0.3, "bgr"))
        assert not np.array_equal(drawn, image)
    assert sorted(p.name for p in out_dir.iterdir()) == ["a.png", "b.png"]


def test_single_coco_named_image(tmp_path, tiny, capsys):
    config, checkpoint = tiny
    write_images(tmp_path, ["000000000042.jpg"])
    out = tmp_path / "one.json"
    code, printed, _ = run_cli([tmp_path / "000000000042.jpg", "--config", config, "--model", checkpoint,
                                "--detector", "full-frame", "--json", out, "--device", "cpu"], capsys)
    assert code == 0 and "1 images, 1 people" in printed
    assert [r["image_id"] for r in read_records(out)] == [42]


def test_unreadable_and_missing_images_are_skipped_and_named(tmp_path, tiny, capsys, coco_mini_dir):
    config, checkpoint = tiny
    folder = tmp_path / "mixed"
    write_images(folder, ["good.png"])
    jpeg = (coco_mini_dir / "000000000785.jpg").read_bytes()
    (folder / "cut.jpg").write_bytes(jpeg[: len(jpeg) // 2])  # a truncated download
    (folder / "text.jpg").write_text("hello")
    (folder / "ghost.jpg").symlink_to(tmp_path / "gone.jpg")  # a broken link
    out = tmp_path / "r.json"
    code, printed, err = run_cli([folder, tmp_path / "missing.png", "--config", config, "--model", checkpoint,
                                  "--detector", "full-frame", "--json", out, "--device", "cpu"], capsys)
    assert code == 1
    assert "1 images, 1 people" in printed
    assert "4 images skipped" in err
    for name, why in (("cut.jpg", "truncated"), ("text.jpg", "could not be decoded"), ("ghost.jpg", "not found"),
                      ("missing.png", "not found")):
        line = next(ln for ln in err.splitlines() if name in ln)
        assert why in line, line
    assert [r["file_name"] for r in read_records(out)] == ["good.png"]


@pytest.mark.parametrize("extra, match", [
    (["--model", "vitpose-x"], "unknown model 'vitpose-x'"),
    (["--detector", "yolo"], "unknown detector 'yolo'"),
    (["--detector", "none"], "--detector none needs the boxes from --boxes"),
    (["--boxes", "{dets}", "--detector", "full-frame"], "--boxes gives the person boxes"),
    (["--boxes", "{bad_dets}"], "record [1]: missing field 'bbox'"),
    (["--boxes", "{tmp}/nope.json"], "--boxes: file not found"),
    (["--out", "{folder}"], "is a source directory"),
])
def test_usage_errors_exit_2_with_one_line(tmp_path, tiny, capsys, extra, match):
    config, checkpoint = tiny
    folder = tmp_path / "imgs"
    write_images(folder, ["1.png"])
    dets = tmp_path / "dets.json"
    dets.write_text(json.dumps([{"image_id": 1, "bbox": [0, 0, 5, 5], "score": 0.9}]))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"image_id": 1, "bbox": [0, 0, 5, 5], "score": 0.9}, {"image_id": 1, "score": 1}]))
    extra = [e.format(dets=dets, bad_dets=bad, tmp=tmp_path, folder=folder) for e in extra]
    argv = [folder, "--config", config, "--model", checkpoint, "--device", "cpu", *extra]
    if "--model" in extra:
        argv = [folder, "--device", "cpu", *extra]
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert err.startswith("vitpose predict: error: ") and match in err, err
    if "unknown model" in match:
        assert "vitpose-b-simple" in err and "vitpose-h" in err  # the names are listed


def test_source_errors(tmp_path, tiny, capsys):
    config, checkpoint = tiny
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli([tmp_path / "empty", "--config", config, "--model", checkpoint], capsys)
    assert code == 2 and "no images in" in err


class Nobody:
    def __call__(self, images, channels="rgb"):
        from vitpose.inference.detect import Detections

        return [Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32)) for _ in images]


def test_a_detector_that_finds_nobody(tmp_path, capsys):
    write_images(tmp_path / "imgs", ["1.png", "2.png"])
    predictor = Predictor(tiny_model(seed=2), device="cpu", detector=Nobody())
    args = build_parser().parse_args(["predict", str(tmp_path / "imgs"), "--json", str(tmp_path / "r.json"),
                                      "--out", str(tmp_path / "drawn")])
    code = predict_cli.predict_images(predictor, predict_cli.list_images(args.source), predict_cli.predict_options(args),
                                      None)
    printed = capsys.readouterr().out
    assert code == 0
    assert read_records(tmp_path / "r.json") == []
    assert "2 images, 0 people, 2 images with nobody found" in printed
    assert sorted(p.name for p in (tmp_path / "drawn").iterdir()) == ["1.png", "2.png"]  # drawn unchanged
    np.testing.assert_array_equal(cv2.imread(str(tmp_path / "drawn" / "1.png")),
                                  cv2.imread(str(tmp_path / "imgs" / "1.png")))


def test_boxes_file_by_coco_number(tmp_path, tiny, capsys):
    """--boxes maps image_id to the file name's number; images without boxes have nobody."""
    config, checkpoint = tiny
    write_images(tmp_path / "imgs", ["000000000007.png", "000000000009.png"])
    dets = tmp_path / "dets.json"
    dets.write_text(json.dumps([{"image_id": 9, "category_id": 1, "bbox": [5, 6, 40, 50], "score": 0.7},
                                {"image_id": 9, "category_id": 2, "bbox": [5, 6, 40, 50], "score": 0.9},
                                {"image_id": 123, "category_id": 1, "bbox": [1, 1, 4, 4], "score": 0.5}]))
    out = tmp_path / "r.json"
    code, printed, err = run_cli([tmp_path / "imgs", "--config", config, "--model", checkpoint, "--boxes", dets,
                                  "--json", out, "--device", "cpu"], capsys)
    assert code == 0 and "has boxes for 1 images (image_id) that are not in the source" in err
    results = read_records(out)
    assert [(r["image_id"], r["bbox"], r["bbox_score"]) for r in results] == [(9, [5.0, 6.0, 40.0, 50.0],
                                                                               pytest.approx(0.7))]
    assert "2 images, 1 people, 1 images with nobody found" in printed


def test_videos_and_webcams_go_to_the_video_module(tmp_path, tiny, capsys, monkeypatch):
    config, checkpoint = tiny
    calls = []
    stub = types.ModuleType("vitpose.inference.video")
    stub.run_video = lambda predictor, source, args, stop=None: calls.append((type(predictor).__name__, source)) or \
        types.SimpleNamespace(exit_status=0)
    stub.check_video_file = lambda path: None
    stub.output_video_path = lambda out, source: out
    monkeypatch.setitem(sys.modules, "vitpose.inference.video", stub)
    monkeypatch.setattr("vitpose.run.sources.check_video_file", stub.check_video_file)
    clip = tmp_path / "clip.MP4"
    clip.write_bytes(b"")
    common = ["--config", config, "--model", checkpoint, "--detector", "full-frame", "--device", "cpu"]
    assert run_cli([clip, *common], capsys)[0] == 0
    assert run_cli(["0", *common], capsys)[0] == 0
    assert calls == [("Predictor", clip), ("Predictor", 0)]
    code, _, err = run_cli([clip, clip, *common], capsys)
    assert code == 2 and "must be the only SOURCE" in err


def test_console_script_is_installed_by_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["vitpose"] == "vitpose.cli:main"
    run = subprocess.run([sys.executable, "-m", "vitpose", "predict", "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=120, check=False)
    assert run.returncode == 0 and "--boxes" in run.stdout and "COCO keypoint results" in run.stdout


def test_a_chunk_of_images_is_bounded_by_decoded_pixels(tmp_path, tiny, capsys, monkeypatch):
    """#18.12: eight huge photos are not decoded at once: a chunk ends at --batch-images images or
    at CHUNK_PIXELS decoded pixels. With a budget of one image, three images take three model
    calls (and give the same records as one image per call)."""
    config, checkpoint = tiny
    write_images(tmp_path / "photos", ["a.png", "b.png", "c.png"])
    calls = []
    real_call = Predictor.__call__

    def counting_call(self, images, *args, **kwargs):
        calls.append(len(images))
        return real_call(self, images, *args, **kwargs)

    monkeypatch.setattr(Predictor, "__call__", counting_call)
    common = [tmp_path / "photos", "--config", config, "--model", checkpoint, "--detector", "full-frame",
              "--device", "cpu", "--precision", "fp32", "--batch-images", 1]
    code, _, err = run_cli([*common, "--json", tmp_path / "one.jsonl"], capsys)
    assert code == 0, err
    single = read_records(tmp_path / "one.jsonl")
    one_image = min(image.shape[0] * image.shape[1] for image in
                    (cv2.imread(str(p)) for p in sorted((tmp_path / "photos").iterdir())))
    monkeypatch.setattr("vitpose.inference.images.CHUNK_PIXELS", one_image)
    calls.clear()
    common[-1] = 8
    code, _, err = run_cli([*common, "--json", tmp_path / "bounded.jsonl"], capsys)
    assert code == 0, err
    assert calls == [1, 1, 1]  # not [3]: each image filled the pixel budget
    assert read_records(tmp_path / "bounded.jsonl") == single
