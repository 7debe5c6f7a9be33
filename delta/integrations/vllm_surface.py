"""What the `delta` backend and its senders use of vLLM, and a check of a vLLM release's source against it.

The backend runs inside vLLM's worker and subclasses a base class vLLM may change in any release; the senders
(`VLLMEngine`, `python -m delta follow`) call vLLM's offline `LLM` and the routes of a `vllm serve`. This module
lists each of those uses as data (`SURFACE`) and checks them against a release's source, read with `ast` (nothing
is imported, so any release can be checked on any machine, GPU builds included):

    pip download vllm==0.34.0 --no-deps -d wheels
    python -m delta.integrations.vllm_surface wheels/vllm-0.34.0-*.whl     # exit status 1 if anything changed

Checked: each function or method called binds the arguments given (positional count, keyword names), the fields
and attributes read exist, the routes answer at their paths with the parameters sent, and the base class's
abstract methods, its methods the backend overrides and what vLLM's worker calls on the backend all match
`DeltaWeightTransferEngine` (read from `vllm_backend.py` beside this file). Not checked: behaviour. A release
whose signatures fit but whose semantics changed passes here; that is what running the tests on it is for.

Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SURFACE", "Calls", "Finding", "HasFields", "Route", "Source", "check", "main"]

_BACKEND = Path(__file__).with_name("vllm_backend.py")
_BACKEND_CLASS = "DeltaWeightTransferEngine"
_BASE = "vllm.distributed.weight_transfer.base.WeightTransferEngine"
_WORKERS = "vllm/v1/worker/"
_ROUTES = "vllm/entrypoints/"
_HOPS = 8  # most re-exports followed to find a name


@dataclass(frozen=True)
class Calls:
    """`delta` calls `target` (a function, a class, or `Class.method`: `self` not counted) with `positional`
    arguments and the `keywords` named. `optional`: a feature used only where the release has it."""

    target: str
    why: str
    positional: int = 0
    keywords: tuple[str, ...] = ()
    optional: bool = False


@dataclass(frozen=True)
class HasFields:
    """`target` (a class) has these fields or attributes (dataclass fields, class attributes, or what `__init__`
    sets on self), or `target` (a `Literal[...]` alias) holds these values."""

    target: str
    names: tuple[str, ...]
    why: str
    optional: bool = False


@dataclass(frozen=True)
class Route:
    """A `vllm serve` route the senders call: `method path`, its handler taking `params` (query or body) and naming
    `answers` (the reply's keys) in its body."""

    method: str
    path: str
    why: str
    params: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()
    optional: bool = False


Use = Calls | HasFields | Route

_RELOAD = "vllm.model_executor.model_loader.reload"
_PATCH = "vllm.model_executor.model_loader.checkpoint_weight_patch"
_LLM = "vllm.entrypoints.llm.LLM"

#: Every use of vLLM outside the backend's own class (whose overrides are checked from its source, `_backend_checks`).
SURFACE: tuple[Use, ...] = (
    Calls(f"{_BASE}.__init__", "the backend's constructor passes vLLM's four arguments on", 4),
    Calls("vllm.distributed.weight_transfer.base.WeightTransferInitInfo", "DeltaInitInfo adds a defaulted field"),
    Calls("vllm.distributed.weight_transfer.base.WeightTransferUpdateInfo", "DeltaUpdateInfo adds its fields"),
    HasFields(_BASE, ("device", "model", "model_config", "vllm_config"), "the backend reads them"),
    Calls(f"{_BASE}.parse_update_info", "the backend's update_weights parses the dict", 1),
    HasFields("vllm.config.parallel.ParallelConfig", ("rank",), "the handshake file is named by the worker's rank"),
    Calls(
        "vllm.distributed.weight_transfer.factory.WeightTransferEngineFactory.register_engine",
        "delta_vllm_plugin registers the backend lazily",
        3,
    ),
    HasFields(
        "vllm.distributed.weight_transfer.factory.WeightTransferEngineFactory",
        ("_registry",),
        "registering twice is skipped",
    ),
    Calls(f"{_RELOAD}.initialize_layerwise_reload", "CPU: the reload of whole fused groups starts", 1),
    Calls(f"{_RELOAD}.finalize_layerwise_reload", "CPU: the reload ends", 2),
    HasFields(f"{_RELOAD}.layerwise.LAYERWISE_INFO", (), "CPU: a failed load is undone layer by layer"),
    Calls(f"{_RELOAD}.types.LayerReloadingInfo.can_load", "CPU: a failed load is undone", 0),
    HasFields(
        f"{_RELOAD}.types.LayerReloadingInfo",
        ("load_numel", "loaded_weights"),
        "CPU: a failed load's buffered tensors are dropped",
    ),
    HasFields(f"{_RELOAD}.inplace", (), "CPU: the partial reload's warnings are quieted (its logger)", optional=True),
    Calls(
        "vllm.model_executor.layers.vocab_parallel_embedding.UnquantizedEmbeddingMethod.process_weights_after_loading",
        "CPU: a tied lm_head is packed again",
        1,
    ),
    Calls(f"{_PATCH}.CheckpointWeightPatch", "CUDA: a dense patch", 4),
    Calls(f"{_PATCH}.CheckpointWeightPatch", "CUDA: a sparse patch (values at positions)", 5),
    Calls(f"{_PATCH}.load_checkpoint_weight_patches", "CUDA: changes written in place", 2),
    HasFields(
        "vllm.engine.arg_utils.EngineArgs",
        (
            "weight_transfer_config",
            "worker_extension_cls",
            "kv_cache_memory_bytes",
            "gpu_memory_utilization",
            "enforce_eager",
            "enable_lora",
            "max_lora_rank",
            "max_model_len",
            "dtype",
        ),
        "VLLMEngine's LLM(...) settings",
    ),
    Calls(f"{_LLM}.init_weight_transfer_engine", "VLLMEngine's handshake", 1),
    Calls(f"{_LLM}.start_weight_update", "VLLMEngine's update", 0),
    Calls(f"{_LLM}.update_weights", "VLLMEngine's update", 1),
    Calls(f"{_LLM}.finish_weight_update", "VLLMEngine's update", 0),
    Calls(f"{_LLM}.update_weight_version", "VLLMEngine labels the tokens with the version it serves", 1),
    Calls(f"{_LLM}.reset_prefix_cache", "VLLMEngine drops the KV blocks of old weights", 0),
    Calls(f"{_LLM}.generate", "VLLMEngine's generation", 2, ("use_tqdm", "lora_request")),
    HasFields(
        "vllm.sampling_params.SamplingParams",
        (
            "max_tokens",
            "temperature",
            "top_p",
            "top_k",
            "seed",
            "logprobs",
            "prompt_logprobs",
            "stop_token_ids",
            "detokenize",
            "stop",
            "include_stop_str_in_output",
        ),
        "VLLMEngine's sampling",
    ),
    HasFields("vllm.outputs.RequestOutput", ("outputs", "prompt_logprobs"), "VLLMEngine reads the outputs"),
    HasFields("vllm.outputs.CompletionOutput", ("token_ids", "logprobs", "finish_reason"), "VLLMEngine's completions"),
    HasFields(
        "vllm.outputs.CompletionOutput",
        ("weight_versions",),
        "per-token weight versions, kept where vLLM reports them",
        optional=True,
    ),
    HasFields("vllm.outputs.WeightVersionSpan", ("version", "start", "end"), "a span's shape", optional=True),
    Calls("vllm.lora.request.LoRARequest", "VLLMEngine's adapter versions", 3),
    Calls("vllm.v1.engine.llm_engine.LLMEngine.add_lora", "VLLMEngine loads an adapter version", 1),
    Calls("vllm.v1.engine.llm_engine.LLMEngine.remove_lora", "VLLMEngine drops an adapter version", 1),
    Route("GET", "/health", "delta follow waits for the server"),
    Route("POST", "/init_weight_transfer_engine", "delta follow's handshake", ("init_info",)),
    Route("POST", "/pause", "delta follow pauses for an apply, requests in flight kept", ("mode",)),
    HasFields("vllm.v1.engine.PauseMode", ("keep",), "the pause that keeps requests in flight"),
    Route("GET", "/is_paused", "delta follow's checks", (), ("is_paused",)),
    Route("POST", "/start_weight_update", "delta follow's update"),
    Route("POST", "/update_weights", "delta follow's update", ("update_info",)),
    Route("POST", "/finish_weight_update", "delta follow's update, labelled with its version", ("weight_version",)),
    Route("POST", "/reset_prefix_cache", "delta follow drops the KV blocks of old weights"),
    Route("POST", "/resume", "delta follow resumes generation"),
    Route("GET", "/weight_info", "the version a server serves", (), ("weight_version",)),
    Route("GET", "/v1/models", "the base a LoRA server serves"),
    Route("POST", "/v1/load_lora_adapter", "delta follow --lora-alpha loads an adapter version"),
    Route("POST", "/v1/unload_lora_adapter", "delta follow --lora-alpha drops an adapter version"),
    HasFields(
        "vllm.entrypoints.openai.completion.protocol.CompletionRequest",
        ("return_weight_versions",),
        "per-token weight versions asked of a vllm serve",
        optional=True,
    ),
    HasFields(
        "vllm.entrypoints.openai.completion.protocol.CompletionResponseChoice",
        ("weight_versions",),
        "per-token weight versions in a vllm serve's completions",
        optional=True,
    ),
)


@dataclass(frozen=True)
class Finding:
    """One use checked: `ok`, or what changed (`problem`); an optional use that is absent is not a failure."""

    use: str
    problem: str | None = None
    optional: bool = False

    @property
    def fails(self) -> bool:
        return self.problem is not None and not self.optional

    def line(self) -> str:
        if self.problem is None:
            return f"ok       {self.use}"
        return f"{'absent' if self.optional else 'CHANGED':8} {self.use}: {self.problem}"


class Source:
    """A vLLM release's Python files, from a wheel or from a folder that holds `vllm/` (site-packages, an unpacked
    wheel, a checkout). Parsed files are kept.

    Raises:
        FileNotFoundError: `path` is neither a wheel nor a folder with `vllm/__init__.py`.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._zip = zipfile.ZipFile(path) if zipfile.is_zipfile(path) else None
        self._names = set(self._zip.namelist()) if self._zip is not None else None
        if self.read("vllm/__init__.py") is None:
            raise FileNotFoundError(f"{path} holds no vllm/__init__.py: give a vLLM wheel or a folder that holds vllm/")
        self._trees: dict[str, ast.Module | None] = {}

    def read(self, rel: str) -> str | None:
        """The text of `rel` (a path under the root, e.g. `vllm/outputs.py`), None if absent."""
        if self._zip is not None:
            assert self._names is not None
            return self._zip.read(rel).decode() if rel in self._names else None
        full = os.path.join(self.path, rel)
        return Path(full).read_text() if os.path.isfile(full) else None

    def files(self, prefix: str) -> list[str]:
        """Every `.py` file under the folder `prefix`, sorted."""
        if self._names is not None:
            return sorted(n for n in self._names if n.startswith(prefix) and n.endswith(".py"))
        root = Path(self.path)
        return sorted(p.relative_to(root).as_posix() for p in (root / prefix).rglob("*.py"))

    def tree(self, rel: str) -> ast.Module | None:
        if rel not in self._trees:
            text = self.read(rel)
            self._trees[rel] = None if text is None else ast.parse(text)
        return self._trees[rel]

    @property
    def version(self) -> str:
        """The release's `__version__` (from `vllm/_version.py`), or "unknown"."""
        found = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", self.read("vllm/_version.py") or "")
        return found.group(1) if found else "unknown"


# -- finding names -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Found:
    """A definition found: its node and the module file it is in."""

    node: ast.AST
    module: str  # the file, e.g. vllm/outputs.py


def _module_file(source: Source, module: str) -> str | None:
    rel = module.replace(".", "/")
    for candidate in (f"{rel}.py", f"{rel}/__init__.py"):
        if source.read(candidate) is not None:
            return candidate
    return None


def _top_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """Top-level statements, those inside top-level `if` / `try` blocks included (TYPE_CHECKING, fallbacks)."""
    stack = list(reversed(tree.body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If | ast.Try):
            inner = [
                *node.body,
                *getattr(node, "orelse", []),
                *[s for h in getattr(node, "handlers", []) for s in h.body],
            ]
            stack.extend(reversed(inner))
        else:
            yield node


def _package(module_file: str) -> str:
    parts = module_file.removesuffix(".py").split("/")
    return ".".join(parts[:-1])


def _find(source: Source, module_file: str, name: str, hops: int = _HOPS) -> _Found | None:
    """The definition of `name` in a module, following `from X import name` re-exports."""
    tree = source.tree(module_file)
    if tree is None or hops < 0:
        return None
    for node in _top_level(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return _Found(node, module_file)
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return _Found(node, module_file)
    for node in _top_level(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    base = _package(module_file).split(".") if node.level else []
                    if node.level > 1:
                        base = base[: len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                    found_file = _module_file(source, module)
                    if found_file is not None:
                        return _find(source, found_file, alias.name, hops - 1)
                    sub = _module_file(source, f"{module}.{alias.name}")  # `from pkg import submodule`
                    return _Found(ast.Module([], []), sub) if sub else None
    return None


def _resolve(source: Source, dotted: str) -> _Found | None:
    """A dotted name: a module, or a name in the longest module prefix, then attributes of classes (following their
    bases); a module alone resolves to an empty `ast.Module`."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_file = _module_file(source, ".".join(parts[:cut]))
        if module_file is None:
            continue
        found: _Found | None = _Found(ast.Module([], []), module_file)
        for attr in parts[cut:]:
            found = _member(source, found, attr) if found is not None else None
        return found
    return None


def _member(source: Source, found: _Found, attr: str, hops: int = _HOPS) -> _Found | None:
    node = found.node
    if isinstance(node, ast.Module):
        return _find(source, found.module, attr)
    if not isinstance(node, ast.ClassDef) or hops < 0:
        return None
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == attr:
            return _Found(item, found.module)
    for base in _bases(source, found):
        hit = _member(source, base, attr, hops - 1)
        if hit is not None:
            return hit
    return None


def _bases(source: Source, found: _Found) -> list[_Found]:
    """The base classes of a class found, where they can be found in the release's source."""
    assert isinstance(found.node, ast.ClassDef)
    bases = []
    for base in found.node.bases:
        expr = base.value if isinstance(base, ast.Subscript) else base  # Generic[...], WeightTransferEngine[...]
        if isinstance(expr, ast.Name):
            hit = _find(source, found.module, expr.id)
            if hit is not None and isinstance(hit.node, ast.ClassDef):
                bases.append(hit)
    return bases


# -- signatures and fields -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Param:
    name: str
    kind: str  # "positional" (positional or keyword), "positional-only", "keyword-only"
    required: bool


@dataclass(frozen=True)
class _Signature:
    params: tuple[_Param, ...]
    varargs: bool = False
    varkw: bool = False

    def binds(self, positional: int, keywords: tuple[str, ...], caller: str = "delta") -> str | None:
        """Why `caller`'s call with `positional` arguments and `keywords` would not bind (None: it binds)."""
        takes = [p for p in self.params if p.kind != "keyword-only"]
        if positional > len(takes) and not self.varargs:
            return f"takes {len(takes)} positional arguments ({self.text()}), {caller} passes {positional}"
        given = {p.name for p in takes[:positional]}
        by_name = {p.name: p for p in self.params}
        for key in keywords:
            param = by_name.get(key)
            if (param is None or param.kind == "positional-only") and not self.varkw:
                return f"takes no argument {key!r} ({self.text()})"
        missing = [p.name for p in self.params if p.required and p.name not in given and p.name not in keywords]
        if missing:
            return f"requires {', '.join(missing)} ({self.text()}), which {caller} does not pass"
        return None

    def text(self) -> str:
        parts = [f"{p.name}{'' if p.required else '=...'}" for p in self.params if p.kind != "keyword-only"]
        kw = [f"{p.name}{'' if p.required else '=...'}" for p in self.params if p.kind == "keyword-only"]
        if self.varargs or kw:
            parts.append("*args" if self.varargs else "*")
        parts += kw
        if self.varkw:
            parts.append("**kwargs")
        return "(" + ", ".join(parts) + ")"


def _function_signature(node: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> _Signature:
    a = node.args
    ordered = [*a.posonlyargs, *a.args]
    first_default = len(ordered) - len(a.defaults)
    params = [
        _Param(arg.arg, "positional-only" if i < len(a.posonlyargs) else "positional", i < first_default)
        for i, arg in enumerate(ordered)
    ]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
    if method and not static and params:
        params = params[1:]  # self or cls
    params += [_Param(arg.arg, "keyword-only", d is None) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    return _Signature(tuple(params), a.vararg is not None, a.kwarg is not None)


def _class_keyword(node: ast.ClassDef, name: str) -> bool:
    calls = [d for d in node.decorator_list if isinstance(d, ast.Call)]
    keywords = [*node.keywords, *(k for c in calls for k in c.keywords)]
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is True for k in keywords)


def _fields(node: ast.ClassDef) -> list[_Param]:
    """The annotated fields of a dataclass, NamedTuple or msgspec Struct, in order (ClassVar excluded)."""
    kw_only = _class_keyword(node, "kw_only")
    fields = []
    for item in node.body:
        if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name):
            continue
        annotation = ast.unparse(item.annotation)
        if annotation.startswith(("ClassVar", "typing.ClassVar")):
            continue
        if annotation in ("KW_ONLY", "dataclasses.KW_ONLY"):
            kw_only = True
            continue
        value = item.value
        required = value is None
        this_kw = kw_only
        if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("field"):
            names = {k.arg for k in value.keywords}
            required = not names & {"default", "default_factory"}
            this_kw = kw_only or any(
                k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in value.keywords
            )
        fields.append(_Param(item.target.id, "keyword-only" if this_kw else "positional", required))
    return fields


def _constructor(source: Source, found: _Found) -> _Signature:
    """How a class is called: its `__init__` (own or inherited), else its fields and its bases' fields."""
    init = _member(source, found, "__init__")
    if init is not None and isinstance(init.node, ast.FunctionDef | ast.AsyncFunctionDef):
        return _function_signature(init.node, method=True)
    chain: list[_Param] = []
    for base in reversed(_bases(source, found)):
        chain += [p for p in _constructor(source, base).params if p.name not in {q.name for q in chain}]
    assert isinstance(found.node, ast.ClassDef)
    own = _fields(found.node)
    chain = [p for p in chain if p.name not in {q.name for q in own}] + own
    return _Signature(tuple(chain))


def _attributes(source: Source, found: _Found, hops: int = _HOPS) -> set[str]:
    """Names a class defines: fields, class attributes, methods, and what its `__init__` assigns on self; its
    bases' too."""
    node = found.node
    assert isinstance(node, ast.ClassDef)
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
        elif isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(item.name)
            if item.name == "__init__":
                for sub in ast.walk(item):
                    targets = sub.targets if isinstance(sub, ast.Assign) else [getattr(sub, "target", None)]
                    for t in targets:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            names.add(t.attr)
    if hops > 0:
        for base in _bases(source, found):
            names |= _attributes(source, base, hops - 1)
    return names


def _literal_values(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


# -- the checks ----------------------------------------------------------------------------------------------------


def _check_use(source: Source, use: Use, routes: dict[tuple[str, str], ast.AST]) -> Finding:
    if isinstance(use, Route):
        label = f"{use.method} {use.path} ({use.why})"
        handler = routes.get((use.method, use.path))
        if handler is None:
            return Finding(label, "no such route in vllm/entrypoints/", use.optional)
        assert isinstance(handler, ast.FunctionDef | ast.AsyncFunctionDef)
        takes = {a.arg for a in [*handler.args.args, *handler.args.kwonlyargs]}
        body = _literal_values(handler)
        missing = [p for p in use.params if p not in takes and p not in body]
        missing += [k for k in use.answers if k not in body]
        return Finding(label, f"its handler no longer takes or answers {missing}" if missing else None, use.optional)
    label = f"{use.target} ({use.why})"
    found = _resolve(source, use.target)
    if found is None:
        return Finding(label, "not found", use.optional)
    if isinstance(use, HasFields):
        if not use.names:
            return Finding(label)
        if isinstance(found.node, ast.ClassDef):
            have = _attributes(source, found)
        else:
            have = _literal_values(found.node)
        missing = [n for n in use.names if n not in have]
        return Finding(label, f"has no {', '.join(missing)}" if missing else None, use.optional)
    node = found.node
    if isinstance(node, ast.ClassDef):
        signature = _constructor(source, found)
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        signature = _function_signature(node, method="." in use.target and _is_method(source, use.target))
    else:
        return Finding(label, f"is no longer a function or class ({type(node).__name__})", use.optional)
    described = f"{use.target.rsplit('.', 1)[-1]}{'(' if use.positional or use.keywords else '()'}"
    if use.positional or use.keywords:
        described += ", ".join(["_"] * use.positional + [f"{k}=" for k in use.keywords]) + ")"
    return Finding(
        f"{use.target} ({use.why}; called as {described})", signature.binds(use.positional, use.keywords), use.optional
    )


def _is_method(source: Source, dotted: str) -> bool:
    owner = _resolve(source, dotted.rsplit(".", 1)[0])
    return owner is not None and isinstance(owner.node, ast.ClassDef)


def _routes(source: Source) -> dict[tuple[str, str], ast.AST]:
    """(METHOD, path) -> handler, for every `@router.get("/path")`-style decorator under vllm/entrypoints/."""
    found: dict[tuple[str, str], ast.AST] = {}
    for rel in source.files(_ROUTES):
        tree = source.tree(rel)
        for node in ast.walk(tree) if tree is not None else ():
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for deco in node.decorator_list:
                if (
                    isinstance(deco, ast.Call)
                    and isinstance(deco.func, ast.Attribute)
                    and deco.func.attr in ("get", "post", "put", "delete")
                    and deco.args
                    and isinstance(deco.args[0], ast.Constant)
                    and isinstance(deco.args[0].value, str)
                ):
                    found.setdefault((deco.func.attr.upper(), deco.args[0].value), node)
    return found


def _our_methods() -> dict[str, _Signature]:
    """`DeltaWeightTransferEngine`'s methods and their signatures, read from `vllm_backend.py`."""
    tree = ast.parse(_BACKEND.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == _BACKEND_CLASS)
    return {
        n.name: _function_signature(n, method=True)
        for n in cls.body
        if isinstance(n, ast.FunctionDef)
        and not any(isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list)
    }


def _backend_checks(source: Source) -> list[Finding]:
    """The base class's abstract methods are all ours; each of its methods we override takes what ours takes; each
    method vLLM's worker calls on the engine exists and binds (ours, or the base's)."""
    base = _resolve(source, _BASE)
    if base is None or not isinstance(base.node, ast.ClassDef):
        return [Finding(f"{_BASE} (the base class of the backend)", "not found")]
    ours = _our_methods()
    findings = []
    abstract = [
        n.name
        for n in base.node.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(ast.unparse(d).endswith("abstractmethod") for d in n.decorator_list)
    ]
    missing = [name for name in abstract if name not in ours]
    findings.append(
        Finding(
            f"{_BASE}'s abstract methods ({', '.join(abstract)})",
            f"{_BACKEND_CLASS} does not define {', '.join(missing)}" if missing else None,
        )
    )
    for name, signature in sorted(ours.items()):
        theirs = _member(source, base, name)
        if theirs is None or not isinstance(theirs.node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue  # a method of ours alone
        their_signature = _function_signature(theirs.node, method=True)
        same = [(p.name, p.kind) for p in their_signature.params] == [(p.name, p.kind) for p in signature.params]
        findings.append(
            Finding(
                f"{_BACKEND_CLASS}.{name}{signature.text()} overrides the base's",
                None if same else f"the base's is now {name}{their_signature.text()}",
            )
        )
    calls: dict[str, set[tuple[int, tuple[str, ...]]]] = {}
    for rel in source.files(_WORKERS):
        tree = source.tree(rel)
        for node in ast.walk(tree) if tree is not None else ():
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "weight_transfer_engine"
            ):
                keywords = tuple(sorted(k.arg for k in node.keywords if k.arg))
                calls.setdefault(node.func.attr, set()).add((len(node.args), keywords))
    for name, shapes in sorted(calls.items()):
        label = f"vLLM's worker calls engine.{name}"
        if name in ours:
            problems = [ours[name].binds(n, kw, caller="vLLM") for n, kw in sorted(shapes)]
            problem = next((p for p in problems if p), None)
            findings.append(Finding(label, None if problem is None else f"{_BACKEND_CLASS}.{name} {problem}"))
        else:
            inherited = _member(source, base, name)
            findings.append(
                Finding(label, None if inherited else f"neither {_BACKEND_CLASS} nor the base defines {name}")
            )
    return findings


@dataclass
class Report:
    """The findings for one release."""

    source: str
    version: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not any(f.fails for f in self.findings)

    def text(self, quiet: bool = False) -> str:
        """A verdict line, then a line per finding (`quiet`: only those that changed or are absent)."""
        changed = sum(f.fails for f in self.findings)
        checks = f"{len(self.findings)} checks"
        verdict = f"fits ({checks})" if self.fits else f"does NOT fit: {changed} of {checks} changed"
        lines = [f"vLLM {self.version} ({os.path.basename(self.source)}): {verdict}"]
        shown = [f for f in self.findings if f.problem is not None or not quiet]
        order = sorted(shown, key=lambda f: (not f.fails, f.problem is None))
        return "\n".join(lines + ["  " + f.line() for f in order])


def check(path: str) -> Report:
    """Check the vLLM source at `path` (a wheel, or a folder holding `vllm/`) against `SURFACE` and the backend's
    class. Reads files only.

    Raises:
        FileNotFoundError: `path` holds no vLLM (see `Source`).
    """
    source = Source(path)
    routes = _routes(source)
    report = Report(path, source.version)
    report.findings = _backend_checks(source) + [_check_use(source, use, routes) for use in SURFACE]
    return report


def main(argv: list[str] | None = None) -> int:
    """`python -m delta.integrations.vllm_surface SOURCE...`: each release's findings; exit status 1 if one does not
    fit."""
    p = argparse.ArgumentParser(prog="python -m delta.integrations.vllm_surface", description=__doc__.splitlines()[0])
    p.add_argument(
        "sources", nargs="+", help="a vLLM wheel (pip download vllm==X --no-deps), or a folder holding vllm/"
    )
    p.add_argument("--quiet", action="store_true", help="print only what changed or is absent")
    args = p.parse_args(argv)
    status = 0
    for path in args.sources:
        try:
            report = check(path)
        except (FileNotFoundError, zipfile.BadZipFile, SyntaxError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(report.text(args.quiet), flush=True)
        status = status or (0 if report.fits else 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
