"""PEFT's LoRA finds VECA's attention by transformers' names (`q_proj`, `v_proj`): it trains, saves its adapter alone,
and the adapter reloaded on a fresh base gives the trained model's outputs."""

import torch
from conftest import tiny_veca_config
from peft import LoraConfig, PeftModel, get_peft_model

from corevision_hf import VecaModel


def base_model() -> VecaModel:
    torch.manual_seed(0)
    return VecaModel(tiny_veca_config())


def test_lora_on_q_and_v_trains_saves_and_reloads(tmp_path):
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    target = torch.randn(2, 8 + 16, 64, generator=torch.Generator().manual_seed(2))
    model = get_peft_model(base_model(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    layers = model.config.num_hidden_layers
    assert len(trainable) == layers * 2 * 2  # lora_A and lora_B of q_proj and v_proj in every block, nothing else
    assert all(".attention.q_proj.lora_" in name or ".attention.v_proj.lora_" in name for name in trainable)

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(model(images, num_cores=8).last_hidden_state, target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[2] < losses[1] < losses[0]
    lora_b = model.base_model.model.encoder.layers[0].attention.v_proj.lora_B["default"].weight
    assert lora_b.abs().max() > 0  # LoRA's B starts at zero: the adapter moved

    model.eval()
    model.save_pretrained(tmp_path / "adapter")
    with torch.no_grad():
        expected = model(images, num_cores=5).last_hidden_state
        reloaded = PeftModel.from_pretrained(base_model(), tmp_path / "adapter").eval()
        torch.testing.assert_close(reloaded(images, num_cores=5).last_hidden_state, expected, atol=0, rtol=0)
        # the adapter is what differs: the bare base gives other features
        assert not torch.allclose(base_model().eval()(images, num_cores=5).last_hidden_state, expected)
