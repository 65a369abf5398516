"""corevision_hf.loading.check_loaded_weights: what from_pretrained loads without a word (a weight stored as integers
is cast to float, NaN weights make every output NaN) is one ValueError naming the first bad tensor."""

import json

import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config
from safetensors.torch import load_file, save_file

from corevision_hf import LookWhereModel, VecaForImageClassification, VecaModel
from corevision_hf.loading import check_loaded_weights


def saved(folder, model, edit=None, shards=False):
    """`model` saved in `folder` (in shards with `shards`), then `edit` applied to its stored tensors."""
    torch.manual_seed(0)
    model.save_pretrained(folder, max_shard_size="20KB" if shards else "5GB")
    for path in folder.glob("*.safetensors"):
        tensors = load_file(path)
        if edit is not None:
            edit(tensors)
        save_file(tensors, path, metadata={"format": "pt"})
    return str(folder)


def to_int32(name):
    def edit(tensors):
        if name in tensors:
            tensors[name] = (tensors[name] * 10).round().int()
    return edit


@pytest.mark.parametrize("model_class, config, tensor", [
    (VecaModel, tiny_veca_config, "encoder.layers.1.mlp.fc2.weight"),
    (LookWhereModel, tiny_lookwhere_config, "extractor.norm.weight"),
])
@pytest.mark.parametrize("shards", [False, True])
def test_a_weight_stored_as_int32_is_refused_naming_it(tmp_path, model_class, config, tensor, shards):
    folder = saved(tmp_path / "int", model_class(config()), to_int32(tensor), shards)
    model = model_class.from_pretrained(folder)
    assert model.get_parameter(tensor).dtype == torch.float32  # what transformers does: cast without a word
    with pytest.raises(ValueError, match=rf"^The weight {tensor} is stored as I32 in the checkpoint '{folder}', not "
                                         r"as floating point .* load a floating-point checkpoint\.$"):
        check_loaded_weights(model, folder)
    check_loaded_weights(model_class.from_pretrained(saved(tmp_path / "fine", model_class(config()))), tmp_path / "fine")


def test_a_head_loading_a_base_checkpoint_maps_the_names(tmp_path):
    folder = saved(tmp_path / "int", VecaModel(tiny_veca_config()), to_int32("norm.weight"))
    head = VecaForImageClassification.from_pretrained(folder, num_labels=3)
    with pytest.raises(ValueError, match=r"^The weight norm.weight is stored as I32"):
        check_loaded_weights(head, folder)


def test_non_finite_weights_are_refused_naming_the_first(tmp_path):
    def poison(tensors):
        tensors["encoder.layers.1.mlp.fc2.weight"][0, 0] = float("nan")
    folder = saved(tmp_path / "nan", VecaModel(tiny_veca_config()), poison)
    with pytest.raises(ValueError, match=rf"^encoder.layers.1.mlp.fc2.weight holds NaN or infinite values: the checkpoint "
                                         rf"'{folder}' is corrupt \(or was saved after training diverged\)"):
        check_loaded_weights(VecaModel.from_pretrained(folder), folder)


def test_a_model_without_safetensors_is_checked_for_values_only(tmp_path):
    model = VecaModel(tiny_veca_config())
    check_loaded_weights(model, tmp_path)  # nothing saved there: nothing to read, finite weights
    (tmp_path / "config.json").write_text(json.dumps({}))
    with torch.no_grad():
        model.norm.weight[0] = float("inf")
    with pytest.raises(ValueError, match=r"^norm.weight holds NaN or infinite values"):
        check_loaded_weights(model, tmp_path)
