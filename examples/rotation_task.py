"""A small held-out classification task for `python -m training.finetune`: is a crop upright or upside down?

Writes two ImageFolders (one sub-folder per class, `upright/` and `upside_down/`):

  - OUT/train: crops of the training photos (assets/photos, assets/wallpaper_photos/train), each saved upright and
    rotated by 180 degrees, `--train-images` in all;
  - OUT/heldout: `--heldout-crops` crops (80-100 % of the shorter side) of every photo in assets/heldout (or
    `--heldout-photos DIR`: e.g. the 121 of examples/gcompris_photos.py), upright and rotated: for evaluation only
    (several crops of a photo are not independent: bootstrap over photos, as
    `experiments.finetune_rotation.finetune_rotation --groups` does);
  - OUT/val, with `--val-crops`: as many crops (80-100 %) of every photo in assets/wallpaper_photos/val, upright and
    rotated, for `--val-data`: a validation set of other photos, so that every training photo trains.

The crops are square, a random 60-100 % of the photo's shorter side at a random place, resized to `--size` px; the
draws are seeded, so the folders are the same bits on every run. Both copies of a crop have the same name,
`{photo}_{crop}.png`: `--val-groups '(.+)_\\d+$'` keeps every image of a photo on one side of the validation split (else
a crop's upright copy may train while its rotated twin validates). Then, for example:

    python examples/rotation_task.py                                  # outputs/rotation/{train,heldout}
    python -m training.finetune outputs/demo/lookwhere --data outputs/rotation/train \\
        --eval-data outputs/rotation/heldout --output-dir outputs/rotation/lookwhere --val-groups '(.+)_\\d+$'
"""

import argparse
import hashlib
import random
import shutil
from pathlib import Path

from PIL import Image

from corevision_hf.cli import HelpFormatter
from corevision_hf.images import open_image

ASSETS = Path(__file__).resolve().parents[1] / "assets"
TRAIN_PHOTOS = (ASSETS / "photos", ASSETS / "wallpaper_photos" / "train")
HELDOUT_PHOTOS = ASSETS / "heldout"
VAL_PHOTOS = ASSETS / "wallpaper_photos" / "val"


def photos(folders) -> list[Path]:
    """The .jpg, .png and .webp photos of `folders`, sorted."""
    return sorted(path for folder in folders for path in Path(folder).iterdir()
                  if path.suffix.lower() in (".jpg", ".png", ".webp"))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def random_crop(image: Image.Image, size: int, rng: random.Random, scale: tuple[float, float]) -> Image.Image:
    """A square crop of `image`, its side a `scale` fraction of the shorter side, at a random place, at `size` px."""
    side = int(min(image.size) * rng.uniform(*scale))
    left, top = rng.randint(0, image.width - side), rng.randint(0, image.height - side)
    return image.crop((left, top, left + side, top + side)).resize((size, size), Image.Resampling.BICUBIC)


def write_pairs(files: list[Path], folder: Path, crops_per_photo: int, size: int, rng: random.Random,
                scale: tuple[float, float]) -> int:
    """Writes `crops_per_photo` crops of each photo, upright and rotated, into folder/{upright,upside_down}; returns
    the number of images written."""
    for name in ("upright", "upside_down"):
        (folder / name).mkdir(parents=True)
    for path in files:
        image = open_image(path)
        for index in range(crops_per_photo):
            crop = random_crop(image, size, rng, scale)
            crop.save(folder / "upright" / f"{path.stem}_{index}.png")
            crop.rotate(180).save(folder / "upside_down" / f"{path.stem}_{index}.png")
    return 2 * crops_per_photo * len(files)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--output-dir", default="outputs/rotation")
    parser.add_argument("--train-images", type=int, default=200, help="crops of the training photos, both ways up")
    parser.add_argument("--heldout-crops", type=int, default=1, help="crops of each held-out photo, both ways up")
    parser.add_argument("--heldout-photos", default=None, metavar="DIR",
                        help="the folder of photos to crop for OUT/heldout (default: the repository's assets/heldout)")
    parser.add_argument("--val-crops", type=int, default=0,
                        help="crops of each validation photo (assets/wallpaper_photos/val), both ways up "
                             "(0: no OUT/val)")
    parser.add_argument("--size", type=int, default=224, help="side of the square crops in pixels")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    train_files = photos(TRAIN_PHOTOS)
    if args.train_images % (2 * len(train_files)):
        parser.error(f"--train-images must be a multiple of {2 * len(train_files)} (two per crop of each of the "
                     f"{len(train_files)} training photos), got {args.train_images}.")
    if args.train_images < 1 or args.heldout_crops < 1 or args.size < 1:
        parser.error("--train-images, --heldout-crops and --size must be positive.")
    if args.val_crops < 0:
        parser.error(f"--val-crops must be 0 or more, got {args.val_crops}.")
    heldout_folder = Path(args.heldout_photos) if args.heldout_photos else HELDOUT_PHOTOS
    heldout_files = photos([heldout_folder]) if heldout_folder.is_dir() else []
    if not heldout_files:
        parser.error(f"--heldout-photos {args.heldout_photos} is no folder of .jpg, .png or .webp photos.")
    shared = {digest(path) for path in heldout_files} & {digest(path) for path in train_files}
    if shared:
        parser.error(f"--heldout-photos {args.heldout_photos} holds {len(shared)} of the training photos: held-out "
                     "photos must be others.")
    output = Path(args.output_dir)
    for split in ("train", "heldout", "val"):
        shutil.rmtree(output / split, ignore_errors=True)
    rng = random.Random(args.seed)
    crops = args.train_images // (2 * len(train_files))
    train = write_pairs(train_files, output / "train", crops, args.size, rng, (0.6, 1.0))
    heldout = write_pairs(heldout_files, output / "heldout", args.heldout_crops, args.size, rng, (0.8, 1.0))
    print(f"wrote {train} training images to {output / 'train'} and {heldout} held-out images to {output / 'heldout'}")
    if args.val_crops:  # drawn last: train/ and heldout/ are the same bits with or without
        val = write_pairs(photos([VAL_PHOTOS]), output / "val", args.val_crops, args.size, rng, (0.8, 1.0))
        print(f"wrote {val} validation images to {output / 'val'}")


if __name__ == "__main__":
    main()
