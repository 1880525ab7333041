"""Output files (#28 item 8's output cases of bad-input-round4.md, item 7's file-writer bugs).

- No write goes through a symbolic link planted at a temporary, partial or lock name: the names the
  writers used to take (`X.tmp`, `X.partial`, `.lock`) and the first names mkstemp would try (made
  guessable here) are left alone, their targets untouched (N1, N2).
- An output that is a device or pipe is written directly and stays what it was (`--json
  /dev/stdout`, a FIFO, /dev/null); where a file must be renamed into place it is refused (N3).
- `--resume` continues the interrupted run's `.partial`, not the older file beside it (N5); with
  `--track` the people keep their ids across the stop (N9).
- A full disk is one line and keeps what can be kept: the drawn video (N6), `--json` (N17),
  import-annotations' --out (N16), the atomic writers that export and evaluate use (N17).
  Full disks are made with the process's file size limit (RLIMIT_FSIZE: writes past it fail with
  EFBIG, also OpenCV's, which Python cannot patch), which needs no privilege; the video case runs
  in a subprocess because OpenCV ignores the error and keeps writing.
- The atomic writers fsync the data before the rename and the folder after it, and rename (a
  reader of the old file keeps the old bytes): monkeypatched os.fsync / os.replace record the
  order (item 7). JSON Lines reach the file after each item, before the file is closed (item 7).
- Round-3 rows still failing: 11 (.pgm drawing), 35 / 105 (an output folder where no file can be
  created, before the work, naming the flag), 43 (`--json` named like a drawing in `--out`).
"""

import contextlib
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_evaluate import write_tiny_model
from test_predict_pipeline import SignalOnCall, cli, strict_records, with_detector, write_images

from vitpose import files
from vitpose.cli import main
from vitpose.inference.results import FullFrame, Poses, StageTimer
from vitpose.inference.runner import PredictOptions
from vitpose.inference.writers import ResultsFile

REPO = Path(__file__).resolve().parents[1]
ANNOTATIONS = REPO / "tests" / "data" / "annotations"
PRECIOUS = "PRECIOUS, not to be overwritten"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, coco_mini_dir):
    """A tiny model's config and weights (test_evaluate's recipe)."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), coco_mini_dir, seed=5)


def write_clip(path, frames=5, size=(64, 48)):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, size)
    for f in range(frames):
        writer.write(np.full((size[1], size[0], 3), (40 + 10 * f) % 256, np.uint8))
    writer.release()
    return path


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """Writes past `nbytes` in any file fail with EFBIG (as on a disk that filled up), SIGXFSZ ignored."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def victim_file(tmp_path) -> Path:
    victim = tmp_path / "precious.txt"
    victim.write_text(PRECIOUS)
    return victim


def import_annotations(out, *extra):
    return main(["import-annotations", str(ANNOTATIONS / "cvat_images_export.xml"), "--format", "cvat",
                 "--out", str(out), *map(str, extra)])


# ------------------------------------------------------------------ N1, N2: planted links


def test_import_annotations_never_writes_through_a_link_at_out_tmp(tmp_path, capsys):
    """N1: `<out>.tmp -> victim` planted in a shared folder: the victim keeps its bytes, --out is a
    file (not the link moved into place)."""
    victim = victim_file(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "coco.json.tmp").symlink_to(victim)
    assert import_annotations(shared / "coco.json") == 0, capsys.readouterr().err
    assert victim.read_text() == PRECIOUS
    out = shared / "coco.json"
    assert import_annotations(tmp_path / "clean.json") == 0
    assert not out.is_symlink() and out.read_text() == (tmp_path / "clean.json").read_text()
    assert json.loads(out.read_text())["annotations"]
    assert os.readlink(shared / "coco.json.tmp") == str(victim)  # left alone


