"""The files 3D tools read (vitpose.inference.pose_formats, `vitpose predict --format`, `vitpose convert`).

Each writer against its tool's documented schema (tests/fixtures/formats3d/, written from the
tools' docs), the keypoints read back equal to the records, and `vitpose convert RUN.jsonl` equal to
`vitpose predict --format` on the same run. The tools' own readers read these files in
tests/test_pose_formats_readers.py (slow: each in its own virtual environment).
"""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO
from test_video import blob_detector, options, predictor, video, with_detector  # noqa: F401 - fixtures

from vitpose import cli
from vitpose.data.metainfo import dataset_info
from vitpose.inference.pose_formats import alphapose_records, dlc_csv, openpose_files, write_pose_format
from vitpose.inference.pose_table import pose_table, read_run
from vitpose.inference.video import run_video

FIXTURES = REPO / "tests" / "fixtures" / "formats3d"
COCO = dataset_info("coco")
K = 17


def record(frame, track, shift=0.0, p=None, missing=()):
    flat = []
    for k in range(K):
        flat += [None, None, None] if k in missing else [100.0 + frame + k + shift, 50.0 + 2 * k + track, 0.5 + k / 100]
    out = {"frame": frame, "category_id": 1, "bbox": [10.0 + track, 20.0, 30.0, 40.0], "keypoints": flat,
           "bbox_score": 0.9, "score": 0.8 + track / 100, "track_id": track}
    if p is not None:
        out["p"] = [p] * K
    return out


@pytest.fixture
def tracked_records():
    """Frames 0..4, tracks 0 and 2; track 0 gone in frame 3, frame 1's keypoint 3 not finite,
    track 2 with a calibrated `p`."""
    return [record(f, t, p=0.75 if t == 2 else None, missing=(3,) if f == 1 else ())
            for f in range(5) for t in (0, 2) if not (f == 3 and t == 0)]


def expected(records, frame, track):
    r = next((r for r in records if r["frame"] == frame and r["track_id"] == track), None)
    if r is None:
        return None
    xy = np.array([math.nan if v is None else v for v in r["keypoints"]]).reshape(K, 3)
    conf = np.array(r["p"], float) if "p" in r else xy[:, 2]
    return xy[:, :2], conf


# ---------------------------------------------------------------------------------------------
# Each writer against the documented schema


def test_openpose_files_follow_openposes_schema_and_keep_tracks_as_indices(tracked_records):
    documented = json.loads((FIXTURES / "openpose_keypoints.json").read_text())
    files = openpose_files(pose_table(tracked_records), "cam1")
    assert list(files) == [f"cam1_{f:012d}_keypoints.json" for f in range(5)]
    for frame, (name, content) in enumerate(files.items()):
        assert set(content) == set(documented) and content["version"] == documented["version"]
        assert [p["person_id"] for p in content["people"]] == [[0], [2]]  # every track, in id order
        for person, track in zip(content["people"], (0, 2)):
            assert set(person) == set(documented["people"][0])
            assert all(isinstance(v, list) for v in person.values())
            values = np.array(person["pose_keypoints_2d"]).reshape(K, 3)
            want = expected(tracked_records, frame, track)
            if want is None:  # a track absent from the frame: OpenPose's "not detected"
                assert not values.any()
                continue
            found = np.isfinite(want[0]).all(axis=1)
            np.testing.assert_allclose(values[found, :2], want[0][found])
            np.testing.assert_allclose(values[found, 2], want[1][found])
            assert not values[~found].any()  # a missing keypoint is 0, 0, 0


def test_openpose_without_tracks_lists_each_frames_people_with_id_minus_one():
    records = [{k: v for k, v in record(0, t).items() if k != "track_id"} for t in (0, 1)]
    people = openpose_files(pose_table(records), "clip")["clip_000000000000_keypoints.json"]["people"]
    assert [p["person_id"] for p in people] == [[-1], [-1]]
    images = [{**r, "file_name": "a/b.jpg", "image_id": 1} for r in records]
    for r in images:
        del r["frame"]
    assert list(openpose_files(pose_table(images), "x")) == ["b_keypoints.json"]
    images[1]["file_name"] = "a/b.png"  # two images of one stem: their whole names
    assert list(openpose_files(pose_table(images), "x")) == ["b_jpg_keypoints.json", "b_png_keypoints.json"]


