"""Build the training crop cache of a run config (see vitpose/data/crop_cache.py).

    vitpose build-crop-cache --config configs/vitpose-s_coco_256x192.yaml [--set k=v ...]

The training set comes from the same config -> dataset builder as train.py
(`vitpose.builders.build_train_set`, without a cache), so the cache is built for exactly the
instances and crop size the run will use; the cache then stores the regions of that set's
`CocoIndex`. It is written to `data.crop_cache` under `data.root` (or `--out`); set
`data.crop_cache` in the config to train from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vitpose build-crop-cache",
                                 description="Build the training crop cache of a config's data "
                                             "(written to data.root / data.crop_cache, or --out).")
    ap.add_argument("--config", required=True, help="YAML run config (as for train.py)")
    ap.add_argument("--data-root", default=None, help="dataset root (default: data.root of the config)")
    ap.add_argument("--out", help="cache directory (default: data.crop_cache under the data root)")
    ap.add_argument("--workers", type=int, default=None, help="decoding processes (default: cores, max 8)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="override a config field (repeatable)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from vitpose.builders import build_train_set
    from vitpose.config import ConfigError, load_config
    from vitpose.data.crop_cache import build_crop_cache

    try:
        cfg = load_config(args.config, args.set)
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    root = Path(args.data_root or cfg.data.root)
    out = Path(args.out) if args.out else (root / cfg.data.crop_cache if cfg.data.crop_cache else None)
    if out is None:
        print("error: no cache path: set data.crop_cache in the config or pass --out", file=sys.stderr)
        return 2
    # The set the run trains on, minus the cache this command is about to (re)build.
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, crop_cache=None))
    train_set = build_train_set(cfg, root)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    info = build_crop_cache(train_set.index, train_set.img_dir, out, train_set.input_size,
                            num_workers=args.workers)
    print(f"crop cache {out}: {info['instances']} instances in {info['regions']} regions, "
          f"{info['bytes'] / 2 ** 20:.1f} MiB ({info['bytes_per_instance'] / 1024:.0f} KiB per instance), "
          f"{info['images_left_out']} unreadable images left out, {info['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
