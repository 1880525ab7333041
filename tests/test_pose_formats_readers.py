"""The 3D tools' own readers read what `vitpose convert` (= `vitpose predict --format`) writes, keypoints equal.

Slow tier: each reader in a virtual environment of its own under ~/.cache/vitpose-tests/
(`serve_helpers.venv_of_its_own`), never a vitpose dependency; `vitpose convert` runs there too
where the format needs the reader's packages (pandas + PyTables for `.h5`, pynwb + ndx-pose for
`.nwb`), which also shows that it needs no torch. The readers:
- aniposelib's DeepLabCut loader (`aniposelib.utils.load_pose2d_fnames`, the .h5 anipose reads);
- sleap-io's DeepLabCut reader (`sleap_io.load_dlc`, a folder of images' .csv);
- pynwb + ndx-pose (the NWB file's PoseEstimation series, skeleton and timestamps);
- Pose2Sim's OpenPose readers (`personAssociation.read_json`, `triangulation.extract_files_frame_f`)
  and its AlphaPose converter (`Utilities.AlphaPose_to_OpenPose`), installed without the rest of
  Pose2Sim's requirements (OpenSim, Qt, RTMLib: not what these functions import).
"""

import json
import math
import os
import subprocess

import numpy as np
import pytest
from conftest import REPO
from serve_helpers import venv_of_its_own

from vitpose.data.metainfo import dataset_info

pytestmark = pytest.mark.slow

COCO = dataset_info("coco")
K = 17
FPS = 25.0


def record(frame, track=None, person=0, p=None, missing=(), image=None):
    flat = []
    for k in range(K):
        flat += ([None] * 3 if k in missing else
                 [100.25 + 3 * frame + k + 40 * person, 60.5 + 2 * k + frame, round(0.4 + k / 40, 4)])
    out = {"frame": frame} if image is None else {"image_id": frame, "file_name": image}
    out.update({"category_id": 1, "bbox": [10.0, 20.0, 30.0, 40.0], "keypoints": flat, "bbox_score": 0.9,
                "score": 0.85})
    if track is not None:
        out["track_id"] = track
    if p is not None:
        out["p"] = [p - k / 100 for k in range(K)]
    return out


def keypoints(r):
    xyc = np.array([math.nan if v is None else v for v in r["keypoints"]], float).reshape(K, 3)
    conf = np.array(r["p"], float) if "p" in r else xyc[:, 2]
    return xyc[:, :2], conf


def run_in(venv, code, *args):
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code, *map(str, args)], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def convert(venv, run, fmt, out, *extra):
    code = "import sys\nfrom vitpose.cli import main\nsys.exit(main(sys.argv[1:]))"
    run_in(venv, code, "convert", run, "--format", fmt, "--out", out, *extra)


