"""Speed against the pose estimators people pick for speed: `bench_predict.py --speed-peers`.

    python benchmarks/bench_predict.py --speed-peers --threads 2 --repeats 7 \
        --rtmlib-python RTMLIB_VENV/bin/python --rtmpose-dir DIR_WITH_rtmpose-{t,s,m}.onnx \
        --ultralytics-python ULTRALYTICS_VENV/bin/python --yolo-pose-onnx yolo11n-pose.onnx

(or the environment variables VITPOSE_RTMLIB_PYTHON, VITPOSE_RTMPOSE_DIR, VITPOSE_ULTRALYTICS_PYTHON,
VITPOSE_YOLO_POSE_ONNX). Contestants, all on ONNX Runtime's CPU provider with the same intra-op
threads (`--threads`, inter-op 1) and OMP_NUM_THREADS, on one decoded COCO image (coco-mini's
000000197388.jpg, BGR as cv2.imread gives it) with its 1, 4 and 8 highest-scoring detection boxes:

- ours: the students `vitpose-t` and `vitpose-n` and ViTPose-S (classic decoder) for reference, int8 as
  `vitpose export --precision int8` writes them (the fp32 graph in the int8 layout, gated equal to
  PyTorch, then ONNX Runtime's dynamic quantization; the AP gate needs trained weights and is left
  out), through `OnnxPredictor.predict(image, boxes)` without the flip test: the crops of the image
  in one session run.
- RTMPose-t/s/m through rtmlib's own `RTMPose(onnx_model=..., backend="onnxruntime", device="cpu")`,
  called as its README shows (`model(image, bboxes)`: one crop per session run, as rtmlib does), in
  rtmlib's own venv. The ONNX files: MMPose 1.3.2's RTMPose COCO 256x192 configs with random weights.
- YOLO-pose nano through Ultralytics' own `YOLO(onnx).predict(image)` (letterbox to 640, the session,
  NMS, keypoints scaled back), in its own venv (AGPL: benchmark only, never imported by vitpose).
  A whole-image model: one pass finds everyone, so its people/s is the people in the image times its
  images/s. Random weights from the packaged YAML find nobody, so its NMS is the cheapest there is.

A forward pass costs the same whatever the weights: these figures say nothing of accuracy (quote
the published AP beside them). Rounds alternate (benchmarks/rounds.py); a round's figure is the
median of 8, 2 and 1 passes at 1, 4 and 8 people (`calls_per_round`); each peer's process times its
own pass and answers over a pipe, so the pipe is not timed and nothing runs at the same time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from rounds import alternate, cpu_note, load_note, ratios, spread, warm_up

PEOPLE_COUNTS = (1, 4, 8)
IMAGE_ID = 197388  # coco-mini's image with the most confident detections (5 above 0.95, 8 above 0.3)
RTMPOSE_SIZES = ("t", "s", "m")
# Published COCO val2017 accuracy of each contestant, quoted (not measured here): RTMPose from
# MMPose's projects/rtmpose README (256x192, detector boxes, flip test; trained on AIC + COCO),
# YOLO11n-pose from Ultralytics' docs (mAP50-95 of the whole-image model at 640), ViTPose-S from its
# paper (256x192, detector boxes, flip test).
PUBLISHED_AP = {"rtmpose-t": "68.5 AP", "rtmpose-s": "72.2 AP", "rtmpose-m": "75.8 AP",
                "yolo11n-pose": "50.0 mAP50-95", "ViTPose-S": "73.8 AP"}
# (flag, environment variable, what it names) of each peer's two paths
PEER_PATHS = {
    "rtmlib": (("--rtmlib-python", "VITPOSE_RTMLIB_PYTHON", "the python of a venv with rtmlib and onnxruntime"),
               ("--rtmpose-dir", "VITPOSE_RTMPOSE_DIR", "a folder with rtmpose-t.onnx, rtmpose-s.onnx, rtmpose-m.onnx")),
    "ultralytics": (("--ultralytics-python", "VITPOSE_ULTRALYTICS_PYTHON",
                     "the python of a venv with ultralytics and onnxruntime"),
                    ("--yolo-pose-onnx", "VITPOSE_YOLO_POSE_ONNX", "YOLO-pose nano exported to ONNX")),
}


def add_arguments(parser) -> None:
    parser.add_argument("--speed-peers", action="store_true",
                        help="ours int8 (vitpose-t, vitpose-n, ViTPose-S) against rtmlib's RTMPose-t/s/m and "
                             "YOLO-pose nano on one image with 1/4/8 people (benchmarks/peer_speed.py)")
    for paths in PEER_PATHS.values():
        for flag, env, what in paths:
            parser.add_argument(flag, default=os.environ.get(env), help=f"{what} (default ${env})")


# ---------------------------------------------------------------------------------------------
# Which peers can run


@dataclass(frozen=True)
class PeerSpec:
    """One peer process: its venv's python, its kind and the ONNX file of each contestant it runs."""
    kind: str
    python: str
    models: dict


