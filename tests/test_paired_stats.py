"""evaluation.paired_stats: the paired bootstrap's intervals of a constant, a spread and a ratio."""

import pytest
import torch

from evaluation.goals import goal
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


def test_a_ratio_over_a_share_near_zero_is_null_not_a_huge_number():
    """The review's 8.8e11: a reference share of 0 in some resamples was divided by 1e-12. Now a bound the resamples
    of a zero reference reach is None (unbounded), and so is the ratio where the reference's own share is 0; the goal
    rule reads a None bound as lying above nothing."""
    rows = bootstrap_rows(20, 500, seed=0)
    values = torch.full((20,), 0.9)
    rare = torch.zeros(20)
    rare[3] = 0.5  # one canvas in 20: about a third of the resamples draw none of it
    sparse = ratio_interval(values, rare, rows)
    assert sparse["ratio"] == pytest.approx(0.9 / 0.025) and sparse["low"] is not None and sparse["high"] is None
    undefined = ratio_interval(values, torch.zeros(20), rows)
    assert undefined == {"ratio": None, "low": None, "high": None}
    assert ratio_interval(torch.zeros(20), torch.zeros(20), rows) == {"ratio": 0.0, "low": 0.0, "high": 0.0}
    assert ratio_interval(rare, values, rows)["high"] is not None  # a share near 0 above the line is fine
    reference = {"low": 0.5}
    assert not goal("g", "", undefined, 1.0, reference, 0.1)["met"]  # no lower bound: not above the margin
    assert not goal("g", "", {"low": 2.0}, 1.0, {"low": None}, 0.1)["met"]
    assert goal("g", "", {"low": 2.0}, 1.0, reference, 0.1)["met"]
