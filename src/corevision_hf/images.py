"""Images in and out of the models: a file -> an RGB PIL image -> normalised pixel values, and back to something to
draw.

Used by feature extraction (`corevision_hf.extract`), comparison, evaluation, the training data, the pictures
(`corevision_hf.visualize`) and the demo page. Every image is decoded the same way, by `open_image` and `to_rgb`;
the models take ImageNet-normalised pixels whose sides are multiples of the patch size.
"""

import functools
import os

import numpy as np
import torch
from PIL import Image, ImageOps

from .veca.image_processing_veca import (
    EXIF_ORIENTATION, IMAGENET_MEAN, IMAGENET_STD, WIDE_PIL_MODES, VecaImageProcessor,
)


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL image -> an 8-bit upright RGB PIL image: the package's one decoding rule (extraction, comparison,
    evaluation, the pictures, the training data), the image processor's too. A photo whose EXIF orientation says it
    is stored sideways or mirrored (a phone's portrait) is turned upright. 16-bit grayscale is scaled by 255 / 65535,
    not clipped at 255 as `convert("RGB")` does; palette, gray, CMYK and alpha images go through `convert("RGB")`
    (alpha dropped). A 32-bit float image ("F") has no fixed range: a ValueError."""
    if image.getexif().get(EXIF_ORIENTATION, 1) != 1:
        image = ImageOps.exif_transpose(image)
    if image.mode == "F":
        raise ValueError("a 32-bit float image has no fixed range of values: save it with 8 or 16 bits per channel.")
    if image.mode in WIDE_PIL_MODES:  # 16-bit gray ("I": 32-bit ints, as PNG and TIFF decoders hold 16-bit samples)
        gray = (np.asarray(image, dtype=np.float64) / 257).round().clip(0, 255)
        image = Image.fromarray(gray.astype(np.uint8))
    return image if image.mode == "RGB" else image.convert("RGB")


def open_image(path) -> Image.Image:
    """The image file at `path` (a path or a binary file object), decoded in full and made RGB by `to_rgb`. A file
    that cannot be decoded (truncated, corrupt, not an image, larger than Pillow's decompression-bomb limit of
    2 x Image.MAX_IMAGE_PIXELS) is a ValueError naming it; a missing one a FileNotFoundError."""
    try:
        with Image.open(path) as image:
            image.load()  # a truncated file fails here, not later inside a batch
            return to_rgb(image)
    except FileNotFoundError:
        raise
    except Exception as error:  # decoders raise many types (OSError, SyntaxError, DecompressionBombError, ...)
        name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else getattr(path, "name", "an image file")
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"{name} cannot be read as an image ({reason[:200]}): replace or remove it.") from None


PIXEL_COPIES = 4  # preparing an image holds about this many float32 copies of it (decoded, resized, normalised)


def check_pixels_fit(height: int, width: int, batch_size: int = 1, what: str = "this size", device="cpu") -> None:
    """A ValueError when PIXEL_COPIES float32 copies of a batch of `batch_size` RGB images of `height` x `width`
    would not fit in the memory of `device` (this machine's RAM for a CPU), before the model needs any: an
    impossible size is one line instead of an allocation failure (or the out-of-memory killer) minutes later."""
    needed = PIXEL_COPIES * 4 * 3 * height * width * batch_size
    if torch.device(device).type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    elif hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    else:  # no way to ask for the memory size here: the allocation will tell
        return
    if needed > total:
        raise ValueError(f"{what}: {batch_size} image(s) of {height} x {width} px need {needed / 2**30:.1f} GiB to "
                         f"prepare their pixels alone, more than the {total / 2**30:.1f} GiB of {device}: choose a "
                         "smaller size.")


@functools.lru_cache(maxsize=16)
def _processor(size: tuple | None, patch_size: int) -> VecaImageProcessor:
    return VecaImageProcessor(size=dict(size) if size else None, patch_size=patch_size, do_resize=size is not None)


def to_pixel_values(image: Image.Image, resolution: int | None = None, patch_size: int | None = None) -> torch.Tensor:
    """A PIL image (any mode, made RGB by `to_rgb`) as the models' image processor prepares it: resized (bicubic, no
    crop, so the whole photo is seen), ImageNet-normalised, a float32 tensor (3, H, W). The one image-to-tensor path
    of the package: extraction, evaluation, training, the pictures and the demo page all call it.
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
    return _processor(size, patch)(to_rgb(image), return_tensors="pt").pixel_values[0]


def to_display(pixel_values: torch.Tensor) -> np.ndarray:
    """Normalised pixel values (3, H, W) -> an RGB float array (H, W, 3) in [0, 1] for matplotlib."""
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (pixel_values.detach().float().cpu() * std + mean).clamp(0, 1).permute(1, 2, 0).numpy()
