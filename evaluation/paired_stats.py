"""Paired bootstrap statistics over test examples: one set of resampled rows shared by every line of a run, so that
each mean, difference and ratio is read on the same resamples (a paired interval).

    rows = bootstrap_rows(len(test), 2000, seed)
    interval(correct, rows)                     # a line's accuracy and its 95% interval
    interval(first - second, rows)              # a paired difference
    ratio_interval(covered, reference, rows)    # a paired ratio of two means
"""

import torch


def bootstrap_rows(count: int, resamples: int, seed: int) -> torch.Tensor:
    """(resamples, count) canvas indices drawn with replacement: one set shared by every line (paired intervals)."""
    return torch.randint(0, count, (resamples, count), generator=torch.Generator().manual_seed(seed + 17))


def interval(values: torch.Tensor, rows: torch.Tensor) -> dict:
    """Mean of per-canvas `values` (N,) and its 95% percentile-bootstrap interval over `rows` (a paired difference
    when `values` are per-canvas differences)."""
    means = values.double()[rows].mean(1)
    low, high = (float(means.quantile(q)) for q in (0.025, 0.975))
    return {"mean": float(values.double().mean()), "low": low, "high": high, "half_width": (high - low) / 2}


def ratio_interval(values: torch.Tensor, reference: torch.Tensor, rows: torch.Tensor) -> dict:
    """mean(values) / mean(reference) over the canvases, with its 95% bootstrap interval (paired resamples)."""
    ratios = values.double()[rows].mean(1) / reference.double()[rows].mean(1).clamp(min=1e-12)
    low, high = torch.quantile(ratios, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return {"ratio": float(values.double().mean() / reference.double().mean().clamp(min=1e-12)), "low": low,
            "high": high}
