"""Device-dependent defaults, decided in one place from a description of the machine (`Machine`): the trainer's
device and bf16 autocast (`plan_trainer`), and the rollout engines' dtype, KV cache or GPU memory share, CUDA
graphs, and whether they serve the published weights bit for bit (`plan_rollout`). A `Machine` can be written by
hand, so every GPU case is decided, and tested, on a CPU (docs/running.md#hardware)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

#: KV cache of vLLM on a CPU (vLLM's own default there is 92 % of the machine's RAM).
CPU_KV_CACHE_BYTES = 256 << 20
#: Share of a GPU's memory vLLM takes (weights + activations + KV cache) when not told otherwise.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.85
#: Share of a GPU's memory `python app.py` leaves to the trainer when its rollout servers run vLLM on the same GPU.
TRAINER_GPU_SHARE = 0.35
#: The least GPU memory share a vLLM rollout server is started with (weights, activations, a small KV cache).
MIN_ROLLOUT_GPU_SHARE = 0.05
#: Compute dtypes the engines take besides `auto`.
DTYPES = ("auto", "bfloat16", "float16", "float32")
_BITS = {"bfloat16": 16, "float16": 16, "float32": 32}


@dataclass(frozen=True)
class Gpu:
    """One visible GPU: its name, CUDA compute capability, whether it computes in bf16 natively (8.0 and up; torch
    emulates it below, vLLM refuses it), its memory and what was free when probed."""

    name: str
    capability: tuple[int, int]
    bf16_native: bool
    total_bytes: int
    free_bytes: int

    @property
    def label(self) -> str:
        """`Tesla T4 (compute 7.5)`, for messages."""
        return f"{self.name} (compute {self.capability[0]}.{self.capability[1]})"


@dataclass(frozen=True)
class Machine:
    """What a role runs on: the GPUs torch sees, in its order (none: a CPU machine), and whether `torchrun` /
    `accelerate launch` started one process per GPU (`distributed`)."""

    gpus: tuple[Gpu, ...] = ()
    distributed: bool = False

    @classmethod
    def probe(cls) -> Machine:
        """The machine this process runs on, as torch sees it (no GPU memory is allocated)."""
        import torch

        gpus = []
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                free, total = _memory(i, props.total_memory)
                gpus.append(Gpu(props.name, (props.major, props.minor), _bf16_native(i), total, free))
        return cls(tuple(gpus), int(os.environ.get("WORLD_SIZE", "1") or 1) > 1)


def _bf16_native(index: int) -> bool:
    """bf16 without emulation: torch's answer for the current device, else its rule on CUDA (capability 8.0 and up);
    asking for another device would open a CUDA context that vLLM's start-up check counts."""
    import torch

    if index == torch.cuda.current_device():
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # an older torch
            pass
    return torch.cuda.get_device_capability(index) >= (8, 0)


def _memory(index: int, total: int) -> tuple[int, int]:
    """(free, total) bytes of GPU `index`; through NVML where installed (vLLM needs it on GPUs), which
    opens no CUDA context in this process, else through torch."""
    try:
        import pynvml

        pynvml.nvmlInit()
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(_physical_index(index)))
        return int(info.free), int(info.total)
    except Exception:  # noqa: BLE001 - NVML absent or failing: torch's answer (opens a context on the GPU)
        import torch

        free, total = torch.cuda.mem_get_info(index)
        return int(free), int(total)


def _physical_index(index: int) -> int:
    """NVML numbers GPUs physically; CUDA_VISIBLE_DEVICES renumbers them for torch."""
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return int(visible[index]) if index < len(visible) and visible[index].strip().isdigit() else index


def device_name(name: str | None, gpus: int) -> str:
    """The torch device `name` means with `gpus` visible GPUs: `auto` (or None) is `cuda` where a GPU is, else `cpu`.

    Raises:
        ValueError: an unknown name, or a GPU that is not there (the message says how to fall back).
    """
    name = (name or "auto").strip().lower()
    if name == "auto":
        return "cuda" if gpus else "cpu"
    if name == "cpu":
        return name
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if not gpus:
            raise ValueError(
                f"device {name!r} asked for, but torch sees no GPU; use --device cpu (or auto), or "
                "install a CUDA build of torch on a machine with one"
            )
        index = int(name[5:]) if ":" in name else 0
        if index >= gpus:
            raise ValueError(f"device {name!r} does not exist: torch sees {gpus} GPU(s)")
        return name
    raise ValueError(f"unknown device {name!r}; choose auto, cpu, cuda or cuda:N")


