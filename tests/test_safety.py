"""Issue 18 (the doors never lose, overwrite or corrupt data), the parts of vitpose.files and its users:

- item 1: the synthetic set is written only into a folder this project made (its `synthetic.json`
  stamp), never into a user's data.root: one line, and the user's files are byte-identical after;
- item 3: `--track` / `--smooth` on a video whose first frame (and one in the middle) has nobody;
- item 4: file, folder and output names that are not UTF-8 (OpenCV's path functions segfault on them);
- item 7: `vitpose export --out` and `evaluate.py --out` are checked before the work, one line naming the flag;
- item 12: an image whose header says 30000x20000 is refused before it is decoded, with the limit
  and how to raise it;
- `vitpose.files`' atomic writer: a failing writer leaves the previous file and no temp file.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zlib

import cv2
import numpy as np
import pytest
from conftest import REPO
from test_evaluate import load_cli, tiny_model, write_config, write_tiny_model
from test_video import FIGURE, FPS, NUM_FRAMES, SIZE, blob_detector, options, predictor, synthetic_frame  # noqa: F401 (a fixture)

import vitpose
from vitpose import files
from vitpose.data.errors import DataError
from vitpose.data.image_io import load_image
from vitpose.data.synthetic import STAMP_NAME, SyntheticRootError, claim_synthetic_root, make_coco
from vitpose.errors import UserError
from vitpose.inference.draw import draw_pose

NON_UTF8 = b"caf\xe9 \xff.png"  # Latin-1 e-acute and a byte no encoding maps: a name only bytes can hold


def snapshot(folder) -> dict[str, str]:
    """Every file under `folder`: relative path -> SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- item 1: a user's data.root is never written into -------------------------------------------------------


def user_coco_set(root):
    """A user's own MMPose-layout set (what a COCO download looks like), plus a file of theirs."""
    make_coco(root, 3, seed=5, split="train")
    make_coco(root, 2, seed=5, split="val")
    (root / "README.txt").write_text("my labels, 3 weeks of work")
    return root


def malformed_user_set(root):
    (root / "annotations").mkdir(parents=True)
    (root / "annotations" / "person_keypoints_train2017.json").write_text('{"images": [')  # cut short
    return root


@pytest.mark.parametrize("make_user_set", [user_coco_set, malformed_user_set], ids=["complete", "malformed"])
def test_a_config_that_only_moves_data_root_never_writes_into_the_users_set(tmp_path, monkeypatch, capsys,
                                                                             make_user_set):
    import train

    user = make_user_set(tmp_path / "my_coco")
    before = snapshot(user)
    config = tmp_path / "it.yaml"
    config.write_text(f"base: {REPO / 'configs' / 'demo.yaml'}\ndata:\n  root: {user}\n")
    monkeypatch.chdir(tmp_path)  # the demo's work_dir (work_dirs/demo) is relative
    code = train.main(["--config", str(config), "--workers", "0"])
    err = capsys.readouterr().err
    assert code == train.EXIT_USAGE
    line = next(ln for ln in err.splitlines() if ln.startswith("train.py: error: "))
    assert f"data.root {user} holds files this project did not write" in line
    assert "data.synthetic_train_images: 0" in line and "nothing was changed" in line
    assert snapshot(user) == before  # byte-identical, and nothing added (no stamp, no images)
    assert not (user / STAMP_NAME).exists()


def test_the_synthetic_root_is_claimed_only_when_new_empty_or_stamped(tmp_path):
    fresh = claim_synthetic_root(tmp_path / "new" / "set")  # created and stamped before any image
    assert (fresh / STAMP_NAME).is_file() and [p.name for p in fresh.iterdir()] == [STAMP_NAME]
    make_coco(fresh, 1, seed=0, split="val")
    assert claim_synthetic_root(fresh) == fresh  # ours: the stamp says so
    (tmp_path / "empty").mkdir()
    assert (claim_synthetic_root(tmp_path / "empty") / STAMP_NAME).is_file()
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SyntheticRootError, match="is a file") as e:
        claim_synthetic_root(tmp_path / "a_file")
    assert isinstance(e.value, UserError) and isinstance(e.value, DataError)


