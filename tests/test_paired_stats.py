"""evaluation.paired_stats: the paired bootstrap's intervals of a constant, a spread and a ratio."""

import pytest
import torch

from evaluation.paired_stats import bootstrap_rows, interval, ratio_interval


def test_intervals_of_constant_and_paired_values():
    rows = bootstrap_rows(10, 200, seed=0)
    same = interval(torch.ones(10), rows)
    assert same["mean"] == same["low"] == same["high"] == 1.0 and same["half_width"] == 0.0
    values = torch.tensor([1.0, 0, 1, 0, 1, 0, 1, 0, 1, 0])
    spread = interval(values, rows)
    assert spread["mean"] == 0.5 and spread["low"] < 0.5 < spread["high"]
    ratio = ratio_interval(2 * values + 1, values + 1, rows)  # means 2 and 1.5
    assert ratio["ratio"] == pytest.approx(2 / 1.5) and ratio["low"] <= ratio["ratio"] <= ratio["high"]
