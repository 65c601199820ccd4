"""The trainer's GPU check skips cleanly without a GPU, naming why; --sim runs its whole flow."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pynvml
import pytest

from stormwatch.agent import FakeNvml

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check_trainer.py"


def _nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def _load_script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # it imports its sibling gpu_check
    spec = importlib.util.spec_from_file_location("gpu_check_trainer", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(_nvml_works(), reason="this machine has an NVIDIA driver")
def test_without_a_gpu_the_check_says_skipped_with_the_reason_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("skipped: no NVIDIA GPU (NVML cannot be initialised: ")
    assert "Traceback" not in done.stderr


def test_with_nvml_but_a_cpu_build_of_torch_the_reason_names_torch(monkeypatch) -> None:
    import torch

    if torch.version.cuda is not None:
        pytest.skip("torch is a CUDA build here")
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(1))
    reason = _load_script(monkeypatch).no_gpu_reason()
    assert reason == f"torch {torch.__version__} is a CPU-only build; install a CUDA build of torch"


def test_when_nvml_lists_no_gpu_the_reason_says_so(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(0))
    assert _load_script(monkeypatch).no_gpu_reason() == "NVML sees no GPU"


@pytest.mark.e2e
@pytest.mark.untimed
def test_sim_mode_trains_under_torchrun_and_reads_it_back_through_the_agent(tmp_path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--sim", "--steps", "6", "--warmup", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK (--sim" in done.stdout
    assert "step time: median" in done.stdout and "MFU: " in done.stdout
    result = json.loads(out.read_text())
    assert result["backend"] == "gloo" and result["steps_measured"] == 4
    assert result["gpus"] and 0 < result["mfu"] <= 1
