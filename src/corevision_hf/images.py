"""Images in and out of the models: PIL -> normalised pixel values, and back to something to draw.

Used by feature extraction (`corevision_hf.extract`), the pictures (`corevision_hf.visualize`) and the demo page.
The models take ImageNet-normalised pixels whose sides are multiples of the patch size.
"""

import numpy as np
import torch
from PIL import Image

from .veca.image_processing_veca import IMAGENET_MEAN, IMAGENET_STD, target_size


def to_pixel_values(image: Image.Image, resolution: int, patch_size: int | None = None) -> torch.Tensor:
    """A PIL image (any mode) resized (bicubic, no crop, so the whole photo is seen) and ImageNet-normalised: a
    float32 tensor (3, H, W). Without `patch_size`, H = W = `resolution`; with it, the aspect ratio is kept: the
    shorter side becomes about `resolution` and both sides are snapped to multiples of `patch_size`, the size the
    models' image processor picks for `size={"shortest_edge": resolution}`."""
    image = image.convert("RGB")
    if patch_size is None:
        height = width = resolution
    else:
        height, width = target_size(image.height, image.width, {"shortest_edge": resolution}, patch_size)
    image = image.resize((width, height), Image.Resampling.BICUBIC)
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255).permute(2, 0, 1)
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (pixels - mean) / std


def to_display(pixel_values: torch.Tensor) -> np.ndarray:
    """Normalised pixel values (3, H, W) -> an RGB float array (H, W, 3) in [0, 1] for matplotlib."""
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (pixel_values.detach().float().cpu() * std + mean).clamp(0, 1).permute(1, 2, 0).numpy()
