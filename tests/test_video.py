"""vitpose.inference.video: poses on a short synthetic video, through run_video and the command line.

The video: two stick figures (drawn with vitpose.draw_pose) walking in opposite directions,
12 frames at 12.5 frames/s. The stand-in detector finds them from the pixels (connected
components of the bright figures), so boxes, crops and tracks are all made from the frames.
"""

import json

import cv2
import numpy as np
import pytest
import torch
from conftest import REPO

from vitpose.builders import build_codec, build_model_from_config
from vitpose.config import load_config
from vitpose.errors import UserError
from vitpose.inference.draw import draw_pose
from vitpose.inference.pipeline import read_boxes_file, read_records
from vitpose.inference.predictor import Predictor
from vitpose.inference.results import FullFrame, Poses
from vitpose.inference.runner import PredictOptions
from vitpose.inference.tracking import KeypointSmoother, Tracker
from vitpose.inference.video import FrameReader, VideoError, run_video

NUM_FRAMES, FPS, SIZE = 12, 12.5, (320, 240)
# A standing figure: COCO-17 keypoints as fractions of (width 50, height 100) from its top left.
FIGURE = np.array([[0.50, 0.08], [0.56, 0.05], [0.44, 0.05], [0.64, 0.08], [0.36, 0.08],
                   [0.80, 0.24], [0.20, 0.24], [0.86, 0.42], [0.14, 0.42], [0.90, 0.58],
                   [0.10, 0.58], [0.66, 0.56], [0.34, 0.56], [0.70, 0.76], [0.30, 0.76],
                   [0.72, 0.95], [0.28, 0.95]]) * [50, 100]


def figure_positions(frame):
    """Top-left corners of figure A (top row, walking right) and B (bottom row, walking left)."""
    return np.array([20.0 + 10 * frame, 8.0]), np.array([250.0 - 10 * frame, 128.0])


def synthetic_frame(frame):
    image = np.full((SIZE[1], SIZE[0], 3), 30, np.uint8)
    for corner in figure_positions(frame):
        image = draw_pose(image, FIGURE + corner, radius=4, thickness=4, channels="bgr")
    return image


def write_video(path, fourcc, frames=NUM_FRAMES):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), FPS, SIZE)
    assert writer.isOpened()
    for f in range(frames):
        writer.write(synthetic_frame(f))
    writer.release()
    return path


def blob_detector(images, channels="rgb"):
    """People = connected bright regions (the figures on the dark background), top to bottom."""
    out = []
    for rgb in images:
        mask = (rgb.max(axis=2) > 90).astype(np.uint8)
        count, _, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
        boxes = [[x, y, x + w, y + h] for x, y, w, h, area in stats[1:count] if area > 100]
        boxes.sort(key=lambda b: b[1])
        out.append((np.array(boxes, np.float64).reshape(-1, 4), np.full(len(boxes), 0.9)))
    return out


def read_video(path):
    capture = cv2.VideoCapture(str(path))
    count, fps = capture.get(cv2.CAP_PROP_FRAME_COUNT), capture.get(cv2.CAP_PROP_FPS)
    frames = []
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        frames.append(frame)
    capture.release()
    return frames, count, fps


def options(tmp_path, **kw):
    base = dict(out=None, json=str(tmp_path / "poses.json"), track=False, smooth=False,
                boxes=None, progress=False, quiet=True)
    return PredictOptions(**{**base, **kw})


def with_detector(predictor, detector, **kw):
    """The module's predictor (same model and codec) with another detector."""
    return Predictor(predictor.model, codec=predictor.codec, device="cpu", detector=detector, **kw)


def records_of(path):
    return read_records(path)


@pytest.fixture(scope="module")
def predictor(tmp_path_factory):
    """The demo config's small ViTPose (128x96 crops) with random weights drawn so heatmaps
    have clear, crop-dependent peaks (the fixtures' recipe)."""
    cfg = load_config(REPO / "configs" / "demo.yaml")
    torch.manual_seed(0)
    model = build_model_from_config(cfg.model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif p.ndim == 1:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.05 if "pos_embed" not in name else 0.5)
    return Predictor(model, codec=build_codec(cfg.model), device="cpu")


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return write_video(tmp_path_factory.mktemp("video") / "walk.mp4", "mp4v")