def skip_message(peer: str, flag: str, env: str, what: str, given) -> str:
    """The line printed for a peer that cannot run: which path is missing and how to name it."""
    state = "not given" if not given else f"{given} does not exist"
    return f"skip {peer}: {what} {state} (pass {flag} or set ${env})"


def find_peers(options: dict) -> tuple[list[PeerSpec], list[str]]:
    """The peers whose venv and ONNX files exist, and one skip line for each that does not.
    `options`: the flag values by destination name (`vars(args)`)."""
    found, skipped = [], []
    for peer, paths in PEER_PATHS.items():
        missing = []
        for flag, env, what in paths:
            given = options.get(flag.lstrip("-").replace("-", "_"))
            if not given or not Path(given).exists():
                missing.append(skip_message(peer, flag, env, what, given))
        if missing:
            skipped.extend(missing)
            continue
        python, files = (options[flag.lstrip("-").replace("-", "_")] for flag, _, _ in paths)
        if peer == "rtmlib":
            models = {f"rtmpose-{s}": str(Path(files) / f"rtmpose-{s}.onnx") for s in RTMPOSE_SIZES}
            absent = [m for m, p in models.items() if not Path(p).is_file()]
            if absent:
                skipped.append(f"skip rtmlib: {', '.join(absent)} not in {files} (export_rtm.py writes them)")
                models = {m: p for m, p in models.items() if m not in absent}
            if not models:
                continue
        else:
            models = {Path(files).stem: str(files)}
        found.append(PeerSpec(peer, str(python), models))
    return found, skipped


# ---------------------------------------------------------------------------------------------
# The peers' process

PEER_TIMER = textwrap.dedent(
    r"""
    import json, sys, time
    spec = json.loads(sys.argv[1])
    import onnxruntime as ort

    # Every session this process opens gets the same threads as ours, whatever its library passes
    # (rtmlib passes no options, Ultralytics its own SessionOptions).
    _Session = ort.InferenceSession
    def session(*args, **kw):
        path = args[0] if args else kw.pop("path_or_bytes")
        options = args[1] if len(args) > 1 else kw.pop("sess_options", None)
        options = options or ort.SessionOptions()
        options.intra_op_num_threads = spec["threads"]
        options.inter_op_num_threads = 1
        return _Session(path, options, **kw)
    ort.InferenceSession = session

    import cv2, numpy as np
    image = cv2.imread(spec["image"], cv2.IMREAD_COLOR)
    boxes = {int(n): b for n, b in spec["boxes"].items()}
    runners, versions = {}, {"onnxruntime": ort.__version__}
    try:  # what CPUID tells this process (benchmarks/avx2.sh hides AVX-512 from every process it starts)
        from numpy._core._multiarray_umath import __cpu_features__ as seen
    except ImportError:
        from numpy.core._multiarray_umath import __cpu_features__ as seen
    versions["CPUID AVX-512F"] = bool(seen.get("AVX512F"))
    if spec["kind"] == "rtmlib":
        import rtmlib
        from rtmlib import RTMPose
        versions["rtmlib"] = getattr(rtmlib, "__version__", "?")
        for name, path in spec["models"].items():
            model = RTMPose(onnx_model=path, backend="onnxruntime", device="cpu")
            runners[name] = lambda n, model=model: model(image, bboxes=boxes[n])
    else:
        import ultralytics
        from ultralytics import YOLO
        versions["ultralytics"] = ultralytics.__version__
        for name, path in spec["models"].items():
            model = YOLO(path, task="pose")
            runners[name] = lambda n, model=model: model.predict(image, imgsz=640, device="cpu", verbose=False)

    print("READY " + json.dumps(versions), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if "time" not in command:
            break
        t0 = time.perf_counter(); runners[command["time"]](command["people"])
        print("DONE " + json.dumps(time.perf_counter() - t0), flush=True)
    """
)


