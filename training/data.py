"""Images for distillation: a `datasets` source split between processes, a decode-safe augmentation (ours in plain
PIL/torch, or the authors' through torchvision and timm: training.augment), and the batches of one epoch.

Labels are never used.

Crops and order are reproducible: every sample draws its augmentation from `random.Random(f"{seed}/{epoch}/{index}")`
(the authors' pipelines from the global generators seeded by it) and a map-style epoch's order is a permutation drawn
from (seed, epoch), so a resumed run (`BatchStream.epoch` with the epoch and the batches already used) sees the same
crops in the same order as an uninterrupted one.
"""

import functools
import hashlib
import itertools
import json
import logging
import math
import os
import random
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from datasets import Dataset, DatasetDict, Features, Image, IterableDataset, load_dataset, load_from_disk
from datasets.distributed import split_dataset_by_node
from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder
from PIL import Image as PILImage

from corevision_hf.atomic import write_text_atomically
from corevision_hf.images import to_pixel_values, to_rgb

from .augment import authors_pipeline, run_seeded

logger = logging.getLogger(__name__)
ASPECT_RATIO = (3 / 4, 4 / 3)
EVAL_RESIZE_RATIO = 256 / 224  # the usual ImageNet evaluation: resize the shorter side to 256, centre-crop 224
AUGMENTATIONS = ("simple", "veca", "lookwhere")


class DataStats:
    """What the decode-safe transform met in this process: images seen (each epoch again), unreadable ones skipped,
    non-RGB ones converted, ones smaller than the crop. DataLoader workers each add to their own row of a shared-memory
    table, so the main process sees their counts (batches prefetched but not yet used included). Under DDP every
    process counts its share: `stats.summary(accelerator.reduce(stats.as_tensor().to(accelerator.device), "sum"))`
    gives the total."""

    names = ("images", "unreadable", "non_rgb", "small")
    max_workers = 256

    def __init__(self):
        self.counts = torch.zeros(self.max_workers + 1, len(self.names), dtype=torch.long).share_memory_()
        self.left_out = 0  # files never listed (names that are not UTF-8), the same on every process

    def add(self, unreadable: bool = False, non_rgb: bool = False, small: bool = False) -> None:
        """Counts one image."""
        worker = torch.utils.data.get_worker_info()
        row = 0 if worker is None else 1 + worker.id % self.max_workers  # one writer per row: no lost updates
        self.counts[row] += torch.tensor([1, unreadable, non_rgb, small])

    def as_tensor(self) -> torch.Tensor:
        """(4,) totals in the order of `names`."""
        return self.counts.sum(0)

    def summary(self, counts: torch.Tensor | None = None) -> str:
        """One line for the end of a run, of `counts` (e.g. reduced over processes) or else of this process's."""
        images, unreadable, non_rgb, small = (self.as_tensor() if counts is None else counts).tolist()
        line = (f"{images} images: skipped {unreadable} unreadable, converted {non_rgb} non-RGB, upscaled {small} smaller "
                "than the crop to it")
        return line + (f"; left out {self.left_out} files whose names are not UTF-8" if self.left_out else "")


def random_resized_crop(image: PILImage.Image, size: int, scale: tuple, rng: random.Random) -> PILImage.Image:
    """torchvision's RandomResizedCrop: a box of `scale` x area and aspect ratio in 3/4..4/3 (ten tries, then a
    centre crop), resized to `size` x `size`. Images smaller than the crop are upscaled."""
    width, height = image.size
    area = width * height
    log_ratio = (math.log(ASPECT_RATIO[0]), math.log(ASPECT_RATIO[1]))
    for _ in range(10):
        target_area = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        crop_w = round(math.sqrt(target_area * aspect))
        crop_h = round(math.sqrt(target_area / aspect))
        if 0 < crop_w <= width and 0 < crop_h <= height:
            top = rng.randint(0, height - crop_h)
            left = rng.randint(0, width - crop_w)
            break
    else:  # fallback: the largest centre crop whose aspect ratio is within range
        ratio = width / height
        if ratio < ASPECT_RATIO[0]:
            crop_w, crop_h = width, round(width / ASPECT_RATIO[0])
        elif ratio > ASPECT_RATIO[1]:
            crop_w, crop_h = round(height * ASPECT_RATIO[1]), height
        else:
            crop_w, crop_h = width, height
        top, left = (height - crop_h) // 2, (width - crop_w) // 2
    box = (left, top, left + crop_w, top + crop_h)
    return image.resize((size, size), PILImage.Resampling.BILINEAR, box=box)


