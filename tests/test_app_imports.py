"""Who may import whom, read from the source with `ast` (every import, those inside functions too).

The apps talk to each other only over HTTP and through the bucket, with the messages of the shared package
`wire` and the protocol of `fleet`: no app imports another app. `dashboard` (the drawing the UIs share) and `launcher`
(which starts the apps as processes) import no app; `wire` (messages only) imports no app, no drawing and nothing of
the fleet's bucket I/O; `fleet` imports `wire` and `delta`, never an app; `delta` (with its vLLM plugin) imports
nothing of the rest. And the project's packages import each other without a circle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = frozenset({"env_space", "rollout_space", "trainer_space"})
#: The packages (and top-level modules) of the project, tests and benchmarks aside.
PROJECT = APPS | {"dashboard", "wire", "fleet", "launcher", "delta", "delta_vllm_plugin", "webguard", "models",
                  "settings", "app"}
#: What each package must not import.
FORBIDDEN: Mapping[str, frozenset[str]] = {
    **{app: APPS - {app} for app in APPS},
    "dashboard": APPS | {"launcher"},
    "launcher": APPS,
    "wire": APPS | {"dashboard", "launcher", "fleet"},
    "fleet": APPS | {"dashboard", "launcher"},
    "delta": PROJECT - {"delta", "delta_vllm_plugin"},  # the library and its vLLM plugin ship together
}


def sources(root: Path, package: str) -> list[Path]:
    """The .py files of a package (a folder) or a top-level module; none where it is missing."""
    folder, module = root / package, root / f"{package}.py"
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [module] if module.is_file() else []


def imports(root: Path, path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, relative ones resolved against its package."""
    package = list(path.relative_to(root).parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            yield node.lineno, ".".join([*base, *([node.module] if node.module else [])])


def edges(root: Path, packages: frozenset[str]) -> Iterator[tuple[str, str, str]]:
    """(importing package, imported package, 'file:line') for each import from one package into another."""
    for package in sorted(packages):
        for path in sources(root, package):
            for line, module in imports(root, path):
                target = module.split(".")[0]
                if target in packages and target != package:
                    yield package, target, f"{path.relative_to(root)}:{line} imports {module}"


def forbidden_imports(root: Path) -> list[str]:
    """Every import that breaks `FORBIDDEN`, with where it is."""
    return [f"{where}: {package} must not import {target}" for package, target, where in edges(root, PROJECT)
            if target in FORBIDDEN.get(package, ())]


def import_circle(root: Path) -> list[str]:
    """A circle of packages importing each other (['a', 'b', 'a']), or [] when there is none."""
    graph: dict[str, set[str]] = {}
    for package, target, _ in edges(root, PROJECT):
        graph.setdefault(package, set()).add(target)
    done: set[str] = set()

    def visit(package: str, path: list[str]) -> list[str]:
        if package in path:
            return [*path[path.index(package):], package]
        if package in done:
            return []
        for target in sorted(graph.get(package, ())):
            if circle := visit(target, [*path, package]):
                return circle
        done.add(package)
        return []

    for package in sorted(graph):
        if circle := visit(package, []):
            return circle
    return []


def test_no_app_imports_another_and_wire_and_dashboard_import_no_app() -> None:
    assert forbidden_imports(ROOT) == []


def test_wire_holds_messages_only() -> None:
    """No module of `wire` reads or writes a bucket: that is `fleet`'s, on top of the role's `delta.Bucket`."""
    reaching = [f"{path.relative_to(ROOT)}:{line} imports {module}" for path in sources(ROOT, "wire")
                for line, module in imports(ROOT, path)
                if module == "delta.bucket" or module.startswith("delta.bucket.") or module == "fleet"]
    bucket_calls = [f"{path.relative_to(ROOT)}" for path in sources(ROOT, "wire")
                    if any(word in path.read_text() for word in ("Bucket(", "open_storage(", ".write_many("))]
    assert reaching == [] and bucket_calls == []


def test_no_storage_is_opened_outside_the_composition_roots_the_cli_and_the_library() -> None:
    """A bucket is opened once per role, in one place: the apps' composition roots (and the launcher's and the
    deploy tool's, which start the apps), the library's own URL entry and its command line. Everything else is
    handed the `delta.Bucket` (or takes a URL and opens one through `Bucket.of`)."""
    roots = {"trainer_space/main.py", "rollout_space/main.py", "rollout_space/sidecar.py", "launcher/launch.py",
             "spaces/deploy.py", "delta/bucket/handle.py", "delta/cli.py", "delta/follow.py", "delta/storage/__init__.py"}
    def opens(path: Path) -> bool:
        calls = [n.func for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
        return any(getattr(f, "id", None) == "open_storage" or getattr(f, "attr", None) == "open_storage"
                   or (getattr(f, "attr", None) == "open" and getattr(f.value, "attr", getattr(f.value, "id", "")) == "Bucket")
                   for f in calls)

    found = sorted(path.relative_to(ROOT).as_posix() for package in sorted(PROJECT) for path in sources(ROOT, package)
                   if path.relative_to(ROOT).as_posix() not in roots and opens(path))
    assert found == []


def test_the_packages_import_each_other_without_a_circle() -> None:
    assert import_circle(ROOT) == []


def test_the_env_space_and_the_landing_page_load_no_torch() -> None:
    """The env Space installs no torch (spaces/env/requirements.txt), yet draws with `dashboard` and speaks `wire`;
    the landing page answers before any model loads."""
    code = "import sys, env_space.server, launcher.landing; print(sorted({'torch', 'delta'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_the_checks_see_a_forbidden_import_and_a_circle(tmp_path: Path) -> None:
    def write(path: str, text: str) -> None:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)

    write("wire/__init__.py", "")
    write("wire/env.py", "import json\n")
    write("env_space/__init__.py", "from wire.env import json\n")
    write("rollout_space/__init__.py", "")
    write("rollout_space/games.py", "def play():\n    from env_space import json\n")
    write("dashboard/__init__.py", "from .render import x\n")
    write("dashboard/render.py", "from wire import env\nfrom rollout_space import games\n")
    assert forbidden_imports(tmp_path) == [
        "dashboard/render.py:2 imports rollout_space: dashboard must not import rollout_space",
        "rollout_space/games.py:2 imports env_space: rollout_space must not import env_space",
    ]
    assert import_circle(tmp_path) == []
    write("wire/http.py", "from dashboard.render import x\n")
    assert import_circle(tmp_path) == ["dashboard", "rollout_space", "env_space", "wire", "dashboard"]
