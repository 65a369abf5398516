"""Images in and out of the models: PIL -> normalised pixel values, and back to something to draw.

Used by feature extraction (`corevision_hf.extract`), comparison, evaluation, the training data, the pictures
(`corevision_hf.visualize`) and the demo page. The models take ImageNet-normalised pixels whose sides are multiples
of the patch size.
"""

import functools

import numpy as np
import torch
from PIL import Image

from .veca.image_processing_veca import IMAGENET_MEAN, IMAGENET_STD, VecaImageProcessor


@functools.lru_cache(maxsize=16)
def _processor(size: tuple | None, patch_size: int) -> VecaImageProcessor:
    return VecaImageProcessor(size=dict(size) if size else None, patch_size=patch_size, do_resize=size is not None)


def to_pixel_values(image: Image.Image, resolution: int | None = None, patch_size: int | None = None) -> torch.Tensor:
    """A PIL image (any mode) as the models' image processor prepares it: RGB, resized (bicubic, no crop, so the whole
    photo is seen), ImageNet-normalised, a float32 tensor (3, H, W). The one image-to-tensor path of the package:
    extraction, evaluation, training, the pictures and the demo page all call it.
    - `patch_size` given: the aspect ratio is kept, the shorter side becomes about `resolution` and both sides are
      snapped to multiples of `patch_size` (the processor's `size={"shortest_edge": resolution}`);
    - no `patch_size`: H = W = `resolution`;
    - no `resolution`: the image keeps its size (only rescaled and normalised)."""
    if resolution is None:
        size, patch = None, 1
    elif patch_size is None:
        size, patch = (("height", resolution), ("width", resolution)), 1
    else:
        size, patch = (("shortest_edge", resolution),), patch_size
    return _processor(size, patch)(image, return_tensors="pt").pixel_values[0]  # converts to RGB itself


def to_display(pixel_values: torch.Tensor) -> np.ndarray:
    """Normalised pixel values (3, H, W) -> an RGB float array (H, W, 3) in [0, 1] for matplotlib."""
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (pixel_values.detach().float().cpu() * std + mean).clamp(0, 1).permute(1, 2, 0).numpy()
