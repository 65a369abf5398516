"""benchmarks.finetune_rotation: the paired bootstrap of two runs' held-out predictions."""

import pytest

from benchmarks.finetune_rotation import paired_bootstrap


def test_paired_bootstrap_resamples_the_images_once_for_both_runs():
    first, second = "10110110", "00100110"
    result = paired_bootstrap(first, second, 2000, 0)
    assert result["difference"] == pytest.approx(2 / 8)
    low, high = result["interval_95"]
    assert 0 <= low < 2 / 8 < high <= 4 / 8  # paired: a draw can never make the second run better here
    assert result == paired_bootstrap(first, second, 2000, 0)
    assert paired_bootstrap(first, first, 2000, 0)["interval_95"] == [0.0, 0.0]
