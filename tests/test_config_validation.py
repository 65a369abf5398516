"""Issue #11, model side: every config value is checked on construction, with the field and its range named;
NaN / infinite pixels, empty batches and images smaller than a patch are clear errors."""

import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config

from corevision_hf import LookWhereModel, VecaModel


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"hidden_size": -64}, "hidden_size must be an int >= 1, got -64"),
        ({"num_attention_heads": 0}, "num_attention_heads must be an int >= 1, got 0"),
        ({"patch_size": 0}, "patch_size must be an int >= 1, got 0"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be an int >= 1"),
        ({"rope_theta": 0}, "rope_theta must be a finite number > 0, got 0"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps must be a finite number > 0"),
        ({"attention_dropout": 1.5}, r"attention_dropout must lie in \[0, 1\)"),
        ({"num_cores": 100000}, r"num_cores=100000 .* choose 1..4096"),
        ({"core_coordinate_init_range": 1.0}, r"core_coordinate_init_range must lie in \(0, 1\)"),
    ],
)
def test_veca_config_fields_are_checked(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_veca_config(**overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"hidden_size": 0}, "hidden_size must be an int >= 1, got 0"),
        ({"num_attention_heads": 0}, "num_attention_heads must be an int >= 1"),
        ({"patch_size": 0}, "patch_size must be an int >= 1"),
        ({"layer_norm_eps": -1e-6}, "layer_norm_eps must be a finite number > 0"),
        ({"num_fill_neighbors": 0}, "num_fill_neighbors must be an int >= 1"),
        ({"drop_path_rate": -0.1}, r"drop_path_rate must lie in \[0, 1\)"),
    ],
)
def test_lookwhere_config_fields_are_checked(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_lookwhere_config(**overrides)


@pytest.mark.parametrize("build", [lambda: VecaModel(tiny_veca_config()), lambda: LookWhereModel(tiny_lookwhere_config())])
def test_empty_batches_and_images_smaller_than_a_patch_are_errors(build):
    model = build().eval()
    with pytest.raises(ValueError, match="batch size 0"):
        model(torch.randn(0, 3, 32, 32))
    with pytest.raises(ValueError, match=r"Image size 3x40 is smaller than one (8x8|4x4) patch"):
        model(torch.randn(1, 3, 3, 40))