@pytest.fixture(scope="module")
def tracked(predictor, video, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tracked")
    args = options(tmp, out=str(tmp / "drawn"), track=True, pipeline="threads")
    summary = run_video(with_detector(predictor, blob_detector), str(video), args)
    return summary, records_of(tmp / "poses.json"), tmp


def test_video_out_has_the_source_frame_count_and_rate(tracked, video):
    summary, _, tmp = tracked
    frames, count, fps = read_video(tmp / "drawn" / "walk.mp4")
    assert summary.video_path == str(tmp / "drawn" / "walk.mp4")
    assert len(frames) == count == NUM_FRAMES and summary.frames_written == NUM_FRAMES
    assert summary.exit_status == 0
    assert fps == pytest.approx(FPS)
    assert frames[0].shape == (SIZE[1], SIZE[0], 3)
    source, _, _ = read_video(video)
    # drawn boxes and skeletons change the picture; the background corner does not
    assert not np.array_equal(frames[3], source[3])
    assert np.abs(frames[3][-10:, :10].astype(int) - source[3][-10:, :10]).max() < 20


def test_json_has_every_frame_and_stable_track_ids(tracked):
    summary, records, _ = tracked
    assert summary.frames_done == NUM_FRAMES and summary.people == 2 * NUM_FRAMES and summary.tracks == 2
    assert sorted(r["frame"] for r in records) == sorted(list(range(NUM_FRAMES)) * 2)
    for r in records:
        assert set(r) == {"frame", "category_id", "keypoints", "score", "bbox_score", "bbox", "track_id"}
        assert len(r["keypoints"]) == 17 * 3 and r["category_id"] == 1
        top_row = r["bbox"][1] < SIZE[1] / 2
        assert r["track_id"] == (0 if top_row else 1), r
        a, b = figure_positions(r["frame"])
        corner = a if top_row else b
        assert abs(r["bbox"][0] - (corner[0] + FIGURE[:, 0].min())) < 8  # the detector found the figure


def test_json_keypoints_equal_predictor_on_the_same_boxes(tracked, predictor, video):
    _, records, _ = tracked
    frames, _, _ = read_video(video)
    # The reference gets the run's batching: the crops of 8 frames (batch_frames' default) in one
    # model call, each frame's boxes in detection order (= the file's order). On AVX-512/AMX CPUs
    # MKL's GEMM sums a crop differently in batches of other sizes, so equality needs equal batches.
    per_frame = [[r for r in records if r["frame"] == f] for f in range(NUM_FRAMES)]
    poses = []
    for start in range(0, NUM_FRAMES, 8):
        chunk = range(start, min(start + 8, NUM_FRAMES))
        boxes = [np.array([[x, y, x + w, y + h] for x, y, w, h in (r["bbox"] for r in per_frame[f])]) for f in chunk]
        poses += predictor([frames[f] for f in chunk], boxes=boxes, channels="bgr")
    for frame_index in (0, 7, 11):
        mine = per_frame[frame_index]
        keypoints, scores = poses[frame_index].keypoints, poses[frame_index].keypoint_scores
        got = np.array([r["keypoints"] for r in mine]).reshape(-1, 17, 3)
        np.testing.assert_array_equal(got[..., :2], keypoints)
        np.testing.assert_array_equal(got[..., 2], scores.astype(np.float64))
        expected_score = 0.9 * np.array([s[s > 0.2].mean() if (s > 0.2).any() else 0.0 for s in scores])
        np.testing.assert_allclose([r["score"] for r in mine], expected_score, rtol=1e-6)


def test_sequential_pipeline_and_torch_warp_give_the_same_json(tracked, predictor, video, tmp_path):
    _, threaded, _ = tracked
    # The threaded run's batching (8 frames): other batch sizes change float32 GEMM sums on
    # AVX-512/AMX CPUs (MKL), so the JSON could differ in the last bits for that reason alone.
    args = options(tmp_path, track=True, batch_frames=8)  # auto: sequential on the CPU
    warping = with_detector(predictor, blob_detector)
    warping.warp_on_device = True  # the crops of the GPU path (vitpose.inference.warp), here on the CPU
    summary = run_video(warping, str(video), args)
    assert summary.pipeline == "sequential" and summary.frames_done == NUM_FRAMES
    assert records_of(tmp_path / "poses.json") == threaded


def test_stage_times_and_summary_text(tracked):
    summary, _, _ = tracked
    for stage in ("decode", "detect", "crop", "pose", "decode heatmaps", "track", "draw", "write"):
        assert summary.stage_seconds[stage] > 0, stage
    text = summary.format()
    assert "12 frames, 24 people, 2 tracks" in text and "frames/s" in text and "stage time: decode" in text
    assert "threads pipeline" in text


def corrupt_frame(path, frame_index):
    """Overwrite the start of one MJPG frame's JPEG data (after its SOI marker) with zeros."""
    data = bytearray(path.read_bytes())
    starts = [i for i in range(len(data) - 2) if data[i] == 0xFF and data[i + 1] == 0xD8 and data[i + 2] == 0xFF]
    assert len(starts) == NUM_FRAMES
    data[starts[frame_index] + 2:starts[frame_index] + 402] = bytes(400)
    path.write_bytes(bytes(data))


def test_corrupt_frame_is_counted_skipped_and_said(predictor, tmp_path):
    video = write_video(tmp_path / "corrupt.avi", "MJPG")
    corrupt_frame(video, 5)
    args = options(tmp_path, out=str(tmp_path / "drawn.avi"), track=True)
    summary = run_video(with_detector(predictor, blob_detector), str(video), args)
    assert summary.skipped == [5] and summary.missing_at_end == 0
    assert summary.frames_decoded == summary.frames_done == NUM_FRAMES - 1
    records = records_of(tmp_path / "poses.json")
    assert sorted({r["frame"] for r in records}) == [f for f in range(NUM_FRAMES) if f != 5]
    assert {r["track_id"] for r in records} == {0, 1}  # the one-frame gap keeps both ids
    frames, count, fps = read_video(tmp_path / "drawn.avi")
    assert len(frames) == NUM_FRAMES and fps == pytest.approx(FPS)  # frame 5 repeats frame 4
    np.testing.assert_array_equal(frames[5], frames[4])
    assert "1 frame(s) failed to decode and were skipped: 5" in summary.format()
    assert summary.exit_status == 1


def test_video_that_ends_early_is_said(predictor, tmp_path):
    video = write_video(tmp_path / "cut.avi", "MJPG")
    data = video.read_bytes()
    video.write_bytes(data[: int(len(data) * 0.6)])
    args = options(tmp_path, out=str(tmp_path / "out"))
    summary = run_video(with_detector(predictor, blob_detector), str(video), args)
    assert 0 < summary.frames_done < NUM_FRAMES
    assert summary.missing_at_end == NUM_FRAMES - summary.frames_done and summary.skipped == []
    frames, _, _ = read_video(tmp_path / "out" / "cut.mp4")
    assert len(frames) == summary.frames_done
    assert f"the video ended early: {summary.missing_at_end} of the {NUM_FRAMES} frames" in summary.format()


def test_frames_without_people_have_no_records(predictor, video, tmp_path):
    boxes = tmp_path / "boxes.json"
    a, b = figure_positions(0)
    boxes.write_text(json.dumps([
        {"frame": 0, "category_id": 1, "bbox": [*(a + 5), 45, 95], "score": 0.8},
        {"frame": 2, "category_id": 1, "bbox": [*(b + 5), 45, 95], "score": 0.7},
        {"frame": 2, "category_id": 2, "bbox": [0, 0, 10, 10], "score": 0.7},  # not a person
    ]))
    summary = run_video(predictor, str(video), options(tmp_path, boxes=str(boxes)))
    records = records_of(tmp_path / "poses.json")
    assert summary.frames_done == NUM_FRAMES and summary.people == 2
    assert [(r["frame"], r["bbox"]) for r in records] == [(0, [*(a + 5), 45, 95]), (2, [*(b + 5), 45, 95])]
    assert "track_id" not in records[0]


def test_full_frame_boxes(predictor, video, tmp_path):
    run_video(with_detector(predictor, FullFrame(), flip_test=False), str(video), options(tmp_path))
    records = records_of(tmp_path / "poses.json")
    assert [r["frame"] for r in records] == list(range(NUM_FRAMES))
    assert all(r["bbox"] == [0.0, 0.0, SIZE[0], SIZE[1]] for r in records)


def test_smooth_is_the_one_euro_filter_per_track(tracked, predictor, video, tmp_path):
    _, raw, _ = tracked
    run_video(with_detector(predictor, blob_detector), str(video), options(tmp_path, smooth=True))
    smoothed = records_of(tmp_path / "poses.json")
    assert all("track_id" not in r for r in smoothed)  # --smooth tracks internally, --track reports
    smoother = KeypointSmoother(FPS)
    expected = []
    for f in range(NUM_FRAMES):
        mine = [r for r in raw if r["frame"] == f]
        ids = np.array([r["track_id"] for r in mine])
        kpts = np.array([r["keypoints"] for r in mine]).reshape(-1, 17, 3)
        expected.append(smoother.smooth(ids, kpts[..., :2], f))
    got = np.array([r["keypoints"] for r in smoothed]).reshape(NUM_FRAMES, 2, 17, 3)
    np.testing.assert_allclose(got[..., :2], np.stack(expected), rtol=0, atol=1e-9)
    raw_kpts = np.array([r["keypoints"] for r in raw]).reshape(NUM_FRAMES, 2, 17, 3)
    np.testing.assert_array_equal(got[..., 2], raw_kpts[..., 2])  # scores are not filtered
    assert np.abs(got[1:, ..., :2] - raw_kpts[1:, ..., :2]).max() > 0.1


def test_tracker_ids_match_a_direct_tracker_run(tracked):
    _, records, _ = tracked
    tracker = Tracker()
    for f in range(NUM_FRAMES):
        mine = [r for r in records if r["frame"] == f]
        boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (r["bbox"] for r in mine)])
        kpts = np.array([r["keypoints"] for r in mine]).reshape(-1, 17, 3)
        assert tracker.update(boxes, kpts[..., :2], kpts[..., 2], frame=f).tolist() == [r["track_id"] for r in mine]


