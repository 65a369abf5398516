from .configuration_lookwhere import LOOKWHERE_PRESETS, LookWhereConfig
from .modeling_lookwhere import (
    LookWhereBackbone,
    LookWhereForImageClassification,
    LookWhereForSemanticSegmentation,
    LookWhereModel,
    LookWhereModelOutput,
    LookWherePreTrainedModel,
)
from .image_processing_lookwhere import LookWhereImageProcessor
from .pipeline_lookwhere import LookWhereImageFeatureExtractionPipeline
