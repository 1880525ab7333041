"""The files 3D and behaviour tools read, written from a run's records (`vitpose predict --format`,
`vitpose convert`): OpenPose's per-frame JSON (Pose2Sim), DeepLabCut's table (anipose / aniposelib,
sleap-io), AlphaPose's JSON (MotionBERT) and NWB with ndx-pose (neuroscience archives, sleap-io).

`write_pose_format(records, fmt, path, skeleton, stem=, fps=)` is the one writer of each format;
`PoseFormatFile` is a results writer of the one protocol (`begin / add / end / close`, a
`vitpose.inference.writers.ResultsFile` whose records are written at the end) that calls it, so
`vitpose predict --format F` and `vitpose convert RUN.jsonl --format F` write the same file.

The per-keypoint confidence of every format is the calibrated probability `p` where the records
have it, else the keypoint score. What is missing is each tool's own "missing": 0, 0, 0 in OpenPose
and AlphaPose, NaN (an empty cell) in DeepLabCut and NWB. Keypoint names and limbs come from the
model's skeleton. Every output is written beside its place and renamed into it (a folder for
OpenPose); pandas + PyTables (`.h5`, extra `dlc`) and pynwb + ndx-pose (extra `nwb`) load only
for those outputs. No torch here.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np

from vitpose.errors import UserError, missing_extra, require_extra
from vitpose.files import atomic_path, replace_dir, write_atomic
from vitpose.files.paths import TEMP_SUFFIX
from vitpose.inference.pose_table import PoseTable, pose_table
from vitpose.inference.writers import ResultsFile

__all__ = ["IMAGE_FORMATS", "POSE_FORMATS", "PoseFormatFile", "dlc_frame", "output_kind", "write_pose_format"]

POSE_FORMATS = ("openpose", "dlc", "alphapose", "nwb")
IMAGE_FORMATS = ("openpose", "dlc", "alphapose")  # NWB holds time series: videos only
SCORER = "vitpose"
OPENPOSE_VERSION = 1.3
DLC_SUFFIXES = (".csv", ".h5")
_OPENPOSE_EMPTY = ("face_keypoints_2d", "hand_left_keypoints_2d", "hand_right_keypoints_2d", "pose_keypoints_3d",
                   "face_keypoints_3d", "hand_left_keypoints_3d", "hand_right_keypoints_3d")


class PoseFormatError(UserError):
    """An output of `--format openpose|dlc|alphapose|nwb` that cannot be written as asked (one line)."""


def output_kind(fmt: str) -> str:
    """"dir" for OpenPose (one file per frame), else "file"."""
    return "dir" if fmt == "openpose" else "file"


def check_format_output(fmt: str, path, flag: str, video: bool) -> None:
    """What the format needs of its output and source, before any work (`PoseFormatError`)."""
    if fmt not in POSE_FORMATS:
        raise ValueError(f"format must be one of {POSE_FORMATS}, got {fmt!r}")
    if fmt == "nwb" and not video:
        raise PoseFormatError(f"--format nwb holds the time series of a video; for images use "
                              f"{' | '.join(IMAGE_FORMATS)}")
    if fmt == "openpose":
        _check_openpose_folder(Path(path).expanduser(), flag)
    suffix = Path(path).suffix.lower()
    if fmt == "dlc" and suffix not in DLC_SUFFIXES:
        raise PoseFormatError(f"{flag} {path}: --format dlc writes DeepLabCut's .csv or .h5; name the file so")
    # the optional packages before the work, not after an hour of video
    if fmt == "dlc" and suffix == ".h5":
        require_extra("--format dlc with a .h5 file", ("pandas", "tables"), "dlc")
    if fmt == "nwb":
        require_extra("--format nwb", ("pynwb", "ndx_pose"), "nwb")


def _check_openpose_folder(path: Path, flag: str) -> None:
    """OpenPose's folder is replaced whole: an existing one may hold nothing but OpenPose's files
    (an earlier run's), never a user's other files, the run's inputs or the working folder."""
    if not path.is_dir():
        return
    other = min((entry.name for entry in os.scandir(path)
                 if not (entry.name.endswith("_keypoints.json") and entry.is_file(follow_symlinks=False))), default=None)
    if other is not None:
        raise PoseFormatError(f"{flag} {path}: OpenPose's folder is replaced whole, and this one holds other files "
                              f"({other}); name a new folder (or an earlier OpenPose one)")


def _finite_or(values: np.ndarray, fill: float) -> list[float]:
    return [fill if not np.isfinite(v) else float(v) for v in values.ravel()]


# ---------------------------------------------------------------------------------------------
# OpenPose: one <stem>_<frame:012d>_keypoints.json per frame (per image: <image stem>_keypoints.json)


def openpose_files(table: PoseTable, stem: str) -> dict[str, dict]:
    """{file name: OpenPose's JSON} per frame or image. With track ids every file lists every track
    in id order (`person_id` [id]; a track absent from the frame is all zeros, OpenPose's "not
    detected"), so people[n] is one person in every frame, as Pose2Sim reads them; without track ids
    the people of the frame in order, `person_id` [-1]."""
    tracked = any(t is not None for t in table.track_ids)
    files = {}
    for row, (label, name) in enumerate(zip(table.labels, _openpose_names(table, stem))):
        people = []
        for column, track in enumerate(table.track_ids):
            if not tracked and not table.present[row, column]:
                continue
            xyc = np.concatenate([table.xy[row, column], table.confidence[row, column][:, None]], axis=1)
            missing = ~np.isfinite(xyc).all(axis=1)
            xyc[missing] = 0.0  # OpenPose writes an undetected keypoint as 0, 0, 0
            people.append({"person_id": [track if tracked else -1], "pose_keypoints_2d": _finite_or(xyc, 0.0),
                           **{key: [] for key in _OPENPOSE_EMPTY}})
        files[name] = {"version": OPENPOSE_VERSION, "people": people}
    return files


def _openpose_names(table: PoseTable, stem: str) -> list[str]:
    """OpenPose's file names: <stem>_<frame:012d>_keypoints.json, or <image stem>_keypoints.json (the
    whole name, dots as underscores, for images whose stems are alike: a.jpg and a.png)."""
    if table.video:
        return [f"{stem}_{label:012d}_keypoints.json" for label in table.labels]
    stems = [Path(str(label)).stem for label in table.labels]
    return [f"{s if stems.count(s) == 1 else Path(str(label)).name.replace('.', '_')}_keypoints.json"
            for s, label in zip(stems, table.labels)]


def _write_openpose(table: PoseTable, path: Path, stem: str) -> None:
    files = openpose_files(table, stem)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent))
    try:
        for name, content in files.items():
            (staged / name).write_text(json.dumps(content), encoding="utf-8")
        os.chmod(staged, 0o777 & ~_umask())
        replace_dir(staged, path)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---------------------------------------------------------------------------------------------
