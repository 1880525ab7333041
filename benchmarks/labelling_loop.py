"""The labelling loop on the demo's synthetic set: does `vitpose audit` find planted label errors?

    python benchmarks/labelling_loop.py audit --model WORK/best.pth --root SYNTH [--fraction 0.05]

`corrupt_coco` plants errors in a COCO keypoint file, a fraction of the labelled people each,
in turn: a left/right swap (every flip pair exchanged, as when an annotator mirrors a person),
a shift (three labelled keypoints moved by 20 % of the box's size in a random direction), a
visibility flip (four labelled keypoints: v 2 <-> 1). Only people with at least 8 labelled
keypoints are corrupted (a swap of a person with two labelled points is no error anyone could see).
`audit` then ranks every person; the figure is the recall of the corrupted people in its top k
(k = the number corrupted) against the recall of random rankings (mean of 1000 shuffles).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

CORRUPTIONS = ("swap", "shift", "visibility")


def corrupt_coco(src: Path, dst: Path, flip_indices, fraction: float = 0.05, seed: int = 0) -> dict[int, str]:
    """Write `src` with errors planted to `dst`; returns {annotation id: corruption}."""
    doc = json.loads(Path(src).read_text())
    rng = np.random.default_rng(seed)
    flip = np.asarray(flip_indices)
    people = [a for a in doc["annotations"] if not a.get("iscrowd") and a["num_keypoints"] > 0]
    eligible = [a for a in people if a["num_keypoints"] >= 8]
    count = max(1, round(fraction * len(people)))
    chosen = rng.choice(len(eligible), size=count, replace=False)
    planted = {}
    for n, index in enumerate(sorted(chosen)):
        ann = eligible[index]
        kind = CORRUPTIONS[n % len(CORRUPTIONS)]
        kpts = np.asarray(ann["keypoints"], np.float64).reshape(-1, 3)
        labelled = np.flatnonzero(kpts[:, 2] > 0)
        if kind == "swap":
            kpts = kpts[flip]
        elif kind == "shift":
            x, y, w, h = ann["bbox"]
            for k in rng.choice(labelled, size=min(3, len(labelled)), replace=False):
                angle = rng.uniform(0, 2 * np.pi)
                kpts[k, 0] += 0.2 * w * np.cos(angle)
                kpts[k, 1] += 0.2 * h * np.sin(angle)
        else:
            for k in rng.choice(labelled, size=min(4, len(labelled)), replace=False):
                kpts[k, 2] = 1 if kpts[k, 2] == 2 else 2
        ann["keypoints"] = [round(float(v), 2) for v in kpts.ravel()]
        planted[ann["id"]] = kind
    Path(dst).write_text(json.dumps(doc))
    return planted


def top_k_recall(ranking: list[int], planted) -> float:
    k = len(planted)
    return sum(annotation_id in planted for annotation_id in ranking[:k]) / k


def random_recall(ids: list[int], planted, draws: int = 1000, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    return float(np.mean([top_k_recall(list(rng.permutation(ids)), planted) for _ in range(draws)]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("audit",))
    parser.add_argument("--model", required=True)
    parser.add_argument("--root", required=True, type=Path, help="the synthetic set (annotations/, val2017/)")
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("work_dirs/labelling_loop"))
    args = parser.parse_args(argv)
    from vitpose.data.metainfo import dataset_info

    args.work.mkdir(parents=True, exist_ok=True)
    corrupted = args.work / "corrupted.json"
    planted = corrupt_coco(args.root / "annotations/person_keypoints_val2017.json", corrupted,
                           dataset_info("coco").flip_indices, args.fraction, args.seed)
    report = args.work / "audit.json"
    for stale in (report, report.with_name(report.name + ".progress.jsonl")):
        stale.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "vitpose", "audit", "--model", args.model, "--annotations", str(corrupted),
                    "--images", str(args.root / "val2017"), "--out", str(report), "--out",
                    str(args.work / "audit.html"), "--tasks", str(args.work / "review.json"), "--device", "cpu"],
                   check=True)
    ranking = [row["annotation_id"] for row in json.loads(report.read_text())["ranking"]]
    found = top_k_recall(ranking, planted)
    chance = random_recall(ranking, planted)
    by_kind = {kind: sum(1 for i in ranking[: len(planted)] if planted.get(i) == kind) for kind in CORRUPTIONS}
    print(f"planted {len(planted)} errors in {len(ranking)} people ({dict(zip(*np.unique(list(planted.values()), return_counts=True)))}); "
          f"audit top-{len(planted)} recall {found:.2f} (found per kind {by_kind}); random ranking {chance:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
