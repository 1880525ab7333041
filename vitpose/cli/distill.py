"""`vitpose distill`: a smaller student trained on a teacher's heatmaps and features, on labelled or unlabelled images.

    vitpose distill --teacher work_dirs/demo/best.pth --student vitpose-t --epochs 10
    vitpose distill --teacher best.pth --student t --set 'model.extra={embed_dim: 64, depth: 4, num_heads: 2}'
    vitpose distill --teacher best.pth --data /data/coco --unlabeled clips/ --unlabeled walk.mp4
    vitpose distill --teacher best.pth --no-labels --unlabeled frames/ --unlabeled-boxes dets.json
    vitpose distill --resume auto                 # the teacher from the checkpoint's record, hash checked

The student inherits the teacher's skeleton, codec, flip pairs and input size; `--student` is a
size (vitpose-t by default, the simple decoder) or a run config (`--config` is the same). The run is
`vitpose train`'s loop: the same checkpoints, `--resume auto`, SIGTERM's save-and-stop, AMP and
loaders (docs/distill.md). This module only parses: `vitpose.distill.run.distill` does the work.
"""

from __future__ import annotations

import argparse

from vitpose.cli.options import add_training_arguments, check_numbers
from vitpose.errors import UsageError


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("distill", help="distil a model onto a smaller student (labelled or unlabelled images)",
                              description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", default=None, metavar="MODEL",
                   help="the model to distil from: a model file (a training checkpoint or weights), a published "
                        "name or an HF repo id (with --resume: the one the checkpoint records)")
    p.add_argument("--student", default=None, metavar="NAME|CONFIG",
                   help="a model size (vitpose-t, the default; the simple decoder) or a run config whose model "
                        "section is the student's")
    p.add_argument("--data", default=None, metavar="COCO",
                   help="the labelled COCO root (annotations/, train2017/, val2017/; its validation split scores "
                        "both models); default: the data the teacher's file records")
    p.add_argument("--no-labels", action="store_true",
                   help="use no ground truth: train on the --unlabeled frames alone (the validation split still scores)")
    p.add_argument("--unlabeled", action="append", default=[], metavar="DIR|VIDEO",
                   help="unlabelled frames (a folder of images, an image, or a video; repeatable): the teacher's "
                        "heatmaps are their only target")
    p.add_argument("--unlabeled-boxes", default=None, metavar="full-frame|DETECTOR|FILE",
                   help="the person boxes of the unlabelled frames, refined by the teacher: full-frame (default), "
                        "a detector's name, or a COCO detection results file")
    p.add_argument("--init", choices=["auto", "teacher", "random"], default=None,
                   help="the student's start: the teacher's blocks where the widths allow (auto), or random")
    add_training_arguments(p)  # as vitpose train's (default work dir work_dirs/distill; --amp: the student's)
    p.set_defaults(run=run)
    return p


def distill_options(args):
    """The parsed flags, checked, as the library's `DistillOptions`."""
    from vitpose.distill.run import DEFAULT_STUDENT, DistillOptions

    if args.student and args.config and args.student != args.config:
        raise UsageError(f"--student {args.student} and --config {args.config}: give the student's run config once")
    if args.no_labels and not args.unlabeled:
        raise UsageError("--no-labels: give the frames to train on with --unlabeled DIR|VIDEO")
    if args.unlabeled_boxes is not None and not args.unlabeled:
        raise UsageError("--unlabeled-boxes: it gives the boxes of --unlabeled frames; give --unlabeled too")
    check_numbers(("--epochs", args.epochs, 1, None), ("--batch-size", args.batch_size, 1, None),
                  ("--workers", args.workers, 0, None))
    if args.teacher is None and args.resume is None:
        raise UsageError("--teacher: required (the model file to distil from)")
    return DistillOptions(
        teacher=args.teacher, student=args.student or args.config or DEFAULT_STUDENT, data=args.data,
        labelled=not args.no_labels, unlabeled=tuple(args.unlabeled), unlabeled_boxes=args.unlabeled_boxes,
        epochs=args.epochs, work_dir=args.work_dir, resume=args.resume, overwrite=args.overwrite, seed=args.seed,
        amp=args.amp, batch_size=args.batch_size, workers=args.workers, device=args.device, init=args.init,
        overrides=tuple(args.overrides))


def run(args) -> int:
    from vitpose.distill.run import distill

    return distill(distill_options(args))
