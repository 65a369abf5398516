"""What the hub files rely on of transformers beyond its public API, each pinned here so that a transformers release
that changes it fails one named test instead of silently changing how checkpoints load or save (issue #60):

- `LoadOnly` (modeling files): a legacy key conversion is made load-only by overriding
  `WeightTransform.reverse_transform`, which `revert_weight_conversion` calls when saving;
- `register_checkpoint_conversion_mapping(..., overwrite=True)` at import: a custom-code model gets only the
  conversions registered by the user under its model_type;
- `LookWhereTaskModel.train`: `from_pretrained` replaces every parameter (requires_grad back to True) and then calls
  `model.eval()`, which re-freezes the selector;
- the configs' `validate`: `save_pretrained` calls `config.validate()` (transformers' public check), which ours extends.
"""

import inspect

import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config
from transformers import conversion_mapping, core_model_loading

from corevision_hf import LookWhereConfig, LookWhereForImageClassification, VecaConfig, VecaModel
from corevision_hf.veca.modeling_veca import LegacyRenaming, LegacySplit


def test_saving_reverses_each_conversion_through_reverse_transform():
    assert list(inspect.signature(core_model_loading.WeightTransform.reverse_transform).parameters) == ["self"]
    assert ".reverse_transform()" in inspect.getsource(core_model_loading.revert_weight_conversion)


@pytest.mark.parametrize("conversion", [LegacyRenaming("attention.proj", "attention.o_proj"),
                                        LegacySplit("attention.qkv", ["attention.q_proj", "attention.k_proj",
                                                                      "attention.v_proj"],
                                                    operations=[core_model_loading.Chunk(dim=0)])])
def test_a_legacy_conversion_reverses_to_a_renaming_of_nothing(conversion):
    reverse = conversion.reverse_transform()
    assert isinstance(reverse, core_model_loading.WeightRenaming)
    assert reverse.source_patterns == reverse.target_patterns == conversion.target_patterns[:1]


def test_the_conversion_registry_takes_the_models_by_model_type():
    parameters = inspect.signature(conversion_mapping.register_checkpoint_conversion_mapping).parameters
    assert list(parameters) == ["model_type_or_class_name", "mapping", "overwrite"]
    # custom code gets a registered mapping only when the user registered it, as the hub files do at import
    assert {"veca", "lookwhere"} <= conversion_mapping.USER_REGISTERED_MAPPINGS
    mapping = conversion_mapping.get_model_conversion_mapping(VecaModel(tiny_veca_config()), add_legacy=False)
    assert any(isinstance(conversion, LegacySplit) or type(conversion).__name__ == "LegacySplit"
               for conversion in mapping)


def test_from_pretrained_ends_in_eval_which_refreezes_the_selector(tmp_path):
    """No train() call here: the freeze comes from from_pretrained's own closing eval()."""
    torch.manual_seed(0)
    LookWhereForImageClassification(tiny_lookwhere_config(num_labels=3)).save_pretrained(tmp_path)
    model = LookWhereForImageClassification.from_pretrained(tmp_path)
    assert not model.training
    assert not any(p.requires_grad for p in model.lookwhere.selector.parameters())
    assert all(p.requires_grad for p in model.lookwhere.extractor.parameters())


@pytest.mark.parametrize("build", [tiny_veca_config, tiny_lookwhere_config])
def test_saving_a_config_runs_its_validate(tmp_path, build):
    config = build()
    assert isinstance(config, (VecaConfig, LookWhereConfig))
    config.hidden_dropout_prob = 1.5  # changed after construction
    with pytest.raises(ValueError, match="hidden_dropout_prob must lie in"):
        config.save_pretrained(tmp_path)
