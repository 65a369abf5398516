"""The latency harness's spread and warnings: what every published latency carries."""

import pytest

from corevision_hf.measure import alternated_latency, latency_warnings, spread_ms


def test_spread_is_the_median_and_interquartile_range_in_ms():
    assert spread_ms([0.004, 0.001, 0.002, 0.003, 0.005]) == pytest.approx(
        {"latency_ms": 3.0, "latency_iqr_ms": 2.0, "runs": 5})
    assert spread_ms([0.002]) == {"latency_ms": 2.0, "latency_iqr_ms": 0.0, "runs": 1}


def test_alternated_latency_times_every_function_in_turn():
    calls = []
    latencies = alternated_latency({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, "cpu", runs=3,
                                   warmup=1)
    assert calls == ["a", "b"] + ["a", "b"] * 3  # warm-ups, then one run of each per round
    assert set(latencies) == {"a", "b"} and latencies["a"]["runs"] == 3


def test_warnings_name_a_large_spread_and_a_larger_input_that_came_out_faster():
    steady = {"latency_iqr_ms": 1.0, "runs": 10}
    latencies = {
        ("student", 224): {"latency_ms": 484.0, **steady},
        ("student", 448): {"latency_ms": 136.0, **steady},  # the busy-machine numbers
        ("teacher", 224): {"latency_ms": 80.0, "latency_iqr_ms": 40.0, "runs": 10},
        ("teacher", 448): {"latency_ms": 351.0, **steady},
    }
    assert latency_warnings(latencies) == [
        "teacher at 224 px: the spread (IQR 40 ms) exceeds 25% of the median 80 ms",
        "student came out faster at 448 px (136 ms) than at 224 px (484 ms)",
    ]
    assert latency_warnings({("student", 224): {"latency_ms": 100.0, **steady},
                             ("student", 1024): {"latency_ms": 900.0, **steady}}) == []
