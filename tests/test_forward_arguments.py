"""Forward takes its own budget arguments and transformers' standard keyword arguments; anything else (a typo such
as `num_core=8`) is a ValueError naming the closest valid argument, for both models, their heads and backbones."""

import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config

from corevision_hf import (
    LookWhereBackbone,
    LookWhereForImageClassification,
    LookWhereForSemanticSegmentation,
    LookWhereModel,
    VecaBackbone,
    VecaForImageClassification,
    VecaModel,
)

MODELS = {
    "veca": (VecaModel, tiny_veca_config),
    "veca-classifier": (VecaForImageClassification, lambda: tiny_veca_config(num_labels=3)),
    "veca-backbone": (VecaBackbone, lambda: tiny_veca_config(out_indices=[1, 2])),
    "lookwhere": (LookWhereModel, tiny_lookwhere_config),
    "lookwhere-classifier": (LookWhereForImageClassification, lambda: tiny_lookwhere_config(num_labels=3)),
    "lookwhere-segmentation": (LookWhereForSemanticSegmentation, lambda: tiny_lookwhere_config(num_labels=3)),
    "lookwhere-backbone": (LookWhereBackbone, lambda: tiny_lookwhere_config(out_indices=[1, 2])),
}
TYPOS = {"veca": ("num_core", "num_cores"), "lookwhere": ("kratio", "k_ratio")}


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", MODELS)
def test_a_misspelt_budget_is_an_error_naming_the_right_one(name, images):
    model_class, config = MODELS[name]
    model = model_class(config()).eval()
    typo, right = TYPOS[name.split("-")[0]]
    with pytest.raises(ValueError, match=f"unexpected argument '{typo}'; this model's own arguments are .*{right}"):
        model(images, **{typo: 2})
    with pytest.raises(ValueError, match="unexpected argument 'max_flops'; this model's own arguments are .*max_gflops"):
        model(images, max_flops=1.0)
    with pytest.raises(ValueError, match=r"takes no max_ms: .*corevision_hf.budget_for_latency"):
        model(images, max_ms=5.0)


@pytest.mark.parametrize("name", ["veca", "lookwhere"])
def test_standard_arguments_still_work(name, images):
    model_class, config = MODELS[name]
    model = model_class(config()).eval()
    budget = {"num_cores": 2} if name == "veca" else {"k": 5}
    with torch.no_grad():
        out = model(images, output_hidden_states=True, output_attentions=False, **budget)
        as_tuple = model(images, return_dict=False, **budget)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    torch.testing.assert_close(as_tuple[0], out.last_hidden_state)


@pytest.mark.parametrize("model_class, config", [(VecaModel, tiny_veca_config), (LookWhereModel, tiny_lookwhere_config)])
def test_unusable_attention_backends_fail_at_load_with_the_reason(model_class, config):
    with pytest.raises(ValueError, match='attn_implementation="bogus"` is not supported'):
        model_class._from_config(config(), attn_implementation="bogus")
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="FlashAttention2 .* package for FlashAttention2 doesn't seem to be installed"):
            model_class._from_config(config(), attn_implementation="flash_attention_2")



def graphs_compiled(model, name: str, values: list, dynamic) -> list[int]:
    """The graphs torch.compile(model, dynamic=dynamic) has compiled after each call at `name`=value."""
    torch._dynamo.reset()
    graphs = []
    compiled = torch.compile(model, backend=lambda graph, inputs: graphs.append(1) or graph.forward, dynamic=dynamic)
    counts = []
    for value in values:
        compiled(torch.ones(1, 3, 32, 32), **{name: value})
        counts.append(len(graphs))
    torch._dynamo.reset()
    return counts


@pytest.mark.parametrize("model_class, config, budgets, specialised", [
    (VecaModel, tiny_veca_config, {"num_cores": [8, 3, 5]}, 1),
    (LookWhereModel, tiny_lookwhere_config, {"k": [8, 12, 30], "k_ratio": [0.25, 0.5, 1.0]}, 2),
])
@torch.no_grad()
def test_a_compiled_model_compiles_twice_for_budgets_or_once_with_dynamic_true(model_class, config, budgets,
                                                                               specialised):
    """docs/usage.md: budgets are Python numbers, so torch's default compiles for the first budget and once more for
    the second (a symbol from then on); dynamic=True compiles once for them all, but for the budgets torch specialises
    (num_cores=1; a k below num_fill_neighbors, the fill's loop length), which add one graph."""
    torch.manual_seed(0)
    model = model_class(config()).eval()
    for name, values in budgets.items():
        assert graphs_compiled(model, name, values, dynamic=None) == [1, 2, 2], name
    name, values = next(iter(budgets.items()))
    assert graphs_compiled(model, name, [*values, specialised], dynamic=True) == [1, 1, 1, 2]


@pytest.mark.parametrize("name", ["veca", "lookwhere"])
def test_a_meta_device_input_is_one_error_naming_it(name, images):
    model_class, config = MODELS[name]
    model = model_class(config()).eval()
    mask = torch.ones(1, 32, 32, dtype=torch.long)
    cases = {"pixel_mask": (images, mask.to("meta")), "pixel_values": (images.to("meta"), mask)}
    for meta, (pixel_values, pixel_mask) in cases.items():
        with pytest.raises(ValueError) as error:
            model(pixel_values, pixel_mask=pixel_mask)
        assert str(error.value) == (f"{meta} is on the meta device, which holds shapes but no values: pass a tensor "
                                    "with values, on the model's device.")