def test_predict_json_never_writes_through_a_link_at_json_partial(tmp_path, tiny, capsys):
    """N2: an existing --json and `<json>.partial -> victim`: the victim keeps its bytes, --json
    holds this run's records as a file of its own."""
    write_images(tmp_path / "imgs", ["a.png", "b.png"])
    victim = victim_file(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    out = shared / "p.jsonl"
    out.write_text("an older run\n")
    (shared / "p.jsonl.partial").symlink_to(victim)
    code, _, err = cli(tmp_path, tiny, tmp_path / "imgs", "--detector", "full-frame", "--json", out, capsys=capsys)
    assert code == 0, err
    assert victim.read_text() == PRECIOUS
    assert not out.is_symlink() and [r["file_name"] for r in strict_records(out)] == ["a.png", "b.png"]
    assert os.readlink(shared / "p.jsonl.partial") == str(victim)


def test_links_at_every_guessable_temp_name_never_redirect_a_write(tmp_path, monkeypatch):
    """Every writer that makes a temporary, partial or lock file, with a link to the victim planted
    at the first name it would try: mkstemp's names are made guessable here (they are random), so a
    writer that opened a computed name instead of creating it exclusively would write through."""
    victim = victim_file(tmp_path)
    folder = tmp_path / "shared"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: iter(["aaaaaaaa", "bbbbbbbb", "cccccccc"]))
    planted = []

    def plant(name):
        link = folder / name
        link.symlink_to(victim)
        planted.append(link)

    plant(".w.json.aaaaaaaa.tmp")
    files.write_atomic(folder / "w.json", "write_atomic")
    plant(".f.bin.aaaaaaaa.tmp")
    with files.atomic_file(folder / "f.bin") as f:
        f.write(b"atomic_file")
    plant(".p.bin.aaaaaaaa.tmp")
    with files.atomic_path(folder / "p.bin") as tmp:
        Path(tmp).write_bytes(b"atomic_path")
    plant(".m.onnx.aaaaaaaa.tmp")
    with files.staged_files(folder / "m.onnx") as staged:
        staged.write_bytes(b"staged_files")
    plant(".vitpose-probe.aaaaaaaa.tmp")
    files.check_output(folder / "checked.json", "--json")
    plant(".r.jsonl.aaaaaaaa.partial")
    (folder / "r.jsonl").write_text("older\n")
    results = ResultsFile(folder / "r.jsonl", "frame")
    results.write([{"frame": 0}])
    results.close(completed=True)
    plant(".vitpose-video.aaaaaaaa.tmp")
    from vitpose.inference.video import VideoFile

    video = VideoFile(folder / "v.avi", 10.0, (32, 24))
    video.write(np.zeros((24, 32, 3), np.uint8))
    video.release()
    plant(".lock")  # the work dir's lock: truncated and written by the run that holds it
    from vitpose.engine.workdir import WorkDirError, claim_work_dir

    with pytest.raises(WorkDirError, match="symbolic link"), claim_work_dir(folder, resume=None):
        pass

    assert victim.read_text() == PRECIOUS
    assert all(link.is_symlink() and os.readlink(link) == str(victim) for link in planted)
    assert (folder / "w.json").read_text() == "write_atomic" and (folder / "f.bin").read_bytes() == b"atomic_file"
    assert (folder / "p.bin").read_bytes() == b"atomic_path" and (folder / "m.onnx").read_bytes() == b"staged_files"
    assert strict_records(folder / "r.jsonl") == [{"frame": 0}] and cv2.VideoCapture(str(folder / "v.avi")).read()[0]


def test_the_crop_cache_is_built_in_a_new_folder_whatever_is_planted_beside_it(tmp_path, coco_mini_dir, monkeypatch):
    """The crop cache was staged in `CACHE.tmp-PID` (a guessable name): links planted there and at
    the first name mkdtemp tries leave their target folder empty; the cache is built, with the
    folder mode mkdir gives (not mkdtemp's 0700)."""
    from vitpose.data import crop_cache
    from vitpose.data.coco import CocoKeypoints

    victim = tmp_path / "victim"
    victim.mkdir()
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: iter(["aaaaaaaa", "bbbbbbbb"]))
    for name in (f"cache.tmp-{os.getpid()}", ".cache.aaaaaaaa.tmp"):
        (tmp_path / name).symlink_to(victim)
    ds = CocoKeypoints(coco_mini_dir / "test_coco.json", coco_mini_dir, train=True, encode_targets=False)
    info = crop_cache.build_crop_cache(ds.index, ds.img_dir, tmp_path / "cache", ds.input_size, num_workers=1)
    assert info["regions"] > 0 and (tmp_path / "cache").is_dir() and not list(victim.iterdir())
    (tmp_path / "plain").mkdir()
    assert stat.S_IMODE(os.stat(tmp_path / "cache").st_mode) == stat.S_IMODE(os.stat(tmp_path / "plain").st_mode)


