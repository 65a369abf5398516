"""The one rule by which the task benchmarks meet or miss a goal: a paired 95% interval against a margin, and a
reference line whose interval lies above chance (evaluation.paired_stats makes both intervals)."""


def goal(name: str, rule: str, value: dict, margin: float, reference: dict, reference_floor: float, **extra
         ) -> dict:
    """One goal by the one rule: the value's 95% interval lies above `margin` (`low` for a difference, a ratio's
    `low` too) and the reference's lies above `reference_floor` (chance, or 1 for a ratio)."""
    above = value["low"] > margin
    reference_ok = reference["low"] > reference_floor
    return {"goal": name, "met": bool(above and reference_ok), "rule": rule, "margin": margin, "value": value,
            "interval_above_margin": bool(above), "reference": reference, "reference_above_chance": bool(reference_ok),
            **extra}
