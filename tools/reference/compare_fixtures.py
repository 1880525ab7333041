"""Compares two fixture sets array by array (needs numpy only; any Python of the project works).

    python tools/reference/compare_fixtures.py NEW_DIR REFERENCE_DIR [--files a.npz b.json]

For every `.npz` file present in both folders it loads both through tests/fixture_files.py (so
compact and full forms compare alike) and reports, per key present in both: equal, or the
largest absolute difference (NaNs must sit in the same places); keys present on one side only
are listed. `.json` files are compared value by value (numbers by their largest difference).
The `info_json` entries and the top level of `.json` files are compared without their `versions`,
`notes` and `ann_file`.
Exit status 1 if any compared value differs by more than --atol (default 0: report only).
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from fixture_files import load_npz  # noqa: E402


def array_difference(a, b):
    """(status, largest |a - b|) of two arrays: 'equal', 'close', 'shape', 'dtype', 'nan', 'text'."""
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}", math.inf
    if a.dtype.kind in "US" or b.dtype.kind in "US":
        return ("equal", 0.0) if np.array_equal(a, b) else ("text differs", math.inf)
    dtype_note = "" if a.dtype == b.dtype else f" (dtype {a.dtype} vs {b.dtype})"
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if not np.array_equal(np.isnan(a64), np.isnan(b64)):
        return "NaN positions differ" + dtype_note, math.inf
    finite = ~np.isnan(a64)
    diff = float(np.max(np.abs(a64[finite] - b64[finite]), initial=0.0))
    return ("equal" if diff == 0 else "differs") + dtype_note, diff


def json_difference(a, b, path=""):
    """Yields (path, note, difference) for every leaf where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                yield f"{path}/{key}", "missing on one side", math.inf
            else:
                yield from json_difference(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield path, f"length {len(a)} vs {len(b)}", math.inf
        else:
            for i, (x, y) in enumerate(zip(a, b)):
                yield from json_difference(x, y, f"{path}[{i}]")
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if a != b:
            yield path, "number", abs(a - b)
    elif a != b:
        yield path, f"{a!r} vs {b!r}"[:120], math.inf


IGNORED = ("versions", "notes", "ann_file")


def _info(arrays):
    info = json.loads(str(arrays.pop("info_json"))) if "info_json" in arrays else {}
    return {k: v for k, v in info.items() if k not in IGNORED}


def compare_npz(new_path, ref_path):
    new, ref = load_npz(new_path), load_npz(ref_path)
    new_info, ref_info = _info(new), _info(ref)
    rows, worst = [], 0.0
    for key in sorted(set(new) & set(ref)):
        status, diff = array_difference(new[key], ref[key])
        rows.append((key, status, diff))
        worst = max(worst, diff)
    only_new, only_ref = sorted(set(new) - set(ref)), sorted(set(ref) - set(new))
    info_diffs = [(p, n, d) for p, n, d in json_difference(new_info, ref_info) if d > 0]
    return rows, only_new, only_ref, info_diffs, worst


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("new", type=Path)
    parser.add_argument("reference", type=Path)
    parser.add_argument("--files", nargs="+", default=None)
    parser.add_argument("--atol", type=float, default=None, help="fail when a difference exceeds this")
    parser.add_argument("--verbose", action="store_true", help="list equal keys too")
    args = parser.parse_args(argv)
    names = args.files or sorted(p.name for p in args.new.iterdir() if (args.reference / p.name).is_file()
                                 and p.suffix in (".npz", ".json"))
    overall = 0.0
    for name in names:
        new_path, ref_path = args.new / name, args.reference / name
        if name.endswith(".json"):
            new_json, ref_json = json.loads(new_path.read_text()), json.loads(ref_path.read_text())
            if isinstance(new_json, dict) and isinstance(ref_json, dict):  # metadata is not compared
                new_json, ref_json = ({k: v for k, v in d.items() if k not in IGNORED} for d in (new_json, ref_json))
            diffs = list(json_difference(new_json, ref_json))
            worst = max((d for _, _, d in diffs), default=0.0)
            same_bytes = new_path.read_bytes() == ref_path.read_bytes()
            print(f"== {name}: {'byte-identical' if same_bytes else f'{len(diffs)} values differ, max {worst:.3g}'}")
            for path, note, d in diffs[:20]:
                print(f"   {path}: {note} {d:.3g}")
        else:
            rows, only_new, only_ref, info_diffs, worst = compare_npz(new_path, ref_path)
            n_equal = sum(status == "equal" for _, status, _ in rows)
            print(f"== {name}: {n_equal}/{len(rows)} common keys equal, max difference {worst:.3g}")
            for key, status, diff in rows:
                if status != "equal" or args.verbose:
                    print(f"   {key}: {status} {diff:.3g}")
            if only_new:
                print(f"   only in {args.new}: {', '.join(only_new)}")
            if only_ref:
                print(f"   only in {args.reference}: {', '.join(only_ref)}")
            for path, note, d in info_diffs:
                print(f"   info{path}: {note}")
        overall = max(overall, worst)
    print(f"largest difference over all compared values: {overall:.3g}")
    if args.atol is not None and overall > args.atol:
        sys.exit(1)


if __name__ == "__main__":
    main()
