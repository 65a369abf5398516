"""evaluation.selections: the cells each selection keeps and how many of the label's cells they find, checked by
hand."""

import pytest
import torch

from evaluation.canvases import Split
from evaluation.selections import coverage, pick_target, random_scores, selection_scores, top_cells


def test_coverage_is_the_share_of_label_cells_kept():
    label_cells = torch.tensor([[True, True, False, False, True], [False, False, False, False, False]])
    chosen = torch.tensor([[0, 2], [1, 3]])
    assert coverage(chosen, label_cells).tolist() == [pytest.approx(1 / 3), 0.0]  # no label cell: 0, not NaN


def test_a_canvas_gets_the_same_random_cells_in_any_batch():
    every = random_scores(range(6), 20, seed=3)
    assert torch.equal(random_scores([4, 1], 20, seed=3), every[[4, 1]])
    assert not torch.equal(random_scores(range(6), 20, seed=3, draw=1), every)  # another draw, other cells
    assert not torch.equal(random_scores(range(6), 20, seed=4), every)


def test_the_digit_ceiling_keeps_ink_cells_first_most_ink_first():
    split = Split.__new__(Split)
    split.digit_ink = torch.tensor([[0.0, 0.5, 0.0, 0.9, 0.1, 0.0]])
    scores = selection_scores("digits", split, torch.zeros(1, 6), {}, seed=0)
    assert top_cells(scores, 3).tolist() == [[1, 3, 4]]
    assert top_cells(scores, 4)[0].tolist().count(0) + top_cells(scores, 4)[0].tolist().count(2) + \
        top_cells(scores, 4)[0].tolist().count(5) == 1  # then one random empty cell


def test_the_where_target_picked_covers_the_most_label_cells():
    label_cells = torch.tensor([[True, False, False, False], [False, True, False, False]])
    maps = {"patches": torch.tensor([[0.0, 0, 1, 0], [0, 0, 1, 0]]),
            "cls": torch.tensor([[1.0, 0, 0, 0], [0, 0, 1, 0]])}
    where = pick_target(maps, label_cells, k=1)
    assert where["coverage_top10"] == {"patches": 0.0, "cls": 0.5} and where["picked"] == "cls"
