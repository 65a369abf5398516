"""The authors' training augmentations, run through the libraries they use (the `train` extra): VECA's torchvision v2
pipeline and LookWhere's torchvision v2 + timm RandAugment pipeline.

Those libraries draw from the global generators (torchvision from torch's, timm from `random` and numpy's), so
`run_seeded` seeds all three for one sample and restores them afterwards: a sample's augmentation is a function of
its seed alone, whatever process or DataLoader worker runs it.
"""

import random

import numpy as np
import torch
from PIL import Image

from corevision_hf.images import IMAGENET_MEAN, IMAGENET_STD


def veca_pipeline(size: int, train: bool):
    """VECA's `make_transform` (alansong1322/VECA, veca/data.py): the shorter side resized to 1.125 x `size` (their
    256 -> 288, 384 -> 432, 512 -> 576, 768 -> 864), then train: random crop + flip + TrivialAugmentWide; eval: centre
    crop. RGB PIL image -> ImageNet-normalised float32 (3, size, size)."""
    from torchvision.transforms import InterpolationMode, v2

    resize_short = round(1.125 * size)
    crop = [v2.RandomCrop(size), v2.RandomHorizontalFlip(), v2.TrivialAugmentWide()] if train else [v2.CenterCrop(size)]
    return v2.Compose([
        v2.ToImage(),
        v2.Resize(resize_short, interpolation=InterpolationMode.BICUBIC, antialias=True),
        *crop,
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
    ])


def scale_and_normalize(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 (3, H, W) -> ImageNet-normalised float32 (3, H, W), as LookWhere's JAX step does it: x / 255, then
    (x - mean) / std."""
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (pixels.float() / 255 - mean) / std


def posterize(image: Image.Image, bits_to_keep: int, **kwargs) -> Image.Image:
    """timm's posterize as it ran before Pillow 13, which rejects keeping 0 bits: then the image turns black."""
    from timm.data import auto_augment

    if bits_to_keep == 0:
        return Image.new(image.mode, image.size)
    return auto_augment.posterize(image, bits_to_keep, **kwargs)


def lookwhere_pipeline(size: int, train: bool):
    """LookWhere's `create_transforms` (antofuller/lookwhere, original_jax_tpu_pretraining/dataset.py) with its
    imagenet_dinov2.yaml: train: random resized crop + flip + RandAugment "rand-m9-mstd0.5-inc1" + ColorJitter(0) +
    RandomErasing(p=0.25); eval: the shorter side resized to `size` / 0.875, centre crop. RGB PIL image ->
    ImageNet-normalised float32 (3, size, size)."""
    from timm.data.auto_augment import rand_augment_transform
    from torchvision.transforms import InterpolationMode, v2

    if train:
        fill = tuple(int(255 * mean) for mean in IMAGENET_MEAN)  # truncated, as their `.astype(int)`
        hparams = {"translate_const": int(size * 0.45), "img_mean": fill}
        rand_augment = rand_augment_transform("rand-m9-mstd0.5-inc1", hparams)
        for op in rand_augment.ops:
            if op.name == "PosterizeIncreasing":  # keeps 0 bits at magnitude 10, which Pillow 13 rejects
                op.aug_fn = posterize
        steps = [
            v2.RandomResizedCrop(size, interpolation=InterpolationMode.BICUBIC),
            v2.RandomHorizontalFlip(),
            rand_augment,
            v2.ColorJitter(0.0, 0.0, 0.0),  # a no-op that still draws from torch's generator, as in their runs
            v2.RandomErasing(0.25, value="random"),  # on a PIL image: N(0, 1) noise cast to uint8, negatives wrapped
        ]
    else:
        steps = [v2.Resize(int(size / 0.875), interpolation=InterpolationMode.BICUBIC), v2.CenterCrop(size)]
    return v2.Compose([*steps, v2.PILToTensor(), scale_and_normalize])


PIPELINES = {"veca": veca_pipeline, "lookwhere": lookwhere_pipeline}


def authors_pipeline(method: str, size: int, train: bool):
    """The named method's pipeline (`PIPELINES`); a clear ValueError when torchvision or timm is not installed."""
    try:
        return PIPELINES[method](size, train)
    except ImportError as error:
        raise ValueError(
            f'augment="{method}" needs the train extra, torchvision and timm ({error}): run `make setup`, which '
            "installs torchvision==0.28.0, the release paired with torch 2.13.0, without its dependencies (a bare "
            "torchvision pulls a newer, CUDA torch)."
        ) from error


def run_seeded(pipeline, image, seed: int):
    """`pipeline(image)` with torch's CPU generator, `random` and numpy's global generator seeded by `seed` (below
    2**32); their previous states are restored afterwards, so the caller's randomness is untouched."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)  # torch.manual_seed would also reseed CUDA's, unrestored
            random.seed(seed)
            np.random.seed(seed)
            return pipeline(image)
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
