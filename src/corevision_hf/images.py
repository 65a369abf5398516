"""Images in and out of the models: PIL -> normalised pixel values, and back to something to draw.

Used by feature extraction (`corevision_hf.extract`), the pictures (`corevision_hf.visualize`) and the demo page.
The models take ImageNet-normalised pixels whose sides are multiples of the patch size.
"""

import numpy as np
import torch
from PIL import Image


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def to_pixel_values(image: Image.Image, resolution: int) -> torch.Tensor:
    """A PIL image (any mode) resized to `resolution` x `resolution` (bicubic, no crop, so the whole photo is seen)
    and ImageNet-normalised: a float32 tensor of shape (3, resolution, resolution)."""
    image = image.convert("RGB").resize((resolution, resolution), Image.Resampling.BICUBIC)
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255).permute(2, 0, 1)
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (pixels - mean) / std


def to_display(pixel_values: torch.Tensor) -> np.ndarray:
    """Normalised pixel values (3, H, W) -> an RGB float array (H, W, 3) in [0, 1] for matplotlib."""
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (pixel_values.detach().float().cpu() * std + mean).clamp(0, 1).permute(1, 2, 0).numpy()
