"""Distillation onto a smaller student (`vitpose distill`, docs/distill.md): the options and the
student's config (`run.py`), the people of the unlabelled frames (`unlabelled.py`). The loss and
the teacher live in `vitpose.engine.distill`; the loop is the training loop."""

from vitpose import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "vitpose.distill.run": ["DistillOptions", "distill", "distill_config"],
    "vitpose.distill.unlabelled": ["prepare_unlabelled"],
})