# ---- vitpose.files: the one atomic writer ----------------------------------------------------------------


def test_a_failing_writer_leaves_the_previous_file_and_no_temp_file(tmp_path):
    target = tmp_path / "results.json"
    files.write_atomic(target, "[1, 2]")
    assert target.read_text() == "[1, 2]" and oct(target.stat().st_mode & 0o777) == oct(files.readable_mode())
    with pytest.raises(RuntimeError, match="disk gone"), files.atomic_file(target) as f:
        f.write(b"[3, ")
        raise RuntimeError("disk gone")
    assert target.read_text() == "[1, 2]"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_staged_files_move_together_or_not_at_all(tmp_path):
    target = tmp_path / "model.onnx"
    with pytest.raises(ValueError), files.staged_files(target) as staged:
        staged.write_bytes(b"graph")
        staged.with_name(staged.name + ".data").write_bytes(b"weights")
        raise ValueError("the gate failed")
    assert list(tmp_path.iterdir()) == []
    with files.staged_files(target) as staged:
        staged.write_bytes(b"graph")
        staged.with_name(staged.name + ".data").write_bytes(b"weights")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]


# ---- check_output: one line naming the flag, before the work ---------------------------------------------


def test_check_output_refusals_name_the_flag(tmp_path):
    source = tmp_path / "clip.mp4"
    source.write_bytes(b"video")
    (tmp_path / "folder").mkdir()
    os.symlink(source, tmp_path / "link.mp4")
    cases = [
        (tmp_path / "folder", "file", "--json", "is a folder; --json takes a file name"),
        (source / "poses.json", "file", "--json", "is a file, not a folder"),
        (source, "file", "--json", f"would replace the input {source}"),
        (tmp_path / "link.mp4", "file", "--out", f"would replace the input {source}"),  # the same file by a link
        (source, "dir", "--out", "would replace the input"),
        (tmp_path / "notes.txt", "dir", "--out", None),  # made below: a file where a folder is wanted
    ]
    (tmp_path / "notes.txt").write_text("x")
    cases[-1] = (tmp_path / "notes.txt", "dir", "--out", "is a file; --out takes a folder")
    for path, kind, flag, message in cases:
        with pytest.raises(files.OutputPathError) as e:
            files.check_output(path, flag, kind=kind, inputs=[None, source])
        text = str(e.value)
        assert text.startswith(f"{flag} {path}") and message in text and "\n" not in text, text
    # fine: a new file in folders still to be made, an existing file to replace, an existing folder
    assert files.check_output(tmp_path / "new" / "deeper" / "r.json", "--json") == tmp_path / "new" / "deeper" / "r.json"
    assert files.check_output(tmp_path / "notes.txt", "--json", inputs=[source]) == tmp_path / "notes.txt"
    assert files.check_output(tmp_path / "folder", "--out", kind="dir") == tmp_path / "folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4", "folder", "link.mp4", "notes.txt"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_check_output_refuses_an_unwritable_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(files.OutputPathError, match=r"^--json .*: the folder .*locked is not writable"):
            files.check_output(locked / "r.json", "--json")
    finally:
        locked.chmod(0o700)


# ---- item 4: names that are not UTF-8 ----------------------------------------------------------------