# AlphaPose: one JSON list of COCO-like results


def alphapose_records(table: PoseTable) -> list[dict]:
    """AlphaPose's results: per person `image_id` (a frame's "N.jpg", as AlphaPose names video
    frames, or the image's file name), `category_id` 1, `keypoints` [x, y, c] * K (0 where missing),
    `score`, `box` [x, y, w, h] and `idx` (the track id, with track ids)."""
    out = []
    for row, label in enumerate(table.labels):
        for column, track in enumerate(table.track_ids):
            if not table.present[row, column]:
                continue
            xyc = np.concatenate([table.xy[row, column], table.confidence[row, column][:, None]], axis=1)
            xyc[~np.isfinite(xyc).all(axis=1)] = 0.0
            record = {"image_id": f"{label}.jpg" if table.video else str(label), "category_id": 1,
                      "keypoints": _finite_or(xyc, 0.0), "score": _finite_or(table.scores[row, column], 0.0)[0],
                      "box": _finite_or(table.boxes[row, column], 0.0)}
            if track is not None:
                record["idx"] = track
            out.append(record)
    return out


# ---------------------------------------------------------------------------------------------
# DeepLabCut: scorer / (individuals /) bodyparts / coords columns, x, y, likelihood


def _dlc_columns(table: PoseTable, names) -> tuple[list[tuple[str, ...]], list[str], np.ndarray]:
    """The column tuples, the level names and the (T, columns) values of the DeepLabCut table: one
    individual (`single`) is the single-animal layout aniposelib reads, else the multi-animal one."""
    single = table.single
    used = table.one_column() if single else table
    levels = ["scorer", "bodyparts", "coords"] if single else ["scorer", "individuals", "bodyparts", "coords"]
    columns, blocks = [], []
    for column, individual in enumerate(used.individuals):
        for k, name in enumerate(names):
            for coord in ("x", "y", "likelihood"):
                columns.append((SCORER, name, coord) if single else (SCORER, individual, name, coord))
            blocks.append(np.stack([used.xy[:, column, k, 0], used.xy[:, column, k, 1],
                                    used.confidence[:, column, k]], axis=1))
    values = np.concatenate(blocks, axis=1) if blocks else np.zeros((len(table.labels), 0))
    return columns, levels, values