def resize_center_crop(image: PILImage.Image, size: int) -> PILImage.Image:
    """Resizes the shorter side to `size * 256 / 224`, then takes the central `size` x `size`."""
    width, height = image.size
    factor = round(size * EVAL_RESIZE_RATIO) / min(width, height)
    width, height = max(size, round(width * factor)), max(size, round(height * factor))
    image = image.resize((width, height), PILImage.Resampling.BILINEAR)
    left, top = (width - size) // 2, (height - size) // 2
    return image.crop((left, top, left + size, top + size))


class ImageTransform:
    """Decode-safe image transform, one of `AUGMENTATIONS`:
    - "simple": train: random resized crop (`scale`, bilinear) + horizontal flip (p=0.5); eval: resize + centre crop;
    - "veca", "lookwhere": the authors' train and eval pipelines through torchvision and timm (`training.augment`,
      the `train` extra); `scale` is not used.
    All convert to RGB and normalise; what they meet is counted in `stats`. The epoch lives in shared memory so
    persistent DataLoader workers see `set_epoch` too."""

    def __init__(
        self, image_size: int = 224, scale: tuple = (0.25, 1.0), seed: int = 0, train: bool = True,
        augment: str = "simple",
    ):
        if augment not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {', '.join(AUGMENTATIONS)}, not {augment!r}.")
        self.image_size = image_size
        self.scale = scale
        self.seed = seed
        self.train = train
        # "simple" is ours in plain PIL/torch, so that training needs no package beyond the core dependencies
        self.pipeline = None if augment == "simple" else authors_pipeline(augment, image_size, train)
        self.epoch = torch.zeros((), dtype=torch.long).share_memory_()
        self.stats = DataStats()

    def set_epoch(self, epoch: int) -> None:
        self.epoch.fill_(epoch)

    def __call__(self, image: PILImage.Image, index: int) -> torch.Tensor:
        """RGB PIL image and its dataset index -> (3, S, S) tensor; one (seed, epoch, index) always gives one crop."""
        rng = random.Random(f"{self.seed}/{int(self.epoch)}/{index}")
        if self.pipeline is not None:  # torchvision and timm draw from the global generators: seeded from this sample's
            return run_seeded(self.pipeline, image, rng.getrandbits(32))
        if self.train:
            image = random_resized_crop(image, self.image_size, self.scale, rng)
            if rng.random() < 0.5:
                image = image.transpose(PILImage.Transpose.FLIP_LEFT_RIGHT)
        else:
            image = resize_center_crop(image, self.image_size)
        return to_pixel_values(image)

    def example(self, example: dict, index: int) -> dict:
        """{"image": undecoded {"path", "bytes"}} -> {"pixel_values": (3, S, S) tensor, or None when the file cannot
        be decoded}."""
        try:
            image = Image().decode_example(example["image"])  # datasets' own decoding, errors caught here
            rgb = to_rgb(image)  # the package's one rule (16-bit scaled, not clipped); a float image has no range
        except Exception:  # any unreadable, truncated or range-less file is skipped, never fatal
            self.stats.add(unreadable=True)
            return {"pixel_values": None, "index": index}
        self.stats.add(non_rgb=image.mode != "RGB", small=min(image.size) < self.image_size)
        return {"pixel_values": self(rgb, index), "index": index}

    def batch(self, batch: dict) -> dict:
        """`with_transform` form of `example`: columns "image" and "index" -> column "pixel_values"."""
        examples = [self.example({"image": image}, index) for image, index in zip(batch["image"], batch["index"])]
        return {key: [example[key] for example in examples] for key in ("pixel_values", "index")}


def set_stream_epoch(dataset: IterableDataset, transform: ImageTransform, epoch: int) -> None:
    """A stream's `set_epoch`: datasets' own (reshuffles shards and buffer) and the transform's (redraws crops)."""
    IterableDataset.set_epoch(dataset, epoch)
    transform.set_epoch(epoch)


ASSETS = Path(__file__).resolve().parents[1] / "assets"
# The shipped photos the benchmarks distil on, and the validation photos their choices (steps, rates, budgets) look at.
TRAIN_PHOTOS = [ASSETS / "photos", ASSETS / "wallpaper_photos" / "train"]
VAL_PHOTOS = ASSETS / "wallpaper_photos" / "val"
# Photos kept for evaluation only: a training run that read them would make every held-out figure meaningless.
HELDOUT_PHOTOS = ASSETS / "heldout"