def test_read_and_write_images_with_a_name_that_is_not_utf8(tmp_path):
    image = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    folder = os.fsencode(tmp_path)
    path = os.path.join(folder, NON_UTF8)
    files.write_image(path, image)  # bytes name
    assert os.listdir(folder) == [NON_UTF8]
    as_str = os.fsdecode(path)  # the str Python makes of it (surrogateescape), e.g. from os.listdir(str)
    for name in (path, as_str):
        np.testing.assert_array_equal(files.read_image(name), image)  # PNG: lossless
    np.testing.assert_array_equal(load_image(as_str)[0], image)  # the data side reads the same way
    with pytest.raises(files.ImageReadError, match="image file not found"):
        files.read_image(os.path.join(folder, b"\xfe.png"))


def test_predict_reads_and_draws_into_folders_whose_names_are_not_utf8(tmp_path, coco_mini_dir):
    """On OpenCV's path functions this segfaulted (exit -11, nothing written)."""
    config, checkpoint = write_tiny_model(tmp_path, coco_mini_dir, seed=11)
    base = os.fsencode(tmp_path)
    source, out, results = (os.path.join(base, name) for name in (b"fotos \xff", b"dibujos \xfe", b"poses \xe9.json"))
    os.mkdir(source)
    image = np.random.default_rng(1).integers(0, 256, (80, 60, 3), dtype=np.uint8)
    ok, png = cv2.imencode(".png", image)
    with open(os.path.join(source, NON_UTF8), "wb") as f:
        f.write(png.tobytes())
    command = [sys.executable, "-m", "vitpose", "predict", source, "--model", os.fsencode(checkpoint),
               "--config", os.fsencode(config), "--detector", "full-frame", "--no-flip", "--device", "cpu",
               "--out", out, "--json", results]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "PYTHONIOENCODING": "utf-8:strict"}  # a desktop's UTF-8 terminal (C.UTF-8 would escape silently)
    proc = subprocess.run(command, capture_output=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    assert os.listdir(out) == [NON_UTF8]
    with open(os.path.join(out, NON_UTF8), "rb") as f:
        drawn = cv2.imdecode(np.frombuffer(f.read(), np.uint8), cv2.IMREAD_COLOR)
    assert drawn.shape == image.shape and not np.array_equal(drawn, image)  # the pose is drawn on it
    with open(results, "rb") as f:
        records = [json.loads(line) for line in f.read().splitlines()]  # JSON Lines
    assert [r["file_name"] for r in records] == [os.fsdecode(NON_UTF8)] and len(records[0]["keypoints"]) == 51


def test_predict_reads_and_draws_a_video_whose_names_are_not_utf8(tmp_path, coco_mini_dir):
    """cv2.VideoCapture / VideoWriter on such names segfaulted (exit -11, nothing written)."""
    config, checkpoint = write_tiny_model(tmp_path, coco_mini_dir, seed=11)
    base = os.fsencode(tmp_path)
    folder, out, results = (os.path.join(base, name) for name in (b"v\xeddeos \xff", b"dibujos \xfe", b"poses \xe9.json"))
    os.mkdir(folder)
    source = os.path.join(folder, b"clip \xff.avi")
    writer = cv2.VideoWriter(str(tmp_path / "clip.avi"), cv2.VideoWriter_fourcc(*"MJPG"), FPS, SIZE)
    for f in range(NUM_FRAMES):
        writer.write(synthetic_frame(f))
    writer.release()
    os.rename(os.fsencode(tmp_path / "clip.avi"), source)
    command = [sys.executable, "-m", "vitpose", "predict", source, "--model", os.fsencode(checkpoint),
               "--config", os.fsencode(config), "--detector", "full-frame", "--no-flip", "--device", "cpu",
               "--precision", "fp32", "--out", out, "--json", results]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "PYTHONIOENCODING": "utf-8:strict"}
    proc = subprocess.run(command, capture_output=True, env=env, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr.decode(errors="replace")[-2000:])
    assert os.listdir(out) == [b"clip \xff.mp4"]  # the source's stem; no temporary file left beside it
    link = tmp_path / "drawn.mp4"  # read back through an ASCII name (the test's own OpenCV call)
    os.symlink(os.path.join(out, b"clip \xff.mp4"), os.fsencode(link))
    capture = cv2.VideoCapture(str(link))
    decoded = 0
    while capture.read()[0]:
        decoded += 1
    capture.release()
    assert decoded == NUM_FRAMES
    with open(results, "rb") as f:
        records = [json.loads(line) for line in f.read().splitlines()]  # JSON Lines
    assert sorted({r["frame"] for r in records}) == list(range(NUM_FRAMES))  # full-frame: one pose per frame
    assert len(records) == NUM_FRAMES and all(len(r["keypoints"]) == 51 for r in records)


