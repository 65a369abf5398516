"""The what-where map target (training.teacher): the CLS query's map against the teacher's own attention weights, and
several maps from one forward (issue #44)."""

import pytest
import torch
from transformers import Dinov2Config, Dinov2Model, Dinov2WithRegistersConfig, Dinov2WithRegistersModel

from training.teacher import MAP_QUERIES, teacher_targets_and_map, teacher_targets_and_maps

FIELDS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, patch_size=8, image_size=32)


def tiny_teacher(registers: int):
    """A random eager-attention DINOv2 (the offline teacher's kind without registers), norms and layer scales away from
    their identity init so that the last attention's input is not a plain copy."""
    torch.manual_seed(0)
    if registers:
        config = Dinov2WithRegistersConfig(num_register_tokens=registers, attn_implementation="eager", **FIELDS)
        teacher = Dinov2WithRegistersModel(config)
    else:
        teacher = Dinov2Model(Dinov2Config(attn_implementation="eager", **FIELDS))
    for param in teacher.parameters():
        param.data += 0.1 * torch.randn_like(param)
    return teacher.eval()


def last_attention_probs(teacher, pixel_values: torch.Tensor) -> torch.Tensor:
    """The last layer's attention probabilities (B, H, T, T), as eager attention returns them."""
    caught = {}
    handle = teacher.encoder.layer[-1].attention.register_forward_hook(lambda m, a, out: caught.update(probs=out[1]))
    with torch.no_grad():
        teacher(pixel_values, output_attentions=True)
    handle.remove()
    return caught["probs"]


@pytest.mark.parametrize("registers", [0, 4])
def test_the_cls_map_is_the_cls_query_attention_over_the_patches(registers):
    teacher = tiny_teacher(registers)
    pixel_values = torch.randn(2, 3, 40, 32)  # a 5 x 4 grid: not square, not the config's size
    grid = (5, 4)
    probs = last_attention_probs(teacher, pixel_values)[:, :, 0, 1 + registers :]  # CLS query, patch keys: (B, H, N)
    per_head = probs / probs.sum(-1, keepdim=True)  # renormalised over the patch keys: softmax of that head's logits
    # our map is the head mean of the logits; log-probabilities are the logits less a per-head constant
    expected = torch.softmax(per_head.log().mean(1), dim=-1)
    _, _, ours = teacher_targets_and_map(teacher, pixel_values, grid, "cls")
    assert ours.shape == (2, 20)
    torch.testing.assert_close(torch.softmax(ours, dim=-1), expected, atol=1e-5, rtol=1e-4)


def test_one_forward_gives_every_map_as_each_query_alone():
    teacher = tiny_teacher(4)
    pixel_values = torch.randn(2, 3, 32, 32)
    calls = []
    handle = teacher.register_forward_hook(lambda *_: calls.append(1))
    cls, patches, maps = teacher_targets_and_maps(teacher, pixel_values, (4, 4), MAP_QUERIES)
    handle.remove()
    assert len(calls) == 1 and set(maps) == set(MAP_QUERIES)
    for query in MAP_QUERIES:
        alone = teacher_targets_and_map(teacher, pixel_values, (4, 4), query)
        for ours, theirs in zip((cls, patches, maps[query]), alone):
            torch.testing.assert_close(ours, theirs, atol=0, rtol=0)
    assert (maps["cls"] - maps["patches"]).abs().max() > 1e-2  # different queries: different targets


def test_an_unknown_query_is_one_line_naming_the_choices():
    with pytest.raises(ValueError, match=r"queries must be among \('patches', 'authors', 'cls'\), got 'registers'"):
        teacher_targets_and_maps(tiny_teacher(0), torch.randn(1, 3, 32, 32), (4, 4), ("cls", "registers"))