def test_bad_sources_and_boxes_are_named(predictor, tmp_path):
    with pytest.raises(VideoError, match="video not found: .*missing.mp4"):
        run_video(predictor, str(tmp_path / "missing.mp4"), options(tmp_path))
    not_video = tmp_path / "notes.mp4"
    not_video.write_text("not a video")
    with pytest.raises(VideoError, match="notes.mp4: OpenCV cannot open this file as a video"):
        FrameReader(str(not_video))
    (tmp_path / "empty.mp4").write_bytes(b"")
    with pytest.raises(VideoError, match="empty.mp4: the file is empty"):
        FrameReader(str(tmp_path / "empty.mp4"))
    with pytest.raises(VideoError, match="webcam 99: the camera could not be opened"):
        FrameReader(99)
    video = write_video(tmp_path / "ok.mp4", "mp4v", frames=2)
    with pytest.raises(UserError, match="this predictor has no detector"):
        run_video(predictor, str(video), options(tmp_path))
    with pytest.raises(UserError, match="--batch-images: frames per batch must be >= 1"):
        run_video(predictor, str(video), options(tmp_path, batch_frames=0))
    bad = tmp_path / "bad_boxes.json"
    bad.write_text(json.dumps([{"frame": 0, "bbox": [1, 2, 3, 4]}, {"frame": 1, "bbox": [1, 2, 0, 4]}]))
    with pytest.raises(UserError, match=r"--boxes: .*bad_boxes.json: record \[1\]: field 'bbox' has zero or negative"):
        read_boxes_file(bad)
    bad.write_text(json.dumps([{"image_id": "a", "bbox": [1, 2, 3, 4]}]))
    with pytest.raises(UserError, match=r"record \[0\]: field 'image_id' must be an integer"):
        read_boxes_file(bad)