def small_video(path, frames: int, size=(160, 120)):
    """An MJPG video of `frames` small frames, a half-size figure walking across (test_video's)."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), FPS, size)
    assert writer.isOpened()
    for f in range(frames):
        image = np.full((size[1], size[0], 3), 30, np.uint8)
        corner = np.array([5.0 + (f % 60), 10.0])
        writer.write(draw_pose(image, FIGURE * 0.5 + corner, radius=2, thickness=2, channels="bgr"))
    writer.release()
    return path


def peak_rss_kib(command: list, env: dict) -> tuple[int, float]:
    """(peak resident memory of `command` in KiB, seconds): measured from a fresh wrapper process
    whose only child is the command, so that ru_maxrss of its children is that command's."""
    wrapper = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", wrapper, *map(str, command)], capture_output=True, env=env,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return int(proc.stdout.split()[-1]), time.perf_counter() - started


@pytest.mark.slow
def test_peak_memory_on_a_3000_frame_video_is_within_10_percent_of_a_300_frame_one(tmp_path, coco_mini_dir):
    """Issue 18's acceptance: memory stays flat on any length (bounded queues, JSON Lines flushed
    frame by frame, the drawn video streamed), with --track --smooth on. Frames of 160x120 (57.6 KB
    as BGR): a stage that kept every frame would add 2700 x 57.6 KB = 155 MB to the 3000-frame run,
    more than 10% of the ~875 MiB a run takes (torch, the model). Records kept in memory (~2.2 KB
    per pose, 6 MB here) would stay under the 10% and are not what this catches. Slow: ~2 min
    on 2 cores (300 frames ~16 s, 3000 frames ~100 s)."""
    config, checkpoint = write_tiny_model(tmp_path, coco_mini_dir, seed=5)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    peaks = {}
    for frames in (300, 3000):
        video = small_video(tmp_path / f"walk{frames}.avi", frames)
        results = tmp_path / f"walk{frames}.jsonl"
        peaks[frames], seconds = peak_rss_kib(
            [sys.executable, "-m", "vitpose", "predict", video, "--model", checkpoint, "--config", config,
             "--detector", "full-frame", "--json", results, "--out", tmp_path / f"drawn{frames}", "--track",
             "--smooth", "--precision", "fp32", "--device", "cpu"], env)
        print(f"{frames} frames: peak RSS {peaks[frames] / 1024:.1f} MiB in {seconds:.1f} s")
        records = [json.loads(line) for line in results.read_text().splitlines()]
        assert [r["frame"] for r in records] == list(range(frames))  # full-frame: one pose per frame, in order
    assert abs(peaks[3000] - peaks[300]) <= 0.10 * peaks[300], peaks


# ---- item 3: --track / --smooth on a video with frames without people ---------------------------------------


