"""benchmarks/bench_predict.py's rule for which trained configs the peers can run, and the wiring of
its speed comparison with rtmlib and Ultralytics (benchmarks/peer_speed.py; nothing is timed here).

The peers (MMPose, HF) build the published ViTPose from their own config and only take our
weights; a trained config the rule lets through must therefore be that model exactly, or the peers'
rows would time (and compare keypoints of) another network than ours.
"""

import argparse
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from vitpose.builders import build_codec, build_model_from_config
from vitpose.config import load_config, shipped_configs
from vitpose.models.vitpose import build_model

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import peer_speed  # noqa: E402
from bench_predict import MMPOSE_CONFIGS, peers_cannot_run  # noqa: E402


def shapes(model):
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


TRAINING_CONFIGS = [n for n in shipped_configs() if not n.endswith("_skeleton")]  # skeleton files sit beside them


@pytest.mark.parametrize("name", TRAINING_CONFIGS)
def test_a_config_the_peers_run_is_the_published_model(name):
    cfg = load_config(name)
    why_not = peers_cannot_run(cfg, name)
    if why_not:
        assert why_not.startswith(name), why_not  # the line names the config ...
        assert "model." in why_not or "skeleton" in why_not or "the peers here" in why_not  # ... and the field
        return
    assert (cfg.model.name, cfg.model.decoder) in MMPOSE_CONFIGS
    ours = build_model_from_config(cfg.model)
    assert shapes(ours) == shapes(build_model(cfg.model.name, cfg.model.decoder))
    codec = build_codec(cfg.model)  # MMPose's ViTPose configs: UDPHeatmap((192, 256), (48, 64), sigma=2)
    assert (tuple(codec.input_size), tuple(codec.heatmap_size), codec.sigma) == ((192, 256), (48, 64), 2.0)


def test_the_trained_vitpose_s_config_runs_the_peers_and_the_demo_does_not():
    def why_not(name):
        return peers_cannot_run(load_config(name), name)

    assert why_not("configs/demo_vitpose-s.yaml") == ""
    assert "model.extra" in why_not("configs/demo.yaml")
    assert "skeleton" in why_not("configs/ap10k_vitpose-b_256x192.yaml")
    assert "vitpose-l" in why_not("configs/vitpose-l_coco_256x192.yaml")


# ---------------------------------------------------------------------------------------------
# The speed comparison with rtmlib and Ultralytics (benchmarks/peer_speed.py)


def test_a_peer_without_its_venv_or_onnx_file_is_skipped_with_a_line_naming_the_flag(tmp_path):
    found, skipped = peer_speed.find_peers({})
    assert found == []
    for flag, env in (("--rtmlib-python", "VITPOSE_RTMLIB_PYTHON"), ("--rtmpose-dir", "VITPOSE_RTMPOSE_DIR"),
                      ("--ultralytics-python", "VITPOSE_ULTRALYTICS_PYTHON"),
                      ("--yolo-pose-onnx", "VITPOSE_YOLO_POSE_ONNX")):
        line = next(line for line in skipped if flag in line)
        assert line.startswith("skip ") and "not given" in line and f"${env}" in line

    gone = tmp_path / "no-such-venv" / "python"
    found, skipped = peer_speed.find_peers({"rtmlib_python": str(gone), "rtmpose_dir": str(tmp_path)})
    assert found == [] and any(f"{gone} does not exist" in line for line in skipped)


def test_rtmlib_runs_the_rtmpose_files_that_are_there_and_names_the_others(tmp_path):
    (tmp_path / "rtmpose-t.onnx").write_bytes(b"")
    found, skipped = peer_speed.find_peers({"rtmlib_python": sys.executable, "rtmpose_dir": str(tmp_path)})
    assert [(p.kind, list(p.models)) for p in found] == [("rtmlib", ["rtmpose-t"])]
    assert any("rtmpose-s, rtmpose-m not in" in line for line in skipped)


def test_the_peers_paths_default_to_their_environment_variables(monkeypatch):
    monkeypatch.setenv("VITPOSE_YOLO_POSE_ONNX", "/models/yolo11n-pose.onnx")
    monkeypatch.delenv("VITPOSE_RTMLIB_PYTHON", raising=False)
    parser = argparse.ArgumentParser()
    peer_speed.add_arguments(parser)
    args = parser.parse_args(["--speed-peers"])
    assert args.speed_peers and args.yolo_pose_onnx == "/models/yolo11n-pose.onnx" and args.rtmlib_python is None


