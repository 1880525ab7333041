"""`vitpose plot`: the curves drawn are the file's numbers, into a PNG of the stated size."""

import json
import struct

import numpy as np

from vitpose import cli
from vitpose.cli.plot import load_curves


def main(argv):
    return cli.main(["plot", *argv])


def write_metrics(path):
    records = [
        {"kind": "train", "epoch": 0, "iter": 10, "loss": 0.004, "lr": 1e-5, "samples_per_s": 500.0},
        {"kind": "train", "epoch": 0, "iter": 20, "loss": 0.003, "lr": 2e-5, "samples_per_s": 510.0},
        {"kind": "eval", "epoch": 0, "iter": 20, "AP": 0.10, "AP .5": 0.3},
        {"kind": "warning", "code": "loader_bound", "text": "..."},
        {"kind": "train", "epoch": 1, "iter": 30, "loss": 0.0025, "lr": 3e-5, "samples_per_s": 505.0},
        {"kind": "eval", "epoch": 1, "iter": 40, "AP": 0.15},
        # Resumed from the iteration-20 checkpoint: 30 and the eval at 40 are replaced.
        {"kind": "train", "epoch": 1, "iter": 30, "loss": 0.0024, "lr": 3e-5, "samples_per_s": 520.0},
        {"kind": "train", "epoch": 1, "iter": 40, "loss": None, "lr": 4e-5, "samples_per_s": 530.0},
        {"kind": "eval", "epoch": 1, "iter": 40, "AP": 0.2},
    ]
    text = "".join(json.dumps(r) + "\n" for r in records) + '{"kind": "train", "ite'  # killed mid-line
    path.write_text(text)


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_load_curves(tmp_path, capsys):
    write_metrics(tmp_path / "metrics.jsonl")
    c = load_curves(tmp_path / "metrics.jsonl")
    assert "metrics.jsonl:10: skipped" in capsys.readouterr().err
    np.testing.assert_array_equal(c["train_iter"], [10, 20, 30, 40])
    np.testing.assert_array_equal(c["loss"], [0.004, 0.003, 0.0024, np.nan])
    np.testing.assert_array_equal(c["lr"], [1e-5, 2e-5, 3e-5, 4e-5])
    np.testing.assert_array_equal(c["samples_per_s"], [500, 510, 520, 530])
    np.testing.assert_array_equal(c["eval_iter"], [20, 40])
    np.testing.assert_array_equal(c["eval_epoch"], [0, 1])
    np.testing.assert_array_equal(c["AP"], [0.1, 0.2])


def test_cli_writes_png(tmp_path, capsys):
    write_metrics(tmp_path / "metrics.jsonl")
    assert main([str(tmp_path)]) == 0
    out = tmp_path / "curves.png"
    assert capsys.readouterr().out.strip() == str(out)
    assert png_size(out) == (1200, 800)
    import matplotlib.image

    pixels = matplotlib.image.imread(out)
    assert pixels.shape[:2] == (800, 1200) and pixels[..., :3].std() > 0.05  # something was drawn

    assert main([str(tmp_path), "--out", str(tmp_path / "sub" / "c.png")]) == 0
    assert png_size(tmp_path / "sub" / "c.png") == (1200, 800)


def test_missing_file_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2  # a user error: one line, exit status 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitpose plot: error: ") and "metrics.jsonl not found" in err[0]
