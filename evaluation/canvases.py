"""The sparse-recognition canvases (evaluation.sparse_digits) as the task benchmarks' models see them: a `Split` of
one variant holds normalised pixels on demand, the labels, and per cell the label digits' and every digit's ink;
`task_splits` makes a variant's training and test splits from the benchmarks' arguments; `Pixels` numbers the images
of several splits as one sequence; `CanvasDataset` serves training splits to training.loop; `PhotoSplit` holds
training photos as a Split (for distillation only)."""

import hashlib
from pathlib import Path

import numpy as np
import torch

from corevision_hf.images import IMAGENET_MEAN, IMAGENET_STD, open_image
from evaluation.sparse_digits import CELL, make_canvases, photo_paths, photo_pool_digest
from training.data import DataStats, image_files, resize_center_crop

VARIANTS = ("single", "majority")  # the order the benchmarks measure and report them in
CHANCE = 0.1  # ten classes, balanced


class Split:
    """Images of one split as the models see them: normalised pixels on demand, labels, and for canvases per cell
    (row-major, G * G) the label digits' ink (`label_cells`, bool) and every digit's ink (`digit_ink`); `key`: the
    arguments that make these images, the teacher-pass cache's key."""

    def __init__(self, images: np.ndarray, labels: torch.Tensor, key: dict | None = None,
                 label_cells: torch.Tensor | None = None, digit_ink: torch.Tensor | None = None):
        self.key = key
        self.images = images  # (N, S, S, 3) uint8: 0.8 MB a canvas, normalised per batch
        self.labels = labels
        self.label_cells, self.digit_ink = label_cells, digit_ink

    @classmethod
    def of_canvases(cls, canvases, grid: int, key: dict | None = None) -> "Split":
        """The Split of evaluation.sparse_digits' `canvases` on a grid of G = `grid` cells a side."""
        count = len(canvases.labels)
        return cls(canvases.images, torch.from_numpy(canvases.labels).long(), key,
                   label_cells=torch.from_numpy(canvases.label_ink).reshape(count, grid * grid) > 0,
                   digit_ink=torch.from_numpy(canvases.digit_ink).reshape(count, grid * grid).float())

    def __len__(self) -> int:
        return len(self.labels)

    def pixels(self, rows) -> torch.Tensor:
        """(B, 3, S, S) float32 pixels of canvases `rows` (a slice, or indices: a tensor or array), normalised with
        ImageNet's mean and std."""
        if isinstance(rows, torch.Tensor):
            rows = rows.numpy()  # numpy reads a one-element tensor as one index and drops the batch axis
        images = torch.from_numpy(self.images[rows]).permute(0, 3, 1, 2).float() / 255
        mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
        return (images - mean) / std

    def first(self, count: int) -> "Split":
        """The first `count` images as a Split of their own, without a cache key (the teacher's passes are of whole
        splits)."""
        head = lambda cells: None if cells is None else cells[:count]  # noqa: E731
        return Split(self.images[:count], self.labels[:count], None, head(self.label_cells), head(self.digit_ink))

    def batches(self, batch_size: int):
        for first in range(0, len(self), batch_size):
            rows = slice(first, min(first + batch_size, len(self)))
            yield rows, self.pixels(rows)


def task_splits(args, variant: str) -> dict[str, Split]:
    """{"train", "test"} canvases of a variant (the generator's seeded train and test digit pools; with --background
    photo, its disjoint photo pools, --extra-photos among them, each pool's digest in the key)."""
    grid = args.canvas_size // CELL
    common = dict(variant=variant, seed=args.seed, background=args.background, digit_size=args.digit_size,
                  strokes=args.strokes, canvas_size=args.canvas_size)
    extra = args.extra_photos if args.background == "photo" else None
    splits = {}
    for split, count in (("train", args.train), ("test", args.test)):
        key = {**common, "split": split, "count": count}
        if extra is not None:
            key["photos"] = photo_pool_digest(split, extra)
        splits[split] = Split.of_canvases(make_canvases(count, split=split, extra_photos=extra, **common), grid, key)
    return splits


def photo_pool_record(extra_photos: Path, splits=("train", "test")) -> dict:
    """What a result keeps of the photo pools of `splits`: per split the photos' names, their count and the pool's
    digest (the key of its canvases' teacher passes)."""
    return {split: {"count": len(photo_paths(split, extra_photos)),
                    "names": [path.name for path in photo_paths(split, extra_photos)],
                    "digest": photo_pool_digest(split, extra_photos)} for split in splits}


class PhotoSplit(Split):
    """Training photos as the canvases' Split (no labels, no digit cells: for distillation only): centre crops at the
    canvas size, so that the teacher and the students see them downsized to the training size as they see the
    canvases."""

    def __init__(self, folders: list[Path], size: int):
        self.hold([path for folder in folders for path in image_files(folder, "none")[0]], size)

    @classmethod
    def of_paths(cls, paths: list[Path], size: int) -> "PhotoSplit":
        """The photos at `paths` (a pool of evaluation.sparse_digits' `photo_paths`), in their order."""
        split = cls.__new__(cls)
        split.hold(list(paths), size)
        return split

    def hold(self, paths: list, size: int) -> None:
        digest = hashlib.sha256()
        for path in paths:
            digest.update(Path(path).read_bytes())
        super().__init__(np.stack([np.asarray(resize_center_crop(open_image(path), size)) for path in paths]),
                         torch.full((len(paths),), -1),
                         key={"photos": digest.hexdigest(), "count": len(paths), "canvas_size": size})


class Pixels:
    """The images of several splits as one sequence of normalised pixels, rows numbered across the splits: `len()`,
    and `[rows]` (a LongTensor) -> (B, 3, S, S) float32, as a tensor of them all would serve (training.conversion's
    `convert` takes either) without holding them all in float32."""

    def __init__(self, splits: list[Split]):
        self.splits = splits
        self.offsets = np.cumsum([0] + [len(s) for s in splits])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, rows: torch.Tensor) -> torch.Tensor:
        parts = np.searchsorted(self.offsets, rows.numpy(), side="right") - 1
        return torch.cat([self.splits[part].pixels(slice(row - first, row - first + 1))
                          for part, row, first in zip(parts.tolist(), rows.tolist(), self.offsets[parts].tolist())])


class CanvasDataset(torch.utils.data.Dataset):
    """The training canvases of every variant for training.loop: {"pixel_values", "index"} (no augmentation: the
    teacher's targets of each canvas are computed once)."""

    def __init__(self, splits: list[Split], stats: DataStats):
        self.images, self.stats = Pixels(splits), stats

    def __len__(self) -> int:
        return len(self.images)

    def set_epoch(self, epoch: int) -> None:  # the canvases do not change between epochs
        pass

    def __getitem__(self, index: int) -> dict:
        self.stats.add()
        return {"pixel_values": self.images[torch.tensor([index])][0], "index": index}
