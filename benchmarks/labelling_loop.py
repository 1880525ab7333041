"""The labelling loop on the demo's synthetic set: does `vitpose audit` find planted label errors?

    python benchmarks/labelling_loop.py audit --model WORK/best.pth --root SYNTH [--fraction 0.05] [--seeds 0 1 2]

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


def hard_video(root: Path, path: Path, boxes_path: Path, images: int = 8, hold: int = 5, hard_every: int = 4,
               seed: int = 0) -> set[int]:
    """A video of `images` synthetic validation images, each held for `hold` frames drifting 2 px a
    frame; every `hard_every`-th frame made hard (a grey occluder over half of each person's box,
    or a strong blur, in turn). Writes the GT boxes as a `--boxes` file keyed by frame; returns the
    hard frames."""
    import cv2

    doc = json.loads((root / "annotations/person_keypoints_val2017.json").read_text())
    rng = np.random.default_rng(seed)
    writer, hard, boxes, frame = None, set(), [], 0
    for image in doc["images"][:images]:
        pixels = cv2.imread(str(root / "val2017" / image["file_name"]))
        people = [a["bbox"] for a in doc["annotations"] if a["image_id"] == image["id"] and a["num_keypoints"] > 0]
        if writer is None:
            writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, pixels.shape[1::-1])
        for t in range(hold):
            shifted = np.roll(pixels, 2 * t, axis=1)
            if frame % hard_every == hard_every - 1:
                hard.add(frame)
                if len(hard) % 2:
                    for x, y, w, h in people:
                        x0 = int(x + 2 * t + rng.uniform(0, 0.5) * w)
                        y0 = int(y + rng.uniform(0, 0.5) * h)
                        shifted[y0:y0 + int(h / 2), x0:x0 + int(w / 2)] = 128
                else:
                    shifted = cv2.GaussianBlur(shifted, (0, 0), 6)
            writer.write(shifted)
            boxes += [{"frame": frame, "bbox": [x + 2 * t, y, w, h], "score": 1.0} for x, y, w, h in people]
            frame += 1
    writer.release()
    boxes_path.write_text(json.dumps(boxes))
    return hard


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("audit", "select", "finetune"))
    parser.add_argument("--epochs", type=int, default=10, help="finetune: epochs of each fine-tuning")
    parser.add_argument("--repeats", type=int, default=2, help="finetune: runs of each arm (seeds / random draws)")
    parser.add_argument("--count", type=int, default=8, help="select: frames to choose")
    parser.add_argument("--model", required=True)
    parser.add_argument("--root", required=True, type=Path, help="the synthetic set (annotations/, val2017/)")
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0, help="select, finetune: the seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="audit: corruption seeds (the first through the command, the others re-ranked)")
    parser.add_argument("--work", type=Path, default=Path("work_dirs/labelling_loop"))
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.what == "select":
        return select_figure(args)
    if args.what == "finetune":
        return finetune_figure(args)
    return audit_figure(args)


def audit_figure(args) -> int:
    """The first seed's corruption through the command; the others re-rank the same predictions
    with the command's own ranking (`ranked`): the model's predictions in the label boxes do not
    depend on the labels, and no corruption moves a box."""
    from vitpose.data.metainfo import dataset_info
    from vitpose.inference.pipeline import read_records
    from vitpose.labelling.audit import ranked, read_labels

    info = dataset_info("coco")
    report = args.work / "audit.json"
    progress = report.with_name(report.name + ".progress.jsonl")
    recalls, chances = [], []
    for n, seed in enumerate(args.seeds):
        corrupted = args.work / f"corrupted{seed}.json"
        planted = corrupt_coco(args.root / "annotations/person_keypoints_val2017.json", corrupted, info.flip_indices,
                               args.fraction, seed)
        if n == 0:
            for stale in (report, progress):
                stale.unlink(missing_ok=True)
            subprocess.run([sys.executable, "-m", "vitpose", "audit", "--model", args.model, "--annotations",
                            str(corrupted), "--images", str(args.root / "val2017"), "--out", str(report), "--out",
                            str(args.work / "audit.html"), "--tasks", str(args.work / "review.json"), "--device",
                            "cpu"], check=True, stdout=subprocess.DEVNULL)
            rows = json.loads(report.read_text())["ranking"]
        else:
            rows = ranked(read_labels(corrupted, 17), {line["image"]: line for line in read_records(progress)}, info)
        ranking = [row["annotation_id"] for row in rows]
        found, chance = top_k_recall(ranking, planted), random_recall(ranking, planted)
        recalls.append(found)
        chances.append(chance)
        ranks = {kind: sorted(ranking.index(i) + 1 for i, what in planted.items() if what == kind)
                 for kind in CORRUPTIONS}
        top = ", ".join(f"{kind} {sum(r <= len(planted) for r in ranks[kind])}/{len(ranks[kind])}"
                        for kind in CORRUPTIONS)
        print(f"seed {seed}: planted {len(planted)} errors in {len(ranking)} people; audit top-{len(planted)} recall "
              f"{found:.2f} ({top}; ranks {ranks}); random ranking {chance:.2f}", flush=True)
    print(f"over seeds {list(args.seeds)}: audit mean {np.mean(recalls):.3f} (sd {np.std(recalls, ddof=min(1, len(recalls) - 1)):.3f}, "
          f"{min(recalls):.1f}-{max(recalls):.1f}, at least 0.8 on {sum(r >= 0.8 - 1e-9 for r in recalls)} of "
          f"{len(recalls)}), random {np.mean(chances):.3f}")
    return 0


def select_figure(args) -> int:
    video, boxes = args.work / "hard.avi", args.work / "hard_boxes.json"
    hard = hard_video(args.root, video, boxes, seed=args.seed)
    out = args.work / "next.json"
    for stale in (out, out.with_name(out.name + ".progress.jsonl")):
        stale.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "vitpose", "select", str(video), "--model", args.model, "--count",
                    str(args.count), "--out", str(out), "--boxes", str(boxes), "--device", "cpu"], check=True)
    lines = [json.loads(line) for line in out.with_name(out.name + ".progress.jsonl").read_text().splitlines()]
    from vitpose.data.annotation_formats import labelstudio_file_name

    chosen = [labelstudio_file_name(t["data"]["image"]) for t in json.loads(out.read_text())]
    frame_of = {line["item"]: line["frame"] for line in lines}
    picked = sum(frame_of[name] in hard for name in chosen)
    base = len(hard) / len(lines)
    from vitpose.labelling.select import FrameScore, settle_jumps

    settled = settle_jumps([FrameScore.from_line(line) for line in lines])
    by_uncertainty = [lines[i] for i in np.argsort(-np.asarray(settled), kind="stable")[: args.count]]
    print(f"{len(hard)} hard frames of {len(lines)} (base rate {base:.2f}); select's {len(chosen)}: {picked} hard "
          f"({picked / len(chosen):.2f}, {picked / len(chosen) / base:.1f}x the base rate); by uncertainty alone: "
          f"{sum(line['frame'] in hard for line in by_uncertainty)} hard")
    return 0


def subset_root(root: Path, names: list[str], where: Path) -> Path:
    """A COCO root whose training set is the `names` images of `root`'s (their ground truth as the
    labels an annotator would give), sharing the images and the validation set."""
    doc = json.loads((root / "annotations/person_keypoints_train2017.json").read_text())
    keep = {image["id"] for image in doc["images"] if image["file_name"] in set(names)}
    doc["images"] = [image for image in doc["images"] if image["id"] in keep]
    doc["annotations"] = [a for a in doc["annotations"] if a["image_id"] in keep]
    (where / "annotations").mkdir(parents=True, exist_ok=True)
    (where / "annotations/person_keypoints_train2017.json").write_text(json.dumps(doc))
    (where / "annotations/person_keypoints_val2017.json").write_bytes(
        (root / "annotations/person_keypoints_val2017.json").read_bytes())
    for split in ("train2017", "val2017"):
        if not (where / split).exists():
            (where / split).symlink_to((root / split).resolve())
    return where


def fine_tune(args, root: Path, work: Path, seed: int) -> float:
    subprocess.run([sys.executable, "-m", "vitpose", "train", "--config", "demo", "--init", args.model,
                    "--data-root", str(root), "--work-dir", str(work), "--epochs", str(args.epochs), "--seed", str(seed),
                    "--set", "data.synthetic_train_images=0", "--set", "data.synthetic_val_images=0",
                    "--set", f"schedule.milestones=[{args.epochs - 2},{args.epochs - 1}]",
                    "--set", f"train.val_every={args.epochs}", "--set", "schedule.warmup_iters=5",
                    "--set", "optim.lr=1e-3", "--device", "cpu"], check=True, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    return [r["AP"] for r in records if r.get("kind") == "eval"][-1]


def finetune_figure(args) -> int:
    """select's N training images vs N random ones, each labelled from the ground truth and
    fine-tuned from --model for the same epochs: AP on the validation set."""
    pool = args.root / "train2017"
    out = args.work / "chosen.json"
    for stale in (out, out.with_name(out.name + ".progress.jsonl")):
        stale.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "vitpose", "select", str(pool), "--model", args.model, "--count",
                    str(args.count), "--out", str(out), "--format", "coco", "--boxes",
                    str(args.root / "person_detection_results/train_detections.json"), "--device", "cpu"],
                   check=True, stdout=subprocess.DEVNULL)
    chosen = sorted({r["file_name"] for r in json.loads(out.read_text())})
    progress = [json.loads(line) for line in out.with_name(out.name + ".progress.jsonl").read_text().splitlines()]
    names = [line["item"] for line in progress]
    aps = {"select": [], "random": []}
    for repeat in range(args.repeats):
        picked = sorted(np.random.default_rng(100 + repeat).choice(names, size=len(chosen), replace=False))
        for arm, subset in (("select", chosen), ("random", picked)):
            root = subset_root(args.root, subset, args.work / f"{arm}{repeat}_data")
            aps[arm].append(fine_tune(args, root, args.work / f"{arm}{repeat}", seed=repeat))
            print(f"{arm} run {repeat}: AP {aps[arm][-1]:.4f}", flush=True)
    for arm, values in aps.items():
        print(f"{arm}: {len(chosen)} images, AP " + ", ".join(f"{v:.4f}" for v in values)
              + f"  (mean {np.mean(values):.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
