"""Teacher-free measures of frozen features on photos: instance retrieval over augmented views (the image-level token)
and dense correspondence under a known crop, scale and flip (the patch tokens).

Agreement with a teacher rewards copying the teacher, errors included. These two ask what a user asks of features:
- **Instance retrieval.** Each photo gives `views` augmented views (a random crop of 35-100% of its area, aspect 3/4
  to 4/3, resized to S x S; a horizontal flip half the time; brightness, contrast and saturation scaled by 0.8-1.2).
  Every view queries all the others by cosine similarity of its feature; the other views of its photo are the
  relevant ones. Per query: top-1 (is the nearest view of the same photo, 0 or 1) and average precision.
- **Dense correspondence.** View A is the whole photo resized to S x S; view B is a square of side 70-90% of A (at a
  random place), resized to S x S and flipped half the time, so that every patch of B has a known place in A. Each
  patch of B is matched to its nearest patch of A (cosine, after removing each view's mean patch feature); it is
  right when that patch lies within one patch (Chebyshev distance <= 1 on A's grid) of the true place.
Raw pixels are the floor of both (`pixel_features`, `pixel_patches`); the teacher is their ceiling.

Every image goes through `corevision_hf.images.to_pixel_values`, as the model cards' agreement images do (a squash
resize, bicubic, no centre crop).
"""

import random

import torch
import torch.nn.functional as F
from PIL import Image, ImageEnhance

from corevision_hf.images import to_pixel_values

ASPECT_RATIO = (3 / 4, 4 / 3)
VIEW_AREA = (0.35, 1.0)
COLOUR_JITTER = (0.8, 1.2)
CROP_SIDE = (0.7, 0.9)  # view B's side, a fraction of view A's


# ---------------------------------------------------------------- views


def random_box(width: int, height: int, rng: random.Random) -> tuple[float, float, float, float]:
    """A crop box (left, top, right, bottom) of `VIEW_AREA` of the image and aspect ratio in `ASPECT_RATIO` (the whole
    image when ten draws do not fit)."""
    for _ in range(10):
        area = width * height * rng.uniform(*VIEW_AREA)
        aspect = rng.uniform(*ASPECT_RATIO)
        w, h = (area * aspect) ** 0.5, (area / aspect) ** 0.5
        if w <= width and h <= height:
            left, top = rng.uniform(0, width - w), rng.uniform(0, height - h)
            return left, top, left + w, top + h
    return 0.0, 0.0, float(width), float(height)


def augmented_views(image: Image.Image, views: int, size: int, seed: int) -> torch.Tensor:
    """`views` augmented views of an RGB image for instance retrieval, drawn from `seed`: (views, 3, size, size)."""
    rng = random.Random(seed)
    out = []
    for _ in range(views):
        view = image.resize((size, size), Image.Resampling.BICUBIC, box=random_box(*image.size, rng))
        if rng.random() < 0.5:
            view = view.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
            view = enhance(view).enhance(rng.uniform(*COLOUR_JITTER))
        out.append(to_pixel_values(view))
    return torch.stack(out)


def correspondence_pair(image: Image.Image, size: int, patch: int, seed: int) -> tuple:
    """Views A and B of an RGB image and where each patch of B lies in A, drawn from `seed`.

    Returns (A (3, S, S), B (3, S, S), true (g * g,) int64): true[i] is the index, on A's g x g grid (g = S / patch),
    of the cell holding the centre of B's patch i (row-major)."""
    rng = random.Random(seed)
    width, height = image.size
    side = rng.uniform(*CROP_SIDE)
    u0, v0 = rng.uniform(0, 1 - side), rng.uniform(0, 1 - side)  # B's corner in A's frame, a fraction of A
    flip = rng.random() < 0.5
    view_a = image.resize((size, size), Image.Resampling.BICUBIC, box=(0, 0, width, height))
    box = (u0 * width, v0 * height, (u0 + side) * width, (v0 + side) * height)
    view_b = image.resize((size, size), Image.Resampling.BICUBIC, box=box)
    if flip:
        view_b = view_b.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    grid = size // patch
    centres = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid  # B's patch centres, a fraction of B
    columns = 1 - centres if flip else centres  # where B's column j came from before the flip
    rows_in_a = ((v0 + side * centres) * grid).floor().clamp(0, grid - 1).long()
    columns_in_a = ((u0 + side * columns) * grid).floor().clamp(0, grid - 1).long()
    true = (rows_in_a[:, None] * grid + columns_in_a[None, :]).flatten()
    return to_pixel_values(view_a), to_pixel_values(view_b), true


# ---------------------------------------------------------------- the floor: raw pixels


def pixel_features(images: torch.Tensor, side: int = 16) -> torch.Tensor:
    """The image-level feature of raw pixels: each image area-averaged to side x side, flattened, its mean removed.
    images (N, 3, S, S) -> (N, 3 * side * side)."""
    small = F.adaptive_avg_pool2d(images, side).flatten(1)
    return small - small.mean(1, keepdim=True)


def pixel_patches(images: torch.Tensor, patch: int) -> torch.Tensor:
    """Each patch's raw pixels as its feature: (N, 3, S, S) -> (N, (S / patch)^2, 3 * patch * patch), row-major."""
    return F.unfold(images, kernel_size=patch, stride=patch).transpose(1, 2)


# ---------------------------------------------------------------- the measures


def retrieval(features: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Leave-one-out instance retrieval by cosine similarity. features (N, D), labels (N,) (the photo of each view).
    Returns {"top1": (N,) 0/1, "ap": (N,) average precision of each query over the other N - 1 views}."""
    normed = F.normalize(features.double(), dim=-1)
    similarity = normed @ normed.T
    similarity.fill_diagonal_(-float("inf"))  # a view does not retrieve itself
    order = similarity.argsort(dim=1, descending=True, stable=True)[:, :-1]  # the last is the query itself
    relevant = (labels[order] == labels[:, None]).double()  # (N, N - 1), by rank
    hits = relevant.cumsum(1)
    ranks = torch.arange(1, relevant.shape[1] + 1, dtype=torch.float64)
    ap = (relevant * hits / ranks).sum(1) / relevant.sum(1).clamp(min=1)
    return {"top1": relevant[:, 0], "ap": ap}


def correspondence_accuracy(patches_a: torch.Tensor, patches_b: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    """Per pair, the share of B's patches whose nearest patch of A (cosine of the features less each view's mean patch
    feature) lies within one cell of the true one.
    patches_a, patches_b (N, g * g, D); true (N, g * g) indices on A's grid. Returns (N,)."""
    grid = int(round(patches_a.shape[1] ** 0.5))
    # the component every patch of a view shares says nothing about where a patch is
    patches_a, patches_b = (p.double() - p.double().mean(1, keepdim=True) for p in (patches_a, patches_b))
    similarity = F.normalize(patches_b, dim=-1) @ F.normalize(patches_a, dim=-1).transpose(1, 2)
    found = similarity.argmax(-1)
    distance = torch.maximum((found // grid - true // grid).abs(), (found % grid - true % grid).abs())
    return (distance <= 1).double().mean(1)
