"""Distillation as a recipe of the training loop: the teacher's targets added to the same steps.

A run whose config names `distill.teacher` trains its model (the student) through the one loop
(`vitpose.engine.loop.train`, `trainer.train_one_epoch`): `set_up_distillation` opens the teacher,
checks its hash, starts the student from the teacher's blocks where the widths allow, and returns a
`DistillObjective`, which the trainer asks for each micro-batch's loss:

    gt_weight * MSE(student, ground truth)            (labelled crops; unlabelled ones weigh 0)
  + heatmap_weight * MSE(student, teacher heatmaps)   (every crop)
  + feature_weight(t) * MSE(projector(student features), teacher features) / mean(teacher features^2)

The feature weight falls linearly to 0 over the first stage (DWPose's first stage); a last
`distill.head_epochs` epochs may train the head alone. The teacher runs under `no_grad` in eval
mode at the fastest precision the accuracy gate backs (`vitpose.device.resolve_precision("auto")`).
Its weights never enter a checkpoint: the file records the teacher's path and sha256, the loss
weights, the projector (for an exact resume) and both validation scores.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from vitpose.builders import build_train_set, load_model
from vitpose.config import Config, ConfigError
from vitpose.data.mixed import MixedSet
from vitpose.device import resolve_precision
from vitpose.engine.losses import KeypointMSELoss
from vitpose.engine.schedule import BASE_LR_KEY
from vitpose.errors import UserError

RECORD_KEY = "distill"  # the checkpoint's record of the distillation
_mse = KeypointMSELoss(use_target_weight=True)


class TeacherChangedError(UserError):
    """The teacher file of a resumed distillation is not the one the run started with."""


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class StudentWithProjector(nn.Module):
    """The student and the projector of its features to the teacher's width: the module the
    optimizer steps and DDP wraps (one forward gives both outputs, so every parameter gets its
    gradient through the wrapper)."""

    def __init__(self, student: nn.Module, projector: nn.Module):
        super().__init__()
        self.student = student
        self.projector = projector

    def forward(self, x):
        features = self.student.forward_features(x)
        return self.student.forward_head(features), self.projector(features)


@dataclass(frozen=True)
class LossWeights:
    gt: float
    heatmap: float
    feature: float
    feature_steps: int  # optimizer steps over which the feature weight falls to 0

    def feature_at(self, iteration: int) -> float:
        return self.feature * max(0.0, 1.0 - iteration / max(self.feature_steps, 1))

    def describe(self) -> str:
        return (f"gt {self.gt:g} + teacher heatmaps {self.heatmap:g} + features {self.feature:g} "
                f"falling to 0 over {self.feature_steps} steps")


class DistillObjective:
    """The loss of one micro-batch of a distillation (`trainer.forward_backward` calls `loss`)."""

    def __init__(self, teacher: nn.Module, teacher_dtype, pair: StudentWithProjector, weights: LossWeights,
                 record: dict):
        self.teacher = teacher.eval().requires_grad_(False)
        self.teacher_dtype = teacher_dtype
        self.trained = pair  # the module whose parameters the optimizer steps
        self.weights = weights
        self.record = record  # teacher, hash, weights, init, scores: what every checkpoint records

    def to(self, device) -> DistillObjective:
        self.teacher.to(device)
        self.trained.to(device)
        return self

    @torch.no_grad()
    def teacher_outputs(self, images):
        with torch.autocast(images.device.type, dtype=self.teacher_dtype, enabled=self.teacher_dtype is not None):
            features = self.teacher.forward_features(images)
            heatmaps = self.teacher.forward_head(features)
        return heatmaps.float(), features.float()

    def loss(self, model, images, heatmaps, keypoint_weights, precision, iteration: int) -> torch.Tensor:
        """The weighted sum of the three losses (fp32) for `model` (the wrapped pair) on `images`."""
        with precision.autocast():
            predicted, projected = model(images)
        target, features = self.teacher_outputs(images)
        w = self.weights
        predicted = predicted.float()
        gt = _mse(predicted, heatmaps, keypoint_weights)
        ones = torch.ones(target.shape[:2], device=target.device)
        teacher = _mse(predicted, target, ones)
        # Relative to the teacher features' power, so the weight does not depend on their scale.
        feature = (projected.float() - features).square().mean() / features.square().mean().clamp_min(1e-12)
        return w.gt * gt + w.heatmap * teacher + w.feature_at(iteration) * feature

    def add_to(self, optimizer: torch.optim.Optimizer, lr: float, weight_decay: float) -> None:
        """The projector's parameters as the optimizer's last group (the head's learning rate)."""
        named = list(self.trained.projector.named_parameters())
        optimizer.add_param_group({"params": [p for _, p in named], "param_names": [f"projector.{n}" for n, _ in named],
                                   "lr": lr, BASE_LR_KEY: lr, "weight_decay": weight_decay})

    def state(self, best_ap: float | None) -> dict:
        """What a checkpoint records: the run's record, the student's best score, the projector."""
        return {**self.record, "student_ap": best_ap,
                "projector": {k: v.detach().cpu() for k, v in self.trained.projector.state_dict().items()}}


def teacher_source(cfg: Config) -> str:
    """The teacher as the file to open: an existing path made absolute (a resume from another
    folder reopens it), else a published name or repo id as given."""
    path = Path(cfg.distill.teacher).expanduser()
    return str(path.resolve()) if path.is_file() else cfg.distill.teacher


def open_teacher(cfg: Config, device, recorded: dict | None):
    """(LoadedModel, sha256): the teacher of `cfg`; on a resume (`recorded`: the checkpoint's record)
    the file must still hash the same."""
    loaded = load_model(teacher_source(cfg), device=device)
    sha = file_sha256(loaded.path) if loaded.path is not None else None
    expected = (recorded or {}).get("teacher_sha256") or cfg.distill.teacher_sha256
    if expected and sha != expected:
        raise TeacherChangedError(f"distill.teacher {cfg.distill.teacher}: its sha256 is {sha}, but this run started "
                                  f"with {expected}; give the teacher the run started with (--teacher), or start "
                                  f"a new --work-dir")
    return loaded, sha


def check_student_fits(cfg: Config, teacher_spec) -> None:
    """The student must read the teacher's crops and predict its heatmaps (one line naming the field)."""
    pairs = [("model.num_keypoints", cfg.model.num_keypoints, teacher_spec.num_keypoints),
             ("model.input_size", tuple(cfg.model.input_size), tuple(teacher_spec.input_size)),
             ("model.heatmap_size", tuple(cfg.model.heatmap_size), tuple(teacher_spec.heatmap_size))]
    for field, student, teacher in pairs:
        if student != teacher:
            raise ConfigError(f"{field} = {list(student) if isinstance(student, tuple) else student}, but the teacher "
                              f"{cfg.distill.teacher} has {list(teacher) if isinstance(teacher, tuple) else teacher}: "
                              f"the student inherits it (leave it unset)")


def teacher_block_indices(student_depth: int, teacher_depth: int) -> list[int]:
    """The teacher blocks a shallower student of the same width starts from: evenly spaced, the
    last one included (every other block when the student has half the depth)."""
    return [round((i + 1) * teacher_depth / student_depth) - 1 for i in range(student_depth)]


def init_student(student: nn.Module, teacher: nn.Module, mode: str) -> str:
    """Start the student from the teacher's weights where the widths allow (`distill.init`: auto,
    teacher, random); returns what was done, in words."""
    s, t = student.backbone, teacher.backbone
    fits = s.embed_dim == t.embed_dim and len(s.blocks) <= len(t.blocks) and \
        s.blocks[0].mlp.fc1.out_features == t.blocks[0].mlp.fc1.out_features and s.pos_embed.shape == t.pos_embed.shape
    if mode == "random" or (mode == "auto" and not fits):
        return "random initialisation" + ("" if mode == "random" else " (the widths differ from the teacher's)")
    if not fits:
        raise ConfigError(f"distill.init = teacher: the student ({s.embed_dim} wide, {len(s.blocks)} blocks) cannot "
                          f"start from the teacher's blocks ({t.embed_dim} wide, {len(t.blocks)} blocks): same width "
                          f"and at most the teacher's depth, or distill.init=random")
    indices = teacher_block_indices(len(s.blocks), len(t.blocks))
    with torch.no_grad():
        for mine, theirs in ((s.patch_embed, t.patch_embed), (s.norm, t.norm)):
            mine.load_state_dict(theirs.state_dict())
        s.pos_embed.copy_(t.pos_embed)
        for i, j in enumerate(indices):
            s.blocks[i].load_state_dict(t.blocks[j].state_dict())
        head = student.head.state_dict()
        theirs = teacher.head.state_dict()
        same_head = head.keys() == theirs.keys() and all(head[k].shape == theirs[k].shape for k in head)
        if same_head:
            student.head.load_state_dict(theirs)
    return f"the teacher's blocks {indices}" + (" and head" if same_head else " (head: random)")


def set_up_distillation(cfg: Config, student: nn.Module, device, steps_per_epoch: int,
                        recorded: dict | None, is_main: bool) -> DistillObjective:
    """The objective of a distillation run: teacher opened (and checked on a resume), the student
    started from it (not on a resume: the checkpoint holds every weight), the projector built
    (its weights from the checkpoint on a resume)."""
    loaded, sha = open_teacher(cfg, device, recorded)
    teacher = loaded.model
    check_student_fits(cfg, loaded.spec)
    init = recorded.get("init") if recorded else init_student(student, teacher, cfg.distill.init)
    projector = nn.Conv2d(student.backbone.embed_dim, teacher.backbone.embed_dim, kernel_size=1)
    if recorded and recorded.get("projector") is not None:
        projector.load_state_dict(recorded["projector"])
    first_stage = max(cfg.schedule.epochs - cfg.distill.head_epochs, 1) * steps_per_epoch
    weights = LossWeights(cfg.distill.gt_weight if cfg.distill.labelled else 0.0, cfg.distill.heatmap_weight,
                          cfg.distill.feature_weight, first_stage)
    sample = torch.zeros(1, 3, cfg.model.input_size[1], cfg.model.input_size[0], device=device)
    dtype = resolve_precision("auto", device, step=lambda: teacher(sample), step_name=f"teacher {loaded.spec.size}")
    record = {"teacher": teacher_source(cfg), "teacher_sha256": sha,
              "teacher_ap": (recorded or {}).get("teacher_ap"), "init": init,
              "teacher_precision": str(dtype).removeprefix("torch.") if dtype is not None else "float32",
              "losses": {"gt": weights.gt, "heatmap": weights.heatmap, "feature": weights.feature,
                         "feature_steps": weights.feature_steps, "head_epochs": cfg.distill.head_epochs},
              "labelled": cfg.distill.labelled, "unlabeled": list(cfg.distill.unlabeled),
              "unlabeled_boxes": cfg.distill.unlabeled_boxes}
    if is_main:
        print(f"distilling from {record['teacher']} (sha256 {sha[:12] if sha else '-'}, "
              f"{record['teacher_precision']}): student from {init}; loss = {weights.describe()}")
    pair = StudentWithProjector(student, projector)
    return DistillObjective(teacher, dtype, pair, weights, record).to(device)


def head_only(cfg: Config, epoch: int) -> bool:
    """Whether `epoch` belongs to the head-only second stage of a distillation."""
    return bool(cfg.distill.teacher) and cfg.distill.head_epochs > 0 and \
        epoch >= cfg.schedule.epochs - cfg.distill.head_epochs




# ---------------------------------------------------------------------------------------------
# The unlabelled frames: prepared before the run (`vitpose.distill.unlabelled`), read by the session

UNLABELLED_MANIFEST = Path("unlabeled") / "sets.json"  # under the work dir: [{"annotations", "images"}]


def unlabelled_sets(cfg: Config) -> list[dict]:
    """The COCO files of the unlabelled frames the run trains on (written before the run)."""
    if not (cfg.distill.teacher and cfg.distill.unlabeled):
        return []
    path = Path(cfg.train.work_dir) / UNLABELLED_MANIFEST
    if not path.is_file():
        raise UserError(f"distill.unlabeled is set but {path} is missing: run `vitpose distill`, which finds the "
                        f"people of the unlabelled frames first")
    return json.loads(path.read_text())


def distill_train_set(cfg: Config, labelled_set):
    """The training set of a distillation: the labelled set (None without labels) and each
    unlabelled part, as one `MixedSet`."""
    parts, labelled = ([labelled_set], [True]) if labelled_set is not None else ([], [])
    info = None if labelled_set is None else labelled_set.dataset_info
    for entry in unlabelled_sets(cfg):
        data = replace(cfg.data, root="/", train_ann=entry["annotations"], train_images=entry["images"],
                       crop_cache=None, reduced_decode=False)
        part = build_train_set(replace(cfg, data=data), info=info)
        info = info or part.dataset_info
        parts.append(part)
        labelled.append(False)
    if not parts:
        raise ConfigError("distill.labelled = false and no distill.unlabeled frames: nothing to train on "
                          "(give --data or --unlabeled)")
    return MixedSet(parts, labelled)


__all__ = ["DistillObjective", "LossWeights", "RECORD_KEY", "StudentWithProjector", "TeacherChangedError",
           "UNLABELLED_MANIFEST", "distill_train_set", "file_sha256", "head_only", "init_student", "open_teacher",
           "set_up_distillation", "teacher_block_indices", "unlabelled_sets"]
