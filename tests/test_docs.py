"""Citations of the reference notes in docs/ resolve, and no comment points outside the repository.

Convention (docs/README.md §2): a page numbers its headings `## N. Title`, `### N.M Title`, ...;
code cites `docs/<page>.md §N.M`, and several sections of one page may follow one page name,
separated by commas or "and" (`docs/data.md §7.1, §7.2`).
"""

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"

# Where citations are looked for: the package, the scripts, tests, benchmarks, examples, configs.
SOURCE_ROOTS = ("vitpose", "tests", "benchmarks", "examples", "configs")
SOURCE_SUFFIXES = (".py", ".yaml", ".yml")
# Code that must stand on its own: its comments and docstrings may not cite documents that live
# outside the repository.
SELF_CONTAINED = ("vitpose", "train.py", "evaluate.py", "benchmarks", "examples", "configs")

DOCUMENT = r"docs/[\w.-]+\.md|tests/fixtures/README\.md"
SECTION_NUMBER = r"§\d+(?:\.\d+)*"
CITATION = re.compile(rf"({DOCUMENT})((?:(?:[ \t]*,[ \t]*|[ \t]+and[ \t]+|[ \t]+){SECTION_NUMBER})+)")
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s+\S", re.MULTILINE)
# The old shared specification, contract and fixture notes that lived next to the repository.
OUTSIDE_REFERENCE = re.compile(r"\bSPEC\b|\bCONTRACT\b|\.\./shared|shared/fixtures|fixtures README")


def source_files(roots=SOURCE_ROOTS):
    """Repository files that may cite docs: top-level scripts and everything under `roots`.

    This file is left out: its own examples cite pages that do not exist on purpose.
    """
    files = sorted(REPO.glob("*.py"))
    for root in roots:
        path = REPO / root
        if path.is_file():
            files.append(path)
        else:
            files += sorted(p for p in path.rglob("*") if p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts)
    return [p for p in dict.fromkeys(files) if p.resolve() != Path(__file__).resolve()]


def citations(text):
    """(page, section, line number) for every `docs/<page>.md §N` in `text`."""
    found = []
    for match in CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        for number in re.findall(SECTION_NUMBER, match.group(2)):
            found.append((match.group(1), number[1:], line))
    return found


def section_numbers(markdown):
    """The numbers of a page's numbered headings, e.g. {"1", "1.2", "7"}."""
    return set(HEADING.findall(markdown))


def broken_citations(texts, docs_dir=DOCS):
    """'file:line: docs/page.md §N (why)' for each citation in {name: text} that does not resolve."""
    problems = []
    for name, text in texts.items():
        for page, number, line in citations(text):
            path = docs_dir.parent / page
            if not path.is_file():
                problems.append(f"{name}:{line}: {page} §{number} (no such page)")
            elif number not in section_numbers(path.read_text(encoding="utf-8")):
                problems.append(f"{name}:{line}: {page} §{number} (no heading numbered {number})")
    return problems


def comments_and_docstrings(path, text):
    """(line number, text) of every comment, and for Python of every docstring, in a file."""
    if path.suffix != ".py":  # YAML: a comment runs from '#' to the end of the line
        return [(i, line[line.index("#"):]) for i, line in enumerate(text.splitlines(), 1) if "#" in line]
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                found.append((node.body[0].lineno, docstring))
    return found


def outside_references(files, root=REPO):
    """'file:line: text' for comments and docstrings that cite documents outside the repository."""
    problems = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        for line, chunk in comments_and_docstrings(path, text):
            for offset, chunk_line in enumerate(chunk.splitlines()):
                if OUTSIDE_REFERENCE.search(chunk_line):
                    problems.append(f"{path.relative_to(root)}:{line + offset}: {chunk_line.strip()}")
    return problems


# ----------------------------------------------------------------------------------------------
# The checkers themselves


def test_citation_parser_reads_lists_of_sections():
    text = "x\n# see docs/data.md §7.1, §7.2 and §8 and tests/fixtures/README.md §4; docs/model.md §1.\n"
    assert citations(text) == [("docs/data.md", "7.1", 2), ("docs/data.md", "7.2", 2), ("docs/data.md", "8", 2),
                               ("tests/fixtures/README.md", "4", 2), ("docs/model.md", "1", 2)]


def test_heading_numbers_follow_the_convention():
    page = "# Title\n\n## 1. Backbone\n### 1.2 Patch embedding\n#### 1.2.3 Detail\n## Unnumbered\n"
    assert section_numbers(page) == {"1", "1.2", "1.2.3"}


def test_broken_citations_are_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n## 1. One\n### 1.1 Sub\n", encoding="utf-8")
    texts = {"a.py": "# docs/page.md §1.1\n# docs/page.md §2\n# docs/none.md §1\n"}
    assert broken_citations(texts, tmp_path / "docs") == [
        "a.py:2: docs/page.md §2 (no heading numbered 2)",
        "a.py:3: docs/none.md §1 (no such page)",
    ]


