"""Analytic forward FLOPs (a multiply-add counts 2), for cost tables and achieved-GFLOP/s figures.

Counted: patch embedding, projections, attention score and value products, MLPs. Not counted: norms,
activations, RoPE, softmax and other element-wise work (a few percent at most). The formulas live in the hub-copied
budget files, which forward reads to choose the budget for `max_gflops=`: one formula for tables and targets.
"""

from .lookwhere.budget_lookwhere import dense_vit_flops, lookwhere_flops
from .veca.budget_veca import veca_flops


__all__ = ["dense_vit_flops", "lookwhere_flops", "veca_flops"]
