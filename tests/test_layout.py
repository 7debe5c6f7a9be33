"""The package layout docs/delta.md ("Public API") promises, checked from the source with `ast`.

- Code outside `delta/` (apps, dashboard, bench, scripts; tests/ are white-box and exempt) imports only
  the public modules, and from each only the names of its `__all__`. The few white-box tools that forge
  files from the internals are listed below, and say so in their docstrings.
- `delta`'s modules import each other without a circle, and its layers only downwards.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DELTA = ROOT / "delta"

PUBLIC = ("delta", "delta.storage", "delta.errors", "delta.signing", "delta.private", "delta.replies", "delta.atomic",
          "delta.poll", "delta.follow", "delta.integrations.trl", "delta.integrations.vllm_backend", "delta.integrations.vllm_http",
          "delta.integrations.vllm_update", "delta.integrations.peft_adapter")
WHITE_BOX = ("bench/codec.py", "bench/crafted.py", "bench/entropy.py", "bench/catchup.py",
             "bench/signing.py")
# Each layer imports only from layers of a lower rank (or its own): errors (retry, poll, atomic, replies, private, _cores,
# _stages) < storage, signing, tensors < codecs < format < patch < bucket < inspect, integrations < follow < cli < the
# package's entry points.
RANK = {"errors": 0, "retry": 0, "poll": 0, "atomic": 0, "replies": 0, "private": 0, "_cores": 0, "_stages": 0, "storage": 1,
        "signing": 1, "tensors": 1, "codecs": 2, "format": 3, "patch": 4, "bucket": 5, "inspect": 6, "integrations": 6,
        "follow": 7, "cli": 8, "__main__": 9, "__init__": 9}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _delta_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in DELTA.rglob("*.py")}


def _all_of(path: Path) -> set[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def _imports(path: Path, package: str) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, imported names) of every import in `path`, at any depth (a function's too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module, [alias.name for alias in node.names]))
    return found


def _outside_files() -> list[Path]:
    skip = {"delta", "tests", ".git", "v", "venv", ".venv", "node_modules"}
    return sorted(p for p in ROOT.rglob("*.py")
                  if p.relative_to(ROOT).parts[0] not in skip and "site-packages" not in p.parts)


def test_code_outside_delta_uses_only_the_public_api():
    modules = _delta_modules()
    exported = {name: _all_of(modules[name]) for name in PUBLIC}
    problems = []
    for path in _outside_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel in WHITE_BOX:
            continue
        package = _module_name(path).rpartition(".")[0]
        for line, module, names in _imports(path, package):
            if module != "delta" and not module.startswith("delta."):
                continue
            where = f"{rel}:{line}"
            if module not in PUBLIC:
                problems.append(f"{where} imports {module}, not a public module (PUBLIC, above)")
                continue
            missing = [n for n in names if n not in exported[module]]
            if missing:
                problems.append(f"{where} imports {missing} from {module}, not in its __all__")
    assert not problems, "\n".join(problems)


def test_white_box_tools_say_so():
    for rel in WHITE_BOX:
        doc = ast.get_docstring(ast.parse((ROOT / rel).read_text())) or ""
        assert "white-box" in doc, f"{rel} imports delta's internals: its docstring must say it is a white-box tool"


def test_every_public_module_names_its_api():
    modules = _delta_modules()
    for name in PUBLIC:
        assert _all_of(modules[name]), f"{name} has no __all__"
    exported = _all_of(modules["delta"])
    assert {"Bucket", "Budget", "Update", "VersionStats", "SubscriberStatus", "PublishedVersion", "Manifest",
            "VersionEntry", "FileRef", "StoredFile", "DeltaHeader", "TensorEntry", "ApplyResult", "Change",
            "StateDigest"} <= exported
    assert len(exported) <= 45, f"delta.__all__ holds {len(exported)} names: the library's API is at most 45"


def test_no_module_of_delta_keeps_a_mutable_registry():
    """What a process keeps about a bucket lives in the `delta.Bucket` the caller holds: no function writes into a
    module-level dict, list or set, nor rebinds a module global. The one exception is named: the process's compute
    threads (`delta._cores`), kept by worker count as torch keeps its intra-op pool."""
    problems = []
    for name, path in _delta_modules().items():
        tree = ast.parse(path.read_text())
        mutable = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                   for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                   if isinstance(t, ast.Name) and isinstance(node.value, (ast.Dict, ast.List, ast.Set))}
        functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in (n for f in functions for n in ast.walk(f)):
            if isinstance(node, ast.Global):
                problems.append(f"{name}:{node.lineno} rebinds a module global ({', '.join(node.names)})")
            target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
            if (isinstance(target, ast.Name) and target.id in mutable
                    and node.func.attr in ("append", "update", "pop", "setdefault", "add", "clear", "extend")):
                problems.append(f"{name}:{node.lineno} changes the module's {target.id} at run time")
            for t in node.targets if isinstance(node, ast.Assign) else []:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in mutable:
                    problems.append(f"{name}:{node.lineno} writes into the module's {t.value.id} at run time")
    assert [p for p in problems if not p.startswith("delta._cores:")] == []


def _graph() -> dict[str, set[str]]:
    modules = _delta_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph.setdefault(name, set())
        for _, module, names in _imports(path, package):
            if module not in modules:
                continue
            # `from pkg import x`: the submodule pkg.x where there is one, else pkg itself
            targets = {f"{module}.{n}" for n in names if f"{module}.{n}" in modules}
            edges |= targets or {module}
            if len(targets) < len(names):
                edges.add(module)
        edges.discard(name)
    return graph


def test_delta_has_no_import_circle():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def _layer(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def test_delta_layers_import_only_downwards():
    problems = [f"{module} ({_layer(module)}) imports {target} ({_layer(target)})"
                for module, targets in sorted(_graph().items()) for target in sorted(targets)
                if RANK[_layer(target)] > RANK[_layer(module)]]
    assert not problems, "\n".join(problems)