def test_a_failing_detector_costs_the_frames_it_fails_on(predictor, video, tmp_path):
    """A batch of 4 frames fails; it is retried frame by frame and only frame 3 is lost."""
    order = {}  # frame pixels -> frame number, in the order the detector first sees them

    def fails_on_frame_3(images, channels="rgb"):
        for image in images:
            order.setdefault(image.tobytes(), len(order))
        if any(order[image.tobytes()] == 3 for image in images):
            raise RuntimeError("detector exploded")
        return blob_detector(images)

    args = options(tmp_path, out=str(tmp_path / "o.avi"), pipeline="threads", batch_frames=4)  # MJPG: lossless repeats
    summary = run_video(with_detector(predictor, fails_on_frame_3), str(video), args)
    assert summary.exit_status == 1 and summary.frames_done == NUM_FRAMES - 1
    assert summary.failed == ["frame 3: RuntimeError: detector exploded"]
    assert sorted({r["frame"] for r in records_of(tmp_path / "poses.json")}) == [f for f in range(NUM_FRAMES) if f != 3]
    drawn, _, _ = read_video(tmp_path / "o.avi")
    assert len(drawn) == NUM_FRAMES  # the failed frame repeats the one before
    np.testing.assert_array_equal(drawn[3], drawn[2])
    assert "1 frame(s) failed and were skipped: frame 3: RuntimeError" in summary.format()


