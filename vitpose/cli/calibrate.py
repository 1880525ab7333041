"""`vitpose calibrate --model M --data COCO [--out M.calibrated.pth]`: what a keypoint score means.

    vitpose calibrate --model work_dirs/demo/best.pth --data held_out/
    vitpose calibrate --model weights.pth --config my_keypoints.yaml --data held_out/annotations.json

On held-out labelled images (a COCO keypoint set the model was not trained on: a folder in
MMPose's layout, or a COCO JSON beside its images), fits per keypoint the probability `p` that a
prediction lies within the skeleton's tolerance (OKS keypoint similarity >= 0.5, or the PCK
threshold for a skeleton scored by PCK) and COCO's three-state visibility (0 absent, 1 occluded,
2 visible), then writes a copy of the model file that records the fit and the data it was fitted
on. `--config`: the training config of weights that do not record their model (as predict's).
Every runtime (predict, serve, Ray, the ONNX / int8 / OpenVINO exports of the new file)
then adds `p` and `visibility` beside each keypoint's raw score. Prints the expected calibration
error (ECE) of the raw score and of p, and the visibility accuracy against the majority class,
measured out of fold; writes the reliability diagram (PNG). docs/calibration.md.

Exit status: 0; 2 when the model, the data or an output cannot be used (one line says which).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitpose.errors import EXIT_OK


def add_parser(subparsers) -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = subparsers.add_parser("calibrate", help="fit p (P(keypoint right)) and visibility on held-out data",
                              shared=("--config", "--device", "--debug"), description=doc[0], epilog="\n\n".join(doc[1:]),
                              formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--model", required=True, help="the weights or checkpoint file (or a published name) to calibrate")
    p.add_argument("--data", required=True,
                   help="held-out labelled images: a COCO keypoint JSON (images beside it) or a folder in MMPose's "
                        "layout; never the model's training set")
    p.add_argument("--out", default=None, help="the calibrated model file (default: M.calibrated.pth beside M; "
                                               "never an input)")
    p.add_argument("--plot", default=None, help="the reliability diagram PNG (default: beside --out)")
    p.add_argument("--batch-size", type=int, default=None, help="boxes per forward pass")
    p.add_argument("--seed", type=int, default=0, help="the folds' and the bootstrap's seed")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    """`vitpose calibrate`: the flags as `CalibrateOptions`, then the library."""
    from vitpose.errors import UsageError
    from vitpose.inference.calibrate import CalibrateOptions, calibrate

    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size {args.batch_size}: give a positive number of boxes")
    if args.plot is not None and Path(args.plot).suffix.lower() != ".png":
        raise UsageError(f"--plot {args.plot}: the reliability diagram is a PNG; name it .png")
    calibrate(CalibrateOptions(model=args.model, data=args.data, out=args.out, plot=args.plot, device=args.device,
                               batch_size=args.batch_size, seed=args.seed, config=args.config))
    return EXIT_OK