def _one_gpu(name: str, machine: Machine, who: str, why: str) -> None:
    """Refuse a GPU other than the first, and several visible GPUs, where `who` would use only cuda:0."""
    index = int(name[5:]) if name.startswith("cuda:") else 0
    if index:
        raise ValueError(
            f"--device {name}: {why}; make that GPU the only one {who} sees instead: "
            f"CUDA_VISIBLE_DEVICES={index} with --device cuda"
        )
    if len(machine.gpus) > 1 and not machine.distributed:
        raise ValueError(
            f"torch sees {len(machine.gpus)} GPUs and {who} uses one: set CUDA_VISIBLE_DEVICES to the "
            "GPU it should take (e.g. CUDA_VISIBLE_DEVICES=0), or run one process per GPU under "
            "`accelerate launch`"
        )


@dataclass(frozen=True)
class TrainerPlan:
    """How the trainer runs: its `device` (`cpu` or `cuda`), `bf16` autocast (only where the GPU has it natively; the
    published weights keep the checkpoint's dtype either way), and `notes` for the log."""

    device: str
    bf16: bool
    notes: tuple[str, ...] = ()


def plan_trainer(machine: Machine, device: str | None = "auto") -> TrainerPlan:
    """The trainer's device and precision on `machine`.

    Raises:
        ValueError: a device that is not there; `cuda:N` with N > 0 (transformers moves the model to cuda:0);
            several visible GPUs outside `accelerate launch`. Each message says what to set.
    """
    name = device_name(device, len(machine.gpus))
    if name == "cpu":
        return TrainerPlan("cpu", False)
    _one_gpu(
        name,
        machine,
        "the trainer",
        "transformers' Trainer puts the model on cuda:0 whatever the device, and the published weights "
        "would stop following it",
    )
    gpu = machine.gpus[0]
    if gpu.bf16_native:
        return TrainerPlan("cuda", True)
    return TrainerPlan(
        "cuda",
        False,
        (
            (
                f"{gpu.label} has no native bf16: training in fp32 (torch would emulate "
                "bf16, slowly); an L4-class GPU (compute 8.0+) trains in bf16"
            ),
        ),
    )


@dataclass(frozen=True)
class RolloutPlan:
    """How a rollout engine runs on a machine.

    Attributes:
        device: Where the transformers engine runs (`cpu`, `cuda`, `cuda:N`); vLLM uses its platform's.
        dtype: The compute dtype the engine is started with (never `auto`).
        exact: The weights served are the published state bit for bit, so the rollout may report its hash.
        kv_cache_bytes: vLLM's KV cache size (CPU); None: sized from `gpu_memory_utilization`.
        gpu_memory_utilization: Share of the GPU's memory vLLM takes (None on a CPU).
        enforce_eager: No CUDA graphs or torch.compile (always on a CPU).
        notes: Warnings to log (an inexact dtype, an emulated one).
    """

    device: str
    dtype: str
    exact: bool
    kv_cache_bytes: int | None
    gpu_memory_utilization: float | None
    enforce_eager: bool
    notes: tuple[str, ...] = field(default=())

    def vllm_kwargs(self) -> dict[str, object]:
        """The keyword arguments of vLLM's `LLM` this plan decides."""
        kwargs: dict[str, object] = {"dtype": self.dtype, "enforce_eager": self.enforce_eager}
        if self.kv_cache_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = self.kv_cache_bytes
        if self.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        return kwargs


def holds(compute: str, published: str) -> bool:
    """Whether `compute` represents every value of `published` exactly (bf16 and fp16 both fit fp32;
    neither fits the other: fp16 has fewer exponent bits, bf16 fewer mantissa bits)."""
    return compute == published or (compute == "float32" and published in _BITS)


def _compute_dtype(gpu: Gpu | None, engine: str, published: tuple[str, ...], dtype: str, notes: list[str]) -> str:
    """`plan_rollout`'s dtype: `dtype` unless `auto`; notes what a GPU without bf16 does (see there)."""
    if dtype != "auto":
        if gpu is not None and dtype == "bfloat16" and not gpu.bf16_native:
            if engine == "vllm":
                raise ValueError(
                    f"--dtype bfloat16: {gpu.label} has no native bf16 and vLLM refuses it; use an "
                    "L4-class GPU (compute 8.0+), or --dtype float32 (exact) or float16 (inexact)"
                )
            notes.append(f"{gpu.label} has no native bf16: torch emulates it, slowly")
        return dtype
    if gpu is None or len(set(published)) != 1:  # a CPU, or a checkpoint of mixed dtypes: float32 holds all
        return "float32"
    if published[0] == "bfloat16" and not gpu.bf16_native:
        if engine == "vllm":
            raise ValueError(
                f"{gpu.label} has no native bf16 and the checkpoint is bf16: vLLM would serve fp16, and the "
                "weights served would differ from the published ones. Use an L4-class GPU (compute 8.0+), or "
                "set DTYPE (--dtype) to float32 (exact, twice the memory) or float16 (inexact: the rollout "
                "then reports no state hash)"
            )
        notes.append(f"{gpu.label} has no native bf16: serving in float32 (exact, twice the memory)")
        return "float32"
    return published[0]


