"""Published ViTPose weights by name, and any Hugging Face repo by id: `list_models()`, `download(name)`,
`download_hf(repo_id, revision)`.

Two kinds of host, each through its own library's cache so that the usual settings work:
- MMPose 1.x checkpoints on MMPose's download server go to the torch.hub cache
  (`$TORCH_HOME/hub/checkpoints/<file>`, default `~/.cache/torch/hub/checkpoints`). The file name
  carries the first 8 hex digits of the file's SHA-256 (OpenMMLab's `publish_model` convention);
  the download is checked against them and a file that fails is never left in the cache.
- Hugging Face repos (`usyd-community/vitpose-*`, or any `org/repo[@revision]`) go through
  `huggingface_hub.hf_hub_download`, so `HF_HOME`, `HF_HUB_CACHE` and `HF_HUB_OFFLINE=1` behave as
  in every HF library.

Offline: a cached file is used without any network access. `HF_HUB_OFFLINE=1` also keeps the
torch.hub names off the network. A name that is neither cached nor downloadable raises
`DownloadError` (one line) saying which file to fetch, from where, and where to put it.

A network that accepts connections and never answers cannot hang a run: every connection and
every read waits at most `VITPOSE_DOWNLOAD_TIMEOUT` seconds (default 30), and an MMPose download
is tried `VITPOSE_DOWNLOAD_TRIES` times (default 3, a second's pause between tries) before the one
line; huggingface_hub retries its requests by itself (5 times, waits of 1 to 8 s).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vitpose.errors import UserError, missing_extra
from vitpose.files import atomic_file

__all__ = ["DownloadError", "ModelInfo", "UnknownModelError", "WeightsNotFoundError", "download", "download_hf",
           "download_url", "hf_config", "is_cached_download", "is_offline", "list_models", "lookup", "parse_repo_id"]

MMPOSE_URL = "https://download.openmmlab.com/mmpose/v1/body_2d_keypoint/topdown_heatmap/coco/"
HF_FILENAME = "model.safetensors"
HF_CONFIG = "config.json"
WEIGHT_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors", ".ckpt")
TIMEOUT_ENV, TRIES_ENV = "VITPOSE_DOWNLOAD_TIMEOUT", "VITPOSE_DOWNLOAD_TRIES"
DEFAULT_TIMEOUT_S, DEFAULT_TRIES = 30.0, 3
# An HF repo id, optionally pinned: `org/repo` or `org/repo@revision` (a branch, tag or commit).
REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")


class WeightsNotFoundError(UserError, FileNotFoundError):
    """A weights file path that does not exist."""


class UnknownModelError(UserError, ValueError):
    """A model name that is neither a published name nor an existing file."""


class DownloadError(UserError, RuntimeError):
    """Weights that are not cached and could not be downloaded (offline, no network, bad hash)."""


@dataclass(frozen=True)
class ModelInfo:
    """One published checkpoint.

    name: what `download` and `Predictor.from_pretrained` take. size: `build_model`'s name
    ("vitpose-s" ...). decoder: "classic" | "simple". dataset: what it was trained on.
    source: "mmpose" (MMPose's server, torch.hub) | "huggingface". location: the URL or the
    repo id. sha256_prefix: the digits the download is checked against (MMPose files).
    coco_ap: COCO val2017 AP with MMPose's detection boxes, as the host publishes it (None:
    not published with the file). plus: a ViTPose+ (mixture-of-experts) file.
    """

    name: str
    size: str
    decoder: str
    dataset: str
    source: str
    location: str
    sha256_prefix: str | None = None
    coco_ap: float | None = None
    plus: bool = False

    @property
    def filename(self) -> str:
        return self.location.rsplit("/", 1)[-1] if self.source == "mmpose" else HF_FILENAME


def _mmpose(name, size, decoder, stem, sha, date, ap):
    url = f"{MMPOSE_URL}td-hm_ViTPose-{stem}_8xb64-210e_coco-256x192-{sha}_{date}.pth"
    return ModelInfo(name, size, decoder, "coco", "mmpose", url, sha, ap)


def _hf(name, size, decoder, repo, dataset="coco", plus=False):
    return ModelInfo(name, size, decoder, dataset, "huggingface", f"usyd-community/{repo}", plus=plus)


# MMPose 1.3.2's configs/body_2d_keypoint/topdown_heatmap/coco/vitpose_coco.yml (URLs and AP);
# the HF repos of the usyd-community organisation (converted from the official ViTPose release).
# ViT-B exists on both hosts: the short names are HF's (faster CDN, the names HF users know),
# MMPose's files are "-mmpose".
_TABLE = (
    _mmpose("vitpose-s", "vitpose-s", "classic", "small", "62d7a712", "20230314", 0.739),
    _mmpose("vitpose-s-simple", "vitpose-s", "simple", "small-simple", "4c101a76", "20230314", 0.736),
    _hf("vitpose-b", "vitpose-b", "classic", "vitpose-base"),
    _hf("vitpose-b-simple", "vitpose-b", "simple", "vitpose-base-simple"),
    _mmpose("vitpose-b-mmpose", "vitpose-b", "classic", "base", "216eae50", "20230314", 0.757),
    _mmpose("vitpose-b-simple-mmpose", "vitpose-b", "simple", "base-simple", "0b8234ea", "20230407", 0.756),
    _mmpose("vitpose-l", "vitpose-l", "classic", "large", "53609f55", "20230314", 0.782),
    _mmpose("vitpose-l-simple", "vitpose-l", "simple", "large-simple", "3a7ee9e1", "20230314", 0.780),
    _mmpose("vitpose-h", "vitpose-h", "classic", "huge", "e32adcd4", "20230314", 0.788),
    _mmpose("vitpose-h-simple", "vitpose-h", "simple", "huge-simple", "ffd48c05", "20230314", 0.789),
    _hf("vitpose-b-coco-aic-mpii", "vitpose-b", "classic", "vitpose-base-coco-aic-mpii", "coco+aic+mpii"),
    _hf("vitpose-plus-s", "vitpose-s", "classic", "vitpose-plus-small", "6 datasets (ViTPose+)", plus=True),
    _hf("vitpose-plus-b", "vitpose-b", "classic", "vitpose-plus-base", "6 datasets (ViTPose+)", plus=True),
    _hf("vitpose-plus-l", "vitpose-l", "classic", "vitpose-plus-large", "6 datasets (ViTPose+)", plus=True),
    _hf("vitpose-plus-h", "vitpose-h", "classic", "vitpose-plus-huge", "6 datasets (ViTPose+)", plus=True),
)
MODELS: dict[str, ModelInfo] = {info.name: info for info in _TABLE}


def list_models() -> list[ModelInfo]:
    """Every published name with its size, decoder, dataset and source."""
    return list(MODELS.values())


def format_model_table() -> str:
    """`list_models()` as a plain-text table (for messages and the command line)."""
    rows = [("name", "size", "decoder", "dataset", "source", "COCO AP")]
    for m in MODELS.values():
        rows.append((m.name, m.size, m.decoder, m.dataset, m.source, f"{m.coco_ap:.3f}" if m.coco_ap else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def is_offline() -> bool:
    """HF_HUB_OFFLINE=1 (or TRANSFORMERS_OFFLINE=1): no network for any name, HF's or MMPose's."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def download_settings() -> tuple[float, int]:
    """(seconds per connection or read, tries) from VITPOSE_DOWNLOAD_TIMEOUT / VITPOSE_DOWNLOAD_TRIES."""
    def number(name, default, kind):
        text = os.environ.get(name, "").strip()
        try:
            value = kind(text) if text else default
        except ValueError:
            value = 0
        if value <= 0:
            raise UserError(f"{name}={text!r}: expected a positive number (default {default})")
        return value

    return float(number(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, float)), int(number(TRIES_ENV, DEFAULT_TRIES, int))