def test_cli_predict_video_with_track(predictor, video, tmp_path):
    from vitpose import cli
    from vitpose.models.checkpoint import save_weights

    checkpoint = tmp_path / "demo.safetensors"
    save_weights(predictor.model, checkpoint)
    code = cli.main(["predict", str(video), "--config", str(REPO / "configs" / "demo.yaml"),
                     "--model", str(checkpoint), "--detector", "full-frame", "--track",
                     "--json", str(tmp_path / "cli.json"), "--out", str(tmp_path / "cli_out"), "--device", "cpu"])
    assert code == 0
    records = records_of(tmp_path / "cli.json")
    assert [r["frame"] for r in records] == list(range(NUM_FRAMES))
    assert {r["track_id"] for r in records} == {0}
    frames, count, fps = read_video(tmp_path / "cli_out" / "walk.mp4")
    assert len(frames) == NUM_FRAMES and fps == pytest.approx(FPS)


@pytest.mark.parametrize("pipeline", ["threads", "sequential"])
def test_ctrl_c_ends_the_outputs_cleanly(predictor, video, tmp_path, pipeline):
    calls = []

    def interrupted_on_the_second_batch(images, channels="rgb"):
        calls.append(len(images))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return blob_detector(images)

    args = options(tmp_path, out=str(tmp_path / "o"), pipeline=pipeline, batch_frames=4, track=True)
    summary = run_video(with_detector(predictor, interrupted_on_the_second_batch), str(video), args)
    assert summary.interrupted and summary.frames_done == 4
    assert sorted({r["frame"] for r in records_of(tmp_path / "poses.json")}) == [0, 1, 2, 3]
    frames, _, _ = read_video(tmp_path / "o" / "walk.mp4")
    assert len(frames) == 4
    assert "interrupted: stopped by the user after 4 frames" in summary.format()
    assert summary.exit_status == 130


class CountingDetector:
    """blob_detector that counts the frames it is called on."""

    def __init__(self):
        self.frames = 0

    def __call__(self, images, channels="rgb"):
        self.frames += len(images)
        return blob_detector(images, channels)


class FigureFinder(Predictor):
    """The pose model of a test that needs poses that follow the figures: in each crop it finds
    the bright figure (or the part of it the crop holds) and lays the figure's keypoints over its
    extent, so that a box that slips off a figure gives a pose that slipped too, as a trained
    model's would. Like many trained models it is unsure of the legs: their scores are 0.2,
    below the 0.3 that makes a keypoint confident."""

    def _keypoints_of_crops(self, crops, center, fixed_scale):
        from vitpose.data.geometry import crop_to_image

        keypoints = np.zeros((len(crops), len(FIGURE), 2))
        scores = np.full((len(crops), len(FIGURE)), 0.01, np.float32)
        for n, crop in enumerate(crops):
            ys, xs = np.nonzero(crop.max(axis=0) > 90)
            if len(xs) < 20:
                continue
            low, high = np.array([xs.min(), ys.min()]), np.array([xs.max(), ys.max()])
            keypoints[n] = low + FIGURE / [50.0, 100.0] * (high - low)
            scores[n] = 0.9
            scores[n, 11:] = 0.2  # hips, knees, ankles
        return crop_to_image(keypoints, center, fixed_scale, self.codec.input_size), scores