def test_outside_references_are_found_in_comments_and_docstrings(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Module (SPEC.md §1)."""\n\nX = "SPEC"  # from ../shared\n\n\n'
                      'def f():\n    """Returns CONTRACT dicts."""\n', encoding="utf-8")
    # The string "SPEC" in code is not a comment and is not reported.
    assert sorted(outside_references([module], root=tmp_path)) == [
        "m.py:1: Module (SPEC.md §1).", "m.py:3: # from ../shared", "m.py:7: Returns CONTRACT dicts."]


# ----------------------------------------------------------------------------------------------
# The repository


def test_every_citation_names_an_existing_page_and_section():
    texts = {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in source_files()}
    found = [c for text in texts.values() for c in citations(text)]
    assert found, "no code cites docs/ at all: the reference notes are not wired to the code"
    problems = broken_citations(texts)
    assert not problems, "citations that do not resolve:\n" + "\n".join(problems)


def test_no_comment_points_outside_the_repository():
    problems = outside_references(source_files(SELF_CONTAINED))
    assert not problems, "comments citing documents outside the repository:\n" + "\n".join(problems)


def test_every_page_is_listed_in_the_index_and_numbers_are_unique():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        if page.name != "README.md":
            assert f"({page.name})" in index, f"docs/{page.name} is not linked from docs/README.md"
        numbers = HEADING.findall(text)
        duplicates = sorted({n for n in numbers if numbers.count(n) > 1})
        assert not duplicates, f"docs/{page.name}: headings numbered {duplicates} more than once"


# ----------------------------------------------------------------------------------------------
# The commands the README shows


README_SCRIPTS = ("train.py", "evaluate.py")


def readme_commands(markdown):
    """(line number, argv) of every `vitpose ...`, `python -m vitpose ...`, `python train.py ...`,
    `python evaluate.py ...` and `torchrun ... -m vitpose ...` command in a page: the lines of its
    ```bash blocks (continuation lines joined, `&&` split, comments dropped) and its inline code."""
    import shlex

    found = []
    in_block, pending, start = False, "", 0
    for number, line in enumerate(markdown.splitlines(), 1):
        if line.startswith("```"):
            in_block = line.strip() == "```bash"
            continue
        if not in_block:
            if line.startswith("|"):  # a table cell names flags (`vitpose export --out`), not commands
                continue
            spans = re.findall(r"`(vitpose [^`]+|python (?:train|evaluate)\.py[^`]*)`", line)
            found += [(number, span) for span in spans if len(span.split()) > 2]  # `vitpose tune` alone is a name
            continue
        pending, start = (pending + " " + line.rstrip("\\").strip(), start or number)
        if line.rstrip().endswith("\\"):
            continue
        found += [(start, part) for part in pending.split(" && ")]
        pending, start = "", 0
    commands = []
    for number, text in found:
        argv = shlex.split(text, comments=True)
        if argv[:3] == ["python", "-m", "vitpose"]:
            commands.append((number, ["vitpose", *argv[3:]]))
        elif argv[:1] == ["vitpose"] or (argv[:1] == ["python"] and argv[1:2] and argv[1] in README_SCRIPTS):
            commands.append((number, argv[1:] if argv[0] == "python" else argv))
        elif argv[:1] == ["torchrun"]:
            rest = argv[argv.index("-m") + 1:] if "-m" in argv else argv[next(i for i, a in enumerate(argv) if a.endswith(".py")):]
            commands.append((number, rest))
    return commands


def test_readme_commands_are_found():
    page = "```bash\nvitpose train --demo   # c\npython train.py \\\n  --epochs 2\npip install . && vitpose plot w\n```\n" \
           "Run `vitpose evaluate --checkpoint x.pth` or `python evaluate.py --gt-boxes`.\n"
    assert readme_commands(page) == [
        (2, ["vitpose", "train", "--demo"]), (3, ["train.py", "--epochs", "2"]), (5, ["vitpose", "plot", "w"]),
        (7, ["vitpose", "evaluate", "--checkpoint", "x.pth"]), (7, ["evaluate.py", "--gt-boxes"])]


def test_the_readme_commands_parse_with_the_real_parsers(capsys):
    """Each command the README shows parses with the parser the command really uses, and each
    shipped config it names (by name or under configs/) exists."""
    import sys

    sys.path.insert(0, str(REPO))
    import evaluate
    import train
    from vitpose.cli import build_parser
    from vitpose.config import ConfigError, find_config

    parse = {"vitpose": lambda argv: build_parser().parse_args(argv), "train.py": train.parse_args,
             "evaluate.py": evaluate.parse_args}
    commands = readme_commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert len([c for c in commands if c[1][0] == "vitpose"]) >= 20, "the README shows few vitpose commands"
    problems = []
    for number, argv in commands:
        if "--help" in argv or "COMMAND" in argv:
            continue
        try:
            args = parse[argv[0]](argv[1:])
        except SystemExit:
            problems.append(f"README.md:{number}: {' '.join(argv)}: {capsys.readouterr().err.strip().splitlines()[-1]}")
            continue
        config = getattr(args, "config", None)
        if config and (str(config).startswith("configs/") or "." not in str(config)) and config != "CFG":
            try:
                find_config(config)
            except ConfigError as e:
                problems.append(f"README.md:{number}: {e}")
    assert not problems, "README commands that do not parse:\n" + "\n".join(problems)


def readme_block(heading):
    """The first ```bash block under README.md's `## heading`, as its command lines."""
    section = REPO.joinpath("README.md").read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_ci_runs_the_readme_install_and_test_commands_and_nothing_hides_a_failure():
    """.ci/run ends with README's Install and Tests commands as written: what CI checks is what a
    new user types (a fresh clone, bare `pytest`). No re-run of failed tests (`--lf`), no `|| `."""
    ci = [line.strip() for line in REPO.joinpath(".ci", "run").read_text().splitlines()
          if line.strip() and not line.strip().startswith("#")]
    install, tests = readme_block("Install"), readme_block("Tests")
    assert ci[-len(install) - len(tests):] == install + tests, ci
    assert not any("--lf" in line or "--last-failed" in line or "||" in line for line in ci), ci