def _looks_like_path(text: str) -> bool:
    return os.sep in text or text.endswith(WEIGHT_SUFFIXES) or text.startswith(".")


def parse_repo_id(text: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) of `org/repo[@revision]`, or None when `text` is not one."""
    m = REPO_ID.match(str(text))
    if m is None or str(text).endswith(WEIGHT_SUFFIXES):
        return None
    return m.group("repo"), m.group("revision")


def lookup(name: str) -> ModelInfo:
    """The published checkpoint called `name` (any case); UnknownModelError: one line with the closest names."""
    key = str(name).strip().lower()
    if key in MODELS:
        return MODELS[key]
    close = difflib.get_close_matches(key, list(MODELS), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise UnknownModelError(f"unknown model {name!r}: {hint}Give a weights file, an HF repo id (org/repo), or "
                            f"a name of vitpose.hub.list_models(): {', '.join(MODELS)}")


def download(name_or_path: str | os.PathLike, progress: bool = True, check_hash: bool = True) -> Path:
    """The local path of a published checkpoint (downloaded once, then cached), or a user's own file.

    Args:
        name_or_path: a name from `list_models()` (any case) or the path of an existing weights file.
        progress: show the download's progress bar.
        check_hash: check an MMPose download against the SHA-256 prefix in its file name.
    Raises:
        FileNotFoundError: a path (it has a directory part or a weights suffix) that does not exist.
        UnknownModelError: neither a file nor a published name (the message names the closest).
        DownloadError: not cached and not downloadable; the message says what to fetch and where.
    """
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    text = str(name_or_path)
    if text.lower() not in MODELS and _looks_like_path(text):
        raise WeightsNotFoundError(f"weights file not found: {text} (and it is not a model name; see "
                                   f"vitpose.hub.list_models())")
    info = lookup(text)
    if info.source == "huggingface":
        return download_hf(info.location, name=info.name)
    return _download_torch_hub(info, progress, check_hash)


def torch_hub_path(info: ModelInfo) -> Path:
    """Where torch.hub keeps (or will keep) an MMPose checkpoint."""
    import torch.hub

    return Path(torch.hub.get_dir()) / "checkpoints" / info.filename


def is_cached_download(path: str | os.PathLike) -> bool:
    """Whether `path` lies in the torch.hub checkpoints cache or the Hugging Face cache."""
    import torch.hub

    path = Path(path).absolute()
    roots = [Path(torch.hub.get_dir()) / "checkpoints"]
    try:
        from huggingface_hub import constants

        roots.append(Path(constants.HF_HUB_CACHE))
    except ImportError:
        pass
    return any(path.is_relative_to(root.absolute()) for root in roots)


def _download_torch_hub(info: ModelInfo, progress: bool, check_hash: bool) -> Path:
    target = torch_hub_path(info)
    if target.is_file():
        return target  # checked when it was downloaded, as torch.hub does
    return download_url(info.location, target, info.sha256_prefix if check_hash else None, info.name, progress)


def download_url(url: str, target: Path, sha256_prefix: str | None = None, name: str | None = None,
                 progress: bool = True, alternative: str = "") -> Path:
    """`url` into the cache file `target` (torch.hub's layout), checked against `sha256_prefix`, with
    the timeout and tries above; DownloadError (one line: the URL, the manual fix and `alternative`)
    when it cannot."""
    name = name or target.name
    how = (f"fetch {url} into {target} once with network access, e.g. "
           f"`curl -L --create-dirs -o {target} {url}`{alternative}")
    if is_offline():
        raise DownloadError(f"{name} is not in the torch.hub cache and HF_HUB_OFFLINE is set: {how}")
    timeout, tries = download_settings()
    for attempt in range(1, tries + 1):
        try:
            fetch_url(url, target, sha256_prefix, timeout, progress)
            return target
        except HashMismatch as e:
            raise DownloadError(f"{name}: the download from {url} failed its SHA-256 check ({e}); nothing was "
                                f"cached. Retry, or pass check_hash=False if you trust the server's file.") from None
        except OSError as e:  # timeouts, URLError, connection refused, DNS, disk
            error = e
            if attempt < tries:
                time.sleep(1.0)
    reason = getattr(error, "reason", None) or error
    raise DownloadError(f"{name} could not be downloaded after {tries} tries with a {timeout:g} s timeout "
                        f"({type(error).__name__}: {reason}); {how}") from None


def matches_hash(path: Path, sha256_prefix: str) -> bool:
    """Whether the file's SHA-256 starts with `sha256_prefix`."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest().startswith(sha256_prefix)


class HashMismatch(ValueError):
    """A downloaded file whose SHA-256 does not start with the expected digits."""


def fetch_url(url: str, target: Path, sha256_prefix: str | None, timeout: float, progress: bool = False) -> None:
    """Download `url` to `target` through a temporary file beside it, moved into place only whole and,
    with `sha256_prefix`, only when its SHA-256 starts with those digits. `timeout` bounds the
    connection and every read (urllib applies it to each socket operation)."""
    digest = hashlib.sha256()
    # the cache file appears only whole and checked: any error (a stalled read, a wrong hash) inside
    # the block leaves no file behind (vitpose.files.atomic_file)
    with atomic_file(target) as out, urllib.request.urlopen(url, timeout=timeout) as response:
        total, done, shown = int(response.headers.get("Content-Length") or 0), 0, -1
        while chunk := response.read(1 << 20):
            out.write(chunk)
            digest.update(chunk)
            done += len(chunk)
            if progress and total and done * 10 // total != shown:
                shown = done * 10 // total
                print(f"\r{target.name}: {done / 2**20:.0f} of {total / 2**20:.0f} MiB", end="", flush=True)
        if progress and shown >= 0:
            print()
        if sha256_prefix and not digest.hexdigest().startswith(sha256_prefix):
            raise HashMismatch(f"SHA-256 {digest.hexdigest()[:12]}..., expected {sha256_prefix}...")


def download_hf(repo_id: str, revision: str | None = None, filename: str = HF_FILENAME,
                name: str | None = None) -> Path:
    """One file of an HF repo through `huggingface_hub` (its cache, offline mode and token), with the
    timeout and tries above; DownloadError (one line: the URL and the manual fix) when it cannot."""
    try:
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RemoteEntryNotFoundError
    except ImportError:
        raise missing_extra(f"downloading {name or repo_id} from the Hugging Face Hub", "huggingface_hub") from None
    at = f"@{revision}" if revision else ""
    url = f"{constants.ENDPOINT}/{repo_id}/resolve/{revision or 'main'}/{filename}"
    timeout, _ = download_settings()  # huggingface_hub retries by itself (5 times, backing off up to 8 s)
    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, etag_timeout=timeout,
                                    endpoint=constants.ENDPOINT))
    except RemoteEntryNotFoundError:
        raise  # the repo has no such file (hf_config: no config.json)
    except LocalEntryNotFoundError as e:
        reason = ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else
                  f"the Hub could not be reached ({timeout:g} s timeout, retried)")
        raise DownloadError(
            f"{name or repo_id + at} ({repo_id}/{filename}{at}) is not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}) and {reason}. Fetch it once with network access: "
            f"`hf download {repo_id} {filename}{' --revision ' + revision if revision else ''}` "
            f"(or from {url}); then offline runs (HF_HUB_OFFLINE=1) find it. ({type(e).__name__})") from None
    except HfHubHTTPError as e:
        raise DownloadError(f"{name or repo_id + at}: the Hub refused {url}: {str(e).splitlines()[0]}") from None
    except OSError as e:  # a read that timed out after the connection was made, a full disk
        raise DownloadError(f"{name or repo_id + at}: {url} could not be downloaded ({type(e).__name__}: {e}); "
                            f"fetch it with `hf download {repo_id} {filename}`, or retry") from None


def hf_config(repo_id: str, revision: str | None = None) -> dict | None:
    """The repo's `config.json` as a dict, or None when the repo has none or it cannot be fetched
    (the weights' shapes then tell the model)."""
    import json

    from huggingface_hub.errors import RemoteEntryNotFoundError

    try:
        path = download_hf(repo_id, revision, HF_CONFIG)
    except (RemoteEntryNotFoundError, DownloadError):
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise DownloadError(f"{path}: the cached {repo_id} {HF_CONFIG} cannot be read ({e}); delete it and run "
                            f"again") from None
