"""A model folder as this package writes it (training exports, converters, the demo, publishing, the web page):
`save_pretrained`'s weights, config.json and hub code, and beside them the model's image processor, as a
transformers user saves a model and its processor."""

import os

from .lookwhere.image_processing_lookwhere import LookWhereImageProcessor
from .veca.image_processing_veca import VecaImageProcessor


PROCESSORS = {"veca": VecaImageProcessor, "lookwhere": LookWhereImageProcessor}


def image_processor_for(config, folder: str | os.PathLike | None = None):
    """The image processor of a VECA or LookWhere `config`: the one saved in `folder` when it holds a
    preprocessor_config.json, else the training size as the shorter side, sides snapped to multiples of the patch
    size."""
    processor_class = PROCESSORS[config.model_type]
    if folder is not None and os.path.isfile(os.path.join(folder, "preprocessor_config.json")):
        return processor_class.from_pretrained(folder)
    return processor_class(size={"shortest_edge": config.image_size}, patch_size=config.patch_size)


def save_model_folder(model, folder: str | os.PathLike, processor=None, **kwargs) -> None:
    """`model.save_pretrained(folder, **kwargs)` and `processor` (default: the model's own, `image_processor_for`)
    beside it: `preprocessor_config.json`, whose `auto_map` names the hub code it copies there. With
    `is_main_process=False` (the other processes of a distributed export) the processor is left to the main one; a
    model other than VECA and LookWhere gets no processor unless one is given."""
    model.save_pretrained(folder, **kwargs)
    if not kwargs.get("is_main_process", True) or (processor is None and model.config.model_type not in PROCESSORS):
        return  # another process's export, or a model of another kind (a dense ViT baseline): its processor is its own
    (processor or image_processor_for(model.config)).save_pretrained(folder)
