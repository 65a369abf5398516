"""`python -m corevision_hf.extract` keeps each image's aspect ratio (shorter side --resolution, sides snapped to
patch multiples) and batches mixed sizes by size, never padded or squashed: stored features equal a call on each
image alone."""

import math

import datasets
import pytest
import torch
from PIL import Image
from test_extract import PHOTOS, models, photos  # noqa: F401  (fixtures)

from corevision_hf import LookWhereModel, VecaModel, extract
from corevision_hf.images import to_pixel_values


def alone(model_dir: str, image: Image.Image, resolution: int, **budget):
    """The reference: the model on this one image, resized by hand to keep its aspect ratio."""
    model_class = VecaModel if "veca" in model_dir else LookWhereModel
    model = model_class.from_pretrained(model_dir).eval()
    pixels = to_pixel_values(image, resolution, patch_size=8)[None]
    with torch.inference_mode():
        out = model(pixels, **budget)
    rows, columns = pixels.shape[-2] // 8, pixels.shape[-1] // 8
    return out.pooler_output[0], out.last_hidden_state[0, -rows * columns :].reshape(rows, columns, -1)


def pool_by_hand(grid: torch.Tensor, stride: int) -> torch.Tensor:
    """Means of stride x stride blocks; a last block cut by the border averages the patches it has."""
    rows, columns = math.ceil(grid.shape[0] / stride), math.ceil(grid.shape[1] / stride)
    return torch.stack([torch.stack([grid[r * stride : (r + 1) * stride, c * stride : (c + 1) * stride].mean((0, 1))
                                     for c in range(columns)]) for r in range(rows)])


def test_to_pixel_values_keeps_the_aspect_ratio():
    image = Image.new("RGB", (600, 400))  # 3:2
    assert to_pixel_values(image, 32, patch_size=8).shape == (3, 32, 48)
    assert to_pixel_values(Image.new("RGB", (512, 600)), 32, patch_size=8).shape == (3, 40, 32)  # 37.5 -> 40
    assert to_pixel_values(image, 32).shape == (3, 32, 32)  # square: the old behaviour


@pytest.mark.parametrize("pending", [extract.PENDING_BATCHES, 0])  # 0: every waiting image runs at once
def test_mixed_sizes_are_batched_by_size_and_equal_calls_on_each_image(models, photos, tmp_path, monkeypatch,
                                                                       pending):
    monkeypatch.setattr(extract, "PENDING_BATCHES", pending)
    out = tmp_path / "features"
    result = extract.main([models["veca"], "--data", str(photos), "--num-cores", "4", "--resolution", "32",
                           "--dense-stride", "2", "--batch-size", "2", "--shard-size", "5", "--output", str(out)])
    loaded = datasets.load_from_disk(str(out)).with_format("torch")
    names = sorted(p.name for p in PHOTOS.glob("*.jpg"))
    assert result["id"] == [f"nested/{name}" for name in names]  # order kept across size buckets and shards
    sizes = set()
    for row, name in zip(loaded, names):
        pooled, grid = alone(models["veca"], Image.open(PHOTOS / name), 32, num_cores=4)
        sizes.add(tuple(grid.shape[:2]))
        torch.testing.assert_close(row["pooled"], pooled, atol=1e-5, rtol=0)
        torch.testing.assert_close(row["dense"], pool_by_hand(grid, 2), atol=1e-5, rtol=0)
    assert sizes == {(4, 4), (4, 6), (5, 4)}  # 512 x 512, the 3:2 photos and 512 x 600 (a 5-row grid: ceil blocks)


def test_lookwhere_keeps_the_aspect_ratio_too(models, photos, tmp_path):
    result = extract.main([models["lookwhere"], "--data", str(photos), "--k-ratio", "0.5", "--resolution", "32",
                           "--batch-size", "3", "--output", str(tmp_path / "features")])
    for row, name in zip(result.with_format("torch"), sorted(p.name for p in PHOTOS.glob("*.jpg"))):
        pooled, _ = alone(models["lookwhere"], Image.open(PHOTOS / name), 32, k_ratio=0.5)
        torch.testing.assert_close(row["pooled"], pooled, atol=1e-5, rtol=0)


def test_a_resumed_run_must_keep_the_resize_mode(models, photos, tmp_path, monkeypatch):
    arguments = [models["veca"], "--data", str(photos), "--resolution", "32", "--shard-size", "2",
                 "--output", str(tmp_path / "features")]
    run_shard, calls = extract.run_shard, []

    def killed(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:  # as if the job were killed after its first shard (a run killed before keeps nothing)
            raise KeyboardInterrupt
        return run_shard(*args, **kwargs)

    monkeypatch.setattr(extract, "run_shard", killed)
    with pytest.raises(KeyboardInterrupt):
        extract.main([*arguments, "--square"])
    with pytest.raises(ValueError, match="unfinished extraction with other settings"):
        extract.main(arguments)