# ------------------------------------------------------------------ N3: devices and pipes


def test_json_to_stdout_a_fifo_or_dev_null_is_streamed_and_each_stays_what_it_was(tmp_path, tiny, capfd):
    """N3: --json through a link to /proc/self/fd/1 (what /dev/stdout is), a FIFO and a link to
    /dev/null: the results go through them, the summary goes to stderr, and the links and the FIFO
    are still a link and a FIFO afterwards (the old code renamed a regular file over each)."""
    write_images(tmp_path / "imgs", ["a.png", "b.png"])
    o = tmp_path / "o"
    o.mkdir()
    (o / "stdout_link").symlink_to("/proc/self/fd/1")
    code, _, _ = cli(tmp_path, tiny, tmp_path / "imgs", "--detector", "full-frame", "--json", o / "stdout_link")
    out, err = capfd.readouterr()
    assert code == 0, err
    assert [json.loads(line)["file_name"] for line in out.splitlines()] == ["a.png", "b.png"]  # nothing else
    assert "2 images, 2 people" in err and os.readlink(o / "stdout_link") == "/proc/self/fd/1"

    fifo = o / "fifo.json"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    try:
        code, _, _ = cli(tmp_path, tiny, tmp_path / "imgs", "--detector", "full-frame", "--json", fifo)
    finally:
        if reader.is_alive() and not received:  # the run never opened it: let the reader go
            with contextlib.suppress(OSError), open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "w"):
                pass
        reader.join(timeout=60)
    assert code == 0 and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [json.loads(line)["file_name"] for line in received[0].splitlines()] == ["a.png", "b.png"]

    (o / "null.json").symlink_to(os.devnull)
    code, _, _ = cli(tmp_path, tiny, tmp_path / "imgs", "--detector", "full-frame", "--json", o / "null.json")
    assert code == 0 and os.readlink(o / "null.json") == os.devnull
    capfd.readouterr()
    code = import_annotations(o / "stdout_link")  # import-annotations --out /dev/stdout too
    out, err = capfd.readouterr()
    assert code == 0 and json.loads(out)["annotations"] and "written:" in err
    assert os.readlink(o / "stdout_link") == "/proc/self/fd/1"


