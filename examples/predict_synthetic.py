"""Pose on whole images with `vitpose.Predictor`, on the synthetic set the demo trains on.

    vitpose train --demo                        # first: trains work_dirs/demo/{last,best}.pth
    python examples/predict_synthetic.py [--checkpoint work_dirs/demo/best.pth] [--out poses/]

It writes a few fresh synthetic images (a seed the demo never trained on), runs the predictor on
their person detection boxes, prints each person's keypoints and draws them to PNG files.
"""

import argparse
import json
import sys
from pathlib import Path

import cv2
import numpy as np

import vitpose
from vitpose.data.synthetic import make_coco

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--config", default=str(REPO / "configs" / "demo.yaml"))
    p.add_argument("--checkpoint", default="work_dirs/demo/best.pth")
    p.add_argument("--images", type=int, default=3)
    p.add_argument("--out", default="work_dirs/demo/poses")
    args = p.parse_args()
    if not Path(args.checkpoint).is_file():
        print(f"checkpoint not found: {args.checkpoint}; run `vitpose train --demo` first", file=sys.stderr)
        return 2

    out = Path(args.out)
    syn = make_coco(out / "images", args.images, seed=12345, split="val")
    detections = json.loads(Path(syn.det_file).read_text())
    images = json.loads(Path(syn.ann_file).read_text())["images"]

    predictor = vitpose.Predictor.from_config(args.config, args.checkpoint, device="cpu")
    for info in images:
        image = cv2.imread(str(Path(syn.img_dir) / info["file_name"]))  # BGR
        boxes = np.array([d["bbox"] for d in detections if d["image_id"] == info["id"] and d["score"] > 0.5])
        if len(boxes) == 0:
            continue
        keypoints, scores = predictor.predict(image, boxes, box_format="xywh", channels="bgr")
        for person, (kpts, sc) in enumerate(zip(keypoints, scores)):
            print(f"image {info['id']} person {person}: nose at ({kpts[0, 0]:.1f}, {kpts[0, 1]:.1f}), "
                  f"mean keypoint score {sc.mean():.2f}")
        drawing = vitpose.draw_pose(image, keypoints, scores, channels="bgr")
        path = out / f"pose_{info['id']:06d}.png"
        cv2.imwrite(str(path), drawing)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
