"""Label Studio's ML backend protocol: what `/setup`, `/predict` and `/health` read and answer.

Label Studio (its ML backend SDK, `label_studio_ml/api.py`) calls a backend with:
- `POST /setup` `{"project": "ID.TIMESTAMP", "schema": LABEL_CONFIG, "hostname", "access_token",
  "extra_params"}` when the backend is connected -> `{"model_version": ...}`;
- `POST /predict` `{"tasks": [{"id", "data": {"image": URL}}, ...], "project", "label_config",
  "params": {"context", ...}}` -> `{"results": [one prediction per task: {"result": [...],
  "score", "model_version"}]}`;
- `GET /health` -> `{"status": "UP", ...}`.

The prediction of a task is the one `vitpose predict --format labelstudio` writes for that image
(`vitpose.inference.records.labelstudio_tasks`): a `rectanglelabels` region per person and its
`keypointlabels` points, named after the project's labelling config (`LabellingNames`: the
`<KeyPointLabels>`, `<RectangleLabels>` and `<Image>` tags; docs/annotations.md's config by default).

A task's image is read from `--image-dir` (the task URL's file name, as `vitpose import-annotations`
reads it: `labelstudio_file_name`), or fetched from the Label Studio that `/setup` named (its
`hostname` and `access_token`, or `--labelstudio-url` and $LABEL_STUDIO_API_KEY): only URLs on that
host, never another, with the body limit and a timeout.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape as xml_escape

from vitpose.data.annotation_formats import labelstudio_file_name
from vitpose.errors import UserError

__all__ = ["LabelStudioAuth", "LabellingNames", "RequestError", "TaskImages", "is_personal_access_token",
           "labelling_config", "labelling_names", "origin"]

MODEL_VERSION = "vitpose"  # what `vitpose predict --format labelstudio` writes as `model_version`


class RequestError(UserError):
    """A request the server refuses: an HTTP status (`http_status`) and one line naming the problem.

    A `UserError`, as every refusal the server words itself: the application's one error handler
    answers it with its status (`vitpose.serve.app`); 502 and 504 say an upstream or the server was
    too slow, which is no bug either."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.http_status = status

    @property
    def status(self) -> int:
        return self.http_status


@dataclass(frozen=True)
class LabellingNames:
    """The names a prediction's regions carry (`to_labelstudio_tasks`' keywords) and the task data key."""

    # Names in the labelling config: the KeyPointLabels control and its values (empty: the model's
    # keypoint names), the RectangleLabels control and the label of a person's rectangle, the Image
    # object, and the task data field of the image's URL.
    keypoint_control: str = "keypoints"
    keypoint_labels: tuple[str, ...] = ()
    box_control: str = "person"
    box_label: str = "person"
    image_object: str = "image"
    data_key: str = "image"
    # The per-region <Choices> whose choice containing "occluded" marks a point occluded, and that
    # choice (a calibrated model's occluded points get it); None: the config has none to mark with.
    visibility_control: str | None = "visibility"
    occluded_choice: str = "occluded"

    def writer_names(self) -> dict:
        return {"keypoint_control": self.keypoint_control, "box_control": self.box_control,
                "image_object": self.image_object, "box_label": self.box_label,
                "visibility_control": self.visibility_control, "occluded_choice": self.occluded_choice}


def _tag(element) -> str:
    return element.tag.rsplit("}", 1)[-1].lower()


