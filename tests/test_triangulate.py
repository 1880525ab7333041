"""`vitpose triangulate` and vitpose.multiview: calibrations of aniposelib and Pose2Sim read, the
confidence-weighted DLT with outlier views dropped against the truth of a synthetic recording (a
moving COCO-17 figure, 3-6 cameras with lens distortion, noise N(0, 2 px / score), 10% dropouts, one
camera with 40% confident outliers 40-150 px away), the .trc read back, bad input in one line, and
(slow) aniposelib's own triangulation on the same input.

Bounds stated here (measured: docs/3d.md §3): MPJPE of `vitpose triangulate` below 40 mm and below
0.6 times the unweighted DLT's on the same points; with --refine below 15 mm.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from vitpose.cli import main
from vitpose.multiview.association import associate
from vitpose.multiview.calibration import Camera, _toml_subset, calibration_text, read_calibration
from vitpose.multiview.refine import _second_difference_bands, banded_solve
from vitpose.multiview.synthetic import ring_cameras, synthetic_scene
from vitpose.multiview.trc import read_trc, trc_text
from vitpose.multiview.triangulation import dlt, triangulate
from vitpose.multiview.views import read_views

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

MPJPE_BOUND_MM = 40.0
REFINED_BOUND_MM = 15.0

# aniposelib's CameraGroup.dump (the toml package: trailing commas, int sizes) and Pose2Sim's
# calibration (float sizes, 4 distortions, `fisheye`), as each writes them.
ANIPOSELIB_TOML = """[cam_0]
name = "A"
size = [ 1440, 1080,]
matrix = [ [ 1852.4, 0.0, 719.5,], [ 0.0, 1852.4, 539.5,], [ 0.0, 0.0, 1.0,],]
distortions = [ -0.036, 0.0, 0.0, 0.0, 0.0,]
rotation = [ -0.0017, -0.0018, -0.0046,]
translation = [ 2.55, -2.77, -18.17,]

[cam_1]
name = "B"
size = [ 1440, 1080,]
matrix = [ [ 1935.9, 0.0, 719.5,], [ 0.0, 1935.9, 539.5,], [ 0.0, 0.0, 1.0,],]
distortions = [ -0.31, 0.0, 0.0, 0.0, 0.0,]
rotation = [ -0.2257, -2.982, 0.3874,]
translation = [ 117.37, 262.50, 1478.82,]

[metadata]
adjusted = true
error = 1.668
"""
POSE2SIM_TOML = """[cam_01]
name = "cam_01"
size = [ 1088.0, 1920.0]
matrix = [ [ 1681.24, 0.0, 532.97], [ 0.0, 1681.07, 948.14], [ 0.0, 0.0, 1.0]]
distortions = [ -0.00072, 0.0022, 9.5e-06, 1.08e-05]
rotation = [ 1.688, 1.048, -0.4196]
translation = [ 0.321, 0.956, 2.891]
fisheye = false

[cam_02]
name = "cam_02"
size = [ 1088.0, 1920.0]
matrix = [ [ 1673.73, 0.0, 534.49], [ 0.0, 1673.80, 963.23], [ 0.0, 0.0, 1.0]]
distortions = [ -0.00075, 0.0021, 1.5e-05, 4.5e-06]
rotation = [ 1.350, 1.596, -1.198]
translation = [ -0.112, 0.777, 3.068]
fisheye = false