@functools.cache
def held_out_digests() -> dict[tuple[int, str], str]:
    """{(size in bytes, sha256): file name} of the held-out photos: a copy under another name or folder is still one
    of them."""
    extensions = {ext.lower() for ext in ImageFolder.EXTENSIONS}
    files = sorted(HELDOUT_PHOTOS.iterdir()) if HELDOUT_PHOTOS.is_dir() else []
    return {(len(data), hashlib.sha256(data).hexdigest()): file.name for file in files
            if file.suffix.lower() in extensions for data in [file.read_bytes()]}


def held_out_size(size: int) -> bool:
    """Whether a held-out photo has `size` bytes: only such files are hashed."""
    return any(size == held_size for held_size, _ in held_out_digests())


def held_out_copy(data: bytes) -> str | None:
    """The name of the held-out photo whose bytes `data` are, or None."""
    if not held_out_size(len(data)):
        return None
    return held_out_digests().get((len(data), hashlib.sha256(data).hexdigest()))


def held_out_file(path: str) -> str | None:
    """The held-out photo that the file at `path` is (one inside assets/heldout, or a copy of one), or None."""
    file = Path(path)
    if HELDOUT_PHOTOS in file.resolve().parents:
        return file.name
    try:
        size = file.stat().st_size
    except OSError:  # not a file here: not a held-out photo either
        return None
    return held_out_copy(file.read_bytes()) if held_out_size(size) else None


def refuse_held_out(found: list[tuple[str, str]], source: str, train: bool) -> None:
    """Raises ValueError when `found`, pairs of (a file or row of `source`, the held-out photo it is), is not empty."""
    if not found:
        return
    use = ("train on a folder without them, such as assets/photos" if train else
           "validation during training picks the best checkpoint, so give it a folder of its own")
    what, name = found[0]
    raise ValueError(
        f"{source} holds {len(found)} of the held-out photos of {HELDOUT_PHOTOS} (e.g. "
        f"{name if what == name else f'{what}, a copy of {name}'}), which are for the final evaluation only: {use}."
    )


def image_columns(schema: pa.Schema) -> list[str]:
    """The columns of an Arrow schema that can hold images: binary, or a struct with a "bytes" or "path" field (the
    `datasets` `Image` feature)."""
    def holds_images(kind):
        return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or (
            pa.types.is_struct(kind) and (kind.get_field_index("bytes") >= 0 or kind.get_field_index("path") >= 0))
    return [field.name for field in schema if holds_images(field.type)]


def held_out_rows(batches) -> list[tuple[str, str]]:
    """(row, held-out photo) for every row of the Arrow record `batches` with an image column (`image_columns`) that
    holds a held-out photo, as bytes (hashed only when as long as a held-out photo) or as a path to one."""
    found, offset = [], 0
    for batch in batches:
        for column in image_columns(batch.schema):
            values = batch.column(column)
            struct = pa.types.is_struct(values.type)
            data = values.field("bytes") if struct and values.type.get_field_index("bytes") >= 0 else (
                None if struct else values)
            if data is not None:
                lengths = pc.binary_length(data).fill_null(-1).to_numpy()
                for row in np.flatnonzero(np.isin(lengths, [size for size, _ in held_out_digests()])):
                    if name := held_out_copy(data[int(row)].as_py()):
                        found.append((f"row {offset + int(row)}", name))
            if struct and values.type.get_field_index("path") >= 0:
                for row, path in enumerate(values.field("path").to_pylist()):
                    stored = data is not None and data[row].is_valid  # the bytes are what is read, not the path
                    if path and not stored and (name := held_out_file(path)):
                        found.append((f"row {offset + row} ({path})", name))
        offset += batch.num_rows
    return found


