"""README.md and docs/*.md against the code: every relative link reaches a file (and its ``#anchor`` a heading
there, by GitHub's slugs), every backticked path under one of the project's folders exists, and every backticked
dotted name of a project package (``delta.publish``, ``wire.env.StepResponse``) imports. The strings and
comments of the project's Python files, docstrings first, are held to the same, and the doc pages and README
sections they point to (``docs/running.md#hardware``, the README's "Deploy") exist. A failure names the line
and what it names there."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ("delta", "env_space", "rollout_space", "trainer_space", "wire", "dashboard", "launcher", "models", "bench")
FOLDERS = (*PACKAGES, "delta_vllm_plugin", "webguard", "docs", "scripts", "spaces", "tests")
FILE_SUFFIXES = ("md", "py", "json", "txt", "toml", "sh", "yaml")
#: Backticked paths that name what a command writes, not what the checkout holds.
GENERATED = ("bench/out/",)

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_SPAN = re.compile(r"`([^`]+)`")
_DOTTED = re.compile(rf"(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+")
_PATH = re.compile(rf"(?<![\w/.-])(?:{'|'.join(FOLDERS)})/[\w./*-]*")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
_DOC_PAGE = re.compile(r"(?<![\w/.-])(?:docs/[\w-]+\.md|README\.md)(?:#[\w-]+)?")
_README_SECTION = re.compile(r"README's \"([^\"]+)\"")


def code_sources() -> list[Path]:
    """The project's Python files: its packages, tests, benchmarks, scripts and top-level modules (this file
    aside: its examples of drift are meant to fail)."""
    folders = [ROOT / folder for folder in FOLDERS if (ROOT / folder).is_dir()]
    files = [*sorted(p for folder in folders for p in folder.rglob("*.py")), *sorted(ROOT.glob("*.py"))]
    return [p for p in files if p != Path(__file__).resolve()]


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a markdown file, fenced code blocks left out."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced:
            yield number, line


def commentary(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a Python file's strings and comments, docstrings included."""
    for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if token.type in (tokenize.STRING, tokenize.COMMENT):
            for offset, line in enumerate(token.string.splitlines()):
                yield token.start[0] + offset, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (markdown marks included), spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub makes for a markdown file: one per heading (repeats get -1, -2, ...), and HTML anchors."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose(path):
        found.update(_HTML_ANCHOR.findall(line))
        heading = _HEADING.match(line)
        if heading:
            base = slug(heading.group(1))
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return found


def link_problem(doc: Path, target: str) -> str | None:
    """Why a relative link of `doc` leads nowhere, or None when it lands."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
        return None
    file_part, _, anchor = target.partition("#")
    file = (doc.parent / file_part).resolve() if file_part else doc
    shown = file.relative_to(ROOT) if file.is_relative_to(ROOT) else file
    if not file.exists():
        return f"links to {target}: no file {shown}"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"links to {target}: no heading with the anchor #{anchor} in {shown}"
    return None


def path_problem(path: str) -> str | None:
    """Why a backticked repository path names nothing, or None when it exists (a glob: when something matches)."""
    path = path.rstrip(".")
    if path.startswith(GENERATED) or any(part.isupper() for part in path.split("/")):  # outputs, placeholders (ROLE)
        return None
    if "*" in path:
        return None if any(ROOT.glob(path)) else f"names {path}: nothing matches"
    return None if (ROOT / path).exists() else f"names {path}: no such file or folder"


def _has_field(owner: object, name: str) -> bool:
    """A class's declared field (a pydantic model's or a dataclass's), which is no class attribute."""
    fields = {*getattr(owner, "model_fields", {}), *getattr(owner, "__dataclass_fields__", {})}
    for klass in getattr(owner, "__mro__", ()):
        fields.update(getattr(klass, "__annotations__", {}))
    return name in fields


def _module_source(module_name: str) -> Path | None:
    """The file of a project module (``a/b.py`` or ``a/b/__init__.py`` for ``a.b``), or None."""
    base = ROOT.joinpath(*module_name.split("."))
    return next((path for path in (base.with_suffix(".py"), base / "__init__.py") if path.is_file()), None)


def _top_level_names(source: Path) -> set[str]:
    """What a module's source defines or imports at its top level, read without importing it."""
    names = set()
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
    return names


