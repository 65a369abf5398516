"""`augment="veca"` and `augment="lookwhere"` are the authors' pipelines, run by their libraries: for every sample the
tensor equals the pipeline composed as the authors compose it, run after seeding torch, `random` and numpy with the
sample's seed; and that seed is a function of (seed, epoch, index) alone."""

import random
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from timm.data.auto_augment import rand_augment_transform
from torchvision.transforms import InterpolationMode, v2

from corevision_hf.images import IMAGENET_MEAN, IMAGENET_STD
from training.data import BatchStream, ImageTransform, build_dataset

ROOT = Path(__file__).resolve().parents[1]
SIZE = 48
SAMPLES = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (2, 0, 2), (3, 2, 7), (5, 9, 11)]  # (seed, epoch, index)
POSTERIZE_ZERO_INDEX = 1431  # at seed 0, epoch 0, the photo's RandAugment keeps 0 bits in PosterizeIncreasing


def veca_authors(size: int, train: bool):
    """alansong1322/VECA, veca/data.py: make_transform(size, resize_short=round(1.125 * size), is_train=train)."""
    resize_short = round(1.125 * size)
    to_img = v2.ToImage()
    to_dtype = v2.ToDtype(torch.float32, scale=True)
    norm = v2.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD)
    if train:
        return v2.Compose([
            to_img,
            v2.Resize(resize_short, interpolation=InterpolationMode.BICUBIC, antialias=True),
            v2.RandomCrop(size),
            v2.RandomHorizontalFlip(),
            v2.TrivialAugmentWide(),
            to_dtype,
            norm,
        ])
    return v2.Compose([
        to_img,
        v2.Resize(resize_short, interpolation=InterpolationMode.BICUBIC, antialias=True),
        v2.CenterCrop(size),
        to_dtype,
        norm,
    ])


def lookwhere_authors(size: int, train: bool):
    """antofuller/lookwhere, original_jax_tpu_pretraining/dataset.py: create_transforms with imagenet_dinov2.yaml, then
    training.py's `x / 0xFF`, `(x - mean) / std`."""
    T = v2
    if train:
        aa_hparams = {
            "translate_const": int(size * 0.45),
            "img_mean": tuple((np.array([0.485, 0.456, 0.406]) * 0xFF).astype(int)),
        }
        pipeline = T.Compose([
            T.RandomResizedCrop(size, interpolation=3),
            T.RandomHorizontalFlip(),
            rand_augment_transform("rand-m9-mstd0.5-inc1", aa_hparams),
            T.ColorJitter(0.0, 0.0, 0.0),
            T.RandomErasing(0.25, value="random"),
            T.PILToTensor(),
        ])
    else:
        pipeline = T.Compose([T.Resize(int(size / 0.875), interpolation=3), T.CenterCrop(size), T.PILToTensor()])
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return lambda image: (pipeline(image).float() / 0xFF - mean) / std


AUTHORS = {"veca": veca_authors, "lookwhere": lookwhere_authors}


def sample_seed(seed: int, epoch: int, index: int) -> int:
    return random.Random(f"{seed}/{epoch}/{index}").getrandbits(32)


def run_authors(pipeline, image: Image.Image, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    return pipeline(image)


@pytest.fixture(scope="module")
def images() -> dict:
    """A photo, and an image smaller than the crop."""
    return {
        "photo": Image.open(ROOT / "assets" / "photos" / "chelsea.jpg").convert("RGB"),
        "small": Image.effect_noise((40, 28), 60).convert("RGB"),
    }


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("method", ["veca", "lookwhere"])
def test_equals_authors_pipeline(images, method, train):
    authors = AUTHORS[method](SIZE, train)
    for seed, epoch, index in SAMPLES:
        transform = ImageTransform(SIZE, seed=seed, train=train, augment=method)
        transform.set_epoch(epoch)
        for name, image in images.items():
            expected = run_authors(authors, image, sample_seed(seed, epoch, index))
            assert torch.equal(transform(image, index), expected), (name, seed, epoch, index)


def test_lookwhere_keeps_zero_bits_as_before_pillow_13(images, monkeypatch):
    """Pillow 13 rejects the 0 bits timm's PosterizeIncreasing keeps at magnitude 10: ours then gives what the authors'
    pipeline gave under Pillow 12 (a black image)."""
    kept_bits = []

    def posterize_pillow_12(image, bits):  # Pillow 12.3's ImageOps.posterize, which accepted 0 bits
        kept_bits.append(bits)
        mask = ~(2 ** (8 - bits) - 1)
        return image.point([value & mask for value in range(256)] * len(image.getbands()))

    photo, seed = images["photo"], sample_seed(0, 0, POSTERIZE_ZERO_INDEX)
    ours = ImageTransform(SIZE, augment="lookwhere")(photo, POSTERIZE_ZERO_INDEX)
    monkeypatch.setattr(ImageOps, "posterize", posterize_pillow_12)
    expected = run_authors(lookwhere_authors(SIZE, train=True), photo, seed)
    assert 0 in kept_bits, "this sample no longer keeps 0 bits: pick another POSTERIZE_ZERO_INDEX"
    assert torch.equal(ours, expected)


def test_global_generators_are_untouched(images):
    transform = ImageTransform(SIZE, augment="lookwhere")
    states = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()
    transform(images["photo"], index=0)
    assert random.getstate() == states[0] and np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """Four small noise images."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "images"
    root.mkdir()
    for i in range(4):
        Image.effect_noise((64 + 8 * i, 48), 60).convert("RGB").save(root / f"{i}.png")
    return root


@pytest.mark.parametrize("method", ["veca", "lookwhere"])
def test_crops_depend_on_seed_epoch_index_alone(folder, method):
    def crops(epoch: int, num_workers: int) -> dict:
        dataset, _ = build_dataset(str(folder), image_size=32, seed=1, augment=method)
        batches = BatchStream(dataset, 2, seed=1, num_workers=num_workers).epoch(epoch)
        return {int(i): x for batch in batches for i, x in zip(batch["index"], batch["pixel_values"])}

    first = crops(epoch=0, num_workers=0)
    assert all(torch.equal(first[i], x) for i, x in crops(epoch=0, num_workers=2).items())
    assert all(not torch.equal(first[i], x) for i, x in crops(epoch=1, num_workers=2).items())


@pytest.mark.parametrize("method, missing", [
    ("veca", "torchvision.transforms"), ("lookwhere", "timm.data.auto_augment"),
])
def test_missing_library_names_the_install(monkeypatch, method, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # as if not installed
    with pytest.raises(ValueError, match="needs the train extra.*run `make setup`"):
        ImageTransform(SIZE, augment=method)


def test_unknown_augment_is_a_clear_error():
    with pytest.raises(ValueError, match="augment must be one of simple, veca, lookwhere"):
        ImageTransform(SIZE, augment="randaugment")
