"""What a DINOv2 / DINOv3 user reaches for: the patch tokens on the output, attention maps, and helpers that refuse a
grid that does not match the tokens instead of returning the wrong ones."""

import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config
from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

from corevision_hf import LookWhereModel, VecaModel
from corevision_hf.tokens import patch_tokens
from corevision_hf.visualize import patch_features


@pytest.fixture
def pixel_values() -> torch.Tensor:
    return torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def test_patch_tokens_on_the_output(pixel_values):
    """VECA: the tokens after the active cores; LookWhere: after CLS and the registers, on the filled grid."""
    torch.manual_seed(0)
    veca = VecaModel(tiny_veca_config()).eval()
    out = veca(pixel_values, num_cores=3)
    assert out.patch_tokens.shape == (2, 4 * 6, 64)
    torch.testing.assert_close(out.patch_tokens, out.last_hidden_state[:, 3:], atol=0, rtol=0)
    lookwhere = LookWhereModel(tiny_lookwhere_config()).eval()
    out = lookwhere(pixel_values, k=10)
    assert out.patch_tokens.shape == (2, 8 * 12, 32)
    torch.testing.assert_close(out.patch_tokens, out.last_hidden_state[:, 5:], atol=0, rtol=0)
    assert lookwhere(pixel_values, k=10, fill_dense=False).patch_tokens is None


@pytest.mark.parametrize("build", [lambda: VecaModel(tiny_veca_config()), lambda: LookWhereModel(tiny_lookwhere_config())])
@torch.no_grad()
def test_attentions_need_eager_and_say_so_in_one_line(pixel_values, build):
    model = build().eval()
    model.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match=r'^output_attentions=True needs attention maps, .*attn_implementation="eager"'):
        model(pixel_values, output_attentions=True)
    model.set_attn_implementation("eager")
    attentions = model(pixel_values, output_attentions=True).attentions
    assert len(attentions) == model.config.num_hidden_layers and all(a.sum() > 0 for a in attentions)


@torch.no_grad()
def test_patch_helpers_refuse_a_grid_that_does_not_match(pixel_values):
    """The docs' old pitfall: a teacher with another patch size ran on the same pixels has another grid; taking the
    last Hp * Wp tokens of the wrong grid gave a garbled picture. Now it is an error, for every kind of output."""
    torch.manual_seed(0)
    veca = VecaModel(tiny_veca_config()).eval()
    teacher = Dinov2WithRegistersModel(Dinov2WithRegistersConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2, patch_size=4, image_size=32)).eval()
    lookwhere = LookWhereModel(tiny_lookwhere_config()).eval()
    assert patch_features(veca(pixel_values), (4, 6)).shape == (2, 4, 6, 64)
    assert patch_features(teacher(pixel_values), (8, 12)).shape == (2, 8, 12, 32)
    torch.testing.assert_close(patch_tokens(teacher(pixel_values), (8, 12)), teacher(pixel_values).last_hidden_state[:, 5:])
    for output, wrong_grid in [(veca(pixel_values), (8, 12)), (teacher(pixel_values), (4, 6)),
                               (lookwhere(pixel_values), (4, 6))]:
        with pytest.raises(ValueError, match="grid"):
            patch_features(output, wrong_grid)
    with pytest.raises(ValueError, match="fill_dense=True"):
        patch_tokens(lookwhere(pixel_values, fill_dense=False), (8, 12))
