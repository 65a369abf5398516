import io
import os
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from corevision_hf.images import IMAGENET_MEAN, IMAGENET_STD
from training.data import BatchStream, ImageTransform, build_dataset, collate

SIZE = 32


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def folder(tmp_path) -> Path:
    """Nested folders: 2 good RGB images, 1 grayscale PNG, 1 CMYK JPEG, 1 tiny 8x8, 1 random-bytes .jpg, 1 truncated
    JPEG."""
    root = tmp_path / "images"
    (root / "a" / "deep").mkdir(parents=True)
    (root / "b").mkdir()
    Image.new("RGB", (64, 48), (200, 10, 10)).save(root / "a" / "red.jpg")
    Image.new("RGB", (40, 80), (10, 200, 10)).save(root / "a" / "deep" / "green.png")
    Image.new("L", (50, 50), 128).save(root / "b" / "gray.png")
    Image.new("CMYK", (48, 48), (0, 255, 255, 0)).save(root / "b" / "cmyk.jpg")
    Image.new("RGB", (8, 8), (10, 10, 200)).save(root / "b" / "tiny.png")
    (root / "b" / "garbage.jpg").write_bytes(bytes(range(256)) * 8)
    buffer = io.BytesIO()
    Image.effect_noise((64, 64), 50).convert("RGB").save(buffer, "JPEG")
    (root / "a" / "truncated.jpg").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    return root


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_folder_batches_skip_and_count_bad_files(folder, streaming, num_workers):
    dataset, stats = build_dataset(str(folder), streaming=streaming, image_size=SIZE)
    loader = DataLoader(dataset, batch_size=3, collate_fn=collate, num_workers=num_workers)
    batches = [batch["pixel_values"] for batch in loader if len(batch["pixel_values"])]  # 0: none was readable
    assert all(batch.dtype == torch.float32 and batch.shape[1:] == (3, SIZE, SIZE) for batch in batches)
    assert torch.cat(batches).shape == (5, 3, SIZE, SIZE)
    assert stats.summary() == "7 images: skipped 2 unreadable, converted 2 non-RGB, upscaled 1 smaller than the crop to it"
    assert stats.summary(2 * stats.as_tensor()).startswith("14 images: skipped 4 unreadable")  # as reduced over 2


def test_collate_drops_unreadable():
    good, bad = {"pixel_values": torch.zeros(3, SIZE, SIZE), "index": 0}, {"pixel_values": None, "index": 1}
    batch = collate([good, bad, good])
    assert batch["pixel_values"].shape == (2, 3, SIZE, SIZE) and batch["index"].tolist() == [0, 0]
    assert collate([bad])["pixel_values"].shape[0] == 0


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_dataset(str(tmp_path / "nowhere"))


def test_folder_without_images_is_a_clear_error(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "notes.txt").write_text("no images")
    with pytest.raises(ValueError, match="holds no image files"):
        build_dataset(str(tmp_path / "empty"))


def test_same_seed_epoch_index_gives_same_crop():
    image = Image.effect_noise((97, 71), 60).convert("RGB")
    transform = ImageTransform(SIZE, seed=3)
    first = transform(image, index=5)
    assert torch.equal(first, ImageTransform(SIZE, seed=3)(image, index=5))
    assert not torch.equal(first, transform(image, index=6))
    transform.set_epoch(1)
    assert not torch.equal(first, transform(image, index=5))
    transform.set_epoch(0)
    assert torch.equal(first, transform(image, index=5))


@pytest.mark.parametrize("streaming", [False, True])
def test_dataset_crops_follow_set_epoch(tmp_path, streaming):
    (tmp_path / "noise").mkdir()
    Image.effect_noise((97, 71), 60).convert("RGB").save(tmp_path / "noise" / "noise.png")
    dataset, _ = build_dataset(str(tmp_path / "noise"), streaming=streaming, image_size=SIZE)

    def first():
        return next(iter(dataset))["pixel_values"]

    epoch0 = first()
    assert torch.equal(epoch0, first())
    dataset.set_epoch(1)
    assert not torch.equal(epoch0, first())
    dataset.set_epoch(0)
    assert torch.equal(epoch0, first())


@pytest.mark.parametrize("train", [True, False])
def test_normalisation_of_a_constant_image(train):
    color = (51, 102, 204)
    pixel_values = ImageTransform(SIZE, train=train)(Image.new("RGB", (60, 45), color), index=0)
    expected = [(c / 255 - mean) / std for c, mean, std in zip(color, IMAGENET_MEAN, IMAGENET_STD)]
    assert pixel_values.shape == (3, SIZE, SIZE)
    assert torch.allclose(pixel_values, torch.tensor(expected).view(3, 1, 1).expand(3, SIZE, SIZE), atol=1e-5)


def gray_images(count: int) -> list:
    return [Image.new("RGB", (40, 36), (8 + 16 * i,) * 3) for i in range(count)]