def labelling_names(label_config, keypoint_names) -> LabellingNames:
    """A project's labelling config (XML text; None or "": docs/annotations.md's) -> its names.

    Refused (422, one line): not XML, a DOCTYPE (no entities are expanded), no `<KeyPointLabels>`,
    its labels missing one of the model's keypoints."""
    if not label_config:
        return LabellingNames(keypoint_labels=tuple(keypoint_names))
    if not isinstance(label_config, str):
        raise RequestError(400, f"label_config must be the labelling config's XML text, got {type(label_config).__name__}")
    if "<!DOCTYPE" in label_config.upper() or "<!ENTITY" in label_config.upper():
        raise RequestError(422, "label_config: a DOCTYPE or ENTITY is not read; send the <View> config alone")
    try:
        root = ET.fromstring(label_config)
    except ET.ParseError as e:
        raise RequestError(422, f"label_config is not XML ({e})") from None
    elements = list(root.iter())
    points = next((e for e in elements if _tag(e) == "keypointlabels"), None)
    if points is None:
        raise RequestError(422, "label_config has no <KeyPointLabels>: use the labelling config of "
                                "docs/annotations.md (KeyPointLabels + RectangleLabels on one Image)")
    image_name = points.get("toName", "image")
    image = next((e for e in elements if _tag(e) == "image" and e.get("name") == image_name), None)
    data_key = (image.get("value", "$image") if image is not None else "$image").lstrip("$")
    labels = tuple(label.get("value") for label in points if _tag(label) == "label" and label.get("value"))
    missing = [name for name in keypoint_names if name not in labels]
    if missing:
        raise RequestError(422, f"label_config: <KeyPointLabels name={points.get('name')!r}> lacks the model's "
                                f"keypoints {missing[:5]}{' ...' if len(missing) > 5 else ''}: add a <Label> for each")
    box = next((e for e in elements if _tag(e) == "rectanglelabels" and e.get("toName", image_name) == image_name),
               None)
    box_label = next((label.get("value") for label in box if _tag(label) == "label" and label.get("value")),
                     "person") if box is not None else "person"
    occluded = next(((e.get("name"), c.get("value")) for e in elements
                     if _tag(e) == "choices" and e.get("perRegion", "").lower() == "true" and e.get("name")
                     for c in e if _tag(c) == "choice" and "occluded" in (c.get("value") or "").lower()), (None, ""))
    return LabellingNames(keypoint_control=points.get("name", "keypoints"),
                          box_control=box.get("name", "person") if box is not None else "person",
                          image_object=image_name, box_label=box_label, data_key=data_key, keypoint_labels=labels,
                          visibility_control=occluded[0], occluded_choice=occluded[1] or "occluded")


_JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")


def is_personal_access_token(key: str) -> bool:
    """A Label Studio 1.2x Personal Access Token (a JWT refresh token: three dot-separated base64url
    parts), not a legacy token (one hex key, sent as `Token KEY`)."""
    return bool(_JWT.fullmatch(key.strip()))


