"""Analytic forward FLOPs (a multiply-add counts 2), for cost tables and achieved-GFLOP/s figures.

Counted: patch embedding, projections, attention score and value products, MLPs. Not counted: norms,
activations, RoPE, softmax and other element-wise work (a few percent at most). The formulas live in the hub-copied
budget files, which forward reads to choose the budget for `max_gflops=`: one formula for tables and targets.

LookWhere's `k_mass` keeps a different k per image, so its cost is a distribution over a set of images: `selector_maps`
runs the selector alone (the count needs nothing else), `mass_gflops` gives each image's GFLOPs at a k_mass,
`gflops_spread` their mean and spread, and `k_mass_for_target` the largest k_mass whose mean fits a target.
"""

import math

import torch

from .lookwhere.budget_lookwhere import dense_vit_flops, kept_for_mass, lookwhere_flops
from .veca.budget_veca import veca_flops


@torch.no_grad()
def selector_maps(model, images) -> list[tuple[torch.Tensor, tuple[int, int]]]:
    """Each image's selector map and size, from a LookWhere model (a `LookWhereModel` or a head holding one) and
    `images`, each a (C, H, W) or (1, C, H, W) normalised tensor of its own size: [((Hp * Wp,) float32 logits on the
    CPU, (H, W))], what `mass_gflops` and `k_mass_for_target` take. One selector pass per image."""
    model = getattr(model, "lookwhere", model)
    patch = model.config.patch_size
    parameter = next(model.parameters())
    maps = []
    for image in images:
        image = image if image.ndim == 4 else image[None]
        grid = (image.shape[2] // patch, image.shape[3] // patch)
        _, selector_map = model.selector(image.to(parameter.device, parameter.dtype), grid)
        maps.append((selector_map[0].float().cpu(), (grid[0] * patch, grid[1] * patch)))
    return maps


def mass_gflops(config, maps, k_mass: float) -> list[float]:
    """Each image's GFLOPs (`lookwhere_flops` at the k it keeps) for `k_mass`, from `selector_maps`."""
    return [lookwhere_flops(config, size[0], size[1], k=int(kept_for_mass(scores[None], k_mass)[0])) / 1e9
            for scores, size in maps]


def gflops_spread(gflops: list[float]) -> dict:
    """{"images", "mean", "std" (population), "min", "max"} of per-image GFLOPs."""
    mean = sum(gflops) / len(gflops)
    return {"images": len(gflops), "mean": mean, "std": math.sqrt(sum((g - mean) ** 2 for g in gflops) / len(gflops)),
            "min": min(gflops), "max": max(gflops)}


def k_mass_for_target(config, maps, max_gflops: float) -> float:
    """The largest k_mass in (0, 1] whose mean GFLOPs over `maps` (`selector_maps` of a calibration set) are at most
    `max_gflops`; a ValueError naming the cheapest mean when even one patch per image costs more. Exact: each image's
    count steps up just past its running masses, so the answer is one of them (or 1), found by bisection."""
    candidates = sorted({1.0, *(value for scores, _ in maps
                                for value in scores.double().softmax(-1).sort(descending=True).values.cumsum(-1)
                                .clamp(max=1.0).tolist() if value > 0)})

    def mean(k_mass: float) -> float:
        return sum(mass_gflops(config, maps, k_mass)) / len(maps)

    if mean(candidates[0]) > max_gflops:
        raise ValueError(f"max_gflops={max_gflops:g} is below the cheapest mean cost on these images, "
                         f"{mean(candidates[0]):.4g} GFLOPs (one patch each): raise it, or use smaller images.")
    low, high = 0, len(candidates) - 1  # mean(candidates[low]) fits
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if mean(candidates[middle]) <= max_gflops else (low, middle - 1)
    return candidates[low]


__all__ = ["dense_vit_flops", "gflops_spread", "k_mass_for_target", "lookwhere_flops", "mass_gflops", "selector_maps",
           "veca_flops"]
