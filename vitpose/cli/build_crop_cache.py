"""Build the training crop cache of a run config (see vitpose/data/crop_cache.py).

    vitpose build-crop-cache --config configs/vitpose-s_coco_256x192.yaml [--set k=v ...]

The training set comes from the same config -> dataset builder as `vitpose train`
(`vitpose.builders.build_train_set`, without a cache), so the cache is built for exactly the
instances and crop size the run will use; the cache then stores the regions of that set's
`CocoIndex`. It is written to `data.crop_cache` under `data.root` (or `--out`); set
`data.crop_cache` in the config to train from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from vitpose.builders import build_train_set
from vitpose.config import load_config
from vitpose.data.crop_cache import build_crop_cache
from vitpose.errors import UserError


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("build-crop-cache", help="build the crop cache of a config's training set",
                              shared=("--config", "--set", "--debug"), description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, metavar="FILE|NAME", help="run config: a YAML file or a shipped config's name (as for vitpose train)")
    p.add_argument("--data-root", default=None, help="dataset root (default: data.root of the config)")
    p.add_argument("--out", help="cache directory (default: data.crop_cache under the data root)")
    p.add_argument("--workers", type=int, default=None, help="decoding processes (default: cores, max 8)")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    cfg = load_config(args.config, args.overrides)
    root = Path(args.data_root or cfg.data.root)
    out = Path(args.out) if args.out else (root / cfg.data.crop_cache if cfg.data.crop_cache else None)
    if out is None:
        raise UserError("no cache path: set data.crop_cache in the config or pass --out")
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
