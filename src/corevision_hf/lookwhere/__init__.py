from .configuration_lookwhere import LOOKWHERE_PRESETS, LookWhereConfig
from .modeling_lookwhere import (
    LookWhereForImageClassification,
    LookWhereForSemanticSegmentation,
    LookWhereModel,
    LookWhereModelOutput,
    LookWherePreTrainedModel,
)
