"""Cost and quality of a distilled checkpoint per budget: `python -m evaluation.evaluate_budgets ...` (from the
repository root), with the frozen-feature probes it fits in `evaluation.probes`."""
