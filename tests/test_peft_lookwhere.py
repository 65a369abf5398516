"""PEFT's LoRA finds LookWhere's attention by transformers' names: adapters on the extractor's `q_proj` / `v_proj` only
train while the selector stays frozen, and the adapter, saved alone and reloaded on a fresh base, gives the trained
model's outputs."""

import torch
from conftest import tiny_lookwhere_config
from peft import LoraConfig, PeftModel, get_peft_model

from corevision_hf import LookWhereModel

# the extractor's blocks only: the selector's attention has the same names
EXTRACTOR_Q_AND_V = r"extractor\.layers\.\d+\.attention\.(q_proj|v_proj)"


def base_model() -> LookWhereModel:
    torch.manual_seed(0)
    return LookWhereModel(tiny_lookwhere_config())


def test_lora_on_the_extractor_trains_with_the_selector_frozen_saves_and_reloads(tmp_path):
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    target = torch.randn(2, 1 + 4 + 16, 32, generator=torch.Generator().manual_seed(2))
    model = get_peft_model(base_model(), LoraConfig(r=4, lora_alpha=8, target_modules=EXTRACTOR_Q_AND_V))
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    assert len(trainable) == model.config.num_hidden_layers * 2 * 2  # lora_A and lora_B of q and v in every block
    assert all(".extractor.layers." in name and ".lora_" in name for name in trainable)
    selector = model.base_model.model.selector
    assert not any(param.requires_grad for param in selector.parameters())
    selector_before = {name: param.detach().clone() for name, param in selector.state_dict().items()}

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(model(images, k=16, fill_dense=False).last_hidden_state, target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[2] < losses[0]
    for name, value in selector.state_dict().items():
        assert torch.equal(value, selector_before[name]), name
    lora_b = model.base_model.model.extractor.layers[0].attention.v_proj.lora_B["default"].weight
    assert lora_b.abs().max() > 0  # LoRA's B starts at zero: the adapter moved

    model.eval()
    model.save_pretrained(tmp_path / "adapter")
    with torch.no_grad():
        expected = model(images, k=20).last_hidden_state
        reloaded = PeftModel.from_pretrained(base_model(), tmp_path / "adapter").eval()
        torch.testing.assert_close(reloaded(images, k=20).last_hidden_state, expected, atol=0, rtol=0)
        # the adapter is what differs: the bare base gives other features
        assert not torch.allclose(base_model().eval()(images, k=20).last_hidden_state, expected)
