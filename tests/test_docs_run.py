"""The documentation's code runs, and the module map names what exists.

- Every ```python block of README.md and docs/*.md is run, on tiny files made here (random
  weights of the sizes the blocks name, the synthetic COCO set, the shipped configs), in a scratch
  folder as the working directory. A block that needs what a test cannot have (a download, a
  GPU, a file of hundreds of MB) is marked in the page, on the line before its fence:
      <!-- docs-test: skip (why) -->
  and is reported as skipped with that reason. Every block, run or skipped, is also checked
  statically: each call of a `vitpose...` name must bind to its signature (a parameter that does
  not exist fails even in a block that cannot run).
- ARCHITECTURE.md's module map: every module a `### vitpose.X` section names (`- file.py ...`)
  exists, and every function, class or constant it cites in backticks next to that module is
  defined there (an attribute of the module or a member of one of its classes; a key or parameter
  the module's code names counts too, for the sample keys and options the map lists).
"""

import ast
import builtins
import functools
import importlib
import inspect
import re
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SKIP_MARKER = re.compile(r"<!--\s*docs-test:\s*skip\s*\((.+?)\)\s*-->")


# ----------------------------------------------------------------------------------------------
# Python blocks


def python_blocks(markdown: str):
    """(line of the fence, code, skip reason or None) of every ```python block of a page."""
    blocks = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() in ("```python", "```py"):
            start = i
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            before = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
            marker = SKIP_MARKER.search(before)
            blocks.append((start + 1, "\n".join(lines[start + 1:j]) + "\n", marker.group(1) if marker else None))
            i = j
        i += 1
    return blocks


def all_blocks():
    found = []
    for page in PAGES:
        for line, code, skip in python_blocks(page.read_text(encoding="utf-8")):
            found.append(pytest.param(page, line, code, skip, id=f"{page.relative_to(REPO)}:{line}"))
    return found


def resolve(dotted: str):
    """The object a dotted name starting with `vitpose` names (modules imported on the way)."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[: i + 1]))
    return obj


def dotted_name(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted_name(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def call_problems(code: str, where: str) -> list[str]:
    """Calls of `vitpose...` names in `code` that do not exist or do not bind to their signature."""
    problems = []
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.Call):
            continue
        name = dotted_name(node.func)
        if name is None or name.split(".")[0] != "vitpose":
            continue
        line = f"{where}+{node.lineno}: {name}(...)"
        try:
            target = resolve(name)
        except (AttributeError, ImportError) as e:
            problems.append(f"{line}: no such name ({e})")
            continue
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):  # a builtin without a signature: nothing to bind
            continue
        args = [None] * sum(not isinstance(a, ast.Starred) for a in node.args)
        kwargs = {k.arg: None for k in node.keywords if k.arg is not None}
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue  # *args / **kwargs in the call: the run says whether it binds
        try:
            signature.bind(*args, **kwargs)
        except TypeError as e:
            problems.append(f"{line}: {e}")
    return problems


def test_blocks_are_found_with_their_skip_markers():
    page = ("text\n```python\nx = 1\n```\n<!-- docs-test: skip (needs a GPU) -->\n\n```python\ny = 2\n```\n"
            "```bash\nvitpose train\n```\n")
    assert python_blocks(page) == [(2, "x = 1\n", None), (7, "y = 2\n", "needs a GPU")]


def test_the_static_check_finds_a_parameter_that_does_not_exist():
    """What README's example did: `Predictor(..., model_name=...)` after model_name was removed."""
    code = 'import vitpose\np = vitpose.Predictor("vitpose-s.pth", model_name="vitpose-s")\nvitpose.nope()\n'
    problems = call_problems(code, "page.md:1")
    assert len(problems) == 2, problems
    assert "vitpose.Predictor(...)" in problems[0] and "model_name" in problems[0]
    assert "vitpose.nope(...): no such name" in problems[1]
    assert call_problems('import vitpose\nvitpose.Predictor("w.pth", device="cpu")\n', "x") == []


