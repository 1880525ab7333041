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
import os
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from vitpose.data.annotation_formats import labelstudio_file_name
from vitpose.errors import UserError

__all__ = ["LabellingNames", "RequestError", "TaskImages", "labelling_names"]

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

    def writer_names(self) -> dict:
        return {"keypoint_control": self.keypoint_control, "box_control": self.box_control,
                "image_object": self.image_object, "box_label": self.box_label}


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
    return LabellingNames(keypoint_control=points.get("name", "keypoints"),
                          box_control=box.get("name", "person") if box is not None else "person",
                          image_object=image_name, box_label=box_label, data_key=data_key, keypoint_labels=labels)


class TaskImages:
    """The bytes of a task's image: from `image_dir`, a `data:` URL, or the Label Studio named by
    `/setup` or `labelstudio_url` (see the module docstring). `max_bytes` bounds every read."""

    def __init__(self, image_dir=None, labelstudio_url: str | None = None, access_token: str | None = None,
                 max_bytes: int = 0, timeout: float = 10.0):
        self.image_dir = Path(image_dir).resolve() if image_dir is not None else None
        self.labelstudio_url = labelstudio_url or None
        self.access_token = access_token or os.environ.get("LABEL_STUDIO_API_KEY") or None
        self.max_bytes = int(max_bytes)
        self.timeout = float(timeout)

    def set_up(self, hostname, access_token) -> None:
        """`/setup`'s `hostname` and `access_token` (a command-line `--labelstudio-url` wins)."""
        if hostname and isinstance(hostname, str) and self.labelstudio_url is None:
            self.labelstudio_url = hostname
        if access_token and isinstance(access_token, str):
            self.access_token = access_token

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
        target = urllib.parse.urlsplit(full)
        if (target.scheme, target.netloc) != (base.scheme, base.netloc) or target.scheme not in ("http", "https"):
            raise RequestError(422, f"{where}: the image URL {url!r} is not on Label Studio's host "
                                    f"{base.scheme}://{base.netloc}; only its images are fetched")
        request = urllib.request.Request(full)
        if self.access_token:
            request.add_header("Authorization", f"Token {self.access_token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 - host checked above
                data = response.read(self.max_bytes + 1 if self.max_bytes else -1)
        except urllib.error.HTTPError as e:
            raise RequestError(502, f"{where}: Label Studio answered {e.code} for {full}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            raise RequestError(502, f"{where}: could not fetch {full} ({getattr(e, 'reason', e)})") from None
        self._too_big(len(data), where)
        return data
