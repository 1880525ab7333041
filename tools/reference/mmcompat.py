"""Lets MMPose 1.3.2 import on a CPU-only machine with mmcv-lite; import it before any mm* module.

Two things stop a plain `import mmpose` in the reference venv (README.md in this folder):

* mmcv-lite ships the Python sources of `mmcv.ops` but not the compiled `mmcv._ext`, so
  `import mmcv.ops` fails, and some MMPose modules (the ED-Pose head, the deformable DETR
  layers) import names from it at load time. ViTPose never calls any of them. We put a
  placeholder package `mmcv.ops` in `sys.modules` whose every attribute is a class that raises
  as soon as something builds or calls it, so an accidental use is loud, never silent.
* mmpretrain 1.2.0 loads its multimodal models (BLIP, CLIP, ...) when transformers is
  installed, and that code no longer imports under transformers 5.x. ViTPose needs only
  mmpretrain's `VisionTransformer`, so we tell mmpretrain that the multimodal extra is absent.

Nothing here changes a computation that the fixtures record.
"""

import sys
import types
import warnings

warnings.filterwarnings("ignore", message=".*MultiScaleDeformableAttention.*")
warnings.filterwarnings("ignore", message=".*mmcv-lite.*")


def _unavailable_op(name):
    """A stand-in class for the compiled op `name`: raises when built or called."""

    def refuse(*args, **kwargs):
        raise RuntimeError(f"mmcv.ops.{name} needs the compiled mmcv, which mmcv-lite does not have")

    return type(name, (), {"__init__": refuse, "__call__": refuse})


def install_mmcv_ops_placeholder():
    """Registers the placeholder `mmcv.ops` unless the real one imports. Returns True if installed."""
    try:
        import mmcv.ops  # noqa: F401
        return False
    except Exception:  # ImportError or a missing shared library: either way, no compiled ops
        pass
    placeholder = types.ModuleType("mmcv.ops")
    placeholder.__file__ = __file__
    placeholder.__path__ = []  # a package, so `from mmcv.ops.x import y` fails with a clear error

    def module_getattr(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _unavailable_op(name)

    placeholder.__getattr__ = module_getattr
    sys.modules["mmcv.ops"] = placeholder
    import mmcv

    mmcv.ops = placeholder
    return True


def switch_off_mmpretrain_multimodal():
    """Makes mmpretrain register placeholders for its multimodal models (as without transformers)."""
    try:
        import mmpretrain.utils.dependency as dependency
    except Exception:
        return False
    dependency.WITH_MULTIMODAL = False
    return True


OPS_PLACEHOLDER = install_mmcv_ops_placeholder()
MULTIMODAL_OFF = switch_off_mmpretrain_multimodal()