def test_alphapose_records_follow_alphaposes_schema(tracked_records):
    documented = json.loads((FIXTURES / "alphapose_results.json").read_text())
    written = alphapose_records(pose_table(tracked_records))
    assert len(written) == len(tracked_records)
    for item in written:
        assert set(item) == set(documented[0])
        assert all(type(item[key]) is type(documented[0][key]) for key in item)
        frame = int(item["image_id"].split(".")[0])  # AlphaPose names a video's frames N.jpg
        xy, conf = expected(tracked_records, frame, item["idx"])
        values = np.array(item["keypoints"]).reshape(K, 3)
        found = np.isfinite(xy).all(axis=1)
        np.testing.assert_allclose(values[found, :2], xy[found])
        np.testing.assert_allclose(values[found, 2], conf[found])
        assert not values[~found].any()


def read_dlc_csv(text):
    rows = list(csv.reader(text.splitlines()))
    levels = [row[0] for row in rows if row[0] in ("scorer", "individuals", "bodyparts", "coords")]
    header, body = rows[: len(levels)], rows[len(levels):]
    columns = list(zip(*(row[1:] for row in header)))
    values = np.array([[math.nan if v == "" else float(v) for v in row[1:]] for row in body])
    return levels, columns, [row[0] for row in body], values


@pytest.mark.parametrize("multi", [False, True])
def test_dlc_csv_has_deeplabcuts_header_rows_and_nan_cells(tracked_records, multi):
    documented = read_dlc_csv((FIXTURES / ("dlc_multi.csv" if multi else "dlc_single.csv")).read_text())
    records = tracked_records if multi else [r for r in tracked_records if r["track_id"] == 2]
    levels, columns, index, values = read_dlc_csv(dlc_csv(pose_table(records), COCO.keypoint_names))
    assert levels == documented[0]
    assert {c[-1] for c in columns} == {c[-1] for c in documented[1]} == {"x", "y", "likelihood"}
    assert index == [str(f) for f in range(5)]
    for column, name in enumerate(columns):
        individual, part, coord = (name[1], name[2], name[3]) if multi else ("track2", name[1], name[2])
        k = COCO.keypoint_names.index(part)
        for frame in range(5):
            want = expected(records, frame, int(individual[len("track"):]))
            got = values[frame, column]
            if want is None:
                assert math.isnan(got)
                continue
            value = want[1][k] if coord == "likelihood" else want[0][k, "xy".index(coord)]
            assert got == pytest.approx(value, nan_ok=True)


def test_dlc_csv_is_what_pandas_reads_as_the_h5s_table(tracked_records):
    pd = pytest.importorskip("pandas")
    from vitpose.inference.pose_formats import dlc_frame

    table = pose_table(tracked_records)
    from io import StringIO

    read = pd.read_csv(StringIO(dlc_csv(table, COCO.keypoint_names)), header=[0, 1, 2, 3], index_col=0)
    frame = dlc_frame(table, COCO.keypoint_names)
    assert list(read.columns) == list(frame.columns) and list(read.columns.names) == list(frame.columns.names)
    np.testing.assert_array_equal(read.to_numpy(), frame.to_numpy())


