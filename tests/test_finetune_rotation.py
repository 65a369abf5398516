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


def test_grouped_bootstrap_resamples_whole_groups_and_weighs_by_their_images():
    first, second = "1111" "10" "00", "0000" "10" "00"  # group a: +1 on 4 images; b, c: 0 on 2 each
    groups = ["a"] * 4 + ["b"] * 2 + ["c"] * 2
    result = paired_bootstrap(first, second, 4000, 0, groups)
    assert result["difference"] == pytest.approx(4 / 8) and result["groups"] == 3
    # every draw's mean is (4 x the times a is drawn) / (images drawn): 0, 4/8, 8/10 or 12/12; the interval spans them
    assert result["interval_95"] == [0.0, 1.0]
    # image-wise resampling of the same strings claims a far narrower interval
    low, high = paired_bootstrap(first, second, 4000, 0)["interval_95"]
    assert 0 < low and high < 1
    with pytest.raises(ValueError, match="different held-out sets"):
        paired_bootstrap(first, second[:-1], 10, 0)


def test_group_keys_follow_the_val_groups_rule():
    from benchmarks.finetune_rotation import group_keys

    files = ["upright/beach_0.png", "upside_down/beach_0.png", "upright/beach_11.png", "upright/odd.png"]
    assert group_keys(files, r"(.+)_\d+$") == ["beach", "beach", "beach", "odd"]