def test_track_and_smooth_a_video_whose_first_frame_has_nobody(predictor, tmp_path):  # noqa: F811 (the fixture)
    """Failed on the first empty frame (`cannot reshape array of size 0`), losing the whole video."""
    from vitpose.inference.video import run_video

    empty = (0, 5)
    path = tmp_path / "gaps.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, SIZE)
    for f in range(NUM_FRAMES):
        writer.write(np.full((SIZE[1], SIZE[0], 3), 30, np.uint8) if f in empty else synthetic_frame(f))
    writer.release()
    blobs = type(predictor)(predictor.model, codec=predictor.codec, device="cpu", detector=blob_detector)
    summary = run_video(blobs, str(path), options(tmp_path, track=True, smooth=True))
    assert summary.frames_done == NUM_FRAMES and summary.people == 2 * (NUM_FRAMES - len(empty))
    records = [json.loads(line) for line in (tmp_path / "poses.json").read_text().splitlines()]  # JSON Lines
    frames = [f for f in range(NUM_FRAMES) if f not in empty]
    assert [r["frame"] for r in records] == [f for f in frames for _ in range(2)]
    # the top figure (walking right) keeps id 0 and the bottom one id 1, across the empty frame 5
    assert [r["track_id"] for r in records] == [0, 1] * len(frames)
    assert all(r["bbox"][1] < 100 for r in records[::2]) and all(r["bbox"][1] > 100 for r in records[1::2])


# ---- item 12: a pixel limit read from the header, before decoding ---------------------------------------


def huge_png(path, width=30000, height=20000) -> int:
    """A valid 1-bit grey PNG of width x height (a few hundred KB; 1.8 GB once decoded as BGR)."""
    def chunk(kind, data):
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    row = b"\x00" + bytes((width + 7) // 8)  # filter byte + packed pixels
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([1, 0, 0, 0, 0])
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(row * height, 9))
                     + chunk(b"IEND", b""))
    return path.stat().st_size


def test_an_image_over_the_pixel_limit_is_refused_before_decoding(tmp_path):
    path = tmp_path / "bomb.png"
    assert huge_png(path) < 1_000_000
    for read in (files.read_image, lambda p: load_image(p)[0]):
        with pytest.raises((files.ImageTooLargeError, DataError)) as e:
            read(path)
        text = str(e.value)
        assert "30000x20000 (600 megapixels" in text and "over the limit of 150 megapixels" in text
        assert "VITPOSE_MAX_PIXELS=600000000" in text and "\n" not in text


def test_the_pixel_limit_is_read_from_each_format_and_can_be_raised(tmp_path, monkeypatch):
    image = np.zeros((30, 50, 3), np.uint8)
    for suffix in (".png", ".jpg", ".bmp", ".webp", ".tiff"):
        path = files.write_image(tmp_path / f"i{suffix}", image)
        assert files.image_header_size(files.read_bytes(path)) == (50, 30), suffix
        with pytest.raises(files.ImageTooLargeError, match=r"50x30 .* over the limit of 0.001 megapixels"):
            files.read_image(path, max_pixels=1000)
        monkeypatch.setenv(files.MAX_PIXELS_ENV, "1000")
        with pytest.raises(files.ImageTooLargeError):
            files.read_image(path)
        monkeypatch.setenv(files.MAX_PIXELS_ENV, "0")  # no limit
        assert files.read_image(path).shape == (30, 50, 3)
        monkeypatch.delenv(files.MAX_PIXELS_ENV)
        assert files.read_image(path, max_pixels=1500).shape == (30, 50, 3)


def test_one_image_reader_and_one_family_of_unreadable_images(tmp_path):
    """`vitpose.files.read_image` and the data layer's `load_image` / `decode_image` are one reader
    (one `cv2.imdecode` of a file's bytes in the package) and refuse a bad file alike: every error is
    an ImageReadError and a UserError naming the file; the data layer's is a DataError too."""
    from vitpose.data.image_io import decode_image

    calls = [str(p.relative_to(REPO)) for p in (REPO / "vitpose").rglob("*.py") if "cv2.imdecode(" in p.read_text()]
    assert calls == ["vitpose/files/images.py"]
    image = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    good = files.write_image(tmp_path / "good.jpg", image)
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(good.read_bytes()[:200])  # a truncated download: OpenCV alone would decode it grey
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "text.png").write_bytes(b"not an image at all")
    huge_png(tmp_path / "huge.png")
    np.testing.assert_array_equal(files.read_image(good), load_image(good)[0])
    for name, why in (("missing.jpg", "not found"), ("empty.png", "is empty"), ("cut.jpg", "truncated"),
                      ("text.png", "could not be decoded"), ("huge.png", "over the limit")):
        path = tmp_path / name
        for read in (files.read_image, lambda p: load_image(p)[0],
                     lambda p: decode_image(files.read_bytes(p), p) if p.exists() else load_image(p)[0]):
            with pytest.raises(files.ImageReadError) as e:
                read(path)
            assert isinstance(e.value, UserError) and why in str(e.value) and name in str(e.value), (name, str(e.value))
            assert isinstance(e.value, files.ImageTooLargeError) == (name == "huge.png")
        with pytest.raises(DataError):
            load_image(path)