def shard_members(shard: str) -> tuple[int, list[tuple[str, str]]]:
    """A tar shard's number of files, and (member, held-out photo) for every file that is a copy of a held-out photo
    (read only when its size is a held-out photo's). A shard that is truncated (inside a member's data or header, or
    between members: tarfile reads the last two as a shard's end) or no tar file is a ValueError naming it and the
    member it cut."""
    size, files, last = os.path.getsize(shard), [], None
    try:
        with tarfile.open(shard) as tar:
            for member in tar:
                last = member
                files += [member] if member.isfile() else []
            found = [(f"{Path(shard).name}:{member.name}", name) for member in files
                     if held_out_size(member.size) and (name := held_out_copy(tar.extractfile(member).read()))]
            end = tar.offset  # where the next header, or the end-of-archive block, starts
    except tarfile.TarError as error:
        if last is not None and last.offset_data + last.size > size:
            whole = len(files) - last.isfile()
            raise ValueError(f"The shard {shard} is truncated inside {last.name} ({size - last.offset_data} of its "
                             f"{last.size} bytes), after {whole} whole files: copy it again or remove it.") from None
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(":")
        raise ValueError(f"The shard {shard} cannot be read ({reason}): it is truncated or not a tar file; copy it "
                         "again or remove it.") from None
    with open(shard, "rb") as f:
        f.seek(end)
        tail = f.read(tarfile.BLOCKSIZE)
    if tail != bytes(tarfile.BLOCKSIZE):  # a member header cut short, or no end-of-archive block at all
        cut = tail[:100].split(b"\0")[0].decode(errors="replace")  # a header starts with the member's name
        where = f"inside the header of {cut}, " if cut else ""
        after = f"after {len(files)} whole files" + ("" if cut else " (no end-of-archive block follows them)")
        raise ValueError(f"The shard {shard} is truncated {where}{after}: copy it again or remove it.")
    return len(files), found


def image_files(path: Path, split: str, train: bool = True) -> tuple[list[str], list[Path]]:
    """The image files of an image folder, sorted: those under `path/split/` when that sub-folder exists (train/ next
    to val/), else all of them at any depth (no other sub-folder is read as a split). Returns (files, left_out):
    files whose names are not valid UTF-8 cannot be held by `datasets` and are left out. Raises before training
    starts when `path` is not a folder holding at least one usable image file, or when it holds held-out photos (in
    assets/heldout, or copies of them: sha256 of each file whose size is a held-out photo's)."""
    if not path.is_dir():
        raise FileNotFoundError(f"Image folder {path} does not exist (expected a directory of images, any nesting).")
    extensions = {ext.lower() for ext in ImageFolder.EXTENSIONS}
    root = path / split if (path / split).is_dir() else path
    files, left_out = [], []
    for file in sorted(root.rglob("*")):
        if file.suffix.lower() in extensions and file.is_file():
            try:
                str(file).encode("utf-8")
            except UnicodeEncodeError:  # a name with bytes that are not UTF-8 (surrogate-escaped by Python)
                left_out.append(file)
                continue
            files.append(str(file))
    refuse_held_out([(Path(file).name, name) for file in files if (name := held_out_file(file))],
                    f"Image folder {root}", train)
    if not files:
        found = f" ({len(left_out)} with names that are not UTF-8: rename them)" if left_out else ""
        raise ValueError(
            f"Image folder {root} holds no image files{found} (looked for {', '.join(sorted(extensions))})."
        )
    if left_out:
        logger.warning(f"left out {len(left_out)} files of {root} whose names are not UTF-8, e.g. {left_out[0]!r}")
    return files, left_out


def is_local(source: str) -> bool:
    """A hub dataset is "name" or "owner/name"; anything that exists here, or looks like a path, is a folder."""
    path = Path(source).expanduser()
    slashes = source.count("/")
    return path.exists() or source.startswith(("/", ".", "~")) or slashes > 1 or (slashes == 1 and path.parent.is_dir())


def is_saved_dataset(path: Path) -> bool:
    """A folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`."""
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def cached_image_files(path: Path, split: str, train: bool, listing: str | None) -> tuple[list[str], int]:
    """`image_files` of `path`, read from the JSON file `listing` when it holds that folder's, else listed and written
    there (one process lists a folder of millions of files; the others, and a resume, read it). Returns (files, number
    left out for their names)."""
    key = {"folder": str(path.resolve()), "split": split}
    if listing and os.path.isfile(listing):
        with open(listing) as f:
            cached = json.load(f)
        if {name: cached.get(name) for name in key} == key:
            return cached["files"], cached["left_out"]
    files, unnamed = image_files(path, split, train)
    if listing:  # written whole (a reader never sees half a file), never through a link
        write_text_atomically(listing, json.dumps({**key, "files": files, "left_out": len(unnamed)}))
    return files, len(unnamed)


