"""One way through: the rules that keep every surface on the same path, read from the source.

Each rule is checked on the package and, with a small planted example, shown able to fail:
- nothing outside `vitpose/cli/` takes or builds an argparse namespace;
- one function opens a predictor (`vitpose.inference.door.open_predictor`);
- one function runs a predictor under the chunk-then-one-by-one rule (`runner.predict_chunk`);
- one module decodes image files, one reads video frames;
- signal handlers are installed in at most three modules;
- no module over 600 lines, no function over 80;
- `vitpose merge --help` (and plot, import-annotations, convert, triangulate) load no torch.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "vitpose"
MODULES = sorted(PACKAGE.rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def call_name(call: ast.Call) -> str:
    """`a.b.c(...)` -> "a.b.c"; `f(...)` -> "f"."""
    parts, node = [], call.func
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def calls(tree, *names) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and call_name(n) in names]


# ----------------------------------------------------------------------------------------------
# The parsed command line stays in vitpose/cli


def namespace_takers(source: str) -> list[str]:
    """Functions that take the parsed command line: a parameter named `args` or annotated
    `argparse.Namespace`, or any use of `argparse` (a namespace built or parsed there)."""
    tree = ast.parse(source)
    found = []
    for fn in functions(tree):
        params = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        for a in params:
            annotation = ast.unparse(a.annotation) if a.annotation is not None else ""
            if a.arg == "args" or "Namespace" in annotation:
                found.append(f"{fn.name}({a.arg})")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(alias.name == "argparse" for alias in node.names):
            found.append("import argparse")
        if isinstance(node, ast.ImportFrom) and node.module == "argparse":
            found.append("from argparse import")
    return found


def test_nothing_outside_the_command_line_takes_the_parsed_arguments():
    offenders = {rel(p): namespace_takers(p.read_text()) for p in MODULES if "cli" not in p.relative_to(PACKAGE).parts}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"take or build an argparse namespace outside vitpose/cli: {offenders}"


def test_the_namespace_check_sees_one():
    assert namespace_takers("def run_video(predictor, source, args):\n    return args.json\n")
    assert namespace_takers("import argparse\ndef f(o: argparse.Namespace):\n    pass\n")
    assert not namespace_takers("def run_video(predictor, source, options):\n    return options.json\n")


# ----------------------------------------------------------------------------------------------
# One door, one chunk rule


def test_one_function_opens_a_predictor():
    """`Predictor.from_pretrained` and `load_exported` (the two runtimes' factories) are called in
    the door only; every command and Ray's actors go through `open_predictor`."""
    callers = {}
    for path in MODULES:
        tree = ast.parse(path.read_text())
        for fn in functions(tree):
            if calls(fn, "Predictor.from_pretrained", "vitpose.Predictor.from_pretrained", "load_exported"):
                callers.setdefault(rel(path), set()).add(fn.name)
    assert callers == {"vitpose/inference/door.py": {"open_predictor"}}, callers


def runs_predictor_in_try(fn) -> bool:
    """A try whose body calls a predictor (`predictor(...)`, `self.predictor(...)`) and whose
    handler catches every Exception: the chunk-then-one-by-one fallback."""
    for node in ast.walk(fn):
        if not isinstance(node, ast.Try):
            continue
        broad = any(h.type is None or ast.unparse(h.type) in ("Exception", "BaseException") for h in node.handlers)
        body_calls = [c for stmt in node.body for c in ast.walk(stmt) if isinstance(c, ast.Call)]
        if broad and any(call_name(c).split(".")[-1] == "predictor" for c in body_calls):
            return True
    return False


def test_one_chunk_fallback():
    found = []
    for path in MODULES:
        for fn in functions(ast.parse(path.read_text())):
            if runs_predictor_in_try(fn):
                found.append(f"{rel(path)}:{fn.name}")
    assert found == ["vitpose/inference/runner.py:predict_chunk"], found


def test_the_chunk_check_sees_a_second_fallback():
    planted = ("def frames(predictor, batch):\n    try:\n        return predictor(batch)\n"
               "    except Exception:\n        return [predictor([b]) for b in batch]\n")
    assert runs_predictor_in_try(functions(ast.parse(planted))[0])


# ----------------------------------------------------------------------------------------------
# One image reader, one video frame reader, few signal handlers


def modules_calling(*names) -> set[str]:
    return {rel(p) for p in MODULES if calls(ast.parse(p.read_text()), *names)}


def test_one_image_decoder():
    assert len(modules_calling("cv2.imdecode")) == 1, modules_calling("cv2.imdecode")


def test_one_video_frame_reader():
    """OpenCV's video reader is opened in one module (`vitpose.run.sources`), which every path
    (predict, segments, select) reads frames through; writing a video is another matter."""
    assert modules_calling("cv2.VideoCapture") == {"vitpose/run/sources.py"}


def test_signal_handlers_in_at_most_three_modules():
    installing = modules_calling("signal.signal")
    assert len(installing) <= 3 and "vitpose/run/stop.py" in installing, installing


# ----------------------------------------------------------------------------------------------
# Sizes


def test_no_module_over_600_lines():
    long = {rel(p): n for p in MODULES if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long


def test_no_function_over_80_lines():
    long = {}
    for path in MODULES:
        for fn in functions(ast.parse(path.read_text())):
            if fn.end_lineno - fn.lineno + 1 > 80:
                long[f"{rel(path)}:{fn.name}"] = fn.end_lineno - fn.lineno + 1
    assert not long, long


# ----------------------------------------------------------------------------------------------
# Light commands stay light


@pytest.mark.parametrize("command", ["merge", "plot", "import-annotations", "convert", "triangulate"])
def test_light_commands_do_not_import_torch(command):
    code = (f"import sys\nfrom vitpose.cli import main\ntry:\n    main([{command!r}, '--help'])\nexcept SystemExit:\n"
            f"    pass\nprint('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False", f"vitpose {command} --help imported torch"


def test_python_m_vitpose_merge_help_does_not_import_torch():
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "vitpose", "merge", "--help"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0 and "usage: vitpose merge" in done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "torch" not in imported