def dlc_csv(table: PoseTable, names) -> str:
    """The DeepLabCut CSV as DeepLabCut (pandas' `to_csv`) writes it: one header row per column
    level, its name first; then a row per frame (its index) or image (its file name); NaN empty."""
    columns, levels, values = _dlc_columns(table, names)
    out = io.StringIO()
    for level, name in enumerate(levels):
        out.write(",".join([name, *(_csv_cell(c[level]) for c in columns)]) + "\n")
    for label, row in zip(table.labels, values):
        out.write(",".join([_csv_cell(str(label)), *("" if not np.isfinite(v) else repr(float(v)) for v in row)])
                  + "\n")
    return out.getvalue()


def _csv_cell(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n\r') else text


def dlc_frame(table: PoseTable, names):
    """The DeepLabCut table as a pandas DataFrame (the `.h5`; needs pandas)."""
    import pandas as pd

    columns, levels, values = _dlc_columns(table, names)
    index = pd.Index(table.labels)
    return pd.DataFrame(values, index=index, columns=pd.MultiIndex.from_tuples(columns, names=levels))


def _write_dlc(table: PoseTable, path: Path, names) -> None:
    if path.suffix.lower() == ".csv":
        write_atomic(path, dlc_csv(table, names))
        return
    try:
        import pandas  # noqa: F401
        import tables  # noqa: F401 - pandas' HDF5 writer
    except ImportError as e:
        raise missing_extra("--format dlc with a .h5 file", e.name or "tables", "dlc") from None
    frame = dlc_frame(table, names)
    with atomic_path(path) as tmp:
        frame.to_hdf(tmp, key="df_with_missing", format="table", mode="w")  # DeepLabCut's key


# ---------------------------------------------------------------------------------------------
# NWB with ndx-pose


def _write_nwb(table: PoseTable, path: Path, skeleton, fps: float, source: str) -> None:
    try:
        from ndx_pose import PoseEstimation, PoseEstimationSeries, Skeleton, Skeletons
        from pynwb import NWBHDF5IO, NWBFile
    except ImportError as e:
        raise missing_extra("--format nwb", e.name or "ndx_pose", "nwb") from None
    if not fps or fps <= 0:
        raise PoseFormatError("--format nwb needs the video's frame rate (vitpose convert --fps)")
    nwbfile = NWBFile(session_description=f"poses of {source} by vitpose", identifier=str(uuid.uuid4()),
                      session_start_time=datetime.datetime.now(datetime.timezone.utc))
    limbs = np.asarray(skeleton.skeleton, dtype=np.uint16).reshape(-1, 2)
    nodes = list(skeleton.keypoint_names)
    model_skeleton = Skeleton(name=skeleton.name or "skeleton", nodes=nodes, edges=limbs)
    behavior = nwbfile.create_processing_module(name="behavior", description="poses estimated by vitpose")
    behavior.add(Skeletons(skeletons=[model_skeleton]))
    used = table.one_column() if table.single else table
    timestamps = np.asarray(used.labels, np.float64) / float(fps)
    for column, individual in enumerate(used.individuals):
        series = []
        for k, name in enumerate(nodes):
            series.append(PoseEstimationSeries(
                name=name, description=f"{name} of {individual}", data=used.xy[:, column, k], unit="pixels",
                reference_frame="(0, 0) is the top left corner of the video frame; x to the right, y down",
                timestamps=timestamps if not series else series[0], confidence=used.confidence[:, column, k],
                confidence_definition="calibrated probability that the keypoint is where predicted where the "
                                      "model has one, else the heatmap maximum"))
        behavior.add(PoseEstimation(
            name="PoseEstimation" if len(used.individuals) == 1 else f"PoseEstimation_{individual}",
            pose_estimation_series=series, description=f"{individual} in {source}", scorer=SCORER,
            source_software="vitpose", skeleton=model_skeleton))
    with atomic_path(path) as tmp, NWBHDF5IO(str(tmp), mode="w") as nwb:
        nwb.write(nwbfile)


# ---------------------------------------------------------------------------------------------
# The one writer


def _check_skeleton(table: PoseTable, skeleton, flag: str) -> None:
    if table.num_keypoints and table.num_keypoints != len(skeleton.keypoint_names):
        raise PoseFormatError(f"the records have {table.num_keypoints} keypoints but the skeleton {skeleton.name!r} "
                              f"names {len(skeleton.keypoint_names)}; give the model's skeleton ({flag})")


def write_pose_format(records: list[dict], fmt: str, path, skeleton, stem: str = "video", fps: float | None = None,
                      source: str = "", video: bool | None = None, flag: str = "--out",
                      skeleton_flag: str = "--config") -> Path:
    """The records of one run (a video, or a folder of images) as `fmt` at `path` (a folder for
    openpose; .csv or .h5 for dlc; a .json for alphapose; a .nwb for nwb). skeleton: a
    `DatasetInfo` (keypoint names, limbs); stem: the video's name (OpenPose's file names); fps: the
    frame rate (NWB's timestamps); video: whether the run is a video's (None: as its records say);
    flag / skeleton_flag: the options named in a refusal. Returns the path."""
    path = Path(path)
    if fmt == "openpose" and (not stem or Path(stem).name != stem):
        # the stem is part of every file's name: a folder in it would write outside `path`
        raise PoseFormatError(f"--stem {stem!r}: OpenPose's files are <stem>_<frame>_keypoints.json inside {flag} "
                              f"{path}; give a name without a folder")
    table = pose_table(records, len(skeleton.keypoint_names))
    _check_skeleton(table, skeleton, skeleton_flag)
    check_format_output(fmt, path, flag, table.video if video is None else video)
    if fmt == "openpose":
        _write_openpose(table, path, stem)
    elif fmt == "alphapose":
        write_atomic(path, json.dumps(alphapose_records(table)))
    elif fmt == "dlc":
        _write_dlc(table, path, skeleton.keypoint_names)
    else:
        _write_nwb(table, path, skeleton, fps, source or stem)
    return path


class PoseFormatFile(ResultsFile):
    """`vitpose predict --format openpose|dlc|alphapose|nwb`: the one writer protocol, the records
    kept until `close`, then written by `write_pose_format` (an existing output is replaced only by
    a completed run; a stopped run writes the frames done where nothing was)."""

    def __init__(self, path, fmt: str, skeleton, stem: str = "video", fps: float | None = None, source: str = "",
                 video: bool = False):
        super().__init__(path, "frame" if video else "file_name", array=True, flag="--json")
        self.fmt, self.skeleton, self.stem, self.fps, self.source, self.video = fmt, skeleton, stem, fps, source, video

    def _close_array(self, completed: bool) -> Path:
        if not completed and self.existed:
            return self.path  # the earlier output stays; nothing of the stopped run replaces it
        return write_pose_format(self.records, self.fmt, self.path, self.skeleton, stem=self.stem, fps=self.fps,
                                 source=self.source, video=self.video, flag="--json")
