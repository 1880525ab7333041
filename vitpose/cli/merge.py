"""`vitpose merge DIR --json OUT`: the shard files of a sharded `vitpose predict` as one results file.

    vitpose predict images/ --shard 0/2 --json shards/      # and --shard 1/2, anywhere, any time
    vitpose merge shards/ --json poses.jsonl                # every unit once, one process's order
    vitpose merge shards/ --json results.json --format coco # one list, as COCO.loadRes reads it

Every unit of DIR/manifest.json must be complete in one of the shard files (a unit complete in
several, after a retry or a rerun with another N, counts once); the records come out in the
manifest's order with the `image_id` and `file_name` one process would have given them, and a
segmented video's track ids are joined across its segment borders (README, "Many GPUs, many
machines"). When units are missing they are listed, nothing is written and the exit status is 1;
run the shards that hold them again with --resume. Shard files of two models (the SHA-256 of the
model file their first line records) or of two source folders are refused (exit 2): the merged
file would mix their poses. What is not a regular file (a FIFO, a device) is passed over.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vitpose.errors import EXIT_FAILED, EXIT_OK
from vitpose.files import check_output, write_atomic
from vitpose.inference.units import as_coco_results, merge_shards, records_text

EXIT_MISSING = EXIT_FAILED  # a unit of the manifest is missing: nothing written


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("merge", help="join the shard files of vitpose predict --shard K/N",
                              shared=("--debug",), description=doc[0], epilog="\n\n".join(doc[1:]),
                              formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("directory", type=Path, help="the --json directory of the shards (with manifest.json)")
    p.add_argument("--json", type=Path, required=True, help="the merged results file")
    p.add_argument("--format", choices=("jsonl", "coco"), default="jsonl",
                   help="jsonl: JSON Lines as vitpose predict writes them; coco: one JSON list of COCO keypoint "
                        "results (a video frame's image_id is its frame) (default: %(default)s)")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    shard_paths = sorted(Path(args.directory).glob("*.jsonl"))
    check_output(args.json, "--json", "file", [args.directory / "manifest.json", *shard_paths])
    merged = merge_shards(args.directory)
    done = merged.units - len(merged.missing)
    print(f"{len(merged.files)} shard files, {done} of {merged.units} units complete, {len(merged.records)} records"
          + (f"; {merged.duplicates} units done twice, counted once" if merged.duplicates else "")
          + (f"; {merged.torn} records of units cut off, left out" if merged.torn else "")
          + (f"; {merged.joins} tracks joined across segment borders" if merged.joins else ""))
    if merged.extra:
        print(f"vitpose merge: note: {len(merged.extra)} units in the shard files are not in the manifest "
              f"(left out; files removed from the source?), e.g. {merged.extra[:3]}", file=sys.stderr)
    if merged.missing:
        print(f"vitpose merge: {len(merged.missing)} units missing; nothing written. Run their shards again "
              f"with --resume:", file=sys.stderr)
        for unit_id in merged.missing[:20]:
            print(f"  {unit_id}", file=sys.stderr)
        if len(merged.missing) > 20:
            print(f"  ... and {len(merged.missing) - 20} more", file=sys.stderr)
        return EXIT_MISSING
    if args.format == "coco":
        write_atomic(args.json, json.dumps(as_coco_results(merged.records), allow_nan=False))
    else:
        write_atomic(args.json, records_text(merged.records))
    print(f"written: {args.json}")
    return EXIT_OK