@pytest.fixture(scope="module")
def doc_files(tmp_path_factory):
    """The files README's and docs' Python blocks name, tiny or random, in one scratch folder."""
    import torch

    import vitpose
    from vitpose.builders import build_dataset_info, build_model_from_config
    from vitpose.config import load_config
    from vitpose.data.synthetic import make_coco
    from vitpose.models.spec import METADATA_KEY, spec_of_model

    root = tmp_path_factory.mktemp("docs")
    shutil.copytree(REPO / "configs", root / "configs")
    coco = make_coco(root / "synthetic", num_images=3, seed=0, split="val")
    shutil.copy(coco.ann_file, root / "annotations.json")
    (root / "images").symlink_to(coco.img_dir, target_is_directory=True)
    first = sorted(Path(coco.img_dir).glob("*.jpg"))[0]
    for name in ("photo.jpg", "img.jpg"):
        shutil.copy(first, root / name)
    torch.manual_seed(0)
    torch.save(vitpose.build_model("vitpose-s").state_dict(), root / "vitpose-s.pth")  # random ViTPose-S
    for run, config in (("demo", "configs/demo.yaml"), ("demo_k5", "configs/demo_k5.yaml")):
        cfg = load_config(root / config)
        skeleton = build_dataset_info(cfg, root)
        model = build_model_from_config(cfg.model, skeleton)
        (root / "work_dirs" / run).mkdir(parents=True)
        # what training writes: the weights, the resolved config and the spec at the top level
        torch.save({"model": model.state_dict(), "config": None, METADATA_KEY: spec_of_model(model).to_dict()},
                   root / "work_dirs" / run / "best.pth")
    return root


@pytest.mark.parametrize("page, line, code, skip", all_blocks())
def test_python_block_runs(page, line, code, skip, doc_files, monkeypatch):
    where = f"{page.relative_to(REPO)}:{line}"
    problems = call_problems(code, where)
    assert not problems, "calls that do not bind:\n" + "\n".join(problems)
    if skip is not None:
        pytest.skip(f"{where}: marked in the page: {skip}")
    monkeypatch.chdir(doc_files)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a block that would download fails instead of waiting
    namespace = {"__name__": "__docs__", "__builtins__": builtins}
    exec(compile(code, where, "exec"), namespace)  # noqa: S102 - the documentation's own code


def test_every_page_with_code_is_covered():
    """The blocks are found on the pages that have them (a renamed fence would hide a block)."""
    blocks = all_blocks()
    assert len(blocks) >= 4, [b.id for b in blocks]
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        fences = len(re.findall(r"^```(?:python|py)\s*$", text, re.MULTILINE))
        assert fences == len(python_blocks(text)), page


# ----------------------------------------------------------------------------------------------
# ARCHITECTURE.md's module map


SECTION = re.compile(r"^### `(vitpose(?:\.\w+)*)`")
BULLET_MODULE = re.compile(r"^- `(\w+)\.py`")
# `name(`, `Name`, `NAME`, `name` at the start of a span (not `"key"`, `--flag`, `a b`, `x.y.z` paths)
CITED = re.compile(r"^([A-Za-z_]\w*)(?:\(|\s*->|\s*$)")


def module_map(markdown: str):
    """(line, package, module file or None, bullet text) of each bullet under a `### vitpose...`
    heading; under `### Outside the package` the package is "" (paths of the repository)."""
    bullets, package, current = [], None, None
    for number, line in enumerate(markdown.splitlines(), 1):
        section = SECTION.match(line)
        if line.startswith("### "):
            package = section.group(1) if section else "" if line.strip() == "### Outside the package" else None
            current = None
            continue
        if line.startswith("## "):
            package = current = None
            continue
        if package is None:
            continue
        if line.startswith("- "):
            module = BULLET_MODULE.match(line)
            current = [number, package, module.group(1) if module else None, line]
            bullets.append(current)
        elif current is not None and line.startswith("  "):
            current[3] += "\n" + line
        else:
            current = None
    return [tuple(b) for b in bullets]


def names_of(module) -> set[str]:
    """What a module defines or uses by name: its attributes, the members of its classes (inherited
    ones too), the parameters of its functions and methods, and the string keys its source spells."""
    names = set(dir(module)) | set(dir(builtins))  # `ValueError` is everywhere
    for value in vars(module).values():
        if inspect.isclass(value):
            names.update(dir(value))
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            for item in node.body:
                targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
            names.update(a.arg for a in node.args.args + node.args.kwonlyargs)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            names.add(node.value)
    return names


