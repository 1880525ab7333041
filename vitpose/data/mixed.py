"""Labelled and unlabelled crops as one training set (a distillation's, docs/distill.md).

`MixedSet(labelled, unlabelled)` numbers the instances of its parts one after the other and
serves them as `CocoKeypoints` does (`ds[(i, epoch)]`, `set_epoch`), so the one worker pool and
its samplers need nothing else. An unlabelled part is a COCO file of person boxes whose keypoints
are only the teacher's guesses (they place the box and the half-body augmentation): its samples
carry zero keypoint weights, so the ground-truth loss ignores them and the teacher's heatmaps are
their only target.
"""

from __future__ import annotations

import bisect


class MixedSet:
    """The parts' instances in order; `labelled` says which parts' keypoints are ground truth."""

    def __init__(self, parts, labelled):
        if not parts:
            raise ValueError("MixedSet needs at least one part")
        self.parts = list(parts)
        self.labelled = [bool(x) for x in labelled]
        self.starts = [0]
        for part in self.parts:
            self.starts.append(self.starts[-1] + len(part))
        first = self.parts[0]
        self.dataset_info = first.dataset_info
        self.num_keypoints = first.num_keypoints
        self.flip_indices = first.flip_indices
        self.ann_file = " + ".join(str(p.ann_file) for p in self.parts)

    @property
    def dropped(self) -> dict:
        counts: dict = {}
        for part in self.parts:
            for reason, n in part.dropped.items():
                counts[reason] = counts.get(reason, 0) + n
        return counts

    @property
    def checked(self):
        """The part the training preflight checks (the labelled one when there is one)."""
        return self.parts[0]

    def __len__(self) -> int:
        return self.starts[-1]

    def set_epoch(self, epoch: int) -> None:
        for part in self.parts:
            part.set_epoch(epoch)

    def __getitem__(self, key):
        index, epoch = key if isinstance(key, tuple) else (key, None)
        if not 0 <= index < len(self):
            raise IndexError(index)
        which = bisect.bisect_right(self.starts, index) - 1
        local = index - self.starts[which]
        part = self.parts[which]
        sample = part[(local, epoch) if epoch is not None else local]
        if not self.labelled[which]:
            for name in ("keypoint_weights", "keypoints_visible"):
                if name in sample:
                    sample[name] = sample[name] * 0
        return sample


__all__ = ["MixedSet"]