@pytest.mark.parametrize("every", [1, 5])
def test_det_every_runs_the_detector_on_every_nth_frame(predictor, video, tmp_path, every):
    """--det-every N: the detector on frames 0, N, 2N, ... (a person lost on carried boxes would
    add frames: the lost rule is off here), poses carry the people between; the summary counts it."""
    detector = CountingDetector()
    args = options(tmp_path, det_every=every, det_lost_ratio=1e-9, track=True, pipeline="sequential")
    summary = run_video(FigureFinder(predictor.model, codec=predictor.codec, device="cpu", detector=detector),
                        str(video), args)
    expected = len(range(0, NUM_FRAMES, every))
    assert detector.frames == expected
    records = records_of(tmp_path / "poses.json")
    assert sorted({r["frame"] for r in records}) == list(range(NUM_FRAMES))
    per_frame = [sum(r["frame"] == f for r in records) for f in range(NUM_FRAMES)]
    assert per_frame == [2] * NUM_FRAMES  # the two figures carried through every frame
    if every > 1:
        assert summary.detector_frames == expected
        assert f"detector ran on {expected} of {NUM_FRAMES} frames (--det-every {every}" in summary.format()


def test_det_every_keeps_each_persons_track_id(predictor, video, tmp_path):
    """--det-every 5 --track on the two walking figures: the detector on frames 0, 5 and 10, the
    poses of carried frames on the figures (within 4 px: the blob extent includes the strokes'
    width), and the same two track ids as the detector on every frame."""
    finder = FigureFinder(predictor.model, codec=predictor.codec, device="cpu", detector=CountingDetector())
    args = options(tmp_path, det_every=5, track=True, pipeline="sequential")
    summary = run_video(finder, str(video), args)
    assert finder.detector.frames == 3 and summary.detector_frames == 3
    records = records_of(tmp_path / "poses.json")
    for f in range(NUM_FRAMES):
        found = sorted((r for r in records if r["frame"] == f), key=lambda r: r["bbox"][1])
        assert [r["track_id"] for r in found] == [0, 1], f"frame {f}"
        for record, corner in zip(found, figure_positions(f)):
            xy = np.array(record["keypoints"]).reshape(-1, 3)[:, :2]
            assert np.abs(xy - (FIGURE + corner)).max() < 4, f"frame {f}"


def test_det_every_detects_again_when_someone_is_lost(predictor, video, tmp_path):
    """A carried person whose mean keypoint score falls below det_lost_ratio times their previous
    frame's sends that frame to the detector: with a ratio of 2 no pose keeps up, so every frame
    is detected."""
    detector = CountingDetector()
    args = options(tmp_path, det_every=5, det_lost_ratio=2.0, pipeline="sequential")
    summary = run_video(with_detector(predictor, detector), str(video), args)
    assert detector.frames == NUM_FRAMES and summary.detector_frames == NUM_FRAMES


def test_keypoint_motion_is_the_similarity_of_the_confident_keypoints():
    """Keypoints moved by (7, -3) and scaled 1.05 about their centre: the centres and the scale
    come back; an unconfident keypoint that jumped is left out; move_box applies the similarity."""
    from vitpose.inference.tracking import keypoint_motion, move_box

    before = FIGURE + [100.0, 50.0]
    centre = before.mean(axis=0)
    after = centre + [7.0, -3.0] + 1.05 * (before - centre)
    after[3] = [900.0, 900.0]
    scores = np.full(len(before), 0.9)
    scores[3] = 0.1
    rest = np.arange(len(before)) != 3
    centre_from, centre_to, scale = keypoint_motion(before, scores, after, scores)
    np.testing.assert_allclose(centre_from, before[rest].mean(axis=0))
    np.testing.assert_allclose(centre_to, after[rest].mean(axis=0))
    assert scale == pytest.approx(1.05)
    moved = move_box([100.0, 50.0, 150.0, 150.0], centre_from, centre_to, scale)
    corners = np.array([[100.0, 50.0], [150.0, 150.0]])
    np.testing.assert_allclose(moved.reshape(2, 2), centre_to + 1.05 * (corners - centre_from))
    # a keypoint that jumps is not a person growing: the scale is clipped to 1.1 per frame
    assert keypoint_motion(before, scores, centre + 3.0 * (before - centre), scores)[2] == 1.1
    # fewer than two confident keypoints: the median displacement of all of them, scale 1
    low = np.full(len(before), 0.1)
    centre_from, centre_to, scale = keypoint_motion(before, low, after, low)
    np.testing.assert_allclose(centre_to - centre_from, np.median(after - before, axis=0))
    assert scale == 1.0


