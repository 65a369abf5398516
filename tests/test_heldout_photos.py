"""The held-out photos (assets/heldout/): at least 20 real photographs, each listed with its source, author and an
open licence, small enough to ship, none of them a training photo, and refused by the training data loader."""

import hashlib
import re
from pathlib import Path

import datasets
import pytest
from PIL import Image

from training.data import HELDOUT_PHOTOS, build_dataset

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = ROOT / "assets" / "heldout"
LICENCES = ("CC0", "CC BY 4.0", "CC BY 2.0", "Public domain")


def photos() -> list[Path]:
    return sorted(p for p in HELDOUT.iterdir() if p.suffix == ".jpg")


def licence_rows() -> dict[str, str]:
    """File name -> licence column, from the table in LICENSES.md."""
    rows = re.findall(r"^\| `([^`]+)` \([^)]*\) \|.*\| ([^|]+) \|$", (HELDOUT / "LICENSES.md").read_text(), re.M)
    return {name: licence.strip() for name, licence in rows}


def test_the_set_is_large_small_and_fully_licensed():
    files = photos()
    assert len(files) >= 20
    assert {p.name for p in HELDOUT.iterdir()} == {p.name for p in files} | {"LICENSES.md"}
    rows = licence_rows()
    assert set(rows) == {p.name for p in files}  # every photo listed, nothing listed that is not there
    for name, licence in rows.items():
        assert licence.startswith(LICENCES), f"{name}: {licence!r} is not public domain, CC0 or CC BY"
    assert sum(p.stat().st_size for p in files) <= 5 * 2**20
    for path in files:
        with Image.open(path) as image:
            assert image.mode == "RGB" and max(image.size) <= 640, path.name
            assert f"`{path.name}` ({image.size[0]} x {image.size[1]})" in (HELDOUT / "LICENSES.md").read_text()


def test_no_held_out_photo_is_a_training_photo():
    digest = lambda path: hashlib.sha256(path.read_bytes()).hexdigest()  # noqa: E731
    training = {digest(p) for p in (ROOT / "assets" / "photos").glob("*.jpg")}
    assert training and not training & {digest(p) for p in photos()}
    assert not {p.name for p in (ROOT / "assets" / "photos").glob("*.jpg")} & {p.name for p in photos()}


@pytest.mark.parametrize("folder", ["assets/heldout", "assets"])
def test_training_refuses_a_folder_holding_held_out_photos(folder, tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    assert HELDOUT_PHOTOS == HELDOUT
    with pytest.raises(ValueError, match=r"held-out photos .* for the final evaluation only: train on"):
        build_dataset(str(ROOT / folder), image_size=32)
    # validation during training picks a checkpoint: a choice made on them too
    with pytest.raises(ValueError, match=r"held-out photos .* validation during training picks the best checkpoint"):
        build_dataset(str(ROOT / folder), image_size=32, train=False)


def test_the_training_photos_load_and_a_link_to_the_held_out_folder_does_not(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    dataset, _ = build_dataset(str(ROOT / "assets" / "photos"), image_size=32)
    assert len(dataset) == len(list((ROOT / "assets" / "photos").glob("*.jpg")))
    (tmp_path / "link").symlink_to(HELDOUT)
    with pytest.raises(ValueError, match="held-out photos"):
        build_dataset(str(tmp_path / "link"), image_size=32)
