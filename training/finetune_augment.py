"""The random changes `training.finetune` makes to its training images, a batch at a time on the batch's device, and
the line that describes them (printed at the start of a run and on its card). Every draw comes from torch's global
generator, which the caller seeds for the batch (training.schedule.reseed_for_step): a run draws the same changes
every time."""


def augment(pixel_values, hflip: bool, scale: tuple[float, float] | None, grayscale: float):
    """`pixel_values` (B, 3, H, W) with half the images flipped left to right (`hflip`), each cropped to a random square
    of a `scale` (LOW, HIGH) share of its side and resized back (None: not cropped), then made grey with probability
    `grayscale`, in that order: a run without crops draws the flips it always drew, one without greys the crops."""
    import torch

    if hflip:
        flip = torch.rand(len(pixel_values), device=pixel_values.device) < 0.5
        pixel_values = torch.where(flip[:, None, None, None], pixel_values.flip(-1), pixel_values)
    if scale is not None:
        pixel_values = random_crops(pixel_values, *scale)
    if grayscale:
        pixel_values = random_grayscale(pixel_values, grayscale)
    return pixel_values


def describe(hflip: bool, scale: tuple[float, float] | None, grayscale: float) -> str:
    """The changes `augment` makes, each with the flag that turns it off and when to ("none" for none)."""
    made = []
    if hflip:
        made.append("left-right flips of half the images (--no-hflip where a mirror image changes the label: "
                    "orientation, handedness, text)")
    if scale is not None:
        made.append(f"square crops of {scale[0]:g} to {scale[1]:g} of the side, resized back (--crop-scale 1 where "
                    "the label depends on what a crop can leave out: counts, positions, a small object)")
    if grayscale:
        made.append(f"grey with probability {grayscale:g} (--grayscale 0 where the colour is the label)")
    return "; ".join(made) or "none"


def random_crops(pixel_values, low: float, high: float):
    """A random square crop of each image of `pixel_values` (B, C, H, W), its side a fraction in [low, high] of the
    image's at a uniform place, resized back to H x W (bilinear): one batched grid_sample, on the images' device, its
    draws from torch's global generator (seed it first)."""
    import torch
    import torch.nn.functional as F

    count, device = len(pixel_values), pixel_values.device
    side = low + (high - low) * torch.rand(count, device=device)
    centre = (1 - side)[:, None] * (2 * torch.rand(count, 2, device=device) - 1)  # the crop stays inside: |c| <= 1-s
    theta = torch.zeros(count, 2, 3, device=device)
    theta[:, 0, 0], theta[:, 1, 1], theta[:, :, 2] = side, side, centre
    grid = F.affine_grid(theta.to(pixel_values.dtype), list(pixel_values.shape), align_corners=False)
    return F.grid_sample(pixel_values, grid, mode="bilinear", padding_mode="border", align_corners=False)


def random_grayscale(pixel_values, probability: float):
    """Each image of `pixel_values` (B, 3, H, W), ImageNet-normalised as the processors give them, made grey with
    `probability`: its luma (ITU-R BT.601, PIL's "L") in all three channels, normalised again. Draws from torch's
    global generator (seed it first)."""
    import torch

    from corevision_hf.images import IMAGENET_MEAN, IMAGENET_STD

    mean = torch.tensor(IMAGENET_MEAN, dtype=pixel_values.dtype, device=pixel_values.device).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=pixel_values.dtype, device=pixel_values.device).view(3, 1, 1)
    luma = torch.tensor([0.299, 0.587, 0.114], dtype=pixel_values.dtype, device=pixel_values.device).view(3, 1, 1)
    grey = ((pixel_values * std + mean) * luma).sum(-3, keepdim=True)
    chosen = torch.rand(len(pixel_values), device=pixel_values.device) < probability
    return torch.where(chosen[:, None, None, None], (grey - mean) / std, pixel_values)