class _OffHost(Exception):
    """A redirect to another host than the one asked: never followed (the key would go with it)."""


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if origin(newurl) is None or origin(newurl) != origin(req.full_url):
            raise _OffHost(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class LabelStudioAuth:
    """The keys of Label Studio hosts (`keys`: origin -> key) and the requests that carry them.

    A legacy token goes as `Authorization: Token KEY`. A Personal Access Token (Label Studio 1.2x's
    default) is a refresh token: it is posted to `<host>/api/token/refresh/` as `{"refresh": KEY}`
    for a short-lived access token, sent as `Authorization: Bearer ACCESS` and renewed once on a 401.
    Redirects are followed only on the same scheme, host and port; a key goes to no other host."""

    def __init__(self, timeout: float = 10.0):
        self.timeout = float(timeout)
        self.keys: dict[str, str] = {}
        self.bases: dict[str, str] = {}  # origin -> the URL the key was given with (its API's root)
        self.fixed: set[str] = set()  # origins whose key came from the command line: kept
        self.access: dict[str, str] = {}
        self.opener = urllib.request.build_opener(_SameOriginRedirects)

    def give(self, url: str, key: str, fixed: bool = False) -> None:
        where = origin(url)
        if where is None or (where in self.fixed and not fixed):
            return
        if self.keys.get(where) != key:
            self.access.pop(where, None)
        self.keys[where], self.bases[where] = key, url
        if fixed:
            self.fixed.add(where)

    def get(self, url: str, where: str, limit: int = -1) -> bytes:
        """The body of GET `url` with its host's key; RequestError (502) names what failed."""
        host = origin(url)
        key = self.keys.get(host, "")
        for renew in (False, True):
            request = urllib.request.Request(url)
            if key:
                request.add_header("Authorization", self._authorization(host, key, where, renew))
            try:
                with self.opener.open(request, timeout=self.timeout) as response:  # noqa: S310 - host checked
                    return response.read(limit)
            except urllib.error.HTTPError as e:
                if e.code == 401 and not renew and is_personal_access_token(key):
                    continue  # the access token expired: one new one
                hint = ("; Label Studio 1.2x disables legacy tokens by default: give a Personal Access Token "
                        "($LABEL_STUDIO_API_KEY)" if e.code == 401 and key and not is_personal_access_token(key)
                        else "")
                raise RequestError(502, f"{where}: Label Studio answered {e.code} for {url}{hint}") from None
            except _OffHost as e:
                raise RequestError(502, f"{where}: Label Studio redirected {url} to {e.args[0]}, another host: "
                                        f"not followed (no key goes there)") from None
            except (urllib.error.URLError, TimeoutError, OSError) as e:
                raise RequestError(502, f"{where}: could not fetch {url} ({getattr(e, 'reason', e)})") from None
        raise AssertionError("unreachable")

    def _authorization(self, host: str, key: str, where: str, renew: bool) -> str:
        if not is_personal_access_token(key):
            return f"Token {key.strip()}"
        if renew or host not in self.access:
            self.access[host] = self._refresh(host, key.strip(), where)
        return f"Bearer {self.access[host]}"

    def _refresh(self, host: str, key: str, where: str) -> str:
        url = urllib.parse.urljoin(self.bases[host].rstrip("/") + "/", "api/token/refresh/")
        request = urllib.request.Request(url, data=json.dumps({"refresh": key}).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with self.opener.open(request, timeout=self.timeout) as response:  # noqa: S310 - host checked
                access = json.loads(response.read(2**20)).get("access")
        except urllib.error.HTTPError as e:
            raise RequestError(502, f"{where}: Label Studio answered {e.code} to the Personal Access Token at {url}: "
                                    f"make a new one (Account & Settings > Personal Access Token)") from None
        except _OffHost as e:
            raise RequestError(502, f"{where}: Label Studio redirected {url} to {e.args[0]}, another host: "
                                    f"not followed (no key goes there)") from None
        except (urllib.error.URLError, TimeoutError, OSError, ValueError, AttributeError) as e:
            raise RequestError(502, f"{where}: could not renew the access token at {url} "
                                    f"({getattr(e, 'reason', e)})") from None
        if not isinstance(access, str) or not access:
            raise RequestError(502, f"{where}: {url} answered no access token")
        return access


def labelling_config(keypoint_names) -> str:
    """The labelling config of a model's keypoints (XML text) that `/predict` answers as it is: an
    `<Image>` `image`, a `<RectangleLabels>` `person` and a `<KeyPointLabels>` `keypoints` with one
    `<Label>` per keypoint name, and the per-region occlusion choice `vitpose import-annotations` reads."""
    labels = "\n".join(f'    <Label value="{xml_escape(name, {chr(34): "&quot;"})}"/>' for name in keypoint_names)
    return ("<View>\n  <Image name=\"image\" value=\"$image\"/>\n"
            "  <RectangleLabels name=\"person\" toName=\"image\"><Label value=\"person\"/></RectangleLabels>\n"
            f"  <KeyPointLabels name=\"keypoints\" toName=\"image\">\n{labels}\n  </KeyPointLabels>\n"
            "  <Choices name=\"visibility\" toName=\"image\" perRegion=\"true\"><Choice value=\"occluded\"/></Choices>\n"
            "</View>\n")


def origin(url) -> str | None:
    """`scheme://host:port` of an http(s) URL (the default port written out), else None."""
    try:
        parts = urllib.parse.urlsplit(str(url).strip())
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return f"{parts.scheme}://{parts.hostname.lower()}:{port}"


class TaskImages:
    """The bytes of a task's image: from `image_dir`, a `data:` URL, or the Label Studio named by
    `labelstudio_url` or `/setup` (see the module docstring). `max_bytes` bounds every read.

    A key goes only to the host it was given for: `access_token` (else $LABEL_STUDIO_API_KEY) to
    `labelstudio_url`, `/setup`'s `access_token` to `/setup`'s `hostname` (`LabelStudioAuth`)."""

    def __init__(self, image_dir=None, labelstudio_url: str | None = None, access_token: str | None = None,
                 max_bytes: int = 0, timeout: float = 10.0):
        self.image_dir = Path(image_dir).resolve() if image_dir is not None else None
        self.labelstudio_url = labelstudio_url or None
        self.pinned = self.labelstudio_url is not None  # named on the command line: /setup never changes it
        self.max_bytes = int(max_bytes)
        self.timeout = float(timeout)
        self.auth = LabelStudioAuth(timeout)
        key = access_token or os.environ.get("LABEL_STUDIO_API_KEY") or None
        if self.pinned and key:
            self.auth.give(self.labelstudio_url, key, fixed=True)

    @property
    def access_token(self) -> str | None:
        """The key that goes to the Label Studio in use (None: no key)."""
        return self.auth.keys.get(origin(self.labelstudio_url)) if self.labelstudio_url else None

    def set_up(self, hostname, access_token, may_replace: bool = False) -> None:
        """`/setup`'s `hostname` and `access_token`. A host named on the command line is never
        replaced; otherwise the first `/setup` names the host, and a later one may name another only
        when `may_replace` (its caller sent the server's token), else 409. Its key goes to its own
        host only (a key from the command line wins there)."""
        if not hostname or not isinstance(hostname, str):
            return  # a key without its host is sent nowhere
        if origin(hostname) is None:
            raise RequestError(422, f"/setup: hostname {hostname[:80]!r} is not an http(s) URL")
        current = self.labelstudio_url
        if not self.pinned and current is not None and origin(hostname) != origin(current) and not may_replace:
            raise RequestError(409, f"/setup: the Label Studio host is already {current} (named by an earlier "
                                    f"/setup); restart vitpose serve with --labelstudio-url {hostname}, or with "
                                    f"--token so that an authenticated /setup may change it")
        if access_token and isinstance(access_token, str):
            self.auth.give(hostname, access_token)
        if not self.pinned:
            self.labelstudio_url = hostname

    def read(self, url: str, where: str) -> tuple[bytes, str]:
        """(image bytes, its file name) of a task's image URL; RequestError names the task."""
        if not isinstance(url, str) or not url:
            raise RequestError(422, f"{where}: data has no image URL")
        if url.startswith("data:"):
            return self._data_url(url, where), "image"
        name = labelstudio_file_name(url)
        if not name:
            raise RequestError(422, f"{where}: the image URL {url!r} names no file")
        if self.image_dir is not None:
            path = (self.image_dir / name).resolve()
            if not path.is_relative_to(self.image_dir):
                raise RequestError(422, f"{where}: the image URL {url!r} points outside --image-dir")
            if path.is_file():
                return self._file(path, where), Path(name).name
        if self.labelstudio_url is not None:
            return self._fetch(url, where), Path(name).name
        raise RequestError(422, f"{where}: image {name!r} not found"
                                + (f" in --image-dir {self.image_dir}" if self.image_dir is not None else "")
                                + "; start `vitpose serve` with --image-dir (Label Studio's local files or uploads "
                                  "folder) or --labelstudio-url")

    def _too_big(self, size: int, where: str) -> None:
        if self.max_bytes and size > self.max_bytes:
            raise RequestError(413, f"{where}: the image is {size} bytes, over the body limit of {self.max_bytes} "
                                    f"(--max-body-mb)")

    def _file(self, path: Path, where: str) -> bytes:
        self._too_big(path.stat().st_size, where)
        return path.read_bytes()

    def _data_url(self, url: str, where: str) -> bytes:
        head, _, payload = url.partition(",")
        if not head.endswith(";base64"):
            raise RequestError(422, f"{where}: a data: image URL must be base64")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(422, f"{where}: the data: image URL is not valid base64") from None
        self._too_big(len(data), where)
        return data

    def _fetch(self, url: str, where: str) -> bytes:
        base = urllib.parse.urlsplit(self.labelstudio_url)
        full = urllib.parse.urljoin(self.labelstudio_url.rstrip("/") + "/", url)
        if origin(full) is None or origin(full) != origin(self.labelstudio_url):
            raise RequestError(422, f"{where}: the image URL {url!r} is not on Label Studio's host "
                                    f"{base.scheme}://{base.netloc}; only its images are fetched")
        data = self.auth.get(full, where, self.max_bytes + 1 if self.max_bytes else -1)
        self._too_big(len(data), where)
        return data
