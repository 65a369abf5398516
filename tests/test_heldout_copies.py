"""The training data loader refuses copies of the held-out photos, not only the folder they live in: a renamed file in
an image folder, image bytes or paths inside a `save_to_disk` or parquet dataset, a file inside a webdataset shard."""

import io
import shutil
import tarfile

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from training.data import HELDOUT_PHOTOS, build_dataset

REFUSED = r"held-out photos .*a copy of {name}\), which are for the final evaluation only"


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def held_out():
    return sorted(HELDOUT_PHOTOS.glob("*.jpg"))[0]


def own_photo() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (20, 120, 220)).save(buffer, "JPEG")
    return buffer.getvalue()


def test_a_renamed_copy_in_an_image_folder_is_refused(tmp_path, held_out):
    folder = tmp_path / "train"
    (folder / "deep").mkdir(parents=True)
    (folder / "mine.jpg").write_bytes(own_photo())
    shutil.copy(held_out, folder / "deep" / "holiday.jpg")
    with pytest.raises(ValueError, match=REFUSED.format(name=held_out.name)):
        build_dataset(str(folder), image_size=32)
    with pytest.raises(ValueError, match="validation during training picks the best checkpoint"):
        build_dataset(str(folder), image_size=32, train=False)


def test_a_file_of_the_same_size_but_other_bytes_is_used(tmp_path, held_out):
    folder = tmp_path / "train"
    folder.mkdir()
    data = bytearray(held_out.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same length: hashed, and not the held-out photo
    (folder / "altered.jpg").write_bytes(bytes(data))
    dataset, _ = build_dataset(str(folder), image_size=32)
    assert len(dataset) == 1


def image_dataset(images: list[dict]) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"image": images, "label": list(range(len(images)))},
                                      features=datasets.Features({"image": datasets.Image(),
                                                                  "label": datasets.Value("int64")}))


@pytest.mark.parametrize("layout", ["saved", "parquet"])
@pytest.mark.parametrize("streaming", [False, True])
def test_held_out_bytes_inside_a_dataset_are_refused(tmp_path, held_out, layout, streaming):
    dataset = image_dataset([{"bytes": own_photo(), "path": None}, {"bytes": held_out.read_bytes(), "path": "x.jpg"}])
    if layout == "saved":
        dataset.save_to_disk(tmp_path / "data")
    else:
        (tmp_path / "data").mkdir()
        dataset.to_parquet(tmp_path / "data" / "train.parquet")
    with pytest.raises(ValueError, match=REFUSED.format(name=held_out.name)):
        build_dataset(str(tmp_path / "data"), streaming=streaming, image_size=32)


def test_a_dataset_row_pointing_into_the_held_out_folder_is_refused(tmp_path, held_out):
    # a parquet file written without the bytes (save_to_disk would embed them): the row names the file to read
    (tmp_path / "data").mkdir()
    images = pa.array([{"bytes": None, "path": str(held_out)}], pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(pa.table({"image": images}), tmp_path / "data" / "train.parquet")
    with pytest.raises(ValueError, match=rf"held-out photos .*row 0 \({held_out}\), a copy of {held_out.name}"):
        build_dataset(str(tmp_path / "data"), image_size=32)


def test_a_dataset_of_other_photos_loads(tmp_path):
    image_dataset([{"bytes": own_photo(), "path": None}] * 3).save_to_disk(tmp_path / "data")
    dataset, _ = build_dataset(str(tmp_path / "data"), image_size=32)
    assert len(dataset) == 3


def test_a_copy_inside_a_webdataset_shard_is_refused(tmp_path, held_out):
    (tmp_path / "shards").mkdir()
    with tarfile.open(tmp_path / "shards" / "000.tar", "w") as tar:
        for key, data in (("0001", own_photo()), ("0002", held_out.read_bytes())):
            info = tarfile.TarInfo(f"{key}.jpg")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match=REFUSED.format(name=held_out.name)):
        build_dataset(str(tmp_path / "shards"), image_size=32)
