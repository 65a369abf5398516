"""corevision_hf: efficient high-resolution vision transformers as hub-native transformers models."""

from transformers import AutoBackbone, AutoConfig, AutoModel, AutoModelForImageClassification

from .flops import dense_vit_flops, veca_flops
from .veca import (
    VECA_PRESETS,
    VecaBackbone,
    VecaConfig,
    VecaForImageClassification,
    VecaModel,
    VecaModelOutput,
    VecaPreTrainedModel,
)

__version__ = "0.1.0"

# In-process: the Auto classes find our models by model_type. On save: the config and modeling files are
# copied next to the weights and `auto_map` is written, so `trust_remote_code=True` loads them without us.
AutoConfig.register("veca", VecaConfig, exist_ok=True)
VecaConfig.register_for_auto_class()
for auto_class, model_class in [
    (AutoModel, VecaModel),
    (AutoModelForImageClassification, VecaForImageClassification),
    (AutoBackbone, VecaBackbone),
]:
    auto_class.register(VecaConfig, model_class, exist_ok=True)
    model_class.register_for_auto_class(auto_class.__name__)

__all__ = [
    "VECA_PRESETS",
    "VecaBackbone",
    "VecaConfig",
    "VecaForImageClassification",
    "VecaModel",
    "VecaModelOutput",
    "VecaPreTrainedModel",
    "dense_vit_flops",
    "veca_flops",
]
