"""bf16 and fp16 on CPU for both models, through `model.to(dtype)` and through autocast, against float32."""

import copy

import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config

from corevision_hf import LookWhereModel, VecaModel
from corevision_hf.lookwhere.modeling_lookwhere import inverse_distance_fill


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """The smallest per-image cosine similarity of two (B, ...) outputs."""
    return torch.nn.functional.cosine_similarity(a.float().flatten(1), b.float().flatten(1)).min().item()


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    # LookWhere keeps every patch here: which patches a lower precision keeps can differ where scores nearly tie,
    # and then outputs are not comparable. The selector map and the fill are compared on their own below.
    return {
        "veca": (VecaModel(tiny_veca_config()).eval(), {"num_cores": 5}),
        "lookwhere": (LookWhereModel(tiny_lookwhere_config()).eval(), {"k": 96}),
    }


def run(model, pixel_values, dtype, how, **budget):
    with torch.no_grad():
        if how == "to":
            return copy.deepcopy(model).to(dtype)(pixel_values.to(dtype), **budget)
        with torch.autocast("cpu", dtype=dtype):
            return model(pixel_values, **budget)


@pytest.mark.parametrize("name", ["veca", "lookwhere"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("how", ["to", "autocast"])
def test_half_precision_matches_float32(models, name, dtype, how):
    model, budget = models[name]
    pixel_values = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(pixel_values, **budget)
    outputs = run(model, pixel_values, dtype, how, **budget)
    if how == "to":
        assert outputs.last_hidden_state.dtype == dtype
    assert cosine(outputs.last_hidden_state, expected.last_hidden_state) >= 0.999
    assert cosine(outputs.pooler_output, expected.pooler_output) >= 0.999
    if name == "lookwhere":
        assert cosine(outputs.selector_map, expected.selector_map) >= 0.999
        sparse = run(model, pixel_values, dtype, how, k_ratio=0.25)  # selection, fill and resizes in half precision
        assert sparse.last_hidden_state.shape == (2, 5 + 96, 32)
        assert torch.isfinite(sparse.last_hidden_state).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dense_fill_in_half_precision(dtype):
    kept = torch.randn(2, 20, 32, generator=torch.Generator().manual_seed(2))
    indices = torch.stack([torch.randperm(96, generator=torch.Generator().manual_seed(i))[:20].sort().values for i in (3, 4)])
    expected = inverse_distance_fill(kept, indices, (8, 12), 5)
    assert cosine(inverse_distance_fill(kept.to(dtype), indices, (8, 12), 5), expected) >= 0.999
    with torch.autocast("cpu", dtype=dtype):
        torch.testing.assert_close(inverse_distance_fill(kept, indices, (8, 12), 5), expected)
