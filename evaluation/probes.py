"""Frozen-feature probes for evaluation: the labelled folders they read and the linear heads they fit.

Classification folder: `train/<class>/<image>` and `val/<class>/<image>` (the ImageFolder layout; class names are
the sub-folder names, sorted). Segmentation folder: `{train,val}/images/<name>.<ext>` with a single-channel
`{train,val}/masks/<name>.png` of class indices per pixel (255 = ignore).
"""

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder
from PIL import Image

from corevision_hf.images import open_image, to_pixel_values

IMAGE_EXTENSIONS = {ext.lower() for ext in ImageFolder.EXTENSIONS}
IGNORE_INDEX = 255


def _images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)


def image_files(folder: str) -> list[Path]:
    """Every image under `folder` (any nesting), sorted; raises when there is none."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"Image folder {root} does not exist: give a folder of images (any nesting).")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise ValueError(f"Image folder {root} holds no images (looked for {', '.join(sorted(IMAGE_EXTENSIONS))}).")
    return files


def classification_folder(folder: str) -> tuple[dict, list[str]]:
    """{"train": [(path, label)], "val": [...]} and the class names, checked before any work starts."""
    root = Path(folder)
    layout = f"expected {root}/train/<class>/<image> and {root}/val/<class>/<image>"
    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise ValueError(f"The probe dataset has no '{split}' split: {layout}.")
    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    if len(classes) < 2:
        raise ValueError(f"The probe dataset {root} has no labels (fewer than two class folders in train/): {layout}.")
    splits = {}
    for split in ("train", "val"):
        unknown = sorted(p.name for p in (root / split).iterdir() if p.is_dir() and p.name not in classes)
        if unknown:
            raise ValueError(f"{root}/{split} has classes missing from train/: {unknown}.")
        splits[split] = [(path, label) for label, name in enumerate(classes) if (root / split / name).is_dir()
                         for path in _images(root / split / name)]
        if not splits[split]:
            raise ValueError(f"The probe dataset's {split}/ split holds no labelled images: {layout}.")
    return splits, classes


def segmentation_folder(folder: str) -> dict:
    """{"train": [(image path, mask path)], "val": [...]}, every image paired with its mask, checked up front."""
    root = Path(folder)
    splits = {}
    for split in ("train", "val"):
        images, masks = root / split / "images", root / split / "masks"
        if not images.is_dir() or not masks.is_dir():
            raise ValueError(
                f"The segmentation dataset needs {images} and {masks} (images and PNG masks of class indices, "
                f"{IGNORE_INDEX} = ignore, matched by file name)."
            )
        pairs = [(image, masks / f"{image.stem}.png") for image in _images(images)]
        missing = [str(mask) for _, mask in pairs if not mask.is_file()]
        if missing or not pairs:
            raise ValueError(f"{images} holds {len(pairs)} images; masks missing: {missing[:3] or 'all'}.")
        splits[split] = pairs
    return splits


def load_image(path: Path, size: int) -> torch.Tensor:
    """An image resized to `size` x `size` (no crop, so the pixels line up with its mask), normalised: (3, S, S)."""
    return to_pixel_values(open_image(path), size)


def load_mask(path: Path, size: int | None = None) -> torch.Tensor:
    """A label mask as (H, W) int64 class indices, resized (nearest) to `size` x `size` when given."""
    with Image.open(path) as mask:
        if mask.mode not in ("L", "P", "I", "I;16"):
            raise ValueError(f"{path} is a {mask.mode} image; label masks must be single-channel class indices.")
        if size is not None:
            mask = mask.resize((size, size), Image.Resampling.NEAREST)
        return torch.from_numpy(np.array(mask, dtype=np.int64))


def fit_linear_classifier(features: torch.Tensor, labels: torch.Tensor, num_classes: int,
                          weight_decay: float = 1e-4, max_iter: int = 200, per_feature: bool = True) -> torch.nn.Module:
    """Multinomial logistic regression on frozen features (N, D) -> (N,) labels: full-batch L-BFGS on standardised
    features with an L2 penalty. Returns a module mapping raw features to logits. `per_feature=False` centres each
    feature but divides all by one scale (their root-mean-square spread): no weight is enlarged for a feature that
    barely varies, so a head that the backbone's fine-tuning moves on from stays stable."""
    mean = features.mean(0)
    if per_feature:
        std = features.std(0).clamp_min(1e-6)
    else:
        std = (features - mean).square().mean().sqrt().clamp_min(1e-6).expand(features.shape[1]).clone()
    head = torch.nn.Linear(features.shape[1], num_classes)
    torch.nn.init.zeros_(head.weight), torch.nn.init.zeros_(head.bias)
    inputs = (features - mean) / std
    optimizer = torch.optim.LBFGS(head.parameters(), max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(head(inputs), labels) + weight_decay * head.weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return torch.nn.Sequential(Standardize(mean, std), head).requires_grad_(False)


def fit_linear_segmenter(features: torch.Tensor, masks: torch.Tensor, num_classes: int, steps: int = 300,
                         lr: float = 1e-2, weight_decay: float = 1e-4, batch_size: int = 8, seed: int = 0
                         ) -> torch.nn.Module:
    """Per-patch linear head on frozen patch features (N, D, Hp, Wp) for masks (N, H, W): logits upsampled
    bilinearly to the mask size, cross-entropy ignoring 255, AdamW on mini-batches. Returns features -> logits at
    patch resolution (upsample them to the size wanted)."""
    flat = features.permute(0, 2, 3, 1).flatten(0, 2)
    mean, std = flat.mean(0).view(1, -1, 1, 1), flat.std(0).clamp_min(1e-6).view(1, -1, 1, 1)
    head = torch.nn.Conv2d(features.shape[1], num_classes, kernel_size=1)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = torch.randint(len(features), (min(batch_size, len(features)),), generator=generator)
        if (masks[batch] == IGNORE_INDEX).all():
            continue  # nothing to learn from, and the mean over no pixels is nan
        logits = head((features[batch] - mean) / std)
        logits = F.interpolate(logits, size=masks.shape[-2:], mode="bilinear", align_corners=False)
        loss = F.cross_entropy(logits, masks[batch], ignore_index=IGNORE_INDEX)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return torch.nn.Sequential(Standardize(mean, std), head).requires_grad_(False)


class Standardize(torch.nn.Module):
    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std
