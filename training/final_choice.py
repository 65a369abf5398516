"""`training.finetune --choose paired`: which of the probe, the WiSE-FT mixes and the last epoch a run keeps as best/,
by a rule that a small validation set cannot fool (experiments/finetune_rule/LOG.md).

The probe stays unless a candidate beats it on the validation images by more than their own noise: the 2.5th
percentile of the candidate's paired difference to the probe, resampling whole validation groups (the crops of one
photo count once), is above 0. Of the candidates that do, the one of the highest validation accuracy is kept (ties:
the higher lower bound, then the one nearer the probe). With fewer than MIN_GROUPS validation groups the bootstrap has
no honest width, and the probe stays.
"""

RESAMPLES = 2000  # bootstrap draws of the validation groups, the same draws for every candidate
MIN_GROUPS = 10  # fewer validation groups than this: no candidate can be told from the probe


def choose(candidates: list[dict], groups: list, seed: int) -> dict:
    """The choice among `candidates` ([{"name", "epoch", "wise_ft", "correct": (N,) bool tensor of the validation
    images}], the probe first, the rest in order of their distance from it), `groups` one key per validation image.
    Returns {"rule", "images", "groups", "resamples", "seed", "candidates": [{"name", "epoch", "wise_ft",
    "validation_accuracy", "minus_probe": {"mean", "low", "high", "half_width"} (not for the probe)}], "kept" (a
    name), "why" (a sentence with the numbers)}."""
    from evaluation.paired_stats import group_draws, grouped_interval

    index, draws = group_draws(groups, RESAMPLES, seed)
    probe = candidates[0]["correct"].double()
    table = []
    for candidate in candidates:
        row = {"name": candidate["name"], "epoch": candidate["epoch"], "wise_ft": candidate["wise_ft"],
               "validation_accuracy": float(candidate["correct"].double().mean())}
        if table:  # every candidate but the probe: its paired difference to the probe
            row["minus_probe"] = grouped_interval(candidate["correct"].double() - probe, index, draws)
        table.append(row)
    count = draws.shape[1]
    record = {"rule": "paired", "images": len(groups), "groups": count, "resamples": RESAMPLES, "seed": seed,
              "candidates": table}
    if len(table) == 1:
        return {**record, "kept": table[0]["name"], "why": "the probe is the only candidate (no epochs)"}
    if count < MIN_GROUPS:
        return {**record, "kept": table[0]["name"],
                "why": f"{count} validation groups, fewer than the {MIN_GROUPS} a paired choice needs"}
    qualified = [(row["validation_accuracy"], row["minus_probe"]["low"], -position, row)
                 for position, row in enumerate(table[1:]) if row["minus_probe"]["low"] > 0]
    if not qualified:
        nearest = max(table[1:], key=lambda row: row["minus_probe"]["low"])
        return {**record, "kept": table[0]["name"],
                "why": f"no candidate beats the probe on validation beyond the noise of {count} groups (the highest "
                       f"lower bound, {nearest['name']}'s: {difference(nearest['minus_probe'])})"}
    kept = max(qualified, key=lambda entry: entry[:3])[3]
    return {**record, "kept": kept["name"],
            "why": f"{kept['name']} beats the probe on validation beyond the noise of {count} groups, "
                   f"{difference(kept['minus_probe'])}, the highest validation accuracy "
                   f"({kept['validation_accuracy']:.4f}) of the {len(qualified)} that do"}


def difference(interval: dict) -> str:
    """A paired difference as "+0.083 [+0.021, +0.146]"."""
    return f"{interval['mean']:+.3f} [{interval['low']:+.3f}, {interval['high']:+.3f}]"
