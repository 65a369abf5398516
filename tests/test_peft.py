"""PEFT's LoRA finds both models' attention by transformers' names (`q_proj`, `v_proj`): the adapters train (on
LookWhere's extractor only, the selector frozen), save alone, and reloaded on a fresh base give the trained model's
outputs."""

import torch
from conftest import tiny_lookwhere_config, tiny_veca_config
from peft import LoraConfig, PeftModel, get_peft_model

from corevision_hf import LookWhereModel, VecaModel

# the extractor's blocks only: the selector's attention has the same names
EXTRACTOR_Q_AND_V = r"extractor\.layers\.\d+\.attention\.(q_proj|v_proj)"


def veca_base() -> VecaModel:
    torch.manual_seed(0)
    return VecaModel(tiny_veca_config())


def lookwhere_base() -> LookWhereModel:
    torch.manual_seed(0)
    return LookWhereModel(tiny_lookwhere_config())


def seeded(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def train_three_steps(model, forward, target: torch.Tensor) -> list[float]:
    """Three AdamW steps (lr 1e-2) on the MSE between `forward(model).last_hidden_state` and `target`: the losses."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(forward(model).last_hidden_state, target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def assert_the_adapter_alone_reloads(model, base_model, forward, folder) -> None:
    """`model`'s adapter, saved alone and loaded on a fresh `base_model()`, gives its features exactly; the bare base
    gives other ones."""
    model.eval()
    model.save_pretrained(folder)
    with torch.no_grad():
        expected = forward(model).last_hidden_state
        reloaded = PeftModel.from_pretrained(base_model(), folder).eval()
        torch.testing.assert_close(forward(reloaded).last_hidden_state, expected, atol=0, rtol=0)
        # the adapter is what differs: the bare base gives other features
        assert not torch.allclose(forward(base_model().eval()).last_hidden_state, expected)


def test_lora_on_veca_q_and_v_trains_saves_and_reloads(tmp_path):
    images = seeded(2, 3, 32, 32, seed=1)
    model = get_peft_model(veca_base(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    layers = model.config.num_hidden_layers
    assert len(trainable) == layers * 2 * 2  # lora_A and lora_B of q_proj and v_proj in every block, nothing else
    assert all(".attention.q_proj.lora_" in name or ".attention.v_proj.lora_" in name for name in trainable)

    losses = train_three_steps(model, lambda m: m(images, num_cores=8), seeded(2, 8 + 16, 64, seed=2))
    assert losses[2] < losses[1] < losses[0]
    lora_b = model.base_model.model.encoder.layers[0].attention.v_proj.lora_B["default"].weight
    assert lora_b.abs().max() > 0  # LoRA's B starts at zero: the adapter moved

    assert_the_adapter_alone_reloads(model, veca_base, lambda m: m(images, num_cores=5), tmp_path / "adapter")


def test_lora_on_the_lookwhere_extractor_trains_with_the_selector_frozen_saves_and_reloads(tmp_path):
    images = seeded(2, 3, 32, 32, seed=1)
    model = get_peft_model(lookwhere_base(), LoraConfig(r=4, lora_alpha=8, target_modules=EXTRACTOR_Q_AND_V))
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    assert len(trainable) == model.config.num_hidden_layers * 2 * 2  # lora_A and lora_B of q and v in every block
    assert all(".extractor.layers." in name and ".lora_" in name for name in trainable)
    selector = model.base_model.model.selector
    assert not any(param.requires_grad for param in selector.parameters())
    selector_before = {name: param.detach().clone() for name, param in selector.state_dict().items()}

    target = seeded(2, 1 + 4 + 16, 32, seed=2)
    losses = train_three_steps(model, lambda m: m(images, k=16, fill_dense=False), target)
    assert losses[2] < losses[0]
    for name, value in selector.state_dict().items():
        assert torch.equal(value, selector_before[name]), name
    lora_b = model.base_model.model.extractor.layers[0].attention.v_proj.lora_B["default"].weight
    assert lora_b.abs().max() > 0  # LoRA's B starts at zero: the adapter moved

    assert_the_adapter_alone_reloads(model, lookwhere_base, lambda m: m(images, k=20), tmp_path / "adapter")