def test_dlc_h5_reads_back_as_its_csv(tracked_records, tmp_path):
    """The .h5 (extra `dlc`, in the dev extra) holds the table the .csv holds: pandas reads both alike."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("tables")
    h5 = write_pose_format(tracked_records, "dlc", tmp_path / "run.h5", COCO)
    csv_file = write_pose_format(tracked_records, "dlc", tmp_path / "run.csv", COCO)
    from_h5 = pd.read_hdf(h5)
    from_csv = pd.read_csv(csv_file, header=[0, 1, 2, 3], index_col=0)
    assert list(from_h5.columns) == list(from_csv.columns)
    np.testing.assert_array_equal(from_h5.to_numpy(), from_csv.to_numpy())
    assert np.isnan(from_h5.to_numpy()).any() and np.isfinite(from_h5.to_numpy()).any()


def test_nwb_reads_back_with_pynwb_and_ndx_pose(tracked_records, tmp_path):
    """NWB (extra `nwb`, in the dev extra) read by pynwb + ndx-pose in this process: one
    PoseEstimation per track, a series per keypoint with the records' points, confidence (p where
    given) and frame / fps timestamps, NaN where a track or a point is missing."""
    pynwb = pytest.importorskip("pynwb")
    ndx_pose = pytest.importorskip("ndx_pose")
    path = write_pose_format(tracked_records, "nwb", tmp_path / "run.nwb", COCO, fps=25.0)
    with pynwb.NWBHDF5IO(str(path), "r") as io:
        behavior = io.read().processing["behavior"]
        found = {name: pe for name, pe in behavior.data_interfaces.items() if isinstance(pe, ndx_pose.PoseEstimation)}
        assert set(found) == {"PoseEstimation_track0", "PoseEstimation_track2"}
        for track in (0, 2):
            pe = found[f"PoseEstimation_track{track}"]
            assert list(pe.skeleton.nodes[:]) == list(COCO.keypoint_names)
            for k, name in enumerate(COCO.keypoint_names):
                series = pe.pose_estimation_series[name]
                np.testing.assert_allclose(series.timestamps[:], np.arange(5) / 25.0)
                for frame in range(5):
                    want = expected(tracked_records, frame, track)
                    if want is None:
                        assert np.isnan(series.data[frame]).all() and np.isnan(series.confidence[frame])
                        continue
                    np.testing.assert_array_equal(series.data[frame], want[0][k])
                    np.testing.assert_array_equal(series.confidence[frame], want[1][k])


def test_run_file_errors_name_the_line(tmp_path):
    bad = tmp_path / "run.jsonl"
    bad.write_text(json.dumps(record(0, 0)) + "\n{not json\n")
    with pytest.raises(Exception, match=r"line 2 is not JSON"):
        read_run(bad)
    bad.write_text(json.dumps({"frame": 0}) + "\n")
    with pytest.raises(Exception, match=r"line 1: not a record"):
        read_run(bad)


BAD_RECORDS = [  # (what is changed in the second record, what the one line names)
    (lambda r: r.update(frame="abc"), "'frame' must be a video's frame index"),
    (lambda r: r.update(frame=None), "'frame' must be a video's frame index"),
    (lambda r: r.update(frame=-3), "'frame' must be a video's frame index"),
    (lambda r: r.update(frame=1.5), "'frame' must be a video's frame index"),
    (lambda r: r.update(frame=10 ** 10), "'frame' must be a video's frame index"),  # would size the table
    (lambda r: r["keypoints"].__setitem__(0, "x"), "'keypoints' must be a list of numbers"),
    (lambda r: r["keypoints"].__setitem__(0, [1]), "'keypoints' must be a list of numbers"),
    (lambda r: r.update(p=["a"] * K), "'p' must be a list of numbers"),
    (lambda r: r.update(p=[1.5] * K), "'p' holds 1.5: a probability is in [0, 1]"),
    (lambda r: r.update(track_id="a"), "'track_id' must be an integer"),
    (lambda r: r.update(bbox=[1, 2]), "'bbox' has 2 values; it must have 4"),
    (lambda r: r.update(score="high"), "'score' must be a number"),
    (lambda r: r.update(keypoints=r["keypoints"][:-3]), "16 keypoints where the first has 17"),
]


@pytest.mark.parametrize("change, expected", [
    (lambda r: r.update(file_name=["a"]), "'file_name' must be the image's file name"),
    (lambda r: r.update(image_id={"a": 1}), "'image_id' must be an integer or a string"),
])
def test_an_image_record_with_a_bad_name_is_one_line(tmp_path, capsys, change, expected):
    """An image's file_name or image_id that is a list or an object ended in 'unhashable type' (exit 70)."""
    first, bad = record(0, 0), record(0, 1)
    for r in (first, bad):
        del r["frame"]
        r["file_name"] = "a.jpg"
    del bad["file_name"]
    change(bad)
    run = tmp_path / "run.jsonl"
    run.write_text(json.dumps(first) + "\n" + json.dumps(bad) + "\n")
    code = cli.main(["convert", str(run), "--format", "alphapose", "--out", str(tmp_path / "out.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "run.jsonl: line 2" in err[0] and expected in err[0], err


@pytest.mark.parametrize("change, expected", BAD_RECORDS)
def test_a_bad_record_is_one_line_naming_its_line_in_convert_and_triangulate(tmp_path, capsys, change, expected):
    """convert and triangulate read records through the one check: a hand-edited field is one line
    (file, line, field) and exit 2, never a traceback from deep in a writer, nor an output sized by it."""
    from vitpose.errors import UserError
    from vitpose.multiview.views import read_views

    bad = record(1, 0)
    change(bad)
    run = tmp_path / "run.jsonl"
    run.write_text(json.dumps(record(0, 0)) + "\n" + json.dumps(bad) + "\n")
    code = cli.main(["convert", str(run), "--format", "alphapose", "--out", str(tmp_path / "out.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "run.jsonl: line 2" in err[0] and expected in err[0], err
    assert not (tmp_path / "out.json").exists()
    with pytest.raises(UserError, match=r"run.jsonl:2: .*" + expected.replace("[", r"\[").replace("]", r"\]")):
        read_views(run)


@pytest.mark.parametrize("stem", ["../../escaped", "a/b", "x/"])
def test_a_stem_with_a_folder_is_refused_and_nothing_is_written_outside_out(tmp_path, capsys, stem):
    """OpenPose's file names start with --stem: '../x' wrote every frame's file two folders above --out."""
    run = tmp_path / "deep" / "run.jsonl"
    run.parent.mkdir()
    run.write_text(json.dumps(record(0, 0)) + "\n")
    out = tmp_path / "deep" / "sub" / "op"
    code = cli.main(["convert", str(run), "--format", "openpose", "--out", str(out), "--stem", stem])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--stem" in err[0], err
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["deep", "deep/run.jsonl"]


def test_convert_refuses_an_infinite_frame_rate(tmp_path, capsys):
    """--fps inf passed '> 0' and would have given every NWB timestamp 0."""
    run = tmp_path / "run.jsonl"
    run.write_text(json.dumps(record(0, 0)) + "\n")
    code = cli.main(["convert", str(run), "--format", "nwb", "--fps", "inf", "--out", str(tmp_path / "x.nwb")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--fps" in err[0], err


# ---------------------------------------------------------------------------------------------
# vitpose convert: the command line


def write_run(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_convert_refuses_bad_input_in_one_line_each(tmp_path, tracked_records, capsys):
    run = write_run(tmp_path / "run.jsonl", tracked_records)
    (tmp_path / "bad.jsonl").write_text(json.dumps(tracked_records[0]) + "\nnope\n")
    cases = [
        (["convert", str(tmp_path / "bad.jsonl"), "--format", "alphapose", "--out", str(tmp_path / "a.json")],
         "line 2 is not JSON"),
        (["convert", str(run), "--format", "alphapose", "--out", str(run)], "would replace the input"),
        (["convert", str(run), "--format", "dlc", "--out", str(tmp_path / "a.txt")], ".csv or .h5"),
        (["convert", str(run), "--format", "nwb", "--out", str(tmp_path / "a.nwb")], "--fps"),
        (["convert", str(run), "--format", "alphapose", "--skeleton", "nosuch", "--out", str(tmp_path / "a.json")],
         "--skeleton"),
        (["convert", str(run), "--format", "alphapose", "--skeleton", "mpii", "--out", str(tmp_path / "a.json")],
         "17 keypoints"),
        (["convert", str(tmp_path / "none.jsonl"), "--format", "alphapose", "--out", str(tmp_path / "a.json")],
         "no such file"),
        (["convert", str(run), "--format", "openpose", "--out", str(tmp_path)], "holds other files (bad.jsonl)"),
    ]
    for argv, message in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (argv, err)
    assert not (tmp_path / "a.json").exists()


def test_predict_refuses_formats_it_cannot_write(tmp_path, capsys):
    image = tmp_path / "imgs" / "img.jpg"  # the outputs beside the image folder: never inside it
    image.parent.mkdir()
    image.write_bytes((REPO / "tests" / "fixtures" / "README.md").read_bytes())
    cases = [(["--format", "nwb", "--json", str(tmp_path / "x.nwb")], "time series of a video"),
             (["--format", "openpose"], "give --json"),
             (["--format", "dlc", "--json", str(tmp_path / "x.csv"), "--shard", "0/2"], "vitpose convert"),
             (["--format", "openpose", "--json", str(tmp_path)], "holds other files"),
             (["--format", "openpose", "--json", str(tmp_path / "p"), "--out", str(tmp_path / "p" / "d")],
              "write them apart")]
    for extra, message in cases:
        assert cli.main(["predict", str(tmp_path / "imgs"), "--detector", "full-frame", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (extra, err)


# ---------------------------------------------------------------------------------------------
# convert == predict --format on the same run


def tree(path: Path) -> dict:
    if path.is_dir():
        return {p.name: json.loads(p.read_text()) for p in sorted(path.iterdir())}
    return {path.name: path.read_text()}


@pytest.fixture(scope="module")
def video_run(predictor, video, tmp_path_factory):  # noqa: F811 - the fixtures of test_video
    tmp = tmp_path_factory.mktemp("formats")
    two = with_detector(predictor, blob_detector)
    run_video(two, str(video), options(tmp, json=str(tmp / "run.jsonl"), track=True))
    return two, tmp


@pytest.mark.parametrize("fmt, out", [("openpose", "pose"), ("dlc", "walk.csv"), ("alphapose", "walk.json")])
def test_convert_writes_what_predict_format_writes(video_run, video, fmt, out):  # noqa: F811
    two, tmp = video_run
    direct = tmp / "direct" / out
    run_video(two, str(video), options(tmp, json=str(direct), track=True, format=fmt))
    converted = tmp / "converted" / out
    argv = ["convert", str(tmp / "run.jsonl"), "--format", fmt, "--out", str(converted)]
    assert cli.main(argv + (["--stem", "walk"] if fmt == "openpose" else [])) == 0
    assert tree(converted) == tree(direct)
    if fmt == "openpose":
        assert cli.main(argv + ["--stem", "walk"]) == 0  # an earlier OpenPose folder is replaced
        assert tree(converted) == tree(direct)
        assert sorted(p.name for p in direct.iterdir())[0] == "walk_000000000000_keypoints.json"
        records = read_run(tmp / "run.jsonl")
        assert len({r["track_id"] for r in records}) == 2
        assert all(len(content["people"]) == 2 for content in tree(direct).values())


def test_write_pose_format_checks_the_skeleton(tmp_path, tracked_records):
    with pytest.raises(Exception, match=r"17 keypoints but the skeleton 'mpii' names 16"):
        write_pose_format(tracked_records, "alphapose", tmp_path / "a.json", dataset_info("mpii"))


def test_cli_predict_format_equals_convert_of_its_json(predictor, video, tmp_path):  # noqa: F811
    from vitpose.inference.results import FullFrame
    from vitpose.models.checkpoint import save_weights

    checkpoint = tmp_path / "demo.safetensors"
    save_weights(predictor.model, checkpoint)
    direct = tmp_path / "walk.csv"
    assert cli.main(["predict", str(video), "--config", str(REPO / "configs" / "demo.yaml"), "--model", str(checkpoint),
                     "--detector", "full-frame", "--track", "--format", "dlc", "--json", str(direct),
                     "--device", "cpu", "--precision", "fp32"]) == 0
    run_video(with_detector(predictor, FullFrame()), str(video), options(tmp_path, json=str(tmp_path / "run.jsonl"),
                                                                          track=True))
    assert cli.main(["convert", str(tmp_path / "run.jsonl"), "--format", "dlc", "--out", str(tmp_path / "c.csv")]) == 0
    assert (tmp_path / "c.csv").read_text() == direct.read_text()
    assert direct.read_text().splitlines()[1].startswith("bodyparts,nose,nose,nose,left_eye")  # one person


@pytest.mark.parametrize("fmt", ["openpose", "dlc", "alphapose"])
def test_predict_on_images_writes_what_convert_writes(predictor, tmp_path, fmt):  # noqa: F811
    import cv2
    from test_video import synthetic_frame

    from vitpose.inference.images import predict_images
    from vitpose.inference.runner import PredictOptions

    folder = tmp_path / "images"
    folder.mkdir()
    paths = [folder / f"walk{i}.png" for i in range(3)]
    for i, path in enumerate(paths):
        cv2.imwrite(str(path), synthetic_frame(2 * i))
    two = with_detector(predictor, blob_detector)
    out = {"openpose": "pose", "dlc": "images.csv", "alphapose": "images.json"}[fmt]
    for name, fmt_of_run in (("run.jsonl", "coco"), (out, fmt)):
        run = PredictOptions(json=tmp_path / "direct" / name, format=fmt_of_run, progress=False, quiet=True)
        assert predict_images(two, paths, run) == 0
    converted = tmp_path / "converted" / out
    assert cli.main(["convert", str(tmp_path / "direct" / "run.jsonl"), "--format", fmt, "--out", str(converted)]) == 0
    assert tree(converted) == tree(tmp_path / "direct" / out)
    if fmt == "openpose":
        assert sorted(tree(converted)) == [f"walk{i}_keypoints.json" for i in range(3)]


def stopped_on_the_second_batch():
    """A detector that finds the blobs, then stops the run (Ctrl-C) on its second call."""
    calls = []

    def detect(images, channels="rgb"):
        calls.append(len(images))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return blob_detector(images)

    return detect


def test_a_stopped_run_writes_the_frames_done_and_keeps_an_earlier_output(predictor, video, tmp_path):  # noqa: F811
    path = tmp_path / "walk.json"
    args = options(tmp_path, json=str(path), format="alphapose", pipeline="sequential", batch_frames=4, track=True)
    summary = run_video(with_detector(predictor, stopped_on_the_second_batch()), str(video), args)
    assert summary.interrupted and summary.frames_done == 4
    assert {item["image_id"] for item in json.loads(path.read_text())} == {f"{f}.jpg" for f in range(4)}
    assert "walk.json is written whole: run again to finish it" in summary.format()
    earlier = path.read_text()
    run_video(with_detector(predictor, stopped_on_the_second_batch()), str(video), args)
    assert path.read_text() == earlier  # a stopped run never replaces an earlier output


def test_a_stopped_offline_smoothing_run_does_not_send_the_user_to_resume(predictor, video, tmp_path):  # noqa: F811
    """Ctrl-C during --smooth offline said "run again with --resume", which that run refuses."""
    path = tmp_path / "walk.jsonl"
    args = options(tmp_path, json=str(path), smooth="offline", pipeline="sequential", batch_frames=4, track=True)
    summary = run_video(with_detector(predictor, stopped_on_the_second_batch()), str(video), args)
    assert summary.interrupted and summary.frames_done == 4 and len(path.read_text().splitlines()) >= 1
    assert "written whole: run again to finish it" in summary.format() and "--resume" not in summary.format()


@pytest.mark.parametrize("flags", [["--config", "demo_k5"], ["--skeleton", str(REPO / "configs" / "demo_k5_skeleton.yaml")]])
def test_convert_names_the_keypoints_of_the_skeleton_given(tmp_path, flags, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # demo_k5's skeleton path is relative to the repository
    names = dataset_info(REPO / "configs" / "demo_k5_skeleton.yaml").keypoint_names
    run = write_run(tmp_path / "k5.jsonl", [{"frame": 0, "keypoints": [1.0, 2.0, 0.5] * 5, "score": 0.5}])
    assert cli.main(["convert", str(run), "--format", "dlc", "--out", str(tmp_path / "k5.csv"), *flags]) == 0
    assert (tmp_path / "k5.csv").read_text().splitlines()[1].split(",")[1::3] == list(names)
    assert cli.main(["convert", str(run), "--format", "dlc", "--out", str(tmp_path / "x.csv")]) == 2
    assert "5 keypoints; name their skeleton with --skeleton" in capsys.readouterr().err


def test_a_missing_extra_is_one_line_naming_it(tmp_path, tracked_records, capsys):
    import importlib.util

    run = write_run(tmp_path / "run.jsonl", tracked_records)
    for fmt, out, modules, extra in (("dlc", "a.h5", ("pandas", "tables"), "dlc"),
                                     ("nwb", "a.nwb", ("pynwb", "ndx_pose"), "nwb")):
        if all(importlib.util.find_spec(m) for m in modules):
            continue  # installed here: the slow tier reads what it writes
        argv = ["convert", str(run), "--format", fmt, "--out", str(tmp_path / out)] + (["--fps", "25"] if fmt == "nwb"
                                                                                    else [])
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f'pip install "vitpose[{extra}]"' in err[0]
        assert not (tmp_path / out).exists()
        video_argv = ["predict", "0", "--format", fmt, "--json", str(tmp_path / out)]  # before the camera opens
        assert cli.main(video_argv) == 2 and f'pip install "vitpose[{extra}]"' in capsys.readouterr().err
