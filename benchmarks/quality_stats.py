"""The statistics of benchmarks/distill_quality.py: a mean over photos and seeds with its 95% interval, and a paired
ratio of two such means with its own.

A measurement is values[seed][photo]. Its standard error has three terms, each with its degrees of freedom:
- photos: var(per-photo means) / photos, photos - 1 df (which photos were drawn);
- seeds: var(per-seed means) / seeds, seeds - 1 df (initialisation, crops, order, budget draws);
- drift: the same-seed rerun drift, d^2 / 2 / seeds with 1 df, where d is the difference of the grand means of one
  student trained twice with identical settings (float rounding that differs between two CPU runs). The seed term
  already holds some of it, so adding it is conservative.
The 95% interval is mean +- t(0.975, df) se with df from Welch-Satterthwaite over the terms: with two seeds and a
large seed term, df approaches 1 and t approaches 12.7.
"""

import functools
import math
import statistics

LEVEL = 0.95


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction (modified Lentz)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side only
        return 1 - _incomplete_beta(1 - x, b, a)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny, c, d = 1e-300, 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return front * result


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` (> 0, not necessarily whole) degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / (df + t * t), df / 2, 0.5)
    return 1 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The `p` quantile (0.5 < p < 1) of Student's t with `df` degrees of freedom; the normal's when df is infinite."""
    if math.isinf(df):
        return statistics.NormalDist().inv_cdf(p)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(64):  # the bracket shrinks to 2^-64 of its width: exact in double precision
        middle = (low + high) / 2
        low, high = (middle, high) if t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2


def interval(mean: float, terms: dict[str, tuple[float, float]]) -> dict:
    """terms: {name: (variance of the mean, degrees of freedom)} -> {"mean", "se", "df", "half_width", "low", "high",
    "terms": {name: standard error}}, the half-width of the 95% interval from t on the Welch-Satterthwaite df."""
    variance = sum(v for v, _ in terms.values())
    denominator = sum(v * v / df for v, df in terms.values() if v > 0)
    df = variance * variance / denominator if denominator > 0 else math.inf
    half = t_quantile((1 + LEVEL) / 2, df) * math.sqrt(variance) if variance > 0 else 0.0
    return {"mean": mean, "se": math.sqrt(variance), "df": df, "half_width": half, "low": mean - half,
            "high": mean + half, "terms": {name: math.sqrt(v) for name, (v, _) in terms.items()}}


def error_terms(values: list[list[float]], drift_variance: float = 0.0) -> dict[str, tuple[float, float]]:
    """values[seed][photo] -> the photo, seed and drift terms (variance of the grand mean, df). `drift_variance`: the
    variance one run's grand mean has from rerun drift (d^2 / 2), divided here by the number of seeds."""
    seeds, photos = len(values), len(values[0])
    per_photo = [statistics.fmean(row[p] for row in values) for p in range(photos)]
    per_seed = [statistics.fmean(row) for row in values]
    terms = {"photos": (statistics.variance(per_photo) / photos if photos > 1 else 0.0, photos - 1)}
    if seeds > 1:
        terms["seeds"] = (statistics.variance(per_seed) / seeds, seeds - 1)
    if drift_variance:
        terms["drift"] = (drift_variance / seeds, 1)
    return terms


def grand_mean(values: list[list[float]]) -> float:
    return statistics.fmean(v for row in values for v in row)


def mean_interval(values: list[list[float]], drift_variance: float = 0.0) -> dict:
    """values[seed][photo] -> the grand mean and its 95% interval (see `interval`)."""
    return interval(grand_mean(values), error_terms(values, drift_variance))


def drift_variance(first: list[float], second: list[float]) -> float:
    """Per-photo values of one student trained twice with identical settings -> d^2 / 2, the variance that rerun
    drift gives one run's grand mean (one df)."""
    return (statistics.fmean(first) - statistics.fmean(second)) ** 2 / 2


def paired(values: list[list[float]], reference: list[list[float]]) -> list[list[float]]:
    """A reference measured once (one row: a fixed baseline) repeated for every seed of `values`, else as it is."""
    return reference * len(values) if len(reference) == 1 else reference


def paired_ratio(values: list[list[float]], reference: list[list[float]], drift: float = 0.0,
                 reference_drift: float = 0.0) -> dict:
    """mean(A) / mean(B) for two measurements of the same photos (and seeds; a reference with one row is the same for
    every seed) with its 95% interval by the delta method: se(A / B) = se(A - r B) / mean(B), A - r B taken per
    photo and seed, so that what both share (an easy photo, a lucky seed) cancels. `drift` / `reference_drift`: the
    rerun-drift variance of A's and B's grand means (`drift_variance`)."""
    reference = paired(values, reference)
    reference_mean = grand_mean(reference)
    ratio = grand_mean(values) / reference_mean
    differences = [[a - ratio * b for a, b in zip(row, row_b)] for row, row_b in zip(values, reference)]
    terms = error_terms(differences, drift + ratio * ratio * reference_drift)
    scaled = {name: (v / reference_mean**2, df) for name, (v, df) in terms.items()}
    return interval(ratio, scaled)


def paired_difference(values: list[list[float]], reference: list[list[float]], drift: float = 0.0,
                      reference_drift: float = 0.0) -> dict:
    """mean(A) - mean(B) with its 95% interval, A - B taken per photo and seed (see `paired_ratio`)."""
    reference = paired(values, reference)
    differences = [[a - b for a, b in zip(row, row_b)] for row, row_b in zip(values, reference)]
    return interval(grand_mean(differences), error_terms(differences, drift + reference_drift))