def test_people_per_second_and_the_ratios_from_fake_timings():
    # A whole-image model's pass finds everyone: 8 people in 0.5 s is 16 people/s, 2 images/s.
    assert peer_speed.people_per_second(8, 0.5) == 16
    times = {"ours": [0.25, 0.5, 0.2], "rtmpose-t": [0.5, 0.5, 0.6]}
    rows = {name: row for name, *row in peer_speed.speed_rows(times, people=4)}
    assert rows["ours"] == ["0.25 [0.2-0.5]", "4 [2-5]", "16 [8-20]"]
    assert rows["rtmpose-t"][2] == "8 [6.67-8]"
    # round by round: 2x, 1x, 3x the peer's people/s
    assert peer_speed.ratio_line(times, "ours", "rtmpose-t") == "ours / rtmpose-t people/s per round: 2 [1-3]"
    assert peer_speed.ratio_line(times, "ours", "rtmpose-s") == ""  # a skipped peer: no line
    # a round's figure is the median of passes that together hold as many people as the largest count
    assert [peer_speed.calls_per_round(n) for n in peer_speed.PEOPLE_COUNTS] == [8, 2, 1]


def test_every_contestant_gets_the_same_image_and_the_top_boxes(coco_mini_dir):
    image, boxes = peer_speed.image_and_boxes(coco_mini_dir)
    assert Path(image).is_file()
    assert sorted(boxes) == [1, 4, 8] and [len(b) for b in boxes.values()] == [1, 4, 8]
    assert boxes[8][:4] == boxes[4] and boxes[4][:1] == boxes[1]
    assert all(x1 > x0 and y1 > y0 for x0, y0, x1, y1 in boxes[8])


FAKE_RTMLIB = """
import onnxruntime as ort

class RTMPose:
    def __init__(self, onnx_model, backend, device):
        self.session = ort.InferenceSession(path_or_bytes=onnx_model, providers=["CPUExecutionProvider"])
        options = self.session.get_session_options()
        if (options.intra_op_num_threads, options.inter_op_num_threads) != (2, 1):
            raise SystemExit(f"threads {options.intra_op_num_threads}, {options.inter_op_num_threads}")

    def __call__(self, image, bboxes):
        return [self.session.run(None, {"x": image[:1, :1].astype("float32")}) for _ in bboxes]
"""


def test_the_peer_process_answers_timed_passes_with_the_same_threads(tmp_path, monkeypatch):
    """The protocol with a stand-in rtmlib whose model is a one-node ONNX graph: its session gets the
    benchmark's threads whatever the library passes, and every command is answered with seconds."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "rtmpose-t.onnx")
    (tmp_path / "lib" / "rtmlib").mkdir(parents=True)
    (tmp_path / "lib" / "rtmlib" / "__init__.py").write_text(FAKE_RTMLIB)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "lib"))
    image = tmp_path / "image.jpg"
    cv2.imwrite(str(image), np.zeros((8, 8, 3), np.uint8))
    spec = peer_speed.PeerSpec("rtmlib", sys.executable, {"rtmpose-t": str(tmp_path / "rtmpose-t.onnx")})
    process = peer_speed.PeerProcess(spec, str(image), {1: [[0, 0, 4, 4]], 4: [[0, 0, 4, 4]] * 4},
                                     threads=2, log_folder=tmp_path)
    try:
        assert "onnxruntime" in process.versions
        assert all(isinstance(process.time("rtmpose-t", n), float) for n in (1, 4))
    finally:
        process.close()
    assert process.proc.returncode == 0


def test_the_report_sets_each_student_against_its_peer(capsys):
    times = {"vitpose-t int8": [0.2, 0.2], "vitpose-n int8": [0.1, 0.1], "rtmpose-t": [0.15, 0.3],
             "rtmpose-s": [0.25, 0.3], "yolo11n-pose": [0.4, 0.4]}
    peer_speed.report({8: times})
    out = capsys.readouterr().out
    assert "| x rtmpose-t (people/s) | x rtmpose-s (people/s) | x yolo11n-pose (people/s)" in out
    assert "x vitpose-t int8" not in out  # ours are rows, the peers are the columns
    assert "8 people: vitpose-t int8 / rtmpose-s people/s per round: 1.38 [1.25-1.5] -> >= 1.0x" in out
    assert "8 people: vitpose-n int8 / rtmpose-t people/s per round: 2.25 [1.5-3] -> >= 1.0x" in out
