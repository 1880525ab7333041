"""Which labels look wrong: rank the labelled people of a COCO file by how likely a label error is.

The model predicts each labelled person in the label's own box (the one top-down pipeline, flip
test on: `predict_image`, `audit_annotations`, resumable), then every person is judged against that
prediction with what the file itself teaches (`vitpose.labelling.calibration`) by the checks of
`vitpose.labelling.checks` (swap, facing, far, visibility, bones, box; their module says how each
is scored); `ranked` orders the people by suspicion 1 - prod(1 - check), `review_records` makes the
flagged people pre-annotations and `html_report` a page with their crops drawn. A high score is a
reason to look, not proof: where the model is wrong, the label may be right.

A model with a calibration (`vitpose calibrate`) gives each keypoint `p` (the probability that it
is right) and a three-state `visibility`; the progress lines keep them, and `ranked` then judges
with p in place of the raw score and checks the labels' visibility flags against the model's own
states instead of learning P(hidden) from the file. Without them it is as it always was.

The names of the parts (`read_labels`, `LabelledImage`, `Calibration`, `calibrate`, `audit_instance`,
`suspicion`, ...) are importable from here too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vitpose.labelling.calibration import (  # noqa: F401 - what the file teaches, importable from here too
    FACING_FOLDS,
    FACING_MIN_PEOPLE,
    VISIBILITY_FEATURES,
    VISIBILITY_FOLDS,
    VISIBILITY_MIN_LABELS,
    Calibration,
    bone_lengths,
    bone_statistics,
    calibrate,
    facing_features,
    facing_probabilities,
    facing_side,
    fit_logistic,
    flag_surprise,
    hidden_probabilities,
    logistic,
    visibility_features,
)
from vitpose.labelling.checks import (  # noqa: F401 - the checks of one person, importable from here too
    BONES_WORST,
    BONES_Z,
    BONES_Z_SPAN,
    FACING_ALONE,
    FAR_WORST,
    SWAP_MARGIN,
    VISIBILITY_Z,
    VISIBILITY_Z_SPAN,
    audit_instance,
    suspicion,
)
from vitpose.labelling.labels import LabelledImage, read_labels

__all__ = ["Calibration", "LabelledImage", "audit_instance", "audit_annotations", "calibrate", "calibrated_lines", "ranked",
           "read_labels", "suspicion"]


def predict_image(predictor, image_rgb: np.ndarray, labelled: LabelledImage) -> dict:
    """The model on the image's labelled people in their label boxes (flip test on): the
    flip-averaged keypoints (M, K, 2) and scores (M, K), and how far apart the plain and the
    mirrored views put each keypoint, over the box's size (M, K): where the two views part, the
    model itself is unsure and its prediction is no evidence against the label."""
    views = predictor.flip_views(image_rgb, boxes=labelled.boxes, box_format="xywh")
    size = np.sqrt(np.maximum(labelled.boxes[:, 2] * labelled.boxes[:, 3], 1.0))[:, None]
    apart = np.hypot(*np.moveaxis(views.plain - views.mirrored, -1, 0)) / size
    line = {"predicted": np.round(views.poses.keypoints, 2).tolist(),
            "scores": np.round(views.poses.keypoint_scores, 4).tolist(), "views_apart": np.round(apart, 4).tolist(),
            "plain_scores": np.round(views.plain_scores, 4).tolist(),
            "mirrored_scores": np.round(views.mirrored_scores, 4).tolist()}
    p, visibility = getattr(views.poses, "keypoint_p", None), getattr(views.poses, "keypoint_visibility", None)
    if p is not None:  # a calibrated model's fields; never invented for one without
        line["p"] = np.round(np.asarray(p, np.float64), 4).tolist()
    if visibility is not None:
        line["visibility"] = np.asarray(visibility).astype(int).tolist()
    return line


def audit_annotations(predictor, labels: list[LabelledImage], images_dir: Path, progress: Path, *,
                      resume: bool = False, stop=None):
    """Predict every labelled image (`predict_image`), each image's line streamed to `progress` (JSON Lines,
    `ResultsFile`: an interrupted run keeps what it finished, `resume=True` continues it).
    Returns ({image file_name: its progress line}, completed)."""
    from vitpose.files import read_image
    from vitpose.inference.pipeline import read_records
    from vitpose.inference.writers import ResultsFile

    results = ResultsFile(progress, "image", resume=resume)
    lines = {line["image"]: line for line in read_records(progress)} if results.done else {}
    completed = False
    try:
        for labelled in labels:
            if labelled.file_name in results.done:
                continue
            if stop is not None and stop():
                break
            image = read_image(Path(images_dir) / labelled.file_name)
            line = {"image": labelled.file_name, "annotation_ids": labelled.annotation_ids,
                    **predict_image(predictor, np.ascontiguousarray(image[:, :, ::-1]), labelled)}
            results.write([line])
            lines[labelled.file_name] = line
        else:
            completed = True
    finally:
        results.close(completed)
    return lines, completed


def ranked(labels: list[LabelledImage], lines: dict, skeleton) -> list[dict]:
    """Every audited person (`audit_instance`, calibrated on the whole file), most suspicious
    first (ties: the larger sum of checks, then file order): rows of annotation_id, image, suspicion, checks, reasons, keypoints.
    Lines of a calibrated model (every one with `p` / `visibility`): p stands in for the raw score,
    and the model's visibility states for the P(hidden) learnt from the file."""
    lines = calibrated_lines(lines)
    states = all("visibility" in line for line in lines.values())
    calibration = calibrate(labels, lines)
    hidden = None if states else hidden_probabilities(labels, lines, calibration)
    facing = facing_probabilities(labels, skeleton)
    bones = bone_statistics(labels, skeleton)
    rows = []
    for image in labels:
        line = lines[image.file_name]
        for m, annotation_id in enumerate(image.annotation_ids):
            checks, reasons, flagged = audit_instance(image.keypoints[m], image.boxes[m], line["predicted"][m],
                                                      line["scores"][m], line["views_apart"][m], skeleton,
                                                      calibration, None if hidden is None else hidden[image.file_name, m],
                                                      None if facing is None else facing[image.file_name, m], bones,
                                                      visibility=line["visibility"][m] if states else None)
            rows.append({"annotation_id": annotation_id, "image": image.file_name,
                         "suspicion": round(suspicion(checks), 4), "checks": checks, "reasons": reasons,
                         "keypoints": flagged})
    return sorted(rows, key=lambda row: (-row["suspicion"], -sum(row["checks"].values())))


