"""benchmarks.gpu_check on a machine without CUDA: runs the agreement checks a CPU can, says what it skipped,
exits 0; and refuses --device cuda in one line."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "benchmarks.gpu_check"]


@pytest.mark.slow
def test_gpu_check_runs_what_a_cpu_can_and_names_what_it_skipped():
    result = subprocess.run([*COMMAND, "--quick", "--device", "cpu"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    diffs = re.findall(r"agreement (veca|lookwhere) +sdpa .* max abs diff (\S+) \(tolerance 1e-04\) ok", result.stdout)
    assert {name for name, _ in diffs} == {"veca", "lookwhere"}
    assert all(float(diff) <= 1e-4 for _, diff in diffs)
    assert "skipped: flash_attention_2: needs a CUDA GPU" in result.stdout
    assert "skipped: bf16 agreement and all timings: need a CUDA GPU" in result.stdout


@pytest.mark.slow
def test_gpu_check_refuses_cuda_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU, where --device cuda runs instead of being refused")
    result = subprocess.run([*COMMAND, "--device", "cuda"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --device cuda, but this torch sees no CUDA GPU; run on a GPU machine or pass --device cpu"
    ]
