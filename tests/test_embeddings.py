"""The embeddings modules own their weights, as DINOv3's `DINOv3ViTEmbeddings` does (VECA's: the patch embedding, the
position table and the core bank; LookWhere's selector: the patch embedding, CLS, registers and positions; its
extractor: the patch embedding, positions and its own prefix tokens), so every tool that walks modules sees them
there: `requires_grad_` freezes them, PEFT's `modules_to_save=["embeddings"]` trains a copy that the forward reads,
`print(model)` lists them, and pickling the embeddings pickles the embeddings alone."""

import pickle

import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config
from peft import LoraConfig, get_peft_model

from corevision_hf import LookWhereModel, VecaModel

VECA_EMBEDDINGS = {"patch_embeddings.projection.weight", "patch_embeddings.projection.bias",
                   "position_embeddings", "core_bank.cores", "core_bank.coordinates"}
SELECTOR_EMBEDDINGS = {"patch_embeddings.projection.weight", "patch_embeddings.projection.bias", "cls_token",
                       "register_tokens", "position_embeddings"}
EXTRACTOR_EMBEDDINGS = {"patch_embeddings.projection.weight", "patch_embeddings.projection.bias",
                        "position_embeddings", "prefix_tokens"}


def veca() -> VecaModel:
    torch.manual_seed(0)
    return VecaModel(tiny_veca_config(position_embedding_grid=4))


def lookwhere(extractor_prefix: str = "extractor") -> LookWhereModel:
    torch.manual_seed(0)
    return LookWhereModel(tiny_lookwhere_config(extractor_prefix=extractor_prefix))


def lookwhere_reading_the_selectors_tokens() -> LookWhereModel:
    return lookwhere("selector")


def images() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def run(model) -> torch.Tensor:
    """A forward whose output reads every embedding weight: all cores, a k that keeps a third of the cells."""
    if model.config.model_type == "veca":
        return model(images(), num_cores=8).last_hidden_state
    return model(images(), k=20, fill_dense=False).last_hidden_state


def embeddings_of(model) -> dict[str, torch.nn.Module]:
    if model.config.model_type == "veca":
        return {"embeddings": model.embeddings}
    return {"selector.embeddings": model.selector.embeddings, "extractor.embeddings": model.extractor.embeddings}


MODELS = [pytest.param(veca, id="veca"), pytest.param(lookwhere, id="lookwhere")]


def test_the_embeddings_hold_their_weights_under_their_names():
    assert {name for name, _ in veca().embeddings.named_parameters()} == VECA_EMBEDDINGS
    model = lookwhere()
    assert {name for name, _ in model.selector.embeddings.named_parameters()} == SELECTOR_EMBEDDINGS
    assert {name for name, _ in model.extractor.embeddings.named_parameters()} == EXTRACTOR_EMBEDDINGS
    keys = set(model.state_dict())
    assert {"selector.embeddings.cls_token", "extractor.embeddings.prefix_tokens"} <= keys
    assert not {"selector.cls_token", "extractor.position_embeddings", "extractor.prefix_tokens"} & keys
    # With the selector's prefix the extractor has no tokens of its own, and no key for them.
    assert not any("prefix_tokens" in key for key in LookWhereModel(tiny_lookwhere_config()).state_dict())


@pytest.mark.parametrize("build", MODELS)
def test_requires_grad_on_the_embeddings_freezes_them(build):
    model = build()
    for module in embeddings_of(model).values():
        module.requires_grad_(False)
    run(model).square().mean().backward()
    frozen = {id(p) for module in embeddings_of(model).values() for p in module.parameters()}
    for name, param in model.named_parameters():
        if id(param) in frozen:
            assert param.grad is None, name
        elif "encoder.layers" in name or "extractor.layers" in name:
            assert param.grad is not None and param.grad.abs().sum() > 0, name  # the blocks train


# What the output's gradient reaches in each embeddings copy: the selector's tokens only through the global tokens it
# hands to the extractor (its map picks patches by top-k, which passes no gradient).
TRAINED = {
    veca: {"embeddings.modules_to_save.default." + name
           for name in ("position_embeddings", "core_bank.cores", "core_bank.coordinates")},
    lookwhere: {"extractor.embeddings.modules_to_save.default." + name
                for name in ("position_embeddings", "prefix_tokens")},
    lookwhere_reading_the_selectors_tokens: {
        *(f"selector.embeddings.modules_to_save.default.{name}"
          for name in ("cls_token", "register_tokens", "position_embeddings")),
        "extractor.embeddings.modules_to_save.default.position_embeddings"},
}


@pytest.mark.parametrize("build", TRAINED)
def test_peft_modules_to_save_trains_the_embeddings_copy_the_forward_reads(build):
    """The usual ViT idiom: LoRA on the attention, the embeddings trained in full beside it. PEFT's copy of each
    embeddings module holds that module alone, its tokens (cores, positions, CLS, registers, prefix) get gradients, and
    changing them moves the output. (PEFT's suffix match also wraps `patch_embeddings` apart, inside the copy, as it
    does in transformers' ViT and DINOv3; that wrap is PEFT's, not this model's.)"""
    base = build()
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["embeddings"]))
    copies = {name.removeprefix("base_model.model."): param for name, param in model.named_parameters()
              if ".modules_to_save.default." in name and "patch_embeddings" not in name}
    assert all(param.requires_grad for param in copies.values())
    tokens = {name: copies[name] for name in TRAINED[build]}
    whole = sum(p.numel() for p in base.parameters())
    assert sum(p.numel() for n, p in model.named_parameters() if ".modules_to_save.default." in n) < whole / 2
    run(model).square().mean().backward()
    for name, param in tokens.items():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    with torch.no_grad():
        before = run(model)
        for param in tokens.values():
            param.add_(0.5)
        assert not torch.allclose(run(model), before)


@pytest.mark.parametrize("build", MODELS)
def test_print_and_pickle_show_the_embeddings_alone(build):
    model = build()
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    for module in embeddings_of(model).values():
        assert f"{type(module).__name__}(\n" in repr(model)  # a module with children (an empty one prints "Name()")
        assert "(patch_embeddings): " in repr(module)
        # the module and its own weights, not a whole model reached through a back-reference
        own = sum(p.numel() * p.element_size() for p in module.parameters())
        assert own <= len(pickle.dumps(module)) < own + (whole - own) // 2


def test_a_fresh_model_draws_every_embedding_weight():
    """The embeddings' own tensors are initialised (transformers skips a module that holds no weight of its own, so a
    weight held by the wrong module would stay as `torch.empty` left it)."""
    veca_model, lookwhere_model = veca(), lookwhere()
    torch.testing.assert_close(veca_model.embeddings.core_bank.cores.std().item(), 64**-0.5, atol=0.01, rtol=0)
    for tensor in (veca_model.embeddings.position_embeddings, lookwhere_model.selector.embeddings.cls_token,
                   lookwhere_model.selector.embeddings.position_embeddings,
                   lookwhere_model.extractor.embeddings.position_embeddings,
                   lookwhere_model.extractor.embeddings.prefix_tokens):
        assert 0.015 < tensor.std() < 0.025 and tensor.abs().max() < 0.2  # trunc_normal(std=initializer_range)