def calibrated_lines(lines: dict) -> dict:
    """The progress lines with a calibrated model's `p` as their `scores` when every line carries it
    (the raw scores kept as `raw_scores`); the lines as they are otherwise."""
    if not lines or not all("p" in line for line in lines.values()):
        return lines
    return {name: {**line, "scores": line["p"], "raw_scores": line["scores"]} for name, line in lines.items()}


def review_records(flagged: list[dict], labels: list[LabelledImage], lines: dict, names) -> list[dict]:
    """Pre-annotation records (as `vitpose predict --json` writes them) of the flagged people for
    `to_labelstudio_tasks` / `to_cvat_xml`: the label's keypoints with score 1, the keypoints a
    check named and the unlabelled ones (the prediction's place) with score 0, so the tool marks
    them for review."""
    by_image = {image.file_name: image for image in labels}
    records = []
    for row in flagged:
        image = by_image[row["image"]]
        m = image.annotation_ids.index(row["annotation_id"])
        label = image.keypoints[m]
        predicted = np.asarray(lines[row["image"]]["predicted"][m])
        named = {name for name, _, _ in row["keypoints"]}
        flat = []
        for k, name in enumerate(names):
            x, y, v = label[k]
            if v > 0:
                flat += [float(x), float(y), 0.0 if name in named else 1.0]
            else:
                flat += [float(predicted[k][0]), float(predicted[k][1]), 0.0]
        records.append({"file_name": image.file_name, "width": image.width, "height": image.height,
                        "bbox": [float(b) for b in image.boxes[m]], "keypoints": flat, "score": row["suspicion"],
                        "bbox_score": 1.0})
    return records


def html_report(rows: list[dict], labels: list[LabelledImage], lines: dict, images_dir: Path, skeleton,
                title: str) -> str:
    """A page a person reads: one table row per instance (rank, image, suspicion, checks, reasons)
    with the label and the model's prediction drawn on the person's crop."""
    import base64
    import html

    import cv2

    from vitpose.files import read_image
    from vitpose.inference.draw import draw_pose

    by_image = {image.file_name: image for image in labels}
    cache: dict = {}
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>{html.escape(title)}</title>",
           "<style>body{font-family:sans-serif}td{vertical-align:top;padding:4px;border-bottom:1px solid #ccc}"
           "img{height:200px}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
           "<p>Most suspicious first. Left: the label; right: the model's prediction (flip test, the label's "
           "box). A high score is a reason to look, not proof.</p>",
           "<table><tr><th>#</th><th>image / annotation</th><th>suspicion</th><th>checks</th><th>reasons</th>"
           "<th>label | model</th></tr>"]
    for rank, row in enumerate(rows, 1):
        image = by_image[row["image"]]
        m = image.annotation_ids.index(row["annotation_id"])
        if row["image"] not in cache:
            cache.clear()
            cache[row["image"]] = read_image(Path(images_dir) / row["image"])
        pixels = cache[row["image"]]
        label = image.keypoints[m]
        predicted = np.asarray(lines[row["image"]]["predicted"][m])
        scores = np.asarray(lines[row["image"]]["scores"][m])
        x, y, w, h = image.boxes[m]
        pad = 0.15 * max(w, h)
        x1, y1 = int(max(0, x - pad)), int(max(0, y - pad))
        x2, y2 = int(min(pixels.shape[1], x + w + pad)), int(min(pixels.shape[0], y + h + pad))
        crops = []
        for keypoints, shown in ((label[:, :2], (label[:, 2] > 0).astype(np.float32)), (predicted, scores)):
            drawn = draw_pose(pixels, keypoints, shown, skeleton=skeleton.skeleton, channels="bgr",
                              keypoint_colors=skeleton.keypoint_colors, link_colors=skeleton.link_colors)
            crop = drawn[y1:max(y2, y1 + 1), x1:max(x2, x1 + 1)]
            ok, encoded = cv2.imencode(".jpg", crop)
            crops.append(f"<img src='data:image/jpeg;base64,{base64.b64encode(encoded.tobytes()).decode()}'>"
                         if ok else "")
        checks = ", ".join(f"{name} {value:.2f}" for name, value in row["checks"].items() if value > 0) or "-"
        reasons = "<br>".join(html.escape(str(r)) for r in row["reasons"]) or "-"
        # every value from the input files is escaped: a COCO file must not put markup in the page
        out.append(f"<tr><td>{rank}</td><td>{html.escape(str(row['image']))}<br>id "
                   f"{html.escape(str(row['annotation_id']))}</td>"
                   f"<td>{row['suspicion']:.2f}</td><td>{html.escape(checks)}</td><td>{reasons}</td>"
                   f"<td>{''.join(crops)}</td></tr>")
    out += ["</table></body></html>"]
    return "\n".join(out) + "\n"
