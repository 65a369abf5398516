"""corevision_hf: efficient high-resolution vision transformers as hub-native transformers models."""

from transformers import (
    AutoBackbone,
    AutoConfig,
    AutoImageProcessor,
    AutoModel,
    AutoModelForImageClassification,
    AutoModelForSemanticSegmentation,
)

from .calibrate import budget_for_latency, calibrate_latency
from .convert.dinov2_teacher import lookwhere_from_teacher
from .convert.vit_teacher import veca_from_teacher
from .cpu import optimize_for_cpu, restore_default_linear
from .flops import (
    dense_vit_flops,
    gflops_spread,
    k_mass_for_target,
    lookwhere_flops,
    mass_gflops,
    selector_maps,
    veca_flops,
)
from .lookwhere import (
    LOOKWHERE_PRESETS,
    LookWhereBackbone,
    LookWhereConfig,
    LookWhereForImageClassification,
    LookWhereForSemanticSegmentation,
    LookWhereImageFeatureExtractionPipeline,
    LookWhereImageProcessor,
    LookWhereModel,
    LookWhereModelOutput,
    LookWherePreTrainedModel,
)
from .saving import save_model_folder
from .veca import (
    VECA_PRESETS,
    VecaBackbone,
    VecaConfig,
    VecaForImageClassification,
    VecaImageFeatureExtractionPipeline,
    VecaImageProcessor,
    VecaModel,
    VecaModelOutput,
    VecaPreTrainedModel,
)


__version__ = "0.1.0"

# In-process: the Auto classes find our models by model_type. On save: the config and modeling files are copied next
# to the weights and `auto_map` is written (the config names every head and the pipeline once its class is registered
# here), so `trust_remote_code=True` loads them without us; `save_model_folder` saves the image processor beside them.
for config_class, processor_class, heads in [
    (
        VecaConfig,
        VecaImageProcessor,
        [
            (AutoModel, VecaModel),
            (AutoModelForImageClassification, VecaForImageClassification),
            (AutoBackbone, VecaBackbone),
        ],
    ),
    (
        LookWhereConfig,
        LookWhereImageProcessor,
        [
            (AutoModel, LookWhereModel),
            (AutoModelForImageClassification, LookWhereForImageClassification),
            (AutoModelForSemanticSegmentation, LookWhereForSemanticSegmentation),
            (AutoBackbone, LookWhereBackbone),
        ],
    ),
]:
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    config_class.register_for_auto_class()
    # One torch implementation, whichever backend transformers prefers on this machine.
    AutoImageProcessor.register(
        config_class, image_processor_classes={"pil": processor_class, "torchvision": processor_class}, exist_ok=True
    )
    processor_class.register_for_auto_class()
    for auto_class, model_class in heads:
        auto_class.register(config_class, model_class, exist_ok=True)
        model_class.register_for_auto_class(auto_class.__name__)

__all__ = [
    "LOOKWHERE_PRESETS",
    "LookWhereBackbone",
    "LookWhereConfig",
    "LookWhereForImageClassification",
    "LookWhereForSemanticSegmentation",
    "LookWhereImageFeatureExtractionPipeline",
    "LookWhereImageProcessor",
    "LookWhereModel",
    "LookWhereModelOutput",
    "LookWherePreTrainedModel",
    "VECA_PRESETS",
    "VecaBackbone",
    "VecaConfig",
    "VecaForImageClassification",
    "VecaImageFeatureExtractionPipeline",
    "VecaImageProcessor",
    "VecaModel",
    "VecaModelOutput",
    "VecaPreTrainedModel",
    "budget_for_latency",
    "calibrate_latency",
    "dense_vit_flops",
    "gflops_spread",
    "k_mass_for_target",
    "lookwhere_flops",
    "lookwhere_from_teacher",
    "mass_gflops",
    "optimize_for_cpu",
    "restore_default_linear",
    "save_model_folder",
    "selector_maps",
    "veca_flops",
    "veca_from_teacher",
]
