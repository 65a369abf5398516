"""The one rule by which the task benchmarks meet or miss a goal: a paired 95% interval against a margin, and a
reference line whose interval lies above chance (evaluation.paired_stats makes both intervals); and a goal's value
along a learning curve (`along_the_curve`), on the same resamples."""


def goal(name: str, rule: str, value: dict, margin: float, reference: dict, reference_floor: float, **extra
         ) -> dict:
    """One goal by the one rule: the value's 95% interval lies above `margin` (`low` for a difference, a ratio's
    `low` too) and the reference's lies above `reference_floor` (chance, or 1 for a ratio). A bound that is None (a
    ratio over a share near 0: evaluation.paired_stats) lies above nothing."""
    above = value["low"] is not None and value["low"] > margin
    reference_ok = reference["low"] is not None and reference["low"] > reference_floor
    return {"goal": name, "met": bool(above and reference_ok), "rule": rule, "margin": margin, "value": value,
            "interval_above_margin": bool(above), "reference": reference, "reference_above_chance": bool(reference_ok),
            **extra}


def bootstrapped(statistic, tensors: list, rows) -> dict:
    """statistic(*means) of per-canvas tensors (N,) each, with its 95% interval over the same paired resamples (`rows`,
    evaluation.paired_stats' (resamples, N)) as every other interval of the run."""
    resampled = statistic(*[t.double()[rows].mean(1) for t in tensors])
    low, high = (float(resampled.quantile(q)) for q in (0.025, 0.975))
    return {"value": float(statistic(*[t.double().mean() for t in tensors])), "low": low, "high": high}


def along_the_curve(statistic, points: list[tuple[dict, list]], rows) -> dict:
    """A goal's value at every point of a learning curve (`points`: (the point's labels, with its "steps"; the
    per-canvas tensors the value is made of)), and its change over the last two points, paired: the curve still rises
    when that interval lies above 0."""
    out = {"curve": [{**labels, "value": bootstrapped(statistic, tensors, rows)} for labels, tensors in points],
           "last_change": None, "still_rising": None}
    if len(points) > 1:
        (before, earlier), (after, later) = points[-2:]
        change = bootstrapped(lambda *m: statistic(*m[:len(later)]) - statistic(*m[len(later):]), [*later, *earlier],
                              rows)
        out.update(last_change={"from_steps": before["steps"], "to_steps": after["steps"], **change},
                   still_rising=change["low"] > 0)
    return out
