"""Saved folders load through trust_remote_code in a Python that cannot import corevision_hf."""

import json
import os
import textwrap

import pytest
import torch
from conftest import load_without_package, make_offline_hub_cache, tiny_veca_config

from corevision_hf import VecaBackbone, VecaForImageClassification, VecaModel, save_model_folder


LOADER = textwrap.dedent(
    """
    import torch
    from transformers import AutoBackbone, AutoImageProcessor, AutoModel, AutoModelForImageClassification

    source, inputs_path, outputs_path = sys.argv[1:4]
    inputs = torch.load(inputs_path)
    model = AutoModel.from_pretrained(source, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    outputs = {c: model(inputs, num_cores=c).last_hidden_state for c in (1, 3, 8)}
    outputs["target"] = model(inputs, max_gflops=0.003).core_coordinates.shape[1]  # budget_veca.py came along
    outputs["classifier"] = AutoModelForImageClassification.from_pretrained(source, trust_remote_code=True).eval()(
        inputs, num_cores=2).logits
    # AutoBackbone.from_pretrained asks the hub whether the repo exists (no offline path in transformers 5),
    # so take the backbone class from the same hub-copied module, and check AutoBackbone.from_config finds it.
    backbone_class = sys.modules[type(model).__module__].VecaBackbone
    backbone = backbone_class.from_pretrained(source, out_indices=[2]).eval()
    assert type(AutoBackbone.from_config(backbone.config, trust_remote_code=True)) is backbone_class
    outputs["backbone"] = backbone(inputs, num_cores=2).feature_maps[0]
    processor = AutoImageProcessor.from_pretrained(source, trust_remote_code=True)
    outputs["processor_mean"] = torch.tensor(processor.image_mean)
    torch.save(outputs, outputs_path)
    """
)


def expected_outputs(model: VecaModel, inputs: torch.Tensor) -> dict:
    config = model.config
    classifier = VecaForImageClassification(config).eval()
    classifier.veca.load_state_dict(model.state_dict())
    backbone = VecaBackbone(tiny_veca_config(num_labels=3, out_indices=[2])).eval()
    backbone.veca.load_state_dict(model.state_dict())
    with torch.no_grad():
        outputs = {c: model(inputs, num_cores=c).last_hidden_state for c in (1, 3, 8)}
        outputs["backbone"] = backbone(inputs, num_cores=2).feature_maps[0]
    return outputs, classifier


def save_tiny_model(folder) -> VecaModel:
    """The tiny VECA and its image processor saved in `folder`, as this package's tools save them."""
    torch.manual_seed(0)
    model = VecaModel(tiny_veca_config(num_labels=3)).eval()
    save_model_folder(model, folder)
    return model


def check_outputs(actual: dict, model: VecaModel, inputs: torch.Tensor) -> None:
    expected, _ = expected_outputs(model, inputs)
    for key, value in expected.items():
        torch.testing.assert_close(actual[key], value, atol=0, rtol=0, msg=f"output {key!r} differs")
    assert actual["classifier"].shape == (inputs.shape[0], 3)
    assert actual["target"] == 3
    torch.testing.assert_close(actual["processor_mean"], torch.tensor([0.485, 0.456, 0.406]))


@pytest.mark.parametrize("model_class", [VecaModel, VecaForImageClassification, VecaBackbone])
def test_the_stock_save_maps_every_head_and_the_pipeline(tmp_path, model_class):
    """transformers' own save_pretrained (not overridden) writes the hub code and an auto_map for every head, whichever
    head is saved, because the registered config names them; the image processor is not the model's to save."""
    model_class(tiny_veca_config(num_labels=3)).save_pretrained(tmp_path / "veca")
    files = set(os.listdir(tmp_path / "veca"))
    assert {"config.json", "model.safetensors", "configuration_veca.py", "modeling_veca.py", "budget_veca.py",
            "pipeline_veca.py"} <= files
    assert "preprocessor_config.json" not in files
    config = json.loads((tmp_path / "veca" / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_veca.VecaConfig", "AutoModel": "modeling_veca.VecaModel",
        "AutoModelForImageClassification": "modeling_veca.VecaForImageClassification",
        "AutoBackbone": "modeling_veca.VecaBackbone",
    }
    assert config["custom_pipelines"]["image-feature-extraction"]["impl"] == (
        "pipeline_veca.VecaImageFeatureExtractionPipeline")


def test_saved_folder_holds_hub_code_and_processor(tmp_path):
    save_tiny_model(tmp_path / "veca")
    files = set(os.listdir(tmp_path / "veca"))
    assert {"config.json", "model.safetensors", "configuration_veca.py", "modeling_veca.py", "budget_veca.py",
            "image_processing_veca.py", "preprocessor_config.json"} <= files
    processor = json.loads((tmp_path / "veca" / "preprocessor_config.json").read_text())
    assert processor["auto_map"] == {"AutoImageProcessor": "image_processing_veca.VecaImageProcessor"}


def test_existing_preprocessor_config_is_kept(tmp_path):
    """The model's save writes no processor, so a processor config already in the folder stays as it was."""
    folder = tmp_path / "veca"
    folder.mkdir()
    (folder / "preprocessor_config.json").write_text('{"mine": true}')
    VecaModel(tiny_veca_config()).save_pretrained(folder)
    assert json.loads((folder / "preprocessor_config.json").read_text()) == {"mine": True}


@pytest.mark.slow
def test_trust_remote_code_from_folder_without_package(tmp_path, images):
    model = save_tiny_model(tmp_path / "veca")
    outputs = load_without_package(tmp_path, LOADER, str(tmp_path / "veca"), images)
    check_outputs(outputs, model, images)


@pytest.mark.slow
def test_trust_remote_code_from_offline_hub_cache(tmp_path, images):
    """The real `from_pretrained("org/name")` path, served from a hub cache with HF_HUB_OFFLINE=1."""
    model = save_tiny_model(tmp_path / "veca")
    env = make_offline_hub_cache(tmp_path, tmp_path / "veca", "org/veca-tiny")
    outputs = load_without_package(tmp_path, LOADER, "org/veca-tiny", images, env=env)
    check_outputs(outputs, model, images)