@functools.cache
def package_names(package: str) -> set[str]:
    """The names of every module directly in a package (a bullet may name its unit's neighbours:
    "`CocoKeypoints` reads it"), and the public API of `vitpose`."""
    import vitpose

    names = set(vitpose.__all__)
    for path in sorted(REPO.joinpath(*package.split(".")).glob("*.py")):
        if path.stem != "__main__":
            dotted = package if path.stem == "__init__" else f"{package}.{path.stem}"
            names |= names_of(importlib.import_module(dotted))
    return names


def module_map_problems(markdown: str) -> list[str]:
    """A bullet's module file must exist, and each name it cites be defined in that module, else
    in its package (a neighbour it mentions) or the public API; a removed name is in none."""
    problems = []
    for line, package, module_file, text in module_map(markdown):
        spans = re.findall(r"`([^`]+)`", text)
        if package == "":  # outside the package: the files and folders it names exist
            for span in spans:
                if re.fullmatch(r"[\w./-]+(\.py|/)", span) and not (REPO / span).exists() \
                        and not span.startswith("vitpose/"):  # vitpose/configs: the wheel's name for configs/
                    problems.append(f"ARCHITECTURE.md:{line}: {span} does not exist")
            continue
        for span in spans:  # `module.NAME` of a module of the package (`transforms.AUGMENTATION_LIMITS`)
            dotted = re.fullmatch(r"(\w+)\.([A-Za-z_]\w*)(?:\(.*\))?", span)
            # (`vitpose.x` is the package's name, e.g. the metadata key `vitpose.model_spec`)
            if dotted and dotted.group(2) != "py" and dotted.group(1) not in ("__main__", "vitpose") \
                    and REPO.joinpath(*package.split("."), f"{dotted.group(1)}.py").is_file():
                module = importlib.import_module(f"{package}.{dotted.group(1)}")
                if dotted.group(2) not in names_of(module):
                    problems.append(f"ARCHITECTURE.md:{line}: `{span}` is not in {module.__name__}")
        if module_file is None:
            continue
        path = REPO.joinpath(*package.split(".")) / f"{module_file}.py"
        if not path.is_file():
            problems.append(f"ARCHITECTURE.md:{line}: {path.relative_to(REPO)} does not exist")
            continue
        if module_file == "__main__":  # importing it runs the command
            continue
        dotted = package if module_file == "__init__" else f"{package}.{module_file}"
        known = names_of(importlib.import_module(dotted))
        for span in spans[1:]:  # the first is the module's file name
            cited = CITED.match(span.strip())
            if cited is None or cited.group(1) in ("None", "True", "False"):
                continue
            name = cited.group(1)
            if name not in known and name not in package_names(package):
                problems.append(f"ARCHITECTURE.md:{line}: `{span}` is not in {dotted}")
    return problems


def test_the_module_map_check_finds_a_removed_function_and_a_missing_module():
    page = ("### `vitpose.models`\n- `vitpose.py` `build_model(name)`, `no_such_function(x)`, `MODEL_SIZES`,\n"
            "  `NoSuchClass`; its `decoder` (a parameter).\n- `gone.py` a module that is not there.\n"
            "- `heads.ClassicHead`, `heads.NoHead`: a neighbour's names.\n"
            "### Outside the package\n- `train.py`, `gone.py`, `configs/`, `nothing/`: `not_checked(here)`\n")
    assert module_map_problems(page) == [
        "ARCHITECTURE.md:2: `no_such_function(x)` is not in vitpose.models.vitpose",
        "ARCHITECTURE.md:2: `NoSuchClass` is not in vitpose.models.vitpose",
        "ARCHITECTURE.md:4: vitpose/models/gone.py does not exist",
        "ARCHITECTURE.md:5: `heads.NoHead` is not in vitpose.models.heads",
        "ARCHITECTURE.md:7: gone.py does not exist",
        "ARCHITECTURE.md:7: nothing/ does not exist",
    ]


def test_architecture_module_map_names_exist():
    text = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert len(module_map(text)) >= 60, "the module map was not found"
    problems = module_map_problems(text)
    assert not problems, "ARCHITECTURE.md's module map names what does not exist:\n" + "\n".join(problems)