def walking_poses(frame, boxes=None, width=320):
    """Two figures at `figure_positions(frame)`, every keypoint confident; boxes: the detector's
    (the figures' extent grown 10 px) unless given."""
    keypoints = np.stack([FIGURE + corner for corner in figure_positions(frame)])
    if boxes is None:
        boxes = np.concatenate([keypoints.min(axis=1) - 10, keypoints.max(axis=1) + 10], axis=1)
    return Poses(np.asarray(boxes, np.float32), np.full(len(boxes), 0.9, np.float32), keypoints,
                 np.full(keypoints.shape[:2], 0.8, np.float32), frame=frame)


def test_det_every_carries_each_box_with_its_pose_and_knows_who_it_carried():
    """A detection frame hands on the detector's boxes; a carried frame's box is the previous box
    moved as the keypoints moved (the figures walk 10 px a frame: A right, B left) and once more
    for the next frame; carried_from names each carried person's index on the frame before, and
    a person whose box leaves the image is dropped from the carried boxes."""
    from vitpose.inference.tracking import DetectionSchedule

    schedule = DetectionSchedule(every=5)
    detected = walking_poses(0)
    schedule.update(detected, SIZE)
    np.testing.assert_allclose(schedule.carried[:, :4], detected.boxes)
    np.testing.assert_allclose(schedule.carried[:, 4], 0.9)
    assert schedule.boxes_for(0) is None and schedule.boxes_for(1) is schedule.carried
    on_carried = walking_poses(1, boxes=schedule.carried[:, :4])
    schedule.update(on_carried, SIZE, carried=True)
    step = np.array([[10.0, 0, 10, 0], [-10, 0, -10, 0]])
    np.testing.assert_allclose(schedule.carried[:, :4], detected.boxes + 2 * step, atol=1e-4)
    np.testing.assert_array_equal(schedule.carried_from, [0, 1])
    assert not schedule.lost(on_carried.keypoint_scores)
    assert schedule.lost(on_carried.keypoint_scores * [[0.1], [1.0]])  # A's score fell to a tenth

    leaving = DetectionSchedule(every=5)
    outside = walking_poses(0, boxes=[[-80.0, 0, -1, 90], [100, 100, 200, 200]])
    leaving.update(outside, SIZE)
    np.testing.assert_array_equal(leaving.carried_from, [1])
    np.testing.assert_allclose(leaving.carried[:, :4], [[100, 100, 200, 200]])


def test_a_carried_person_keeps_their_track_id_however_their_box_moved():
    """`follows` continues the previous frame's track whatever the overlap: a person jumping 60 px
    a frame (box 50 px wide: IoU 0 with the frame before) keeps id 0; without `follows` every
    frame starts a new track (what made --det-every give 37 ids for 4 people)."""
    boxes = [np.array([[20.0 + 60 * f, 10, 70 + 60 * f, 110]]) for f in range(4)]
    followed, plain = Tracker(), Tracker()
    ids = [followed.update(boxes[0])] + [followed.update(b, follows=[0]) for b in boxes[1:]]
    assert [i.tolist() for i in ids] == [[0]] * 4
    assert [plain.update(b).tolist() for b in boxes] == [[0], [1], [2], [3]]
    with pytest.raises(ValueError, match="follows names 2 detections, the frame has 1"):
        followed.update(boxes[0], follows=[0, 0])
