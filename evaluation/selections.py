"""Which cells of a patch grid a line keeps, and how many of the label's cells that finds: a selection is a score per
cell whose top k cells are kept (`top_cells`); `coverage` is the share of the label digits' cells among them.

The scores of each selection the benchmarks compare: LookWhere's selector map, uniform random cells (the same for a
canvas in any batch), the centre cells, a teacher map (an oracle), and the digits' own ink cells (a ceiling).
"""

import math

import torch


def top_cells(scores: torch.Tensor, k: int) -> torch.Tensor:
    """(N, C) scores -> (N, k) indices of each row's k highest-scoring cells, sorted."""
    return scores.topk(k, dim=-1).indices.sort(dim=-1).values


def coverage(chosen: torch.Tensor, label_cells: torch.Tensor) -> torch.Tensor:
    """(N,) share of each canvas's label-digit cells (N, C) bool among the `chosen` (N, k) cells."""
    kept = label_cells.new_zeros(label_cells.shape).scatter_(1, chosen, True)
    return (kept & label_cells).sum(1) / label_cells.sum(1).clamp(min=1)


def random_scores(rows, cells: int, seed: int, draw: int = 0) -> torch.Tensor:
    """(len(rows), cells) uniform scores, canvas i's from its own generator (seed, draw, i): the same cells whichever
    batch the canvas falls in."""
    return torch.stack([torch.rand(cells, generator=torch.Generator().manual_seed((seed * 1009 + draw) * 1_000_003
                                                                                  + int(i))) for i in rows])


def centre_scores(grid: tuple[int, int]) -> torch.Tensor:
    """(Hp * Wp,) scores whose top-k are the k cells nearest the grid's centre (ties in row-major order)."""
    rows = torch.arange(grid[0]).repeat_interleave(grid[1]).double() - (grid[0] - 1) / 2
    cols = torch.arange(grid[1]).repeat(grid[0]).double() - (grid[1] - 1) / 2
    return -(rows**2 + cols**2) - 1e-6 * torch.arange(grid[0] * grid[1])


def selection_scores(kind: str, split, selector_maps: torch.Tensor, teacher_maps: dict, seed: int,
                     draw: int = 0) -> torch.Tensor:
    """(N, G * G) scores whose top-k cells a selection keeps: "selector", "random", "centre", "digits" (the canvases
    of `split`, an evaluation.canvases Split) or "oracle_<query>" (that teacher map)."""
    count, cells = selector_maps.shape
    if kind == "selector":
        return selector_maps
    if kind == "random":
        return random_scores(range(count), cells, seed, draw)
    if kind == "centre":
        return centre_scores((math.isqrt(cells),) * 2).expand(count, -1)
    if kind == "digits":  # every digit's ink cells first (most ink first), then random cells
        return split.digit_ink + (split.digit_ink == 0) * 1e-3 * random_scores(range(count), cells, seed, draw)
    return teacher_maps[kind.removeprefix("oracle_")]


def pick_target(maps: dict, label_cells: torch.Tensor, k: int) -> dict:
    """Each teacher map's mean coverage of the label cells in its top-k cells on the training canvases, and the pick."""
    covered = {query: float(coverage(top_cells(m, k), label_cells).mean()) for query, m in maps.items()}
    return {"coverage_top10": covered, "picked": max(covered, key=covered.get)}
