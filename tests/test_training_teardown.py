"""A two-process CPU distillation always exits: the run that hung at exit in about one of six tries before the
teardown fix (training.checkpointing `finish`) is repeated six times by tests/distill_teardown.py."""

import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.slow
def test_two_process_runs_never_hang_at_exit(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tests.distill_teardown", "--runs", "6", "--timeout", "120",
         "--scratch-dir", str(tmp_path / "teardown")],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("final/ exported: True") == 6, result.stdout
    assert "6 runs: 0 hung, 0 failed" in result.stdout, result.stdout
