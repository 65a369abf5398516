"""Paired bootstrap statistics over test examples: one set of resampled rows shared by every line of a run, so that
each mean, difference and ratio is read on the same resamples (a paired interval).

    rows = bootstrap_rows(len(test), 2000, seed)
    interval(correct, rows)                     # a line's accuracy and its 95% interval
    interval(first - second, rows)              # a paired difference
    ratio_interval(covered, reference, rows)    # a paired ratio of two means

Where examples come in groups that are not independent draws (the crops of one photo), whole groups are resampled:

    index, draws = group_draws(photo_of_each_image, 2000, seed)
    grouped_interval(first - second, index, draws)    # a paired difference, over photos
"""

import math

import torch

# A reference share at most this is 0: the shares are means of 0/1 or of cell fractions, whose smallest non-zero
# value over a run's canvases is far above it.
NEAR_ZERO = 1e-9


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
    """mean(values) / mean(reference) over the canvases, with its 95% bootstrap interval (paired resamples). Over a
    reference share near 0 (at most NEAR_ZERO) a share above it is unbounded: "ratio" is None where the means are so,
    and a bound is None where the resamples that are so reach it. A share of 0 over a share of 0 is 0, as it always
    was here (the VECA benchmark's retention of a line at 0 reads it)."""
    means, reference_means = values.double()[rows].mean(1), reference.double()[rows].mean(1)
    ratios = torch.where(reference_means > NEAR_ZERO, means / reference_means.clamp(min=NEAR_ZERO),
                         torch.where(means > NEAR_ZERO, math.inf, 0.0))
    low, high = (bound if math.isfinite(bound) else None
                 for bound in torch.quantile(ratios, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist())
    mean, reference_mean = float(values.double().mean()), float(reference.double().mean())
    ratio = mean / reference_mean if reference_mean > NEAR_ZERO else None if mean > NEAR_ZERO else 0.0
    return {"ratio": ratio, "low": low, "high": high}


def group_draws(groups: list, resamples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(index (N,): each example's group, numbered in order of first appearance; draws (resamples, G): the groups of
    each resample, drawn with replacement), one set shared by every line of a run, as `bootstrap_rows` is."""
    number = {key: position for position, key in enumerate(dict.fromkeys(groups))}
    return torch.tensor([number[key] for key in groups]), bootstrap_rows(len(number), resamples, seed)


def grouped_interval(values: torch.Tensor, index: torch.Tensor, draws: torch.Tensor) -> dict:
    """Mean of per-example `values` (N,) and its 95% percentile-bootstrap interval resampling whole groups (`index`
    and `draws` of `group_draws`): each resample's mean is over the examples of the groups it drew."""
    values = values.double()
    sums = torch.zeros(draws.shape[1], dtype=torch.float64).index_add_(0, index, values)
    counts = torch.bincount(index, minlength=draws.shape[1]).double()
    means = sums[draws].sum(1) / counts[draws].sum(1)
    low, high = (float(means.quantile(q)) for q in (0.025, 0.975))
    return {"mean": float(values.mean()), "low": low, "high": high, "half_width": (high - low) / 2}
