"""Preflight checks of a keypoint dataset: the mistakes that otherwise train silently to nothing.

Users of ViTPose-style trainers report the same failure again and again: a keypoint count or a flip
table that does not fit the file gives all-zero target weights, a loss of zero and AP 0, with no
error anywhere. The checks here look for that and its relatives before any training:

- `check_skeleton`: the skeleton's K equals the model's (and the file's), its flip indices are a
  permutation that is its own inverse (a set of swaps), and which of its facts are defaults;
- `check_keypoints`: per-joint label counts, joints never labelled, the share of instances with no
  visible keypoint, keypoints that look normalised to [0, 1] instead of pixels;
- `box_size_histogram`: how big the instances are (sqrt of the box area, COCO's size bands);
- `check_targets`: the training targets of a spread of instances, made by the real augmentation
  and codec; all of them zero is an error (nothing would be learnt);
- `check_images`: the images decode and have their recorded size (a sample, or all of them).

Each returns `Finding`s (check, status, detail); `CheckReport` collects them with the text blocks
(per-joint table, histogram) and prints one table. The command line is `python -m
vitpose.cli.check_data --config CFG [--all]` (vitpose/cli/check_data.py); train.py runs the fast version
(`vitpose.engine.preflight.preflight`) before its first step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import DataError
from .keypoint_sides import twin_name
from .metainfo import DatasetInfo

OK, WARN, ERROR = "ok", "warn", "ERROR"
SAMPLE_IMAGES = 64  # images decoded by a sampled image check
TARGET_SAMPLES = 64  # instances whose training targets are made by check_targets
# sqrt(box area) bands: COCO's small/medium/large limits (32, 96) and a few more.
BOX_SIZE_EDGES = (0, 16, 32, 64, 96, 128, 256, 512, float("inf"))


@dataclass(frozen=True)
class Finding:
    """One line of the report: what was checked, ok/warn/ERROR, and what was found."""

    check: str
    status: str
    detail: str


@dataclass
class CheckReport:
    """The findings of the checks run on one or more datasets, and the text blocks they made."""

    findings: list[Finding] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)

    def add(self, *findings: Finding) -> None:
        self.findings.extend(findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.status == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.status == WARN]

    def format(self, blocks: bool = True) -> str:
        """The findings as a table, then (with `blocks`) the per-joint table and histograms."""
        width = max([len(f.check) for f in self.findings] + [5])
        lines = [f"{'check'.ljust(width)}  status  detail", "-" * (width + 40)]
        for f in self.findings:
            lines.append(f"{f.check.ljust(width)}  {f.status.ljust(6)}  {f.detail}")
        summary = (f"{len(self.errors)} error(s), {len(self.warnings)} warning(s), "
                   f"{len(self.findings) - len(self.errors) - len(self.warnings)} ok")
        return "\n".join(lines + [summary] + ([""] + self.blocks if blocks else [])).rstrip() + "\n"

    def raise_on_error(self) -> None:
        """DataError naming every failed check (nothing when there is none)."""
        if self.errors:
            detail = "; ".join(f"{f.check}: {f.detail}" for f in self.errors)
            raise DataError(f"preflight found {len(self.errors)} error(s): {detail}")


# ------------------------------------------------------------------------------ skeleton

def flip_problem(flip_indices, K: int) -> str | None:
    """Why `flip_indices` is not a set of left/right swaps over K keypoints, or None."""
    flip = [int(i) for i in flip_indices]
    if len(flip) != K:
        return f"{len(flip)} flip indices for {K} keypoints"
    outside = [i for i in flip if not 0 <= i < K]
    if outside:
        return f"flip index {outside[0]} is out of range 0..{K - 1}"
    if sorted(flip) != list(range(K)):
        twice = next(i for i in flip if flip.count(i) > 1)
        return f"not a permutation: index {twice} is the mirror of two keypoints"
    for i in range(K):
        if flip[flip[i]] != i:
            return f"not its own inverse: {i} -> {flip[i]} -> {flip[flip[i]]}"
    return None


def check_skeleton(info: DatasetInfo, model_keypoints: int | None = None,
                   file_keypoints: int | None = None) -> list[Finding]:
    """K of the skeleton = K of the model = K of the annotation file; the flip table; defaults."""
    K = info.num_keypoints
    out = [Finding("skeleton", OK, f"{info.name!r}: {K} keypoints, {len(info.flip_pairs)} flip pairs, "
                                   f"{len(info.skeleton)} limbs ({info.source})")]
    if model_keypoints is not None:
        ok = int(model_keypoints) == K
        out.append(Finding("K model = skeleton", OK if ok else ERROR,
                           f"model {model_keypoints}, skeleton {K}" + ("" if ok else
                           f": the model would predict the wrong joints; set model.num_keypoints: {K}")))
    if file_keypoints is not None:
        ok = int(file_keypoints) == K
        out.append(Finding("K file = skeleton", OK if ok else ERROR, f"file {file_keypoints}, skeleton {K}"))
    problem = flip_problem(info.flip_indices, K)
    out.append(Finding("flip indices", ERROR if problem else OK,
                       problem or "a permutation and its own inverse (left/right swaps)"))
    odd = [] if problem else unlike_twins(info)
    if odd:
        out.append(Finding("flip pairs by name", WARN, "; ".join(odd[:4]) + (" ..." if len(odd) > 4 else "")
                           + " (a wrong pair teaches the model to swap joints)"))
    if not info.upper_body_ids and not info.lower_body_ids:
        out.append(Finding("half-body sets", WARN, "none: half-body augmentation is off (add upper_body / "
                                                   "lower_body to a skeleton YAML to use it)"))
    if "sigmas" in info.defaulted and info.metric == "coco-oks":  # PCK and PCKh do not use them
        out.append(Finding("OKS sigmas", WARN, f"default {info.sigmas[0]:.4f} for every keypoint (the mean of "
                                               "COCO's): AP depends on them, set `sigmas` in a skeleton YAML"))
    return out


def unlike_twins(info: DatasetInfo) -> list[str]:
    """Flip pairs that the names contradict: a side-named keypoint mirrored to something other
    than its name twin, or kept in place although its twin is there."""
    names, position = info.keypoint_names, {n: i for i, n in enumerate(info.keypoint_names)}
    found = []
    for i, j in enumerate(info.flip_indices):
        twin = twin_name(names[i])
        if twin is None or twin not in position or position[twin] == j:
            continue
        found.append(f"{names[i]!r} mirrors to itself although {twin!r} exists" if i == j
                     else f"{names[i]!r} mirrors to {names[j]!r}, not {twin!r}")
    return found


# ------------------------------------------------------------------------------ labels

def check_keypoints(dataset, info: DatasetInfo, name: str = "train") -> tuple[list[Finding], str]:
    """Per-joint label counts, unlabelled joints, instances with no visible keypoint, and
    coordinates that look normalised. Returns (findings, the per-joint table)."""
    ix = dataset.index
    if not ix.has_keypoints:
        return [Finding(f"{name} labels", OK, "detected boxes: no labels to check")], ""
    vis = np.asarray(ix.keypoints_visible) > 0
    n = len(vis)
    counts = vis.sum(axis=0)
    out = []
    never = [info.keypoint_names[k] for k in np.flatnonzero(counts == 0)]
    if never:
        out.append(Finding(f"{name} joints labelled", WARN if len(never) < len(counts) else ERROR,
                           f"never labelled in {n} instances: {', '.join(never[:8])}"
                           f"{' ...' if len(never) > 8 else ''} (no target, nothing learnt for them)"))
    else:
        out.append(Finding(f"{name} joints labelled", OK, f"every joint in {int(counts.min())}..{int(counts.max())} "
                                                          f"of {n} instances"))
    empty = int(np.count_nonzero(vis.sum(axis=1) == 0))
    share = empty / max(n, 1)
    out.append(Finding(f"{name} no visible keypoint", ERROR if empty == n else WARN if share > 0.2 else OK,
                       f"{empty} of {n} instances ({100 * share:.1f}%)"))
    labelled = ix.keypoints[vis]
    boxes = np.asarray(ix.bbox_xyxy)
    box_px = float(np.median(np.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]))) if n else 0.0
    if len(labelled) and box_px > 10 and np.mean(np.all((labelled >= 0) & (labelled <= 1.5), axis=1)) > 0.9:
        out.append(Finding(f"{name} keypoint units", ERROR, "labelled keypoints lie in [0, 1] while boxes are "
                                                            f"~{box_px:.0f} px: keypoints must be in pixels"))
    cats = np.unique(np.asarray(ix.category_ids))
    if len(cats) > 1:
        out.append(Finding(f"{name} categories", OK, f"{len(cats)} category ids (kept per instance)"))
    width = max(len(s) for s in info.keypoint_names)
    rows = [f"{name}: labelled instances per joint (of {n})"]
    for k, label in enumerate(info.keypoint_names):
        bar = "#" * int(round(30 * counts[k] / max(n, 1)))
        rows.append(f"  {k:3d} {label.ljust(width)} {int(counts[k]):7d} {100 * counts[k] / max(n, 1):5.1f}% {bar}")
    return out, "\n".join(rows)


def box_size_histogram(dataset, name: str = "train") -> tuple[Finding, str]:
    """Instances by sqrt(box area) in pixels; a set of tiny boxes is worth a warning."""
    boxes = np.asarray(dataset.index.bbox_xyxy, np.float64)
    size = np.sqrt(np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None))
    counts, _ = np.histogram(size, bins=np.asarray(BOX_SIZE_EDGES))
    rows = [f"{name}: instances by box size sqrt(w h) in pixels (of {len(size)})"]
    peak = max(int(counts.max()), 1)
    for lo, hi, c in zip(BOX_SIZE_EDGES[:-1], BOX_SIZE_EDGES[1:], counts):
        band = f"{int(lo)}-{int(hi)}" if np.isfinite(hi) else f">={int(lo)}"
        rows.append(f"  {band:>9} {int(c):7d} {'#' * int(round(30 * c / peak))}")
    small = float(np.mean(size < 32)) if len(size) else 0.0
    status = WARN if small > 0.5 else OK
    finding = Finding(f"{name} box sizes", status, f"median {np.median(size):.0f} px, {100 * small:.0f}% under 32 px"
                      + (" (crops of tiny boxes are mostly blur)" if status == WARN else ""))
    return finding, "\n".join(rows)


# ------------------------------------------------------------------------------ targets

def spread(n: int, count: int) -> list[int]:
    """`count` indices spread evenly over range(n) (all of them when n <= count)."""
    if n <= count:
        return list(range(n))
    return sorted(set(np.linspace(0, n - 1, count).round().astype(int).tolist()))


def check_targets(dataset, samples: int = TARGET_SAMPLES, epoch: int = 0) -> list[Finding]:
    """The keypoint weights of the training targets of a spread of instances, made by the
    dataset's own augmentation (epoch `epoch`'s draws) and codec, without decoding images.

    All zero is an ERROR: the loss would be zero and nothing would be learnt (the silent failure
    of a wrong keypoint count, flip table or visibility column).
    """
    if not getattr(dataset, "train", False) or not dataset.index.has_keypoints:
        return []
    from .transforms import transform_points

    picked = spread(len(dataset), samples)
    totals, zero = [], 0
    for i in picked:
        geo = dataset.augment_geometry(i, np.random.default_rng((dataset.seed, epoch, i)))
        kpts = transform_points(geo["keypoints"], geo["matrix"])
        weights = dataset.target_weights(kpts, geo["keypoints_visible"])
        total = float(np.sum(weights))
        totals.append(total)
        zero += total == 0
    if not picked:
        return []
    if not any(totals):
        return [Finding("training targets", ERROR,
                        f"all-zero keypoint weights for all {len(picked)} sampled instances: the loss would be 0 "
                        "and nothing learnt (check the visibility column, K and the flip table of the skeleton)")]
    status = WARN if zero / len(picked) > 0.5 else OK
    return [Finding("training targets", status,
                    f"{len(picked) - zero} of {len(picked)} sampled instances have targets; mean "
                    f"{np.mean(totals):.1f} weighted joints each")]


# ------------------------------------------------------------------------------ images

def check_images(dataset, mode: str = "sample", name: str = "train", limit: int = SAMPLE_IMAGES,
                 max_listed: int = 3) -> list[Finding]:
    """Decode the dataset's images ("sample": `limit` spread over the set, "all", "off") and
    check their size against the records. Every failure is counted, the first few are named."""
    if mode == "off" or len(dataset) == 0:
        return []
    # the first instance of every image, in order
    _, first = np.unique(np.asarray(dataset.index.image_index), return_index=True)
    first = np.sort(first).tolist()
    instances = first if mode != "sample" else [first[j] for j in spread(len(first), limit)]
    bad = []
    for i in instances:
        try:
            dataset.read_image(i)
        except DataError as e:
            bad.append(str(e))
    what = f"{len(instances)} of {len(first)} images" + (" (sample; --all for every one)" if mode == "sample" else "")
    if not bad:
        return [Finding(f"{name} images", OK, f"{what} decoded at their recorded size")]
    listed = "; ".join(bad[:max_listed]) + (" ..." if len(bad) > max_listed else "")
    # Training skips unreadable images (up to data.max_bad_images) and validation stops at the
    # first; none readable at all is a wrong folder either way.
    tolerated = getattr(dataset, "train", False) and len(bad) < len(instances)
    return [Finding(f"{name} images", WARN if tolerated else ERROR, f"{len(bad)} unreadable of {what}"
                    + (" (training skips them, up to data.max_bad_images)" if tolerated else "") + f": {listed}")]