def test_predict_skips_and_counts_an_image_over_the_limit(tmp_path, coco_mini_dir, capsys):
    from vitpose.cli import main

    config, checkpoint = write_tiny_model(tmp_path, coco_mini_dir, seed=11)
    folder = tmp_path / "photos"
    folder.mkdir()
    files.write_image(folder / "good.png", np.full((64, 48, 3), 90, np.uint8))
    huge_png(folder / "huge.png")
    code = main(["predict", str(folder), "--config", str(config), "--model", str(checkpoint), "--detector",
                 "full-frame", "--json", str(tmp_path / "r.json"), "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 1 and "1 images, 1 people" in out and "1 images skipped" in err
    line = next(ln for ln in err.splitlines() if "huge.png" in ln)
    assert "30000x20000" in line and "VITPOSE_MAX_PIXELS" in line
    assert [json.loads(line)["file_name"] for line in (tmp_path / "r.json").read_text().splitlines()] == ["good.png"]


# ---- item 7: export --out and evaluate.py --out are checked before the work --------------------------------


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    vitpose.save_weights(tiny_model(seed=3), path)
    return path


@pytest.mark.parametrize("where, message", [
    ("folder.onnx", "is a folder; --out takes a file name"),
    ("notes.txt/model.onnx", "is a file, not a folder"),
    ("model.safetensors", "would replace the input"),
])
def test_export_out_is_checked_before_the_work(tmp_path, tiny_checkpoint, capsys, where, message):
    from vitpose.cli import main

    (tmp_path / "folder.onnx").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    model = tmp_path / "model.safetensors"
    shutil.copy(tiny_checkpoint, model)
    before = snapshot(tmp_path)
    argv = ["export", "--model", str(model), "--out", str(tmp_path / where)]
    if where.endswith(".safetensors"):
        argv += ["--format", "pt2"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"vitpose export: error: --out {tmp_path / where}") and message in err, err
    assert len(err.strip().splitlines()) == 1 and snapshot(tmp_path) == before


def test_evaluate_out_is_checked_before_the_work(tmp_path, coco_mini_dir, tiny_checkpoint, capsys, monkeypatch):
    data = shutil.copytree(coco_mini_dir, tmp_path / "coco")  # a copy: the old code wrote over its input
    config = write_config(tmp_path, data)
    before = snapshot(data)
    (tmp_path / "out").mkdir()
    evaluate = load_cli()
    import vitpose.builders

    def work_began(*args, **kwargs):
        pytest.fail("the output was checked after the work began")

    monkeypatch.setattr(vitpose.builders, "build_dataset_info", work_began)  # the first step of the work
    for out, message in ((tmp_path / "out", "is a folder; --out takes a file name"),
                         (data / "test_coco.json", "would replace the input")):
        code = evaluate.main(["--config", str(config), "--checkpoint", str(tiny_checkpoint), "--workers", "0",
                              "--device", "cpu", "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2
        assert err.startswith(f"evaluate.py: error: --out {out}") and message in err and len(err.splitlines()) == 1
    assert snapshot(data) == before
