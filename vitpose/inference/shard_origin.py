"""Where a shard file's records come from: the model (its file's SHA-256) and the source.

Every shard file's header records them (`vitpose.inference.units.ShardFile`), so that `vitpose
merge` refuses shard files of two models (a shard rerun after the model changed) or of two
sources (two folders with the same file names), and `--resume` refuses to continue another
model's file. No torch here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["ORIGIN_KEYS", "describe_origin", "model_identity", "origin_differences"]

ORIGIN_KEYS = ("model", "model_sha256", "source")

# Files of a model given by name (a published name, an HF repo id) are not hashed: the name is
# its identity (published weights are hash-checked on download; pin an HF repo with @revision).
_HASH_CHUNK = 1 << 22


def model_identity(model: str | os.PathLike | None, config: str | os.PathLike | None = None) -> dict:
    """{"model": as given, "model_sha256": hex or None} of a prediction's model: the SHA-256 of its
    file (an OpenVINO IR: its .xml and .bin; a folder: its files), and of `config` when that is a
    file (weights trained with another config are another model). The file, not the ModelSpec:
    two checkpoints of one architecture (a retrained model, a fine-tune) share their spec. It costs
    one read of the file (about 1.5 GB/s; ViTPose-H's 2.5 GB in under 2 s, from the page cache the
    model's loading filled) once per shard run."""
    if model is None:
        return {"model": None, "model_sha256": None}
    path = Path(model).expanduser()
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path] if path.is_file() else []
    if path.is_file() and path.suffix.lower() == ".xml" and path.with_suffix(".bin").is_file():
        files.append(path.with_suffix(".bin"))
    if config is not None and Path(config).expanduser().is_file():
        files.append(Path(config).expanduser())
    if not files:
        return {"model": str(model), "model_sha256": None}
    digest = hashlib.sha256()
    for file in files:
        with open(file, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
    return {"model": str(model), "model_sha256": digest.hexdigest()}


def describe_origin(origin: Mapping, what: str) -> str:
    if what == "model":
        sha = origin.get("model_sha256")
        return f"{origin.get('model')}" + (f" (sha256 {sha[:12]})" if sha else "")
    return str(origin.get("source"))


def origin_differences(a: Mapping, b: Mapping) -> Iterator[tuple[str, str, str]]:
    """(what, a's, b's) for the model and the source where both are known and differ; a model is
    compared by its file's hash when both have one (the same file under two paths is one model)."""
    if a.get("model") is not None and b.get("model") is not None:
        both_hashed = a.get("model_sha256") and b.get("model_sha256")
        key = "model_sha256" if both_hashed else "model"
        if a.get(key) != b.get(key):
            yield "the model", describe_origin(a, "model"), describe_origin(b, "model")
    if a.get("source") is not None and b.get("source") is not None and a["source"] != b["source"]:
        yield "the source", a["source"], b["source"]