[metadata]
adjusted = false
error = 0.0
"""


def views_of(scene, min_score=0.3):
    c, t, k, _ = scene.pixels.shape
    observed = np.stack([cam.normalized(scene.pixels[i]) for i, cam in enumerate(scene.cameras)])
    weights = scene.scores.transpose(1, 2, 0).reshape(t * k, c)
    return (observed.transpose(1, 2, 0, 3).reshape(t * k, c, 2), np.where(weights >= min_score, weights, 0.0),
            np.stack([cam.extrinsics() for cam in scene.cameras]), np.stack([cam.focal for cam in scene.cameras]))


def errors_mm(points, truth):
    return np.linalg.norm(points - truth.reshape(-1, 3), axis=1) * 1000


# ----------------------------------------------------------------------------------------------
# Calibration files


@pytest.mark.parametrize("text, names, distortions, size", [
    (ANIPOSELIB_TOML, ["A", "B"], 5, (1440, 1080)),
    (POSE2SIM_TOML, ["cam_01", "cam_02"], 4, (1088, 1920)),
])
def test_both_calibration_flavours_are_read(tmp_path, text, names, distortions, size):
    path = tmp_path / "calib.toml"
    path.write_text(text)
    cameras = read_calibration(path)
    assert [c.name for c in cameras] == names  # [metadata] is not a camera
    assert all(len(c.distortions) == distortions and c.size == size and not c.fisheye for c in cameras)
    assert np.allclose(cameras[0].rotation @ cameras[0].rotation.T, np.eye(3))  # Rodrigues -> a rotation
    # Python 3.10's reader (the subset the two tools write) agrees with tomllib
    import tomllib
    assert _toml_subset(text, path) == tomllib.loads(text)


@pytest.mark.parametrize("flavour", ["aniposelib", "pose2sim"])
def test_written_calibration_reads_back(tmp_path, flavour):
    cameras = ring_cameras(3)
    path = tmp_path / "c.toml"
    path.write_text(calibration_text(cameras, flavour))
    back = read_calibration(path)
    for a, b in zip(cameras, back):
        assert np.allclose(a.rotation, b.rotation) and np.allclose(a.translation, b.translation)
        assert np.allclose(a.matrix, b.matrix) and np.allclose(a.distortions[:4], b.distortions[:4])


def test_undistortion_inverts_the_projection():
    camera = ring_cameras(1)[0]
    world = np.array([[0.3, -0.2, 1.1], [0.0, 0.0, 0.2], [-0.4, 0.3, 1.8]])
    in_camera = world @ camera.rotation.T + camera.translation
    assert np.allclose(camera.normalized(camera.project(world)), in_camera[:, :2] / in_camera[:, 2:], atol=1e-6)
    fisheye = Camera("f", camera.matrix, np.array([0.05, -0.01, 0.0, 0.0]), camera.rotation, camera.translation,
                     fisheye=True)
    assert np.allclose(fisheye.normalized(fisheye.project(world)), in_camera[:, :2] / in_camera[:, 2:], atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Triangulation against the truth


@pytest.mark.parametrize("cameras", [3, 4, 6])
def test_weighted_dlt_with_outlier_views_dropped_beats_the_unweighted_dlt(cameras):
    scene = synthetic_scene(cameras=cameras, frames=90, seed=cameras)
    observed, weights, extrinsics, focal = views_of(scene)
    ours = errors_mm(triangulate(observed, weights, extrinsics, focal, max_error=15.0).points, scene.truth)
    plain = errors_mm(dlt(observed, (weights > 0).astype(float), extrinsics), scene.truth)
    both = np.isfinite(ours) & np.isfinite(plain)
    assert np.nanmean(ours) < MPJPE_BOUND_MM, np.nanmean(ours)
    assert ours[both].mean() < 0.6 * plain[both].mean(), (ours[both].mean(), plain[both].mean())
    assert np.isnan(ours).mean() < 0.10  # left out: two views that disagree (9% with 3 cameras, 0 with 6)


def test_confidence_weighting_helps_without_outliers():
    scene = synthetic_scene(cameras=4, frames=90, outlier_camera=False, seed=1)
    observed, weights, extrinsics, focal = views_of(scene)
    weighted = errors_mm(triangulate(observed, weights, extrinsics, focal, max_error=None).points, scene.truth)
    plain = errors_mm(dlt(observed, (weights > 0).astype(float), extrinsics), scene.truth)
    assert np.nanmean(weighted) < 0.95 * np.nanmean(plain), (np.nanmean(weighted), np.nanmean(plain))


def test_exact_views_give_the_truth():
    scene = synthetic_scene(cameras=3, frames=10, noise_px=0.0, dropout=0.0, outlier_camera=False)
    observed, weights, extrinsics, focal = views_of(scene, min_score=0.0)
    result = triangulate(observed, weights, extrinsics, focal)
    assert np.allclose(result.points, scene.truth.reshape(-1, 3), atol=1e-6)
    assert np.nanmax(result.errors) < 1e-3 and result.used.all()


def test_banded_solve_equals_the_dense_solve():
    rng = np.random.default_rng(0)
    d0, d1, d2 = _second_difference_bands(12, 3.0)
    weights = rng.uniform(0, 2, (12, 2))
    rhs = rng.normal(size=(12, 2))
    x = banded_solve(d0[:, None] + weights + 1e-9, d1, d2, rhs)
    for m in range(2):
        dense = np.diag(d0 + weights[:, m] + 1e-9) + np.diag(d1, 1) + np.diag(d1, -1) + np.diag(d2, 2) + np.diag(d2, -2)
        assert np.allclose(dense @ x[:, m], rhs[:, m])


# ----------------------------------------------------------------------------------------------
# The command


def write_inputs(folder: Path, scene, track_ids=True) -> list[str]:
    (folder / "cams.toml").write_text(calibration_text(scene.cameras))
    files = []
    for c in range(len(scene.cameras)):
        (folder / f"cam{c + 1}.jsonl").write_text(scene.jsonl(c, 0 if track_ids else None))
        files.append(str(folder / f"cam{c + 1}.jsonl"))
    return files


def test_the_command_writes_the_trc_and_the_errors(tmp_path, capsys):
    scene = synthetic_scene(cameras=4, frames=60, seed=2)
    files = write_inputs(tmp_path, scene)
    out = tmp_path / "trial.trc"
    assert main(["triangulate", *files, "--calibration", str(tmp_path / "cams.toml"), "--out", str(out), "--fps", "60"]) == 0
    names, frames, points, header = read_trc(out)
    assert names[0] == "nose" and len(names) == 17 and list(frames) == list(range(60))
    assert header["DataRate"] == "60" and header["NumFrames"] == "60" and header["Units"] == "m"
    assert np.nanmean(errors_mm(points.reshape(-1, 3), scene.truth)) < MPJPE_BOUND_MM
    rows = (tmp_path / "trial.errors.csv").read_text().splitlines()
    assert rows[0] == "person,frame,keypoint,x,y,z,reprojection_error_px,views"
    assert len(rows) - 1 == np.isfinite(points).all(-1).sum()
    assert "written:" in capsys.readouterr().out

    # every detection in one group (no epipolar gate): the file holds the library's triangulation, of the
    # pixels as the JSON Lines round them (to 1/1000 px)
    assert main(["triangulate", *files, "--calibration", str(tmp_path / "cams.toml"), "--out", str(out),
                 "--max-epipolar", "1e6"]) == 0
    observed, weights, extrinsics, focal = views_of(scene)
    direct = triangulate(observed, weights, extrinsics, focal).points.reshape(60, 17, 3)
    assert np.allclose(read_trc(out)[2], direct, atol=5e-4, equal_nan=True)

    refined = tmp_path / "refined.trc"
    assert main(["triangulate", *files, "--calibration", str(tmp_path / "cams.toml"), "--out", str(refined),
                 "--refine"]) == 0
    points = read_trc(refined)[2]
    assert np.nanmean(errors_mm(points.reshape(-1, 3), scene.truth)) < REFINED_BOUND_MM

    # one person, the same track id in every camera: --match ids groups them as the epipolar gate does
    by_ids = tmp_path / "ids.trc"
    assert main(["triangulate", *files, "--calibration", str(tmp_path / "cams.toml"), "--out", str(by_ids),
                 "--match", "ids"]) == 0
    assert np.allclose(read_trc(by_ids)[2], read_trc(out)[2], equal_nan=True)


def test_trc_reads_back_equal():
    rng = np.random.default_rng(0)
    points = rng.normal(size=(5, 3, 3))
    points[2, 1] = np.nan
    for up in ("z", "y"):
        text = trc_text(points, ["a", "b", "c"], [10, 11, 12, 13, 14], 25.0, "mm", up, "t.trc")
        lines = text.splitlines()
        assert lines[0] == "PathFileType\t4\t(X/Y/Z)\tt.trc"
        assert lines[2].split("\t") == ["25", "25", "5", "3", "mm", "25", "11", "15"]
        path = Path(pytest.importorskip("tempfile").mkdtemp()) / "t.trc"
        path.write_text(text)
        names, frames, back, _ = read_trc(path, up)
        assert names == ["a", "b", "c"] and list(frames) == [10, 11, 12, 13, 14]
        assert np.allclose(back, points, atol=1e-6, equal_nan=True)
    # a Z-up world is written Y-up in Pose2Sim's column order (Y, Z, X)
    first_row = trc_text(points, ["a", "b", "c"], range(5), 25.0).splitlines()[6].split("\t")
    assert np.allclose([float(v) for v in first_row[2:5]], points[0, 0, [1, 2, 0]], atol=1e-6)


def test_p_is_the_weight_when_given(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"frame": 3, "keypoints": [1, 2, 0.9, None, None, 0.0], "p": [0.4, None],
                                "track_id": 7}) + "\n")
    detection = read_views(path)[3][0]
    assert np.allclose(detection.weights, [0.4, 0.0]) and detection.track_id == 7
    assert np.isnan(detection.pixels[1]).all()


def test_two_people_are_told_apart_without_track_ids():
    one = synthetic_scene(cameras=4, frames=20, outlier_camera=False, dropout=0.0, seed=3)
    two = synthetic_scene(cameras=4, frames=20, outlier_camera=False, dropout=0.0, seed=3)
    shift = np.array([1.2, -0.8, 0.0])
    two.pixels = np.stack([cam.project(one.truth + shift) for cam in one.cameras])
    from vitpose.multiview.views import Detection
    views = []
    for c in range(4):
        frames = {}
        for t in range(20):
            people = [Detection(one.pixels[c, t], one.scores[c, t]), Detection(two.pixels[c, t], one.scores[c, t])]
            frames[t] = people[::-1] if (t + c) % 2 else people  # the order says nothing
        views.append(frames)
    people = associate(views, one.cameras)
    assert len(people) == 2 and all(len(p.frames) == 20 for p in people)
    extrinsics = np.stack([c.extrinsics() for c in one.cameras])
    centres = []
    for person in people:
        _, normalized, _, weights = person.arrays()
        points = dlt(normalized.transpose(0, 2, 1, 3).reshape(-1, 4, 2), weights.transpose(0, 2, 1).reshape(-1, 4),
                     extrinsics)
        centres.append(points.reshape(20, 17, 3).mean((0, 1)))
    truth_centres = [one.truth.mean((0, 1)), (one.truth + shift).mean((0, 1))]
    assert sorted(np.argmin([np.linalg.norm(c - t) for t in truth_centres]) for c in centres) == [0, 1]
    for c in centres:
        assert min(np.linalg.norm(c - t) for t in truth_centres) < 0.02


@pytest.mark.parametrize("problem, expected", [
    ("count", "2 JSON Lines files for the 4 cameras of --calibration"),
    ("camera", "has no camera named 'cam9'"),
    ("field", "[cam_0] has no 'rotation'"),
    ("line", "cam2.jsonl:3: not a JSON line"),
    ("missing", "--calibration"),
    ("ids", "--match ids: camera 1, frame 0: a record without 'track_id'"),
    ("keypoints", "cam3.jsonl: 5 keypoints a record"),
    ("cutoff", "--cutoff must be in [0.1, 15] (half of --fps 30)"),
    ("focal", "[cam_0] 'matrix' has focal lengths 0, 0"),  # every point would project to the centre
    ("same file", "cam1.jsonl twice: each camera is one file of its own"),
    ("same camera", "--cameras names cam1 twice"),
    ("fps", "--fps must be a finite number, got inf"),  # passed every lower bound; the .trc said DataRate inf
    ("errors", "--errors"),  # the CSV written over the .trc, both reported written
    ("same place", "are at the same place: no baseline"),  # NaN warnings, then no person
    ("units", "--units 'm\\tx': give a name without tabs"),  # a tab would shift the .trc header's columns
])
def test_bad_input_is_one_line(tmp_path, capsys, problem, expected):
    scene = synthetic_scene(cameras=4, frames=5)
    files = write_inputs(tmp_path, scene, track_ids=problem != "ids")
    calibration = tmp_path / "cams.toml"
    extra = {"ids": ["--match", "ids"], "cutoff": ["--refine", "--cutoff", "20"],
             "fps": ["--fps", "inf"], "errors": ["--errors", str(tmp_path / "p.trc")],
             "units": ["--units", "m\tx"]}.get(problem, [])
    if problem == "count":
        files = files[:2]
    elif problem == "camera":
        extra = ["--cameras", "cam1,cam2,cam3,cam9"]
    elif problem == "field":
        calibration.write_text(calibration.read_text().replace("rotation = ", "rotations = ", 2))
    elif problem == "line":
        path = Path(files[1])
        lines = path.read_text().splitlines()
        lines[2] = lines[2][:40]
        path.write_text("\n".join(lines) + "\n")
    elif problem == "missing":
        calibration = tmp_path / "none.toml"
    elif problem == "focal":
        text = calibration.read_text()
        first = text.index("matrix = [ [ ") + len("matrix = [ [ ")
        fx = text[first:text.index(",", first)]
        calibration.write_text(text.replace(fx, "0.0", 2))
    elif problem == "same place":
        text = calibration.read_text()
        tables = text.split("\n\n")
        tables[1] = "\n".join(line if not line.startswith(("rotation", "translation")) else
                              next(t for t in tables[0].splitlines() if t.startswith(line.split(" ")[0]))
                              for line in tables[1].splitlines())
        calibration.write_text("\n\n".join(tables))
    elif problem == "same file":
        files[1] = files[0]
    elif problem == "same camera":
        extra = ["--cameras", "cam1,cam1,cam2,cam3"]
    elif problem == "keypoints":
        Path(files[2]).write_text(json.dumps({"frame": 0, "keypoints": [1.0, 2.0, 0.9] * 5}) + "\n")
    status = main(["triangulate", *files, "--calibration", str(calibration), "--out", str(tmp_path / "p.trc"), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and expected in err[0], err


# ----------------------------------------------------------------------------------------------
# aniposelib on the same input


@pytest.mark.slow
def test_no_worse_than_aniposelib():
    """aniposelib's CameraGroup.triangulate (and its RANSAC) on the same keypoints, in its own
    environment (it needs opencv-contrib)."""
    import bench_triangulate
    from serve_helpers import tool_in_its_own_venv

    python = tool_in_its_own_venv("VITPOSE_ANIPOSELIB_PYTHON", "python", ["aniposelib"], venv_name="aniposelib")
    for cameras in (3, 4, 6):
        figures = bench_triangulate.compare(cameras=cameras, seed=0, frames=60, python=python)
        ours, theirs = figures["vitpose triangulate"], figures["aniposelib triangulate"]
        # over the points each gave, and over the points every method gave
        assert ours[0] <= theirs[0] and ours[2] <= theirs[2], (cameras, figures)
        refined, ransac = figures["vitpose triangulate --refine"], figures["aniposelib triangulate_ransac"]
        assert refined[0] <= ransac[0] and refined[2] <= ransac[2], (cameras, figures)