def load_local(path: Path, split: str, streaming: bool, train: bool = True, listing: str | None = None) -> tuple:
    """A `save_to_disk` folder, a folder of parquet files, a folder of webdataset `.tar` shards (read by `datasets`'
    webdataset loader) or an image folder (`image_files`, listed once into `listing` when given; labels never read).
    Returns (dataset, number of files left out for their names). Raises ValueError when it holds a held-out photo:
    a file of an image folder, a row's image bytes or path, a file in a shard (a parquet folder's image columns are
    read through once for it; a `save_to_disk` folder's only where the length matches)."""
    if is_saved_dataset(path):
        dataset = load_from_disk(str(path))
        if isinstance(dataset, DatasetDict):
            if split not in dataset:
                raise ValueError(f"{path} holds the splits {', '.join(dataset)}, not {split!r}.")
            dataset = dataset[split]
        refuse_held_out(held_out_rows(dataset.data.to_batches()), f"The dataset {path}", train)
        left_out = 0
    elif path.is_dir() and any(path.rglob("*.parquet")):
        found = []
        for file in sorted(path.rglob("*.parquet")):
            parquet = pq.ParquetFile(file)
            if columns := image_columns(parquet.schema_arrow):
                rows = held_out_rows(parquet.iter_batches(columns=columns))
                found += [(f"{file.name} {row}", name) for row, name in rows]
        refuse_held_out(found, f"The parquet folder {path}", train)
        return load_dataset("parquet", data_dir=str(path), split=split, streaming=streaming), 0
    elif path.is_dir() and (shards := sorted(str(p) for p in path.rglob("*.tar"))):
        counts, members = zip(*map(shard_members, shards))
        refuse_held_out([found for shard in members for found in shard], f"The shards of {path}", train)
        if not sum(counts):
            raise ValueError(f"The {len(shards)} shard(s) of {path} hold no files: write images into them, or give "
                             "another --data.")
        return load_dataset("webdataset", data_files={split: shards}, split=split, streaming=streaming), 0
    else:
        files, left_out = cached_image_files(path, split, train, listing)
        dataset = Dataset.from_dict({"image": files}, features=Features({"image": Image(decode=False)}))
    # a stream of contiguous shards, so that processes (and workers) read disjoint shards
    return (dataset.to_iterable_dataset(num_shards=min(len(dataset), 1024)) if streaming else dataset), left_out


