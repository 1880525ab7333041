"""Check a config's data before training: `vitpose check-data --config CFG [--all]`.

Builds the skeleton (`data.dataset_info`), the training and validation sets exactly as train.py
does (`vitpose.builders`), and runs the checks of vitpose/data/check.py on them: K of the file =
K of the model = K of the skeleton, the flip table, the images (a sample, or `--all`), per-joint
label counts, instances with no visible keypoint, box sizes, and whether the training targets
would be all zero. Prints one table; exit status 0 when there is no error, 1 when a check failed,
2 when the config or a file could not be read at all.

`preflight(cfg, train_set)` is the fast subset train.py runs before its first step (no
validation set, 16 training images).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitpose.builders import build_dataset_info, build_train_set, build_val_set, dataset_info_path
from vitpose.config import Config, ConfigError, load_config
from vitpose.data import check as C
from vitpose.data.errors import DataError
from vitpose.data.metainfo import DatasetInfo, dataset_info

FAST_IMAGES = 16  # training images decoded by train.py's preflight


def check_datasets(info: DatasetInfo, model_keypoints: int, train_set=None, val_set=None,
                   images: str = "sample", image_limit: int = C.SAMPLE_IMAGES) -> C.CheckReport:
    """Every check on the sets given (either may be None); see vitpose/data/check.py."""
    report = C.CheckReport()
    file_k = (train_set or val_set).index.num_keypoints if (train_set or val_set) is not None else None
    report.add(*C.check_skeleton(info, model_keypoints, file_k))
    for name, dataset in (("train", train_set), ("val", val_set)):
        if dataset is None:
            continue
        report.add(C.Finding(f"{name} set", C.OK, f"{len(dataset)} instances, {len(dataset.index.image_ids)} images "
                                                  f"from {dataset.bbox_file or dataset.ann_file}; dropped "
                                                  f"{dataset.dropped or 'none'}"))
        findings, table = C.check_keypoints(dataset, info, name)
        report.add(*findings)
        if dataset.index.has_keypoints:
            finding, histogram = C.box_size_histogram(dataset, name)
            report.add(finding)
            report.blocks += [table, histogram]
        report.add(*C.check_targets(dataset))
        report.add(*C.check_images(dataset, images, name, limit=image_limit))
    return report


def preflight(cfg: Config, train_set) -> C.CheckReport:
    """The fast checks train.py runs before the first step (the training set only, FAST_IMAGES
    images). The caller prints `report.format()` and calls `report.raise_on_error()`."""
    info = getattr(train_set, "dataset_info", None) or build_dataset_info(cfg)
    return check_datasets(info, cfg.model.num_keypoints, train_set=train_set, image_limit=FAST_IMAGES)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vitpose check-data",
                                 description="Check a config's skeleton, annotation files and images before "
                                             "training; exit status 1 when a check fails.")
    ap.add_argument("--config", required=True, help="YAML run config (as for train.py)")
    ap.add_argument("--all", action="store_true", help="decode every image (default: a spread-out sample)")
    ap.add_argument("--data-root", default=None, help="dataset root (default: data.root of the config)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="override a config field (repeatable)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.set)
        root = Path(args.data_root or cfg.data.root)
        # Not build_dataset_info: a model K that differs from the skeleton's is a row of the table.
        info = dataset_info(dataset_info_path(cfg, root))
    except (ConfigError, DataError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sets = {}
    report = C.CheckReport()
    for name, build in (("train", build_train_set), ("val", build_val_set)):
        try:
            sets[name] = build(cfg, root, info=info)
        except (DataError, ValueError) as e:  # a bad file is a finding, not a crash
            report.add(C.Finding(f"{name} set", C.ERROR, str(e)))
    checked = check_datasets(info, cfg.model.num_keypoints, sets.get("train"), sets.get("val"),
                             images="all" if args.all else "sample")
    report.add(*checked.findings)
    report.blocks += checked.blocks
    print(report.format(), end="")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