def test_outputs_that_must_be_renamed_refuse_a_device_or_pipe(tmp_path, tiny, capsys):
    """N3: a drawn video (and an export) are written beside and renamed into place: a link to
    /dev/null or a FIFO there is refused before the work, one line naming the flag, and left as it
    was; evaluate's --out may stream but not into its own report on stdout."""
    video = write_clip(tmp_path / "clip.avi")
    (tmp_path / "null.mp4").symlink_to(os.devnull)
    code, _, err = cli(tmp_path, tiny, video, "--detector", "full-frame", "--out", tmp_path / "null.mp4",
                       capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "--out " in err and "device or pipe" in err, err
    assert os.readlink(tmp_path / "null.mp4") == os.devnull
    os.mkfifo(tmp_path / "m.onnx")
    with pytest.raises(files.OutputPathError, match="--out .*m.onnx is a device or pipe"):
        files.check_output(tmp_path / "m.onnx", "--out")
    (tmp_path / "stdout_link").symlink_to("/proc/self/fd/1")
    with pytest.raises(files.OutputPathError, match="standard output, which carries its report"):
        files.check_output(tmp_path / "stdout_link", "--out", streams=True, stdout=False)
    assert files.check_output(tmp_path / "m.onnx", "--out", streams=True, stdout=False) == tmp_path / "m.onnx"
    write_images(tmp_path / "imgs", ["x.png"])
    code, _, err = cli(tmp_path, tiny, tmp_path / "imgs", "--json", os.devnull, "--resume", capsys=capsys)
    assert code == 2 and "is a device or pipe; --resume continues a file" in err, err


# ------------------------------------------------------------------ N5, N9: resume


def test_resume_continues_the_interrupted_runs_partial_not_the_older_file(tmp_path, tiny, capsys, monkeypatch):
    """N5: run A completes into p.jsonl; run B (other pictures, the same names) is stopped, its
    records so far beside p.jsonl; B --resume gives exactly the records of B uninterrupted (none of
    A's kept), and leaves no partial file behind."""
    write_images(tmp_path / "A", ["1.png", "2.png"], seed=1)
    write_images(tmp_path / "B", ["1.png", "2.png", "3.png", "4.png"], seed=2)
    out, reference = tmp_path / "p.jsonl", tmp_path / "reference.jsonl"
    with_detector(tiny, FullFrame(), monkeypatch)
    common = ("--batch-images", 1)
    assert cli(tmp_path, tiny, tmp_path / "B", "--json", reference, *common, capsys=capsys)[0] == 0
    assert cli(tmp_path, tiny, tmp_path / "A", "--json", out, *common, capsys=capsys)[0] == 0
    with_detector(tiny, SignalOnCall(signal.SIGINT, 3), monkeypatch)
    assert cli(tmp_path, tiny, tmp_path / "B", "--json", out, *common, capsys=capsys)[0] == 130
    with_detector(tiny, FullFrame(), monkeypatch)
    code, _, err = cli(tmp_path, tiny, tmp_path / "B", "--json", out, "--resume", *common, capsys=capsys)
    assert code == 0, err
    assert strict_records(out) == strict_records(reference)
    assert not list(tmp_path.glob(".p.jsonl.*"))


class GivenBoxes:
    """A predictor stand-in: each given box is a person whose keypoints sit at its centre; sets
    `stop` after `stop_after` calls (a signal during the run)."""

    detector = None

    def __init__(self, stop=None, stop_after=None):
        self.timer, self.stop, self.stop_after, self.calls = StageTimer(), stop, stop_after, 0

    def __call__(self, images, boxes=None, channels="bgr"):
        self.calls += 1
        if self.stop is not None and self.calls == self.stop_after:
            self.stop.set()
        out = []
        for b in boxes:
            b = np.asarray(b, np.float32).reshape(-1, 5)
            centre = (b[:, :2] + b[:, 2:4]) / 2
            out.append(Poses(b[:, :4], b[:, 4], np.repeat(centre[:, None].astype(np.float64), 17, 1),
                             np.ones((len(b), 17), np.float32)))
        return out


def test_track_ids_continue_across_a_resume(tmp_path):
    """N9: person A in frames 0-9, person B (elsewhere) in 10-29: ids 0 and 1. Stopped at frame 15
    and resumed, B keeps id 1 (the old code started the tracker at 0 again: B became 0)."""
    from vitpose.inference.video import run_video

    source = write_clip(tmp_path / "clip.avi", frames=30, size=(96, 64))
    boxes = tmp_path / "boxes.json"
    boxes.write_text(json.dumps([{"frame": f, "bbox": [2, 2, 30, 50] if f < 10 else [60, 2, 30, 50], "score": 0.9}
                                 for f in range(30)]))

    def run(out, resume=False, stop=None, stop_after=None):
        args = PredictOptions(json=out, boxes=boxes, track=True, resume=resume, pipeline="sequential",
                               batch_frames=1, progress=False, quiet=True)
        return run_video(GivenBoxes(stop, stop_after), source, args, stop=stop)

    assert run(tmp_path / "whole.jsonl").exit_status == 0
    whole = strict_records(tmp_path / "whole.jsonl")
    assert {r["track_id"] for r in whole if r["frame"] < 10} == {0} and {r["track_id"] for r in whole
                                                                         if r["frame"] >= 10} == {1}
    stop = threading.Event()
    assert run(tmp_path / "t.jsonl", stop=stop, stop_after=16).exit_status == 130
    assert 10 < len(strict_records(tmp_path / "t.jsonl")) < 30
    assert run(tmp_path / "t.jsonl", resume=True).exit_status == 0
    assert strict_records(tmp_path / "t.jsonl") == whole


# ------------------------------------------------------------------ N6, N16, N17: a full disk


VIDEO_ON_A_FULL_DISK = r"""
import resource, signal, sys
import numpy as np
from vitpose.inference.video import VideoFile, VideoWriteError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
video = VideoFile(sys.argv[1], 10.0, (160, 120))
rng = np.random.default_rng(0)
for _ in range(40):  # noise: about 1 MB, far past the limit
    video.write(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8))
try:
    video.release()
except VideoWriteError as e:
    print("REFUSED:", e)
    sys.exit(3)
print("WROTE")
"""


@pytest.mark.parametrize("name", ["v.mp4", "v.avi"])
def test_a_video_the_disk_could_not_hold_is_an_error_and_no_file(tmp_path, name):
    """N6: OpenCV's writer only warns when the disk is full and leaves a file that does not open
    (.mp4) or holds a few frames (.avi); the video is checked at release: an error naming it, and no
    broken file left behind (a file size limit in a subprocess: OpenCV's own writes fail)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", VIDEO_ON_A_FULL_DISK, str(tmp_path / name)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr[-2000:]
    assert f"could not write the video {tmp_path / name}" in proc.stdout and "40 frames" in proc.stdout
    assert not (tmp_path / name).exists() and not list(tmp_path.glob(".vitpose-video.*"))


def test_run_video_says_the_video_was_not_written_and_exits_1(tmp_path, monkeypatch):
    """N6: the summary says the video could not be written instead of "wrote ...", the status is 1,
    and the JSON (another file) is finished all the same."""
    from vitpose.inference import video as video_module

    source = write_clip(tmp_path / "clip.avi")
    boxes = tmp_path / "boxes.json"
    boxes.write_text(json.dumps([{"frame": f, "bbox": [2, 2, 30, 40]} for f in range(5)]))
    monkeypatch.setattr(video_module.VideoFile, "_unreadable", lambda self: "the file does not open as a video")
    args = PredictOptions(json=tmp_path / "r.jsonl", boxes=boxes, out=tmp_path / "drawn.mp4", pipeline="sequential",
                           progress=False, quiet=True)
    summary = video_module.run_video(GivenBoxes(), source, args)
    text = summary.format()
    assert summary.exit_status == 1 and "could not write the video" in text and "wrote " + str(args.out) not in text
    assert not args.out.exists() and [r["frame"] for r in strict_records(args.json)] == [0, 1, 2, 3, 4]


def test_import_annotations_output_errors_are_one_line(tmp_path, capsys):
    """N16: --out under a file, in a folder where nothing can be created (/proc: even root cannot),
    and a disk that fills up during the write: one line each, exit 2, nothing left behind, an
    earlier --out intact."""
    (tmp_path / "afile").write_text("x")
    for out, message in ((tmp_path / "afile" / "x.json", "is a file, not a folder"),
                         (Path("/proc/vitpose-x.json"), "/proc")):
        code = import_annotations(out)
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and f"error: --out {out}" in err and message in err, err
    out = tmp_path / "train.json"
    out.write_text("an earlier import")
    with file_size_limit(1000):  # the COCO file is larger (1.7 kB)
        code = import_annotations(out)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"cannot write {out}" in err and "Traceback" not in err, err
    assert out.read_text() == "an earlier import" and sorted(p.name for p in tmp_path.iterdir()) == ["afile",
                                                                                                      "train.json"]


def test_predict_json_on_a_full_disk_is_one_line_and_resume_finishes_it(tmp_path, tiny, capsys):
    """N17: the disk fills up after two images' records: one line naming --json and how to go on
    (exit 2, no traceback); with space again, --resume completes the file, each image once."""
    names = ["a.png", "b.png", "c.png", "d.png"]
    write_images(tmp_path / "imgs", names)
    out = tmp_path / "r.jsonl"
    with file_size_limit(2500):  # one image's record is about 1 KB
        code, _, err = cli(tmp_path, tiny, tmp_path / "imgs", "--detector", "full-frame", "--json", out,
                           "--batch-images", 1, capsys=capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err and last.startswith(f"vitpose predict: error: --json: cannot write {out}")
    assert "continue with --resume" in last, err
    code, _, err = cli(tmp_path, tiny, tmp_path / "imgs", "--detector", "full-frame", "--json", out, "--resume",
                       capsys=capsys)
    assert code == 0 and [r["file_name"] for r in strict_records(out)] == names, err


def test_the_writers_of_export_and_evaluate_turn_a_full_disk_into_one_line(tmp_path):
    """N17: `vitpose export` writes through staged_files and `evaluate --out` through write_atomic;
    a full disk there is an OutputWriteError (a UserError: one line in every command, exit 2; still
    an OSError with its errno for callers that explain it), nothing replaced, no temp file left."""
    from vitpose.evaluation.coco_evaluator import save_predictions

    predictions = [{"image_id": i, "keypoints": np.zeros((17, 2)), "keypoint_scores": np.ones(17)} for i in range(50)]
    old = tmp_path / "predictions.json"
    old.write_text("[]")
    with file_size_limit(4096), pytest.raises(files.OutputWriteError) as raised:
        save_predictions(predictions, old)
    assert str(raised.value).startswith(f"cannot write {old}: ") and "\n" not in str(raised.value)
    assert raised.value.errno is not None and isinstance(raised.value, OSError)
    with file_size_limit(4096), pytest.raises(files.OutputWriteError, match="nothing was replaced"), \
            files.staged_files(tmp_path / "m.onnx") as staged:
        staged.write_bytes(bytes(10000))
    assert old.read_text() == "[]" and sorted(p.name for p in tmp_path.iterdir()) == ["predictions.json"]
    import errno

    full = files.write_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "x.json", "--out")
    assert str(full).startswith(f"--out: cannot write {tmp_path / 'x.json'}: disk full (") and "GiB free" in str(full)


# ------------------------------------------------------------------ round-3 rows 11, 35, 43, 105


def test_a_pgm_image_is_drawn_as_png(tmp_path, tiny, capsys):
    """Row 11: .pgm holds only grey: the colour drawing of gray.pgm is gray.pgm.png (said once)."""
    (tmp_path / "imgs").mkdir()
    cv2.imwrite(str(tmp_path / "imgs" / "gray.pgm"), np.full((50, 60), 120, np.uint8))
    write_images(tmp_path / "imgs", ["b.png"])
    code, _, err = cli(tmp_path, tiny, tmp_path / "imgs", "--detector", "full-frame", "--out", tmp_path / "drawn",
                       capsys=capsys)
    assert code == 0, err
    drawn = cv2.imread(str(tmp_path / "drawn" / "gray.pgm.png"), cv2.IMREAD_UNCHANGED)
    assert drawn is not None and drawn.shape == (50, 60, 3) and (tmp_path / "drawn" / "b.png").is_file()
    assert "gray.pgm -> gray.pgm.png" in err


@pytest.mark.parametrize("command", ["predict-dir", "predict-json", "export"])
def test_a_folder_where_no_file_can_be_created_is_refused_before_the_work(tmp_path, capsys, command):
    """Rows 35 and 105: /proc takes no new files, even from root (for whom os.access says yes):
    refused before any model loads (no-such-model would fail after), one line naming the flag,
    without a staging name."""
    argv = {"predict-dir": ["predict", str(tmp_path), "--model", "no-such-model", "--out", "/proc/vpout"],
            "predict-json": ["predict", str(tmp_path), "--model", "no-such-model", "--json", "/proc/vp.jsonl"],
            "export": ["export", "--model", "no-such-model", "--out", "/proc/a.onnx"]}[command]
    write_images(tmp_path, ["a.png"])
    code = main(argv)
    err = capsys.readouterr().err
    flag, target = argv[-2:]
    assert code == 2 and err.count("\n") == 1 and f"error: {flag} {target}" in err and ".tmp" not in err, err


def test_json_named_like_a_drawing_is_refused_before_the_work(tmp_path, capsys):
    """Row 43: --json out/a.png with --out out would replace the drawing of a.png."""
    write_images(tmp_path / "imgs", ["a.png"])
    code = main(["predict", str(tmp_path / "imgs" / "a.png"), "--model", "no-such-model", "--out",
                 str(tmp_path / "out"), "--json", str(tmp_path / "out" / "a.png")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "is the name of the drawing of a.png in --out" in err, err


# ------------------------------------------------------------------ item 7: flushes, fsyncs, renames


def test_json_lines_reach_the_file_after_each_item(tmp_path):
    """A process killed after N items keeps N items' lines: each write is in the file (readable
    by another open) before the next, for a new file and for the partial beside an existing one."""
    for existing in (False, True):
        path = tmp_path / f"r{existing}.jsonl"
        if existing:
            path.write_text("older\n")
        results = ResultsFile(path, "file_name")
        for i in range(3):
            results.write([{"file_name": f"{i}.png", "person": 0}, {"file_name": f"{i}.png", "person": 1}])
            lines = Path(results.target).read_text().splitlines()
            assert [json.loads(line)["file_name"] for line in lines] == [f"{j}.png" for j in range(i + 1) for _ in "ab"]
        results.close(completed=True)


def test_predict_writes_each_images_lines_before_the_next_image(tmp_path, tiny, capsys, monkeypatch):
    """The same through `vitpose predict`: when the detector runs on image k, the JSON Lines file
    already holds images 0..k-1 (the old bug: lines held back until the end were lost to a SIGKILL)."""
    names = [f"{i}.png" for i in range(4)]
    write_images(tmp_path / "imgs", names)
    out, seen = tmp_path / "r.jsonl", []

    def peeking(images, channels="rgb"):
        seen.append(len(out.read_text().splitlines()) if out.exists() else 0)
        return FullFrame()(images, channels)

    with_detector(tiny, peeking, monkeypatch)
    assert cli(tmp_path, tiny, tmp_path / "imgs", "--json", out, "--batch-images", 1, capsys=capsys)[0] == 0
    assert seen == [0, 1, 2, 3]


def _write_with(writer: str, target: Path) -> None:
    if writer == "write_atomic":
        files.write_atomic(target, b"new")
    elif writer == "atomic_file":
        with files.atomic_file(target) as f:
            f.write(b"new")
    elif writer == "atomic_path":
        with files.atomic_path(target) as tmp:
            Path(tmp).write_bytes(b"new")
    elif writer == "staged_files":
        with files.staged_files(target) as staged:
            staged.write_bytes(b"new")
    elif writer == "ResultsFile":
        results = ResultsFile(target, "frame")
        results.write([{"frame": 0}])
        results.close(completed=True)
    elif writer == "VideoFile":
        from vitpose.inference.video import VideoFile

        video = VideoFile(target, 10.0, (32, 24))
        video.write(np.zeros((24, 32, 3), np.uint8))
        video.release()


@pytest.mark.parametrize("writer", ["write_atomic", "atomic_file", "atomic_path", "staged_files", "ResultsFile",
                                    "VideoFile"])
def test_the_atomic_writers_fsync_the_data_then_rename_then_fsync_the_folder(tmp_path, monkeypatch, writer):
    """Over an existing file: the file that ends up at the target is fsynced before the rename that
    puts it there (else a power cut can leave the name on empty data), the folder after it (else the
    rename can be lost), and it is renamed, not copied: the target is a new inode and a reader of the
    old file still reads the old bytes (a copy in place tears the file for readers and crashes)."""
    target = tmp_path / ("t.avi" if writer == "VideoFile" else "t.bin")
    target.write_bytes(b"old")
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        st = os.fstat(fd)
        events.append(("fsync", "folder" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino))
        return real_fsync(fd)

    def replace(src, dst, **kwargs):
        events.append(("rename", os.lstat(src).st_ino, Path(dst)))
        return real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with open(target, "rb") as old_reader:
        old_inode = os.fstat(old_reader.fileno()).st_ino
        _write_with(writer, target)
        assert old_reader.read() == b"old"
    new_inode = os.stat(target).st_ino
    assert new_inode != old_inode and target.read_bytes() != b"old"
    renames = [i for i, e in enumerate(events) if e == ("rename", new_inode, target)]
    assert len(renames) == 1, events
    assert ("fsync", "file", new_inode) in events[:renames[0]], events
    assert ("fsync", "folder", os.stat(tmp_path).st_ino) in events[renames[0] + 1:], events


def test_an_output_inside_an_input_folder_is_refused_before_any_work(tmp_path, capsys):
    """An input folder (images, a labelled set) is the user's: nothing a run writes goes inside it,
    however the path is spelt (nested, through a link); beside it is fine."""
    from vitpose.cli import main
    from vitpose.files import OutputPathError, check_output

    data = tmp_path / "held"
    (data / "annotations").mkdir(parents=True)
    (tmp_path / "link").symlink_to(data)
    for inside in (data / "x.pth", data / "annotations" / "new" / "x.pth", tmp_path / "link" / "x.pth"):
        with pytest.raises(OutputPathError, match="is inside the input folder"):
            check_output(inside, "--out", inputs=[data])
        with pytest.raises(OutputPathError, match="is inside the input folder"):
            check_output(inside.with_suffix(""), "--out", "dir", inputs=[data])
    assert check_output(tmp_path / "x.pth", "--out", inputs=[data]) == tmp_path / "x.pth"
    code = main(["calibrate", "--model", str(tmp_path / "m.pth"), "--data", str(data),
                 "--out", str(data / "m.cal.pth")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--out" in err[0] and "inside the input folder" in err[0], err
    assert sorted(p.name for p in data.iterdir()) == ["annotations"]
