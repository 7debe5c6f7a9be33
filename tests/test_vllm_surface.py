"""The API-surface check (`delta.integrations.vllm_surface`): it passes on the vLLM installed here (0.32 in the
suite, 0.31 under scripts/test_vllm031.sh), and on a copy of its source where the worker API changed as it did after
0.23 it fails, saying what changed. The releases that are not installed (0.33, 0.34, and 0.22 failing) are checked
from their wheels by scripts/check_vllm_api.sh, which downloads them; docs/delta.md holds its output."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

import delta_vllm_plugin
from delta.integrations.vllm_surface import check, main
from tests._engines import needs_vllm

BASE = "vllm/distributed/weight_transfer/base.py"


def installed_vllm() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent.parent  # the folder that holds vllm/


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The installed vLLM's Python files (no compiled ones), to change one file at a time."""
    root = tmp_path_factory.mktemp("vllm-src")
    shutil.copytree(installed_vllm() / "vllm", root / "vllm",
                    ignore=lambda _, names: [n for n in names if n.endswith((".so", ".pyc", ".cu", ".h"))])
    return root


@needs_vllm
def test_the_installed_vllm_fits_and_its_release_is_in_the_window() -> None:
    import vllm
    import vllm.outputs

    report = check(str(installed_vllm()))
    assert report.version == vllm.__version__
    assert report.fits, report.text()
    delta_vllm_plugin.check_vllm_version(report.version)
    # Per-token weight versions: CompletionOutput.weight_versions came with 0.32 (absent from 0.31's source).
    spans = next(f for f in report.findings if "per-token weight versions, kept" in f.use)
    assert (spans.problem is None) == hasattr(vllm.outputs, "WeightVersionSpan")


@needs_vllm
def test_a_changed_worker_api_fails_the_check_saying_what_changed(source_copy: Path, capsys) -> None:
    base = source_copy / BASE
    text = base.read_text()
    assert "    def finish_weight_update(self) -> None:" in text
    changed = text.replace("    def finish_weight_update(self) -> None:",
                           "    def finish_weight_update(self, weight_version: str) -> None:", 1)
    changed = changed.replace("    @abstractmethod\n    def shutdown(self) -> None:",
                              "    @abstractmethod\n    def trainer_send_weights(self) -> None:\n        ...\n\n"
                              "    @abstractmethod\n    def shutdown(self) -> None:", 1)
    base.write_text(changed)
    try:
        report = check(str(source_copy))
        lines = report.text().splitlines()
        assert not report.fits
        assert lines[0].endswith(f"does NOT fit: 2 of {len(report.findings)} checks changed")
        assert ("  CHANGED  DeltaWeightTransferEngine.finish_weight_update() overrides the base's: the base's is now "
                "finish_weight_update(weight_version)") in lines
        assert any(line.startswith("  CHANGED  vllm.distributed.weight_transfer.base.WeightTransferEngine's abstract "
                                   "methods") and line.endswith("DeltaWeightTransferEngine does not define "
                                                                "trainer_send_weights") for line in lines)
        assert main(["--quiet", str(source_copy)]) == 1
        out = capsys.readouterr().out.splitlines()
        assert sum(line.startswith("  CHANGED") for line in out) == 2 and not any(" ok " in line for line in out)
    finally:
        base.write_text(text)
    assert check(str(source_copy)).fits  # the copy itself holds everything the check reads


def test_a_folder_without_vllm_is_one_line(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path} holds no vllm/__init__.py: give a vLLM wheel or a folder " \
                                      "that holds vllm/\n"
