"""One-way layers: every import inside vitpose/ goes down the layer table of ARCHITECTURE.md.

The table is read from ARCHITECTURE.md itself (its `layer N name modules...` lines), so the document
and the code cannot disagree: a module missing from the table, or an import that goes up or
sideways (e.g. data -> engine, engine -> inference, models -> data), fails here.
"""

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "vitpose"


def layer_table() -> dict[str, int]:
    """ARCHITECTURE.md's `layer N  name  vitpose.a vitpose.b ...` lines -> {unit: N}."""
    table = {}
    for line in (REPO / "ARCHITECTURE.md").read_text().splitlines():
        m = re.match(r"^layer (\d+)\s+\S+\s+(vitpose\..*)$", line.strip())
        if m:
            for unit in m.group(2).split():
                assert unit not in table, f"{unit} is listed twice in ARCHITECTURE.md"
                table[unit] = int(m.group(1))
    assert table, "ARCHITECTURE.md has no layer table"
    return table


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str, table: dict[str, int]) -> str | None:
    """The table entry a module belongs to (the longest listed prefix), or None."""
    best = None
    for unit in table:
        if (module == unit or module.startswith(unit + ".")) and (best is None or len(unit) > len(best)):
            best = unit
    return best


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").is_file()


def imports_of(path: Path, module: str | None = None) -> list[tuple[int, str]]:
    """Every vitpose module `path` imports (module level and inside functions), with line numbers.

    module: the file's dotted name (default: from its place under the repository)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = (module or module_name(path)).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from vitpose import engine` imports a subpackage
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names
                      if _is_module(f"{target}.{alias.name}")]
    return [(line, name) for line, name in found if name == "vitpose" or name.startswith("vitpose.")]


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_has_a_layer():
    table = layer_table()
    missing = [module_name(p) for p in MODULES if p != PACKAGE / "__init__.py"
               and unit_of(module_name(p), table) is None]
    assert not missing, f"modules not in ARCHITECTURE.md's layer table: {missing}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_imports_only_go_down(path):
    if path == PACKAGE / "__init__.py":
        return  # the lazy public-name table of `import vitpose` (strings, not imports)
    table = layer_table()
    here = unit_of(module_name(path), table)
    bad = []
    for line, target in imports_of(path):
        there = unit_of(target, table)
        if there is None or there == here:
            continue  # `vitpose` itself (lazy names) or the module's own unit
        if table[there] >= table[here]:
            bad.append(f"line {line}: {target} ({there}, layer {table[there]})")
    assert not bad, f"{module_name(path)} ({here}, layer {table[here]}) imports upward or sideways: {bad}"


def test_the_checker_sees_an_upward_import(tmp_path):
    """The walker resolves relative and in-function imports (else the test above proves nothing)."""
    sample = tmp_path / "probe.py"
    sample.write_text("def f():\n    from ..engine import trainer\n    from vitpose.inference.predictor import Predictor\n")
    names = [name for _, name in imports_of(sample, module="vitpose.data.probe")]
    table = layer_table()
    assert table[unit_of("vitpose.data.probe", table)] < table[unit_of(names[0], table)]
    assert "vitpose.engine" in names and "vitpose.engine.trainer" in names and "vitpose.inference.predictor" in names


def test_the_module_map_names_every_module():
    """ARCHITECTURE.md's module map has a `### \\`vitpose.pkg\\`` section per package that names
    each of its files (`name.py`), so a new module cannot go undescribed."""
    text = (REPO / "ARCHITECTURE.md").read_text()
    sections = {}
    for section in re.split(r"^### ", text, flags=re.MULTILINE)[1:]:
        m = re.match(r"`(vitpose(?:\.\w+)*)`", section)
        if m:
            sections[m.group(1)] = section
    missing = []
    for path in MODULES:
        package = module_name(path.parent) if path.parent != PACKAGE else "vitpose"
        if f"`{path.name}`" not in sections.get(package, ""):
            missing.append(f"{path.relative_to(REPO)} (under ### `{package}`)")
    assert not missing, "modules ARCHITECTURE.md's module map does not describe: " + ", ".join(missing)


def test_at_most_eight_modules_sit_directly_in_the_package():
    flat = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(flat) <= 8, f"{len(flat)} modules directly in vitpose/ (group them): {flat}"


# ----------------------------------------------------------------------------------------------
# No import cycles: modules of one unit may import each other (the layer test allows it), but
# never in a circle, so that each module can be read (and imported) after the ones it uses.


def lazy_names(path: Path) -> dict[str, str]:
    """{name: module} of a package `__init__.py`'s `lazy_exports(__name__, {module: [names]})` table:
    `from vitpose.models import build_model` imports `vitpose.models.vitpose` on first use."""
    names = {}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports" and len(node.args) == 2:
            for module, listed in ast.literal_eval(node.args[1]).items():
                names.update({name: module for name in listed})
    return names


def import_graph(paths: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """{module: the vitpose modules it imports}: module-level and in-function imports, and the
    module behind each lazily exported name it imports from a package.

    paths: {module name: file} (default: every module of the package)."""
    paths = {module_name(p): p for p in MODULES} if paths is None else paths
    lazy = {name: lazy_names(p) for name, p in paths.items() if p.name == "__init__.py"}
    graph = {}
    for module, path in paths.items():
        targets = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        for _, target in imports_of(path, module):
            targets.add(target)
        for node in ast.walk(tree):  # `from vitpose.models import build_model` -> vitpose.models.vitpose
            if isinstance(node, ast.ImportFrom) and not node.level and node.module in lazy:
                targets.update(lazy[node.module][a.name] for a in node.names if a.name in lazy[node.module])
        graph[module] = {t for t in targets if t in paths and t != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of the graph, one per strongly connected group of two or more modules (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_no_import_cycles():
    cycles = import_cycles(import_graph())
    assert not cycles, "modules that import each other in a circle (function-level imports included): " + \
        "; ".join(" <-> ".join(group) for group in cycles)


def test_the_cycle_finder_sees_a_cycle_through_a_function_level_import(tmp_path):
    """spec -> wrappers at module level and wrappers -> spec inside a function: one cycle."""
    package = tmp_path / "vitpose" / "models"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from vitpose import lazy_exports\n"
                                         "__all__, __getattr__ = lazy_exports(__name__, {'vitpose.models.c': ['C']})\n")
    (package / "a.py").write_text("from vitpose.models.b import f\n")
    (package / "b.py").write_text("def f():\n    from vitpose.models import C\n")
    (package / "c.py").write_text("import vitpose.models.a\nC = 1\n")
    (package / "d.py").write_text("from vitpose.models.a import f\n")
    paths = {"vitpose.models" if p.name == "__init__.py" else f"vitpose.models.{p.stem}": p
             for p in package.glob("*.py")}
    graph = import_graph(paths)
    assert graph["vitpose.models.b"] == {"vitpose.models", "vitpose.models.c"}
    assert import_cycles(graph) == [["vitpose.models.a", "vitpose.models.b", "vitpose.models.c"]]