def write_run(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def nan_list(values):
    return np.array([math.nan if v is None else v for v in values], float)


# ---------------------------------------------------------------------------------------------


def test_aniposelib_reads_the_deeplabcut_h5(tmp_path):
    venv = venv_of_its_own("aniposelib", ["aniposelib==0.8.0", "opencv-contrib-python-headless", "pandas", "tables",
                                          "pyyaml"])
    # one person (anipose's case): frame 2 nobody, frame 1's keypoint 4 not found, p from frame 3 on
    records = [record(f, track=0 if f < 4 else 1, p=0.9 if f >= 3 else None, missing=(4,) if f == 1 else ())
               for f in range(6) if f != 2]
    run = write_run(tmp_path / "cam1.jsonl", records)
    convert(venv, run, "dlc", tmp_path / "cam1.h5")
    read = json.loads(run_in(venv, (
        "import json, sys\nimport numpy as np\nfrom aniposelib.utils import load_pose2d_fnames\n"
        "d = load_pose2d_fnames({'cam1': sys.argv[1]})\n"
        "print(json.dumps({'bodyparts': list(d['bodyparts']), 'points': np.where(np.isnan(d['points']), None, "
        "d['points']).tolist(), 'scores': np.where(np.isnan(d['scores']), None, d['scores']).tolist()}))"),
        tmp_path / "cam1.h5").splitlines()[-1])
    assert read["bodyparts"] == list(COCO.keypoint_names)
    points = np.array(read["points"], dtype=float)[0]
    scores = np.array(read["scores"], dtype=float)[0]
    assert points.shape == (6, K, 2)
    assert np.isnan(points[2]).all() and np.isnan(scores[2]).all()  # the frame with nobody
    for r in records:
        xy, conf = keypoints(r)
        np.testing.assert_array_equal(points[r["frame"]], xy)
        np.testing.assert_array_equal(scores[r["frame"]], conf)


def test_sleap_io_reads_the_deeplabcut_csv_of_a_folder_of_images(tmp_path):
    venv = venv_of_its_own("sleap-io", ["sleap-io==0.9.5", "pynwb", "ndx-pose", "pyyaml", "opencv-python-headless"])
    import cv2

    frames = tmp_path / "frames"
    frames.mkdir()
    records = []
    for i in range(3):
        name = f"img{i:03d}.png"
        cv2.imwrite(str(frames / name), np.zeros((120, 160, 3), np.uint8))
        people = 2 if i != 1 else 1
        records += [record(i, person=n, image=name, missing=(5,) if (i, n) == (2, 1) else ()) for n in range(people)]
    run = write_run(tmp_path / "images.jsonl", records)
    convert(venv, run, "dlc", frames / "poses.csv")
    read = json.loads(run_in(venv, (
        "import json, sys\nimport numpy as np\nimport sleap_io as sio\n"
        "labels = sio.load_dlc(sys.argv[1], config=False)\nout = {}\n"
        "for lf in labels.labeled_frames:\n"
        "    name = lf.video.filename[lf.frame_idx].rsplit('/', 1)[-1]\n"
        "    for inst in lf.instances:\n"
        "        pts = inst.numpy()\n"
        "        out.setdefault(name, {})[inst.track.name] = {n.name: [None if np.isnan(v) else float(v) for v in "
        "pts[i]] for i, n in enumerate(inst.skeleton.nodes)}\n"
        "print(json.dumps(out))"), frames / "poses.csv").splitlines()[-1])
    assert set(read) == {"img000.png", "img001.png", "img002.png"}
    seen = {}
    for r in records:
        xy, _ = keypoints(r)
        n = seen[r["file_name"]] = seen.get(r["file_name"], -1) + 1  # untracked: the n-th person of the image
        person = read[r["file_name"]][f"person{n}"]
        got = np.array([nan_list(person[name]) for name in COCO.keypoint_names])
        np.testing.assert_array_equal(got, xy)


def test_pynwb_and_ndx_pose_read_the_nwb_file(tmp_path):
    venv = venv_of_its_own("sleap-io", ["sleap-io==0.9.5", "pynwb", "ndx-pose", "pyyaml", "opencv-python-headless"])
    records = [record(f, track=t, person=t, p=0.8 if t == 3 else None, missing=(2,) if f == 1 else ())
               for f in range(4) for t in (1, 3) if (f, t) != (2, 1)]
    run = write_run(tmp_path / "cam.jsonl", records)
    convert(venv, run, "nwb", tmp_path / "cam.nwb", "--fps", FPS)
    read = json.loads(run_in(venv, (
        "import json, sys\nimport numpy as np\nfrom pynwb import NWBHDF5IO\nimport ndx_pose\n"
        "def clean(a):\n    return np.where(np.isnan(a), None, a).tolist()\n"
        "with NWBHDF5IO(sys.argv[1], 'r') as io:\n"
        "    behavior = io.read().processing['behavior']\n    out = {}\n"
        "    for name, pe in behavior.data_interfaces.items():\n"
        "        if not isinstance(pe, ndx_pose.PoseEstimation):\n            continue\n"
        "        out[name] = {'nodes': list(pe.skeleton.nodes[:]), 'edges': pe.skeleton.edges[:].tolist(),\n"
        "                     'series': {s: {'data': clean(v.data[:]), 'confidence': clean(v.confidence[:]),\n"
        "                                    'timestamps': list(map(float, v.timestamps[:])), 'unit': v.unit}\n"
        "                                for s, v in pe.pose_estimation_series.items()}}\n"
        "print(json.dumps(out))"), tmp_path / "cam.nwb").splitlines()[-1])
    assert set(read) == {"PoseEstimation_track1", "PoseEstimation_track3"}
    for track in (1, 3):
        pe = read[f"PoseEstimation_track{track}"]
        assert pe["nodes"] == list(COCO.keypoint_names) and pe["edges"] == [list(e) for e in COCO.skeleton]
        for k, name in enumerate(COCO.keypoint_names):
            series = pe["series"][name]
            assert series["unit"] == "pixels" and series["timestamps"] == [f / FPS for f in range(4)]
            data = np.array(series["data"], dtype=float)
            confidence = np.array(series["confidence"], dtype=float)
            for f in range(4):
                r = next((r for r in records if r["frame"] == f and r["track_id"] == track), None)
                if r is None:
                    assert np.isnan(data[f]).all() and np.isnan(confidence[f])
                    continue
                xy, conf = keypoints(r)
                np.testing.assert_array_equal(data[f], xy[k])
                np.testing.assert_array_equal(confidence[f], conf[k])


POSE2SIM = ["numpy", "pandas", "scipy", "matplotlib", "opencv-python-headless", "rtoml", "c3d", "anytree", "tqdm",
            "pyyaml"]


def test_pose2sim_reads_the_openpose_files_with_people_by_track(tmp_path):
    venv = venv_of_its_own("pose2sim", POSE2SIM, no_deps=["pose2sim==0.10.49"])
    records = [record(f, track=t, person=t, p=0.7 if t == 5 else None, missing=(7,) if (f, t) == (0, 5) else ())
               for f in range(3) for t in (2, 5) if (f, t) != (1, 2)]
    run = write_run(tmp_path / "cam1.jsonl", records)
    convert(venv, run, "openpose", tmp_path / "cam1_json")
    read = json.loads(run_in(venv, (
        "import json, sys\nfrom pathlib import Path\nimport numpy as np\n"
        "from Pose2Sim.personAssociation import read_json\nfrom Pose2Sim.triangulation import extract_files_frame_f\n"
        "files = sorted(Path(sys.argv[1]).glob('*.json'))\n"
        "out = {'names': [f.name for f in files], 'people': [read_json(f) for f in files],\n"
        "       'triangulation': [[np.asarray(a, float).tolist() for a in extract_files_frame_f([str(f)], "
        "list(range(17)), 2)] for f in files]}\n"
        "print(json.dumps(out))"), tmp_path / "cam1_json").splitlines()[-1])
    assert read["names"] == [f"cam1_{f:012d}_keypoints.json" for f in range(3)]
    for f in range(3):
        people = read["people"][f]
        x_files, y_files, likelihood_files = (np.array(a)[:, 0] for a in read["triangulation"][f])
        for n, track in enumerate((2, 5)):  # people[n] is the n-th track in every frame
            got = np.array(people[n]).reshape(K, 3)
            np.testing.assert_array_equal(np.stack([x_files[n], y_files[n], likelihood_files[n]], 1), got)
            r = next((r for r in records if r["frame"] == f and r["track_id"] == track), None)
            if r is None:
                assert not got.any()  # OpenPose's "not detected"
                continue
            xy, conf = keypoints(r)
            found = np.isfinite(xy).all(axis=1)
            np.testing.assert_array_equal(got[found, :2], xy[found])
            np.testing.assert_array_equal(got[found, 2], conf[found])
            assert not got[~found].any()


def test_pose2sims_alphapose_converter_reads_the_alphapose_json(tmp_path):
    venv = venv_of_its_own("pose2sim", POSE2SIM, no_deps=["pose2sim==0.10.49"])
    records = [record(f, track=t, person=t, p=0.6 if t == 1 else None) for f in range(3) for t in (0, 1)]
    run = write_run(tmp_path / "clip.jsonl", records)
    convert(venv, run, "alphapose", tmp_path / "clip.json")
    read = json.loads(run_in(venv, (
        "import json, sys\nfrom pathlib import Path\n"
        "from Pose2Sim.Utilities.AlphaPose_to_OpenPose import AlphaPose_to_OpenPose_func\n"
        "from Pose2Sim.personAssociation import read_json\n"
        "AlphaPose_to_OpenPose_func(sys.argv[1], sys.argv[2])\n"
        "print(json.dumps({f.name: read_json(f) for f in sorted(Path(sys.argv[2]).glob('*.json'))}))"),
        tmp_path / "clip.json", tmp_path / "openpose").splitlines()[-1])
    assert sorted(read) == [f"{f:05d}.json" for f in range(3)]
    for f in range(3):
        for n in (0, 1):
            xy, conf = keypoints(records[2 * f + n])
            got = np.array(read[f"{f:05d}.json"][n]).reshape(K, 3)
            np.testing.assert_array_equal(got[:, :2], xy)
            np.testing.assert_array_equal(got[:, 2], conf)
