"""Ray Data (issue 29 item 4): `vitpose.integrations.ray` and `vitpose predict --engine ray`.

Slow tier, Ray local with 2 CPUs (`ray.init(num_cpus=2)`), skipped when Ray is not installed
(`pip install 'vitpose[ray]'`). `actor_resources` is plain arithmetic and runs in CI.
- `--engine ray --workers 2` + `vitpose merge` == one local process (keypoints within 1e-4 px);
  `--resume` runs only the units its shard file does not hold.
- `PosePredictor` in `read_binary_files(...).map_batches(...)` on 2 CPUs with 2 actors finishes
  (with Ray's default of 1 CPU per actor the read tasks never get a CPU and the job hangs) and its
  rows equal `Predictor` on the same pixels and boxes.
"""

import json
import threading

import numpy as np
import pytest
from test_evaluate import tiny_model
from test_shard import COMMON, NAMES, assert_same_records, merge, predict, records, write_images

import vitpose
from vitpose.integrations.ray import actor_resources


def test_actor_resources_leave_the_read_stage_a_cpu():
    assert actor_resources(2, cpus=2, gpus=0) == {"num_cpus": 0.5}
    assert actor_resources(1, cpus=2, gpus=0) == {"num_cpus": 1.0}
    assert actor_resources(4, cpus=64, gpus=0) == {"num_cpus": 1.0}
    assert actor_resources(2, cpus=1, gpus=0) == {"num_cpus": 0.05}  # one CPU: the actors take almost none
    for workers, cpus in ((2, 2), (3, 2), (8, 4), (2, 1)):
        assert actor_resources(workers, cpus=cpus, gpus=0)["num_cpus"] * workers <= max(cpus - 1, 0.1)
    assert actor_resources(2, cpus=8, gpus=2) == {"num_gpus": 1, "num_cpus": 0.25}
    assert "num_gpus" not in actor_resources(2, cpus=8, gpus=2, device="cpu")


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray-model") / "tiny.safetensors"
    vitpose.save_weights(tiny_model(seed=11), path)
    return path


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'vitpose[ray]')")
    pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'ray[data]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_engine_ray_two_workers_equals_one_process_and_resumes(tmp_path, weights, ray_local, capsys):
    write_images(tmp_path / "photos", NAMES[:8])
    base = [tmp_path / "photos", "--model", weights, *COMMON]
    assert predict([*base, "--json", tmp_path / "one.jsonl"], capsys)[0] == 0
    ray_run = [*base, "--engine", "ray", "--workers", "2", "--json", tmp_path / "shards", "--resume"]
    code, printed, err = predict(ray_run, capsys)
    assert code == 0, err
    assert "8 images, 8 people (ray, 2 workers)" in printed
    assert merge(tmp_path / "shards", tmp_path / "merged.jsonl", capsys)[0] == 0
    assert_same_records(records(tmp_path / "merged.jsonl"), records(tmp_path / "one.jsonl"))
    write_images(tmp_path / "photos", NAMES[8:], seed=3)
    code, printed, err = predict(ray_run, capsys)
    assert code == 0, err
    assert f"{len(NAMES) - 8} images" in printed and "(8 already in" in printed
    assert merge(tmp_path / "shards", tmp_path / "merged.jsonl", capsys)[0] == 0
    assert len(records(tmp_path / "merged.jsonl")) == len(NAMES)


@pytest.mark.slow
def test_pose_predictor_in_map_batches_does_not_starve_the_reads(tmp_path, weights, ray_local):
    import cv2

    from vitpose.inference.predictor import Predictor
    from vitpose.integrations.ray import PosePredictor

    write_images(tmp_path / "photos", NAMES[:6])
    ds = ray_local.data.read_binary_files(str(tmp_path / "photos"), include_paths=True, override_num_blocks=6)
    boxes = {name: [[5.0, 6.0, 40.0, 60.0, 0.9]] for name in NAMES[:6]}

    def with_boxes(row):
        return {**row, "boxes": json.dumps(boxes[row["path"].rsplit("/", 1)[1]])}

    kwargs = {"model": str(weights), "detector": None, "device": "cpu", "precision": "fp32", "batch_size": 1,
              "flip_test": True}
    poses = ds.map(with_boxes).map_batches(PosePredictor, fn_constructor_kwargs=kwargs, batch_size=1, concurrency=2,
                                           batch_format="numpy", **actor_resources(2))
    rows = []
    worker = threading.Thread(target=lambda: rows.extend(poses.take_all()), daemon=True)
    worker.start()
    worker.join(timeout=180)
    assert not worker.is_alive(), "map_batches did not finish: the actors starved the read tasks"
    assert sorted(r["file_name"] for r in rows) == sorted(NAMES[:6])
    reference = Predictor.from_pretrained(str(weights), detector=None, device="cpu", precision="fp32", batch_size=1)
    for row in rows:
        image = cv2.imread(str(tmp_path / "photos" / row["file_name"]))
        expected = reference(image, boxes=np.asarray(boxes[row["file_name"]]), channels="bgr")
        flat = np.asarray(row["keypoints"], float).reshape(-1, 3)
        np.testing.assert_allclose(flat[:, :2], expected.keypoints[0], atol=1e-4, rtol=0)
        assert list(row["bbox"]) == [5.0, 6.0, 35.0, 54.0] and row["bbox_score"] == pytest.approx(0.9)
