"""The map head trains on every cell of its fine map at every training size (issue #44): a student built for
distillation resizes its selector map with antialiasing, and the training script keeps it unless told otherwise."""

import json

import pytest
import torch
from conftest import lookwhere_args
from transformers import AutoModel, Dinov2Config, Dinov2Model

from corevision_hf import lookwhere_from_teacher
from training import distill_lookwhere

PATCH = 4


def tiny_student(**overrides):
    """A LookWhere from a tiny random DINOv2 whose position table is 40 x 40 patches, its selector 8 x 8 patches: a
    map head of 5 x 5 cells per selector patch, a 40 x 40 fine map (as DINOv2-S/14 at 518 px, selector 112 px)."""
    torch.manual_seed(0)
    teacher = Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2,
                                       patch_size=PATCH, image_size=40 * PATCH))
    student = lookwhere_from_teacher(teacher, selector_depth=1, selector_image_size=8 * PATCH, **overrides)
    assert student.config.selector_grid_size * student.config.map_upsampling == 40
    return student


def fine_map_gradient(student, grid: tuple[int, int]) -> torch.Tensor:
    """The gradient of a random weighting of the selector map at a `grid` training size, at the map head's output:
    (B, selector cells, cells per selector patch)."""
    caught = {}

    def keep(module, inputs, output):
        output.retain_grad()
        caught["cells"] = output

    handle = student.selector.map_head.register_forward_hook(keep)
    try:
        output = student(torch.randn(2, 3, grid[0] * PATCH, grid[1] * PATCH), k=4)
    finally:
        handle.remove()
    (output.selector_map * torch.randn_like(output.selector_map)).sum().backward()
    return caught["cells"].grad


@pytest.mark.parametrize("grid", [(8, 8), (9, 9), (9, 7), (44, 44)])  # 5x shrink, non-divisible, non-square, larger
def test_every_map_head_cell_gets_a_gradient_at_every_training_size(grid):
    student = tiny_student()
    assert student.config.selector_map_antialias
    gradient = fine_map_gradient(student, grid)
    assert gradient.shape == (2, 64, 25)
    assert (gradient != 0).all(), f"{int((gradient == 0).sum())} of {gradient.numel()} cells get no gradient"


def test_without_antialiasing_a_5x_shrink_trains_only_the_centre_cells():
    """What the students trained before: 40 x 40 to 8 x 8 bilinear reads the centre of each 5 x 5 block alone."""
    gradient = fine_map_gradient(tiny_student(selector_map_antialias=False), (8, 8))
    trained = (gradient != 0).view(2, 8, 8, 5, 5)
    assert trained[..., 2, 2].all() and trained.sum() == trained[..., 2, 2].sum()  # 1 of 25 cells per block


@pytest.mark.parametrize("overrides, expected", [({}, True), ({"selector_map_antialias": False}, False)])
def test_the_training_script_trains_with_the_antialiased_map_unless_overridden(teacher_dir, image_dir, tmp_path,
                                                                              overrides, expected):
    distill_lookwhere.main(lookwhere_args(teacher_dir, image_dir, tmp_path, "--max-steps", "1",
                                          "--config-overrides", json.dumps(overrides)))
    assert AutoModel.from_pretrained(tmp_path / "final").config.selector_map_antialias is expected
