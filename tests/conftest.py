import pytest
import torch

from corevision_hf import VecaConfig, VecaModel


def tiny_veca_config(**overrides) -> VecaConfig:
    """A VECA small enough for CPU tests: width 64, 2 layers, 4 heads of 16, patch 8, a bank of 8 cores."""
    fields = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        patch_size=8,
        num_cores=8,
        image_size=32,
    )
    return VecaConfig(**{**fields, **overrides})


@pytest.fixture
def tiny_config() -> VecaConfig:
    return tiny_veca_config()


@pytest.fixture
def tiny_model(tiny_config) -> VecaModel:
    torch.manual_seed(0)
    return VecaModel(tiny_config).eval()


@pytest.fixture
def images() -> torch.Tensor:
    """Two non-square images: a 3 x 5 patch grid."""
    return torch.randn(2, 3, 24, 40, generator=torch.Generator().manual_seed(1))
