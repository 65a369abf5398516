"""Issue #11, model side: every config value is checked on construction, with the field and its range named;
NaN / infinite pixels, empty batches and images smaller than a patch are clear errors."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import load_without_package, tiny_lookwhere_config, tiny_veca_config
from transformers import AutoModel, pipeline
from transformers.activations import ACT2FN

from corevision_hf import LookWhereModel, VecaModel, save_model_folder
from corevision_hf.lookwhere import LookWhereImageFeatureExtractionPipeline, configuration_lookwhere
from corevision_hf.veca import VecaImageFeatureExtractionPipeline, configuration_veca


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
        ({"mlp_type": "gelu"}, r'mlp_type must be "swiglu" \(the paper\'s\) or "plain" .*got \'gelu\''),
        ({"mlp_type": "plain", "hidden_act": "gleu"}, "hidden_act='gleu' is not an activation of transformers' ACT2FN"),
        ({"position_embedding_grid": 0}, r"position_embedding_grid must be None .* or an int >= 1 .*got 0"),
        ({"position_embedding_antialias": "yes"}, "position_embedding_antialias must be True or False, got 'yes'"),
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
        ({"map_head_act": "gleu"}, "map_head_act='gleu' is not an activation of transformers' ACT2FN"),
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
    with pytest.raises(ValueError, match=r"Image size 3x40 is not a multiple of the patch size (8|4) \(one patch at least\); resize or crop it to (8x40|4x40)"):
        model(torch.randn(1, 3, 3, 40))


def test_veca_bank_size_cannot_change_at_load_time(tmp_path):
    """`num_cores` is the trained bank's size: at load time it is an error naming `default_num_cores`, the budget."""
    torch.manual_seed(0)
    save_model_folder(VecaModel(tiny_veca_config()), tmp_path)  # a bank of 8
    for asked in (4, 16):
        with pytest.raises(ValueError, match=f"pass default_num_cores={asked} instead") as error:
            AutoModel.from_pretrained(tmp_path, trust_remote_code=True, num_cores=asked)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="default_num_cores=4 instead"):
        pipeline("image-feature-extraction", model=str(tmp_path), trust_remote_code=True, model_kwargs={"num_cores": 4})
    assert AutoModel.from_pretrained(tmp_path, trust_remote_code=True, num_cores=8).config.num_cores == 8  # unchanged
    model = AutoModel.from_pretrained(tmp_path, trust_remote_code=True, default_num_cores=4).eval()
    pixel_values = torch.randn(1, 3, 24, 40)
    with torch.inference_mode():
        default, four = model(pixel_values), model(pixel_values, num_cores=4)
    torch.testing.assert_close(default.last_hidden_state, four.last_hidden_state)
    assert model.config.num_cores == 8


def test_lookwhere_k_at_load_time_points_to_default_k(tmp_path):
    torch.manual_seed(0)
    LookWhereModel(tiny_lookwhere_config()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="pass default_k=5 instead") as error:
        AutoModel.from_pretrained(tmp_path, trust_remote_code=True, k=5)
    assert "\n" not in str(error.value)
    model = AutoModel.from_pretrained(tmp_path, trust_remote_code=True, default_k=5).eval()
    with torch.inference_mode():
        assert model(torch.randn(1, 3, 32, 32)).selected_indices.shape == (1, 5)


LOAD_TIME_BUDGETS_LOADER = textwrap.dedent(
    """
    import torch
    from transformers import AutoModel

    source, _, outputs_path = sys.argv[1:4]
    errors = {}
    for name, kwargs in [("veca", {"num_cores": 4}), ("lookwhere", {"k": 5})]:
        try:
            AutoModel.from_pretrained(f"{source}/{name}", trust_remote_code=True, **kwargs)
        except ValueError as error:
            errors[name] = str(error)
    torch.save(errors, outputs_path)
    """
)


def test_load_time_budget_errors_come_with_the_hub_code(tmp_path):
    """The checks live in the configuration files, so a process that cannot import this package gives them too."""
    torch.manual_seed(0)
    VecaModel(tiny_veca_config()).save_pretrained(tmp_path / "models" / "veca")
    LookWhereModel(tiny_lookwhere_config()).save_pretrained(tmp_path / "models" / "lookwhere")
    errors = load_without_package(tmp_path, LOAD_TIME_BUDGETS_LOADER, str(tmp_path / "models"), torch.zeros(1))
    assert "pass default_num_cores=4 instead" in errors["veca"]
    assert "pass default_k=5 instead" in errors["lookwhere"]


WITHOUT_TORCH = textwrap.dedent(
    """
    import json, sys
    sys.modules["torch"] = None  # torch is not installed, as far as this process can tell: importing it raises
    sys.modules["corevision_hf"] = None
    from transformers import AutoConfig

    folder = sys.argv[1]
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    try:
        type(config)(hidden_act="gleu")
        error = None
    except ValueError as raised:
        error = str(raised)
    print(json.dumps({"type": type(config).__name__, "error": error,
                      "pipeline": config.custom_pipelines["image-feature-extraction"]["impl"]}))
    """
)


@pytest.mark.parametrize("name", ["veca", "lookwhere"])
def test_the_hub_configuration_loads_and_checks_its_fields_without_torch(tmp_path, name):
    """A configuration file is data, as transformers' are: its hub copy loads where torch cannot be imported, and still
    refuses an activation transformers does not have."""
    build = {"veca": lambda: VecaModel(tiny_veca_config()), "lookwhere": lambda: LookWhereModel(tiny_lookwhere_config())}
    build[name]().save_pretrained(tmp_path / name)
    (tmp_path / "load.py").write_text(WITHOUT_TORCH)
    result = subprocess.run([sys.executable, str(tmp_path / "load.py"), str(tmp_path / name)], capture_output=True,
                            text=True, cwd=tmp_path, env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.splitlines()[-1])
    assert loaded["type"] == {"veca": "VecaConfig", "lookwhere": "LookWhereConfig"}[name]
    assert loaded["error"].startswith("hidden_act='gleu' is not an activation of transformers' ACT2FN")
    pipeline = {"veca": VecaImageFeatureExtractionPipeline, "lookwhere": LookWhereImageFeatureExtractionPipeline}[name]
    assert loaded["pipeline"] == f"pipeline_{name}.{pipeline.__name__}"


@pytest.mark.parametrize("module", [configuration_veca, configuration_lookwhere])
def test_the_activation_names_are_transformers(module):
    """The configuration files list ACT2FN's names (importing ACT2FN imports torch): the list is transformers' own."""
    assert sorted(module.ACTIVATIONS) == sorted(ACT2FN)