def which_images(batches) -> list[int]:
    """The source image of every example (its gray level survives crop, flip and normalisation)."""
    means = torch.cat([batch["pixel_values"][:, 0].mean((1, 2)) for batch in batches])
    return [round(((m * IMAGENET_STD[0] + IMAGENET_MEAN[0]) * 255 - 8).item() / 16) for m in means]


@pytest.fixture
def saved(tmp_path) -> str:
    """Nine gray images written by save_to_disk, and the same as a parquet file."""
    features = datasets.Features({"image": datasets.Image()})
    dataset = datasets.Dataset.from_dict({"image": gray_images(9)}, features=features)
    dataset.save_to_disk(tmp_path / "saved")
    (tmp_path / "parquet").mkdir()
    dataset.to_parquet(tmp_path / "parquet" / "train.parquet")
    return str(tmp_path)


@pytest.mark.parametrize("layout, streaming", [("saved", False), ("saved", True), ("parquet", False), ("parquet", True)])
def test_processes_read_disjoint_parts(saved, layout, streaming):
    if layout == "parquet" and streaming:  # one file of one row group: one shard, which two processes cannot split
        with pytest.raises(ValueError, match="streams as 1 shards, fewer than the 2 processes"):
            build_dataset(f"{saved}/{layout}", streaming=True, image_size=SIZE, process_index=0, num_processes=2)
        return
    parts = []
    for rank in range(2):
        dataset, _ = build_dataset(f"{saved}/{layout}", streaming=streaming, image_size=SIZE, process_index=rank,
                                   num_processes=2)
        parts.append(which_images(BatchStream(dataset, 1, seed=0).epoch(0)))
    assert not set(parts[0]) & set(parts[1])
    if streaming:  # every example once, one process possibly one more than the other
        assert sorted(parts[0] + parts[1]) == list(range(9))
    else:  # equal parts, the remainder left out; indices stay positions in the whole dataset
        assert len(parts[0]) == len(parts[1]) == 4 and len(set(parts[0] + parts[1])) == 8


@pytest.mark.parametrize("streaming", [False, True])
def test_batch_streams_resume_where_they_stopped(saved, streaming):
    dataset, _ = build_dataset(f"{saved}/saved", streaming=streaming, image_size=SIZE, seed=1)
    full = which_images(BatchStream(dataset, 2, seed=1).epoch(1))
    assert len(full) == 8  # drop_last: four full batches of two
    assert which_images(BatchStream(dataset, 2, seed=1).epoch(1, skip=3)) == full[6:]
    if not streaming:  # a new order every epoch, the same for the same (seed, epoch)
        assert which_images(BatchStream(dataset, 2, seed=1).epoch(2)) != full
        assert which_images(BatchStream(dataset, 2, seed=1).epoch(1)) == full


def test_folder_layout_is_never_read_as_splits(tmp_path):
    """A test/ (or any) sub-folder is just images; a train/ sub-folder next to others is the training set."""
    for name in ("a/test/x.png", "a/b/y.png", "c.png"):
        (tmp_path / "photos" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 40)).save(tmp_path / "photos" / name)
    dataset, _ = build_dataset(str(tmp_path / "photos"), image_size=SIZE)
    assert len(dataset) == 3
    for name in ("train/1.png", "train/deep/2.png", "val/3.png"):
        (tmp_path / "imagenet" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 40)).save(tmp_path / "imagenet" / name)
    dataset, _ = build_dataset(str(tmp_path / "imagenet"), image_size=SIZE)
    assert len(dataset) == 2


def test_odd_file_names_are_read_or_left_out_and_counted(tmp_path):
    folder = tmp_path / "odd"
    folder.mkdir()
    for name in ("[brackets]*?.png", "space and ümlaut.png", "no_extension_case.PNG"):
        Image.new("RGB", (40, 40), (10, 20, 30)).save(folder / name, format="PNG")
    Image.new("RGB", (40, 40)).save(os.fsdecode(bytes(folder) + b"/latin1-\xe9.png"), format="PNG")  # not UTF-8
    dataset, stats = build_dataset(str(folder), image_size=SIZE)
    assert torch.cat([b["pixel_values"] for b in BatchStream(dataset, 1, seed=0).epoch(0)]).shape[0] == 3
    assert stats.summary().endswith("; left out 1 files whose names are not UTF-8")


def test_sixteen_bit_gray_is_scaled_not_clipped(tmp_path):
    (tmp_path / "deep").mkdir()
    level = 30000  # 16-bit: about 117 of 255, which an 8-bit clip would turn white
    Image.fromarray(np.full((40, 40), level, dtype=np.uint16)).save(tmp_path / "deep" / "gray16.png")
    dataset, stats = build_dataset(str(tmp_path / "deep"), image_size=SIZE, train=False)
    pixel_values = next(iter(BatchStream(dataset, 1, seed=0).epoch(0)))["pixel_values"][0]
    expected = [(round(level / 257) / 255 - mean) / std for mean, std in zip(IMAGENET_MEAN, IMAGENET_STD)]
    torch.testing.assert_close(pixel_values.mean((1, 2)), torch.tensor(expected), atol=1e-5, rtol=0)
    assert "converted 1 non-RGB" in stats.summary()
