"""`vitpose predict VIDEO --det-every N`: frames/s and keypoint agreement against N = 1.

    python train.py --demo                       # a trained model (work_dirs/demo/best.pth)
    python benchmarks/bench_det_every.py --model work_dirs/demo/best.pth [--every 5] [--rounds 3]

The video is a camera pan over one synthetic scene of the demo's kind (`synthesize_image`):
each frame is a window of the scene moved `--step` pixels further, so the people move across
the frame while their true boxes are known. The detector is the CPU default's architecture
(torchvision Faster R-CNN MobileNetV3-FPN) with random weights, run for its real cost on every
frame it is asked for; the boxes it returns are the scene's true boxes (random weights find no
people, and the build machine cannot download the COCO weights). So the time is a real
detector's and the boxes are a perfect detector's: the agreement measures only what carrying
people on their previous poses changes.

Both settings run in alternating rounds (1, N, 1, N, ...) in one process; the figures are the
median frames/s with the spread (min-max) over rounds, the speed-up taken round by round, the
detector's share of N = 1's time, the frames the detector ran on, the track ids, and, for every person of every frame matched
to N = 1's by box IoU, the distance of their confident keypoints (score > 0.3 in both) as
median / 99th percentile pixels. The load average is printed: compare figures of one run.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vitpose.data.synthetic import image_rng, synthesize_image
from vitpose.inference.detect import build_detector, default_detector_name
from vitpose.inference.pipeline import read_records
from vitpose.inference.predictor import Predictor
from vitpose.inference.tracking import box_iou
from vitpose.inference.video import run_video

FRAME_SIZE = (320, 240)


def write_pan_video(path: Path, frames: int, step: int, seed: int):
    """A video panning over one synthetic scene; returns each frame's true person boxes (xyxy)."""
    import cv2

    width = FRAME_SIZE[0] + step * frames
    scene = synthesize_image(image_rng(seed, "val", 0), width, FRAME_SIZE[1], max_people=4)
    xyxy = scene.bboxes.copy()
    xyxy[:, 2:] += xyxy[:, :2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 25.0, FRAME_SIZE)
    truth = []
    for f in range(frames):
        x0 = f * step
        writer.write(np.ascontiguousarray(scene.image[:, x0:x0 + FRAME_SIZE[0]]))
        boxes = xyxy - [x0, 0, x0, 0]
        boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, FRAME_SIZE[0])
        truth.append(boxes[(boxes[:, 2] - boxes[:, 0]) > 12].astype(np.float32))
    writer.release()
    return truth


class TimedOracleDetector:
    """Runs a real detector network for its cost, answers with the true boxes of the frame (found
    by the frame's pixels: the video is decoded once up front with the same decoder)."""

    def __init__(self, network, video: Path, truth):
        import cv2

        self.network, self.calls, self.by_pixels = network, 0, {}
        capture = cv2.VideoCapture(str(video))
        for boxes in truth:
            ok, bgr = capture.read()
            assert ok, "the benchmark's own video must decode"
            for image in (bgr, np.ascontiguousarray(bgr[..., ::-1])):
                self.by_pixels[hash(image.tobytes())] = boxes
        capture.release()

    def __call__(self, images, channels="rgb"):
        self.network(images, channels=channels)
        self.calls += len(images)
        out = []
        for image in images:
            boxes = self.by_pixels[hash(np.ascontiguousarray(image).tobytes())]
            out.append((boxes, np.full(len(boxes), 0.99, np.float32)))
        return out


def agreement(base: list[dict], other: list[dict]) -> tuple[float, float, int]:
    """Median / 99th percentile px between confident keypoints of matched people, and the count."""
    distances = []
    for frame in {r["frame"] for r in base}:
        a = [r for r in base if r["frame"] == frame]
        b = [r for r in other if r["frame"] == frame]
        if not a or not b:
            continue
        xywh = lambda rs: np.array([r["bbox"] for r in rs], np.float64)  # noqa: E731
        to_xyxy = lambda x: np.concatenate([x[:, :2], x[:, :2] + x[:, 2:]], axis=1)  # noqa: E731
        iou = box_iou(to_xyxy(xywh(a)), to_xyxy(xywh(b)))
        for i, j in enumerate(iou.argmax(axis=1)):
            if iou[i, j] < 0.3:
                continue
            ka = np.array(a[i]["keypoints"], np.float64).reshape(-1, 3)
            kb = np.array(b[j]["keypoints"], np.float64).reshape(-1, 3)
            confident = (ka[:, 2] > 0.3) & (kb[:, 2] > 0.3)
            distances += list(np.linalg.norm(ka[confident, :2] - kb[confident, :2], axis=1))
    d = np.array(distances)
    return float(np.median(d)), float(np.percentile(d, 99)), len(d)


def one_run(predictor, oracle, video: Path, every: int, out: Path):
    oracle.calls = 0
    args = argparse.Namespace(out=None, json=str(out), json_array=False, resume=False, track=True, smooth=False,
                              boxes=None, progress=False, quiet=True, det_every=every, pipeline="sequential",
                              batch_frames=1)
    started = time.perf_counter()
    summary = run_video(predictor, str(video), args)
    return time.perf_counter() - started, summary, read_records(out), oracle.calls


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="work_dirs/demo/best.pth")
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--step", type=int, default=3, help="pixels the camera pans per frame")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=10, help="the scene (seed 10: four people)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench_det_every_"))
    truth = write_pan_video(tmp / "pan.avi", args.frames, args.step, args.seed)
    network = build_detector(default_detector_name("cpu"), pretrained=False)
    oracle = TimedOracleDetector(network, tmp / "pan.avi", truth)
    predictor = Predictor(args.model, detector=oracle, device="cpu")
    results = {1: [], args.every: []}
    one_run(predictor, oracle, tmp / "pan.avi", 1, tmp / "warm.jsonl")  # warm-up (allocations, caches)
    for _ in range(args.rounds):
        for every in (1, args.every):
            results[every].append(one_run(predictor, oracle, tmp / "pan.avi", every, tmp / f"n{every}.jsonl"))
    print(f"load average {os.getloadavg()[0]:.2f}; {args.frames} frames {FRAME_SIZE[0]}x{FRAME_SIZE[1]}, "
          f"{sum(len(t) for t in truth) / len(truth):.1f} people per frame, {args.threads} threads, {args.rounds} rounds")
    base_records = results[1][-1][2]
    for every, runs in results.items():
        fps = [args.frames / wall for wall, *_ in runs]
        summary, records, calls = runs[-1][1], runs[-1][2], runs[-1][3]
        people = len(records) / statistics.median([wall for wall, *_ in runs])
        shares = summary.stage_seconds
        detect_share = shares.get("detect", 0.0) / max(sum(shares.values()), 1e-9)
        line = (f"--det-every {every}: {statistics.median(fps):.2f} frames/s (rounds {min(fps):.2f}-{max(fps):.2f}), "
                f"{people:.2f} people/s, detector on {calls} of {args.frames} frames "
                f"({100 * detect_share:.0f}% of the time), {len({r['track_id'] for r in records})} track ids")
        if every != 1:
            med, p99, n = agreement(base_records, records)
            ratios = [base_wall / wall for (base_wall, *_), (wall, *_) in zip(results[1], runs)]  # round by round
            line += (f"; {statistics.median(ratios):.2f}x N=1's frames/s (rounds {min(ratios):.2f}-{max(ratios):.2f})"
                     f"; keypoints vs N=1: median {med:.2f} px, p99 {p99:.2f} px ({n} keypoints)")
        print(line)


if __name__ == "__main__":
    main()
