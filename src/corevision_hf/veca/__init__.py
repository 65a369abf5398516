from .configuration_veca import VECA_PRESETS, VecaConfig
from .modeling_veca import (
    VecaBackbone,
    VecaForImageClassification,
    VecaModel,
    VecaModelOutput,
    VecaPreTrainedModel,
)
from .image_processing_veca import VecaImageProcessor
from .pipeline_veca import VecaImageFeatureExtractionPipeline
