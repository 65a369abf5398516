"""Cost and quality of a distilled checkpoint per budget: `python -m evaluation.evaluate_budgets ...` (from the
repository root), with the frozen-feature probes it fits in `evaluation.probes`; the where-target check
(`python -m evaluation.where_check`); and the library the benchmark scripts share, one job a module (the task's
canvases, teacher passes, readers, fine-tuning protocol, paired statistics and goal rule; the quality benchmark's
students, training and agreement: docs/development.md lists them)."""