def name_problem(dotted: str) -> str | None:
    """Why a dotted name does not import (the longest importable module, then attributes), or None when it does."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            owner: object = importlib.import_module(module_name)
        except ModuleNotFoundError:
            source = _module_source(module_name)
            if source is None:
                continue  # no such module: the rest of the name may be attributes
            # The module is there but needs a package this machine lacks (vllm): its source says what it defines.
            if cut == len(parts) or parts[cut] in _top_level_names(source):
                return None
            return f"names {dotted}: {module_name} has no {parts[cut]}"
        for i, attribute in enumerate(parts[cut:], cut):
            if hasattr(owner, attribute):
                owner = getattr(owner, attribute)
            elif _has_field(owner, attribute) and i == len(parts) - 1:
                return None
            else:
                return f"names {dotted}: {'.'.join(parts[:i])} has no {attribute}"
        return None
    return f"names {dotted}: no module {parts[0]}"


def section_problem(name: str) -> str | None:
    """Why "the README's <name>" points nowhere (no README heading starts with it), or None."""
    headings = [match.group(1).lower() for _, line in prose(README) if (match := _HEADING.match(line))]
    found = any(heading.startswith(name.lower()) for heading in headings)
    return None if found else f"names the README's \"{name}\": no such section"


def line_problems(line: str, source: Path) -> Iterator[str]:
    """What one line of `source` (a doc page, or a Python file's strings and comments) names that is not there."""
    if source.suffix == ".md":
        yield from filter(None, (link_problem(source, target) for target in _LINK.findall(line)))
    else:
        yield from filter(None, (link_problem(README, target) for target in _DOC_PAGE.findall(line)))
    yield from filter(None, map(section_problem, _README_SECTION.findall(line)))
    for span in _SPAN.findall(line):
        yield from filter(None, map(path_problem, _PATH.findall(span)))
        dotted = _DOTTED.match(span)
        if dotted and dotted.group().rsplit(".", 1)[1] not in FILE_SUFFIXES:  # `delta.md` names a file
            yield from filter(None, [name_problem(dotted.group())])


def problems(source: Path) -> list[str]:
    """Every line of `source` that names something missing, as 'path:line what'."""
    lines = prose(source) if source.suffix == ".md" else commentary(source)
    where = source.relative_to(ROOT)
    return [f"{where}:{number} {why}" for number, line in lines for why in line_problems(line, source)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_what_the_docs_name_exists(doc: Path) -> None:
    assert problems(doc) == []


def test_what_docstrings_and_comments_name_exists() -> None:
    assert [problem for source in code_sources() for problem in problems(source)] == []


def test_the_checks_catch_what_drifted(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# The `Other` page: notes\n## Notes\n## Notes\n")
    doc = tmp_path / "page.md"
    doc.write_text("```\n[in a fence](nowhere.md)\n```\n")
    assert anchors(tmp_path / "other.md") == {"the-other-page-notes", "notes", "notes-1"}
    assert link_problem(doc, "other.md#notes-1") is None and link_problem(doc, "https://example.com/x") is None
    gone = f"links to other.md#gone: no heading with the anchor #gone in {tmp_path / 'other.md'}"
    assert link_problem(doc, "other.md#gone") == gone
    assert link_problem(doc, "gone.md").startswith("links to gone.md: no file")
    assert name_problem("wire.env.StepResponse.done") is None  # a pydantic field
    assert name_problem("wire.env.NoSuchThing") == "names wire.env.NoSuchThing: wire.env has no NoSuchThing"
    assert name_problem("wire.nosuchmodule.Thing") == "names wire.nosuchmodule.Thing: wire has no nosuchmodule"
    assert path_problem("wire/env.py") is None and path_problem("tests/test_env_*.py") is None
    assert path_problem("wire/gone.py") == "names wire/gone.py: no such file or folder"
    assert list(prose(doc)) == []
    code = tmp_path / "code.py"
    code.write_text('"""See docs/running.md#no-such-part and `wire.env.Gone`."""\n# the README\'s "No such part"\n')
    assert [why for _, line in commentary(code) for why in line_problems(line, code)] == [
        "links to docs/running.md#no-such-part: no heading with the anchor #no-such-part in docs/running.md",
        "names wire.env.Gone: wire.env has no Gone",
        "names the README's \"No such part\": no such section",
    ]