class PeerProcess:
    """A peer's timer in its own venv: answers one timed pass per command, so rounds alternate."""

    def __init__(self, spec: PeerSpec, image: str, boxes: dict, threads: int, log_folder: Path):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), YOLO_OFFLINE="1", YOLO_VERBOSE="False")
        payload = json.dumps(dict(kind=spec.kind, models=spec.models, image=image, threads=threads,
                                  boxes={str(n): b for n, b in boxes.items()}))
        self.log = open(log_folder / f"{spec.kind}.log", "w+")
        self.proc = subprocess.Popen([spec.python, "-c", PEER_TIMER, payload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
                                     cwd=log_folder)
        self.versions = self._answer("READY ")

    def _answer(self, prefix: str):
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return json.loads(line[len(prefix):])
        self.log.seek(0)
        raise SystemExit(f"peer timer failed (exit {self.proc.wait()}):\n{self.log.read()[-4000:]}")

    def time(self, name: str, people: int) -> float:
        self.proc.stdin.write(json.dumps({"time": name, "people": people}) + "\n")
        self.proc.stdin.flush()
        return self._answer("DONE ")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("{}\n")
            self.proc.stdin.flush()
            self.proc.wait()
        self.log.close()


# ---------------------------------------------------------------------------------------------
# Ours


# Each of ours: (model name, decoder, what it is)
OURS = (("vitpose-t", "simple", "vitpose-t int8"), ("vitpose-n", "simple", "vitpose-n int8"),
        ("vitpose-s", "classic", "ViTPose-S int8"))


def int8_file(model, folder: Path, name: str) -> Path:
    """`model` as `vitpose export --precision int8` writes it, less the AP gate (random weights): the
    fp32 graph in the int8 layout, gated equal to PyTorch, then ONNX Runtime's dynamic quantization."""
    import vitpose.inference.export as E
    from vitpose.inference import int8_graph
    from vitpose.inference.quantize import quantize_onnx

    fp32 = folder / f"{name}.fp32.onnx"
    E.to_onnx(model, fp32, int8_layout=int8_graph.available(), log=None)
    path = folder / f"{name}.int8.onnx"
    quantize_onnx(fp32, path, "dynamic")
    return path


def build_ours(name: str, decoder: str, draw_weights):
    from vitpose.models.vitpose import MODEL_SIZES, build_model

    if name not in MODEL_SIZES and name == "vitpose-t":  # the student size, before it is in MODEL_SIZES
        return draw_weights(build_model("vitpose-s", decoder, embed_dim=192, depth=12, num_heads=3)).eval()
    return draw_weights(build_model(name, decoder)).eval()


# ---------------------------------------------------------------------------------------------
# Figures


def people_per_second(people: int, seconds: float) -> float:
    """People per second of a pass over one image with `people` people (a whole-image model's too)."""
    return people / seconds


def speed_rows(times: dict, people: int) -> list[tuple]:
    """(name, s per image, images/s, people/s) of each contestant: medians [min-max] over rounds."""
    return [(name, spread(seconds), spread([1 / s for s in seconds]),
             spread([people_per_second(people, s) for s in seconds])) for name, seconds in times.items()]


def ratio_line(times: dict, ours: str, peer: str) -> str:
    """Ours' people/s over the peer's, round by round (the same people in both: the time ratio)."""
    if ours not in times or peer not in times:
        return ""
    return f"{ours} / {peer} people/s per round: {spread(ratios(times, peer, ours))}"


def print_people_table(times: dict, people: int, baselines: tuple[str, ...]) -> None:
    print(f"\n{people} people | s per image, median [min-max] | images/s | people/s | "
          + " | ".join(f"x {b} (people/s)" for b in baselines if b in times))
    print("| --- | ---: | ---: | ---: |" + " ---: |" * sum(b in times for b in baselines))
    for name, seconds, images, persons in speed_rows(times, people):
        against = [spread(ratios(times, b, name)) for b in baselines if b in times]
        print(f"| {name} | {seconds} | {images} | {persons} | " + " | ".join(against) + " |")


# ---------------------------------------------------------------------------------------------


def image_and_boxes(coco_mini: Path) -> tuple[str, dict]:
    """The image and its 1/4/8 highest-scoring detection boxes (xyxy), the same for every contestant."""
    detections = json.loads((coco_mini / "test_coco_det_AP_H_56.json").read_text())
    mine = sorted((d for d in detections if d["image_id"] == IMAGE_ID), key=lambda d: -d["score"])
    xyxy = [[x, y, x + w, y + h] for x, y, w, h in (d["bbox"] for d in mine)]
    return str(coco_mini / f"{IMAGE_ID:012d}.jpg"), {n: xyxy[:n] for n in PEOPLE_COUNTS}


def our_runners(draw_weights, folder: Path, image, boxes: dict, threads: int) -> dict:
    """name -> (people -> one timed pass) of each of ours, as an OnnxPredictor on its int8 file."""
    from vitpose.inference.onnx import OnnxPredictor
    from vitpose.models.vitpose import MODEL_SIZES

    runners = {}
    for name, decoder, label in OURS:
        if name not in MODEL_SIZES and name != "vitpose-t":
            print(f"note: {name} is not in MODEL_SIZES here; no {label} row")
            continue
        path = int8_file(build_ours(name, decoder, draw_weights), folder, name)
        predictor = OnnxPredictor(path, flip_test=False, threads=threads, batch_size=max(PEOPLE_COUNTS))
        runners[label] = lambda n, p=predictor: p.predict(image, np.asarray(boxes[n], np.float32), channels="bgr")
    return runners


def run(args, draw_weights, coco_mini: Path) -> None:
    """The peers comparison: every contestant at 1, 4 and 8 people, alternating rounds."""
    peers, skipped = find_peers(vars(args))
    for line in skipped:
        print(line)
    image_path, boxes = image_and_boxes(coco_mini)
    image = cv2.imread(image_path, cv2.IMREAD_COLOR)
    print(f"speed against the peers: {image_path.rsplit('/', 1)[-1]} ({image.shape[1]}x{image.shape[0]}), "
          f"{'/'.join(map(str, PEOPLE_COUNTS))} people, {args.threads} threads, warm-up until steady then "
          f"{args.repeats} alternating rounds; {load_note()}\n{cpu_note()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="vitpose-peers-") as tmp:
        folder = Path(tmp)
        ours = our_runners(draw_weights, folder, image, boxes, args.threads)
        processes = [PeerProcess(spec, image_path, boxes, args.threads, folder) for spec in peers]
        try:
            for process in processes:
                print(f"{process.proc.args[0]}: {process.versions}")
            steps = dict(ours)
            for spec, process in zip(peers, processes):
                for name in spec.models:
                    steps[name] = lambda n, p=process, name=name: p.time(name, n)
            all_times = measure(steps, args.repeats)
        finally:
            for process in processes:
                process.close()
    report(all_times)
    print(f"\nafter: {load_note()}")


def calls_per_round(people: int) -> int:
    """Passes per contestant and round (their median is the round's figure): as many as make the
    work of one pass with the most people, so that a short pass is not at the mercy of one
    preemption on a shared machine."""
    return max(1, max(PEOPLE_COUNTS) // people)


def measure(steps: dict, rounds: int) -> dict:
    """people -> name -> seconds per round, every contestant warmed up and alternated at each count."""
    all_times = {}
    for people in PEOPLE_COUNTS:
        runners = {name: (lambda step=step: step(people)) for name, step in steps.items()}
        warmed = {name: warm_up(run, max_steps=10) for name, run in runners.items()}
        print(f"{people} people, median of {calls_per_round(people)} passes per round; warm-up passes: "
              + ", ".join(f"{k} {v}" for k, v in warmed.items()), flush=True)
        all_times[people] = alternate(runners, rounds, repeats=calls_per_round(people),
                                      report=lambda line: print("  " + line, flush=True))
    return all_times


def report(all_times: dict) -> None:
    ours = {label for _, _, label in OURS}
    for people, times in all_times.items():
        print_people_table(times, people, tuple(name for name in times if name not in ours))
    print("\nacceptance (people/s per round, median [min-max]):")
    for people, times in all_times.items():
        for ours, peer in (("vitpose-t int8", "rtmpose-s"), ("vitpose-n int8", "rtmpose-t")):
            line = ratio_line(times, ours, peer)
            if line:
                median = statistics.median(ratios(times, peer, ours))
                print(f"  {people} people: {line} -> {'>= 1.0x' if median >= 1.0 else 'below 1.0x'}")
    print("published accuracy (COCO val2017, quoted, not measured): "
          + ", ".join(f"{k} {v}" for k, v in PUBLISHED_AP.items()))


if __name__ == "__main__":
    sys.exit("run it through benchmarks/bench_predict.py --speed-peers")