def plan_rollout(
    machine: Machine,
    *,
    engine: str,
    published: tuple[str, ...] = ("bfloat16",),
    device: str | None = "auto",
    dtype: str = "auto",
    memory_fraction: float | None = None,
    cuda_graphs: bool = True,
) -> RolloutPlan:
    """The rollout engine's settings on `machine` for `engine` (`vllm` or `transformers`) and the checkpoint's float
    dtypes (`published`), from `--device`, `--dtype` (`auto`: the published dtype where computed natively, else
    float32), `--gpu-memory-utilization` and `--cuda-graphs`.

    Raises:
        ValueError: a setting that cannot start, or would serve other weights than published unasked (vLLM on a GPU
            without native bf16 for a bf16 checkpoint; vLLM told `cuda:N`; a memory share outside (0, 1] or above
            what is free); the message says what to set.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if memory_fraction is not None and not 0 < memory_fraction <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {memory_fraction}")
    name = device_name(device, len(machine.gpus))
    gpu = None
    if engine == "vllm" and machine.gpus:
        if name == "cpu":
            raise ValueError(
                "--device cpu with the vllm engine on a machine with a GPU: vLLM runs on the GPU "
                "whatever the device; use --engine transformers, or hide the GPUs (CUDA_VISIBLE_DEVICES=)"
            )
        if name not in ("cuda", "cuda:0"):
            raise ValueError(
                f"--device {name}: vLLM runs on the first visible GPU whatever the device; make that "
                f"GPU the only one it sees instead: CUDA_VISIBLE_DEVICES={name[5:]} with --device cuda"
            )
        gpu, name = machine.gpus[0], "cuda"
    elif name != "cpu":
        gpu = machine.gpus[int(name[5:]) if name.startswith("cuda:") else 0]
    notes: list[str] = []
    compute = _compute_dtype(gpu, engine, published, dtype, notes)
    exact = all(holds(compute, p) for p in published)
    if not exact:
        notes.append(
            f"serving in {compute} weights published in {'/'.join(sorted(set(published)))}: the served "
            "weights are rounded, not the published ones; the rollout reports no state hash"
        )
    if gpu is None or engine != "vllm":
        return RolloutPlan(
            name, compute, exact, CPU_KV_CACHE_BYTES if engine == "vllm" else None, None, True, tuple(notes)
        )
    fraction = DEFAULT_GPU_MEMORY_UTILIZATION if memory_fraction is None else memory_fraction
    free_share = gpu.free_bytes / gpu.total_bytes
    if fraction > free_share:
        fits = max(int((free_share - 0.05) * 100) / 100, 0.0)
        what = (
            f"set GPU_MEMORY_UTILIZATION (--gpu-memory-utilization) to {fits:.2f} or less"
            if fits >= 0.1
            else "free the GPU (stop what runs on it) first"
        )
        raise ValueError(
            f"vLLM would take {fraction:.2f} of the {gpu.label}'s {gpu.total_bytes / 2**30:.1f} GiB, but "
            f"only {gpu.free_bytes / 2**30:.1f} GiB ({free_share:.2f}) are free (another process, "
            f"such as a trainer on the same GPU, holds the rest): {what}"
        )
    return RolloutPlan("cuda", compute, exact, None, fraction, not cuda_graphs, tuple(notes))


_SAFETENSORS_FLOATS = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def published_dtypes(folder: str) -> tuple[str, ...]:
    """The dtypes of the float tensors in a model folder's safetensors files (what the trainer publishes),
    read from the files' headers alone."""
    found: set[str] = set()
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            with open(os.path.join(folder, name), "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            found.update(
                _SAFETENSORS_FLOATS[v["dtype"]]
                for k, v in header.items()
                if k != "__metadata__" and v["dtype"] in _SAFETENSORS_FLOATS
            )
    return tuple(sorted(found))


def log_notes(notes: tuple[str, ...]) -> None:
    """Log each decision worth knowing as a warning (a T4, an inexact dtype)."""
    for note in notes:
        logger.warning("%s", note)


def rollout_share_beside_trainer(machine: Machine, rollouts: int) -> float | None:
    """Each vLLM rollout server's share of the GPU's memory when `python app.py` starts `rollouts` of them beside the
    trainer on one machine: vLLM's default share less `TRAINER_GPU_SHARE`, split evenly (None without a GPU).

    Raises:
        ValueError: so many servers that a share would fall below `MIN_ROLLOUT_GPU_SHARE`.
    """
    if not machine.gpus:
        return None
    share = int((DEFAULT_GPU_MEMORY_UTILIZATION - TRAINER_GPU_SHARE) / rollouts * 100) / 100
    if share < MIN_ROLLOUT_GPU_SHARE:
        raise ValueError(
            f"{rollouts} vLLM rollout servers and the trainer do not fit one GPU ({share:.2f} of its "
            "memory each): start fewer with --rollouts, or run them with --engine transformers"
        )
    return share