def build_dataset(
    source: str,
    split: str = "train",
    streaming: bool = False,
    image_size: int = 224,
    scale: tuple = (0.25, 1.0),
    seed: int = 0,
    train: bool = True,
    image_column: str = "image",
    process_index: int = 0,
    num_processes: int = 1,
    augment: str = "simple",
    shuffle_buffer: int = 1000,
    listing: str | None = None,
) -> tuple:
    """This process's part of the images of a local folder (see `load_local`) or a `datasets` hub name, transformed by
    an `ImageTransform` (`augment`: "simple", "veca" or "lookwhere"). A missing or image-less folder raises here.

    Returns (dataset, stats): a map-style `Dataset` (`with_transform`) or, with `streaming=True`, an
    `IterableDataset` (`.map`), whose examples are {"pixel_values": (3, S, S) tensor, or None when unreadable,
    "index"}; and the `DataStats` its transform fills. Read it with `BatchStream`.
    Processes get disjoint parts (`datasets.distributed.split_dataset_by_node`), each example read by one process.
    Map-style: equal contiguous parts (the last len % num_processes images are left out), indices are positions in
    the whole dataset. Streamed: whole shards per process (some process gets one more when they do not divide), then
    a shuffle buffer of `shuffle_buffer` examples and a shard order drawn from (seed, epoch), from the first pass on;
    an index is a position in the process's (and DataLoader worker's) stream, so crops repeat for the same seed,
    epoch, world size and number of workers. An image folder's listing is kept in `listing` (`cached_image_files`).
    The image column is `image_column`, or for webdataset shards the first of jpg, jpeg, png, webp they hold.
    """
    left_out = 0
    if is_local(source):
        dataset, left_out = load_local(Path(source).expanduser(), split, streaming, train, listing)
    else:  # a hub dataset is not checked for held-out photos: that would mean downloading all of it first
        dataset = load_dataset(source, split=split, streaming=streaming)
    columns = dataset.column_names
    if columns is not None and image_column == "image" and "image" not in columns:  # webdataset keys by extension
        image_column = next((name for name in ("jpg", "jpeg", "png", "webp") if name in columns), image_column)
    if columns is not None and image_column not in columns:
        raise ValueError(f"{source} has no {image_column!r} column (columns: {', '.join(columns)}): name the column "
                         "that holds the images with --image-column.")
    # undecoded, so that a corrupt file reaches our try/except instead of failing inside datasets
    dataset = dataset.select_columns([image_column]).cast_column(image_column, Image(decode=False))
    if image_column != "image":
        dataset = dataset.rename_column(image_column, "image")
    transform = ImageTransform(image_size, scale, seed, train, augment)
    transform.stats.left_out = left_out
    if streaming:
        if dataset.num_shards < num_processes:
            dataset = dataset.reshard()  # parquet: a shard per row group
        if dataset.num_shards < num_processes:
            raise ValueError(
                f"{source} streams as {dataset.num_shards} shards, fewer than the {num_processes} processes that must "
                f"each read whole ones: split it into at least {num_processes} files, or leave out --streaming."
            )
        dataset = split_dataset_by_node(dataset, rank=process_index, world_size=num_processes, strategy="shards")
        dataset = dataset.shuffle(seed=seed, buffer_size=shuffle_buffer)
        dataset = dataset.map(transform.example, with_indices=True, remove_columns=["image"])
        dataset.set_epoch = functools.partial(set_stream_epoch, dataset, transform)
    else:
        dataset = dataset.add_column("index", range(len(dataset)))
        if num_processes > 1:
            dataset = dataset.select(range(len(dataset) // num_processes * num_processes))  # equal parts
            dataset = split_dataset_by_node(dataset, rank=process_index, world_size=num_processes)
        dataset = dataset.with_transform(transform.batch)
        dataset.set_epoch = transform.set_epoch  # a map-style Dataset has no epoch of its own
    return dataset, transform.stats


class EpochOrder(torch.utils.data.Sampler):
    """A map-style epoch's order: a permutation drawn from (seed, epoch), from batch `skip` on (`start` sets both
    before each pass). It runs in the main process, so persistent workers need no word of the epoch."""

    def __init__(self, size: int, batch_size: int, seed: int):
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.epoch, self.skip = 0, 0

    def start(self, epoch: int, skip: int) -> None:
        self.epoch, self.skip = epoch, skip

    def __iter__(self):
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch))
        return iter(order[self.skip * self.batch_size :].tolist())

    def __len__(self) -> int:
        return max(0, self.size - self.skip * self.batch_size)


class BatchStream:
    """The batches of `dataset` (from `build_dataset`), each from `collate`, epoch after epoch, through one DataLoader
    whose workers live for the whole run (`persistent_workers`, prefetching; pinned memory for a GPU). Only full
    batches: drop_last. `epoch(e, skip)` gives epoch e's batches after the first `skip` (used before a resume): a
    map-style epoch is the permutation of `EpochOrder`, skipped without reading the skipped images; a stream is read
    through the skipped ones. Each sample's crop is a function of (seed, epoch, index), whichever worker makes it."""

    def __init__(self, dataset, batch_size: int, seed: int, num_workers: int = 0, pin_memory: bool = False):
        self.dataset = dataset
        self.order = None if isinstance(dataset, IterableDataset) else EpochOrder(len(dataset), batch_size, seed)
        self.loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, sampler=self.order, collate_fn=collate, num_workers=num_workers,
            drop_last=True, persistent_workers=num_workers > 0, pin_memory=pin_memory,
        )

    def epoch(self, epoch: int, skip: int = 0):
        self.dataset.set_epoch(epoch)  # the crops' epoch: shared memory, seen by persistent workers
        if self.order is None:
            return itertools.islice(self.loader, skip, None)
        self.order.start(epoch, skip)
        return iter(self.loader)


def collate(batch: list) -> dict:
    """Examples -> {"pixel_values": (B, 3, S, S) float tensor, "index": (B,) dataset indices}. Unreadable examples
    are dropped, so B may be smaller than the batch size, and 0 (shape (0, 3, 0, 0)) when none was readable: skip
    such a batch."""
    kept = [example for example in batch if example["pixel_values"] is not None]
    return {
        "pixel_values": torch.stack([e["pixel_values"] for e in kept]) if kept else torch.empty(0, 3, 0, 0),
        "index": torch.tensor([int(e["index"]) for e in kept], dtype=torch.long),
    }
