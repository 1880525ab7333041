"""The walk of `vitpose predict`'s arguments: which vitpose modules one run goes through, in order.

    python tools/walk_predict.py            # prints the figures
    python tools/walk_predict.py --list     # and the walk itself, one visit a line

A tiny model (one ViT block, 17 keypoints, COCO's skeleton recorded in its file) and a 60x80 image
are written to a temporary folder; then `vitpose predict IMG --model FILE --detector full-frame
--json J --precision fp32` runs in this process under `sys.setprofile`. From the moment
`vitpose.cli.predict.run` is entered until it returns, the tool keeps the stack of vitpose frames
(frames of other packages, such as torch calling a module's `forward`, are passed through) and
writes down the module of the innermost vitpose frame each time it changes: a call into another
module is a visit, and so is the return to the module that called. Consecutive calls in one module
are one visit. The package root's lazy-name table (`vitpose/__init__.py`) is no layer, and a
module's first import runs its body (no argument flows there): both are left out. A "return to a higher layer" is a visit to a module whose layer (ARCHITECTURE.md's table, as
tests/test_architecture.py reads it) is above the layer of the visit before it: control going back
up to a caller.

The visits from the call of `load_model` to the return to its caller are counted on their own too
(the way from the `--model` argument to a model).

Only the main thread is followed (the image path runs there). The figures are for comparing one
version of the code with another: fewer visits and fewer returns mean a shorter way from the
command line to the model and back.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def layer_table() -> dict[str, int]:
    """ARCHITECTURE.md's `layer N  name  vitpose.a ...` lines -> {unit: N}."""
    table = {}
    for line in (REPO / "ARCHITECTURE.md").read_text().splitlines():
        m = re.match(r"^layer (\d+)\s+\S+\s+(vitpose\..*)$", line.strip())
        if m:
            table.update({unit: int(m.group(1)) for unit in m.group(2).split()})
    return table


def layer_of(module: str, table: dict[str, int]) -> int | None:
    """The layer of the longest table entry that is `module` or a package above it."""
    best = None
    for unit in table:
        if (module == unit or module.startswith(unit + ".")) and (best is None or len(unit) > len(best)):
            best = unit
    return None if best is None else table[best]


def make_inputs(folder: Path) -> tuple[Path, Path]:
    """(weights file, image): a tiny 17-keypoint ViTPose recording COCO's skeleton, a 60x80 image."""
    import cv2
    import numpy as np
    import torch

    import vitpose
    from vitpose.data import dataset_info
    from vitpose.models.spec import SKELETON_FIELDS, spec_of_model

    torch.manual_seed(0)
    model = vitpose.build_model("vitpose-s", "simple", 17, depth=1, embed_dim=48, num_heads=2,
                                img_size=(64, 48)).eval()
    coco = dataset_info("coco")
    skeleton = json.loads(json.dumps({name: getattr(coco, name) for name in SKELETON_FIELDS}))
    weights = vitpose.save_weights(model, folder / "tiny.safetensors", spec=spec_of_model(model, skeleton=skeleton))
    image = folder / "person.png"
    cv2.imwrite(str(image), np.random.default_rng(0).integers(0, 255, (80, 60, 3), dtype=np.uint8))
    return weights, image


def walk(argv: list[str]) -> tuple[list[str], tuple[int, int] | None]:
    """The modules `vitpose.cli.main(argv)` visits from `vitpose.cli.predict.run`'s entry to its
    return, and (first, last) index of the visits made inside the first `load_model` call."""
    from vitpose.cli import main

    visits: list[str] = []
    loading: list[int] = []  # [index of load_model's first visit, index of the visit after it returned]
    stack: list[str] = []  # module of each vitpose frame on the call stack, innermost last
    importing = 0  # vitpose module bodies on the stack: a first import runs them, no argument flows there
    depth_of_run = None

    def note(module: str) -> None:
        if not importing and module != "vitpose" and (not visits or visits[-1] != module):
            visits.append(module)

    def profile(frame, event, _arg):
        nonlocal depth_of_run, importing
        if event not in ("call", "return"):
            return
        module = frame.f_globals.get("__name__", "")
        if module != "vitpose" and not module.startswith("vitpose."):
            return
        body = frame.f_code.co_name == "<module>"
        if event == "call":
            importing += body
            stack.append(module)
            if depth_of_run is None and module == "vitpose.cli.predict" and frame.f_code.co_name == "run":
                depth_of_run = len(stack)
            if depth_of_run is not None:
                note(module)
                if frame.f_code.co_name == "load_model" and not loading:
                    loading.append(len(visits) - 1)
        else:
            if frame.f_code.co_name == "load_model" and len(loading) == 1:
                loading.append(len(visits))  # the caller's visit, noted below
            importing -= body
            if stack:
                stack.pop()
            if depth_of_run is not None:
                if len(stack) < depth_of_run:
                    depth_of_run = -1  # run returned: stop recording
                elif stack:
                    note(stack[-1])
            if depth_of_run == -1:
                depth_of_run = None
                sys.setprofile(None)

    sys.setprofile(profile)
    try:
        status = main(argv)
    finally:
        sys.setprofile(None)
    if status != 0:
        raise SystemExit(f"vitpose predict exited with {status}; the walk is not of a successful run")
    return visits, tuple(loading) if len(loading) == 2 else None


def figures(visits: list[str], table: dict[str, int]) -> tuple[int, int, int]:
    """(visits, distinct modules, returns to a higher layer)."""
    layers = [layer_of(m, table) for m in visits]
    returns = sum(1 for a, b in zip(layers, layers[1:]) if a is not None and b is not None and b > a)
    return len(visits), len(set(visits)), returns


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print each visit with its layer")
    args = parser.parse_args(argv)
    table = layer_table()
    with tempfile.TemporaryDirectory() as tmp:
        weights, image = make_inputs(Path(tmp))
        visits, loading = walk(["predict", str(image), "--model", str(weights), "--detector", "full-frame",
                       "--json", str(Path(tmp) / "poses.json"), "--precision", "fp32", "--device", "cpu"])
    if args.list:
        for module in visits:
            print(f"  {layer_of(module, table)!s:>4}  {module}")
    n, distinct, returns = figures(visits, table)
    print(f"walk of vitpose predict: {n} visits to {distinct} modules, {returns} returns to a higher layer")
    if loading is not None:
        n, distinct, returns = figures(visits[loading[0]:loading[1] + 1], table)
        print(f"  of which load_model (from its call to the return to its caller): {n} visits to {distinct} "
              f"modules, {returns} returns to a higher layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
