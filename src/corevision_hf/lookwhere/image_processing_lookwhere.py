# Copied from corevision_hf.veca.image_processing_veca with Veca->LookWhere, VECA->LookWhere, veca->lookwhere
"""Image processor for LookWhere: keeps the aspect ratio and snaps both sides to multiples of the patch size.

Hub-copied: imports only torch and transformers. Each hub repo must be self-contained, so the two models' processor
files are one code with the model name substituted: the copy is marked `# Copied from` its source on its first line,
and tools/check_copies.py keeps it equal (`--fix` rewrites it). Change the source.
"""

import math
import numbers

import torch
import torch.nn.functional as F
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature
from transformers.processing_utils import ImagesKwargs


# The normalisation of every ImageNet-pretrained ViT (DINOv2, DINOv3): the one definition the package imports.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# The longest side a processed image may have, in px: one float32 RGB image of 16384 x 16384 is already 3 GiB, and
# a larger size (a typo such as 100000) would end in an allocation failure instead of this limit's error.
MAX_IMAGE_SIDE = 16384
# A normalised image lies within about +-3; beyond this, the input had the wrong scale (or would overflow the model).
MAX_PIXEL_MAGNITUDE = 1e3
# PIL modes with more than 8 bits per sample, which `convert("RGB")` clips at 255.
WIDE_PIL_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N", "F")
# The EXIF tag of a photo's orientation: a phone stores a portrait photo sideways and says so here.
EXIF_ORIENTATION = 0x0112
# PIL resampling codes (what `preprocessor_config.json` files store) -> torch interpolation modes.
RESAMPLE_MODES = {0: "nearest", 2: "bilinear", 3: "bicubic"}
SIZE_KEYS = ({"shortest_edge"}, {"longest_edge"}, {"max_patches"}, {"height", "width"})
# Set on the pixel values of a batch `pad` padded: forward refuses them without their pixel_mask (`check_inputs`).
PADDED = "padded_by_processor"
OPTIONS = (
    "size", "patch_size", "resample", "do_convert_rgb", "do_resize", "do_rescale", "rescale_factor", "do_normalize",
    "image_mean", "image_std", "do_pad",
)


class LookWhereImageProcessorKwargs(ImagesKwargs, total=False):
    patch_size: int


class LookWhereImageProcessor(BaseImageProcessor):
    r"""
    RGB conversion, aspect-preserving resize with both sides snapped to multiples of `patch_size`, rescale to
    [0, 1], ImageNet normalisation and, for batches of different sizes, zero padding (bottom and right, after
    normalisation) to the largest, with a `pixel_mask` (B, H, W) that the model takes: 1 on each image, 0 on its
    padding. Runs in torch; nothing is squashed to a fixed square unless asked.

    Args:
        size (`dict`, defaults to `{"shortest_edge": 256}`): one of `{"shortest_edge": s}` (shorter side ~ s),
            `{"longest_edge": s}` (longer side ~ s), `{"max_patches": n}` (the largest grid of at most n patches),
            each snapped to the nearest patch multiple (at least one patch), or `{"height": h, "width": w}`
            (exactly that, both multiples of `patch_size`). No side of a processed image may pass `MAX_IMAGE_SIDE`
            (16384 px).
        patch_size (`int`, defaults to 16): the model's patch size.
        resample (`int`, defaults to 3): 0 nearest, 2 bilinear, 3 bicubic (PIL codes; antialiased when shrinking).
        do_convert_rgb, do_resize, do_rescale, do_normalize, do_pad (`bool`, default `True`): the steps above.
        rescale_factor (`float`, defaults to 1 / 255), image_mean, image_std (ImageNet by default).
    """

    valid_kwargs = LookWhereImageProcessorKwargs
    model_input_names = ["pixel_values", "pixel_mask"]

    def __init__(
        self,
        size: dict | None = None,
        patch_size: int = 16,
        resample: int = 3,
        do_convert_rgb: bool = True,
        do_resize: bool = True,
        do_rescale: bool = True,
        rescale_factor: float = 1 / 255,
        do_normalize: bool = True,
        image_mean: list[float] | None = None,
        image_std: list[float] | None = None,
        do_pad: bool = True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.size = dict(size) if size is not None else {"shortest_edge": 256}
        self.patch_size = patch_size
        self.resample = int(resample)
        self.do_convert_rgb = do_convert_rgb
        self.do_resize = do_resize
        self.do_rescale = do_rescale
        self.rescale_factor = rescale_factor
        self.do_normalize = do_normalize
        self.image_mean = list(image_mean if image_mean is not None else IMAGENET_MEAN)
        self.image_std = list(image_std if image_std is not None else IMAGENET_STD)
        self.do_pad = do_pad
        check_options(self.size, self.patch_size, self.resample)

    def preprocess(self, images, return_tensors: str | None = "pt", **kwargs) -> BatchFeature:
        """One image or a list of them (PIL images, (H, W, C) or (C, H, W) arrays / tensors, or a (B, C, H, W)
        tensor) -> `BatchFeature` with `pixel_values` (B, C, H, W) float32 and, when the images resize to different
        sizes, `pixel_mask` (B, H, W) int64 (see `pad`); torch tensors (`return_tensors="pt"` or None) or numpy
        arrays (`"np"`). Keyword arguments override the processor's fields for this call (`size`, `do_pad`, ...)."""
        unknown = set(kwargs) - set(OPTIONS)
        if unknown:
            raise ValueError(f"Unknown image processor arguments {sorted(unknown)}; choose from {list(OPTIONS)}.")
        options = {name: kwargs.get(name, getattr(self, name)) for name in OPTIONS}
        check_options(options["size"], options["patch_size"], options["resample"])
        if return_tensors not in (None, "pt", "np"):
            raise ValueError(
                f"return_tensors={return_tensors!r} is not supported; use 'pt' (torch tensors) or 'np' (numpy arrays)."
            )

        processed = [self.process_one(image, options) for image in to_image_list(images)]
        if not processed:
            raise ValueError("No images were given; pass one image or a non-empty list of images.")
        sizes = {tuple(image.shape[-2:]) for image in processed}
        if len(sizes) > 1 and not options["do_pad"]:
            raise ValueError(
                f"The images resize to different sizes {sorted(sizes)}; pass do_pad=True to pad them to the largest, "
                "process them one at a time, or give size={'height': h, 'width': w}."
            )
        data = self.pad(processed)
        if return_tensors == "np":
            data = {name: tensor.numpy() for name, tensor in data.items()}
        return MarkedBatchFeature(data=data, tensor_type=return_tensors)

    def pad(self, images: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Processed (C, H_i, W_i) images -> {"pixel_values": (B, C, H, W)}, the images zero-padded at the bottom and
        right to the largest height and width, and, when any was padded, "pixel_mask": (B, H, W) int64, 1 on each
        image and 0 on its padding, which the model takes to give each image the features it gets alone. Padded pixel
        values carry the attribute `padded_by_processor` (kept by `BatchFeature.to`), so that forward refuses them
        without their mask instead of returning features of the padding."""
        height, width = max(image.shape[-2] for image in images), max(image.shape[-1] for image in images)
        pixel_values = torch.stack([F.pad(image, (0, width - image.shape[-1], 0, height - image.shape[-2]))
                                    for image in images])
        if all(image.shape[-2:] == (height, width) for image in images):
            return {"pixel_values": pixel_values}
        pixel_mask = torch.zeros(len(images), height, width, dtype=torch.int64)
        for mask, image in zip(pixel_mask, images):
            mask[: image.shape[-2], : image.shape[-1]] = 1
        setattr(pixel_values, PADDED, True)
        return {"pixel_values": pixel_values, "pixel_mask": pixel_mask}

    def process_one(self, image, options: dict) -> torch.Tensor:
        """One image -> (C, H', W') float32 tensor, H' and W' multiples of the patch size."""
        pixels = to_channels_first(image, options["do_convert_rgb"]).float()
        patch = options["patch_size"]
        height, width = pixels.shape[-2:]
        new_height, new_width = target_size(height, width, options["size"], patch) if options["do_resize"] else (
            height, width)
        if max(new_height, new_width) > MAX_IMAGE_SIDE:
            raise ValueError(
                f"A {height}x{width} image would be processed at {new_height}x{new_width} px, over the limit of "
                f"{MAX_IMAGE_SIDE} px per side (MAX_IMAGE_SIDE): give a smaller size, e.g. "
                f"{{'longest_edge': {MAX_IMAGE_SIDE}}}, or resize the image first."
            )
        if options["do_resize"]:
            if (new_height, new_width) != (height, width):
                mode = RESAMPLE_MODES[options["resample"]]
                low, high = pixels.min(), pixels.max()  # bicubic overshoots; keep the input's range
                pixels = F.interpolate(
                    pixels[None], size=(new_height, new_width), mode=mode, antialias=mode != "nearest",
                    **({} if mode == "nearest" else {"align_corners": False}),
                )[0].clamp(low, high)
        elif height % patch or width % patch:
            raise ValueError(
                f"Image size {height}x{width} is not a multiple of the patch size {patch} and do_resize=False; "
                "pass do_resize=True (sides are then snapped to patch multiples) or crop the image first."
            )
        if options["do_rescale"]:
            pixels = pixels * options["rescale_factor"]
        if options["do_normalize"]:
            mean = torch.tensor(options["image_mean"], dtype=torch.float32).view(-1, 1, 1)
            std = torch.tensor(options["image_std"], dtype=torch.float32).view(-1, 1, 1)
            if mean.shape[0] not in (1, pixels.shape[0]) or std.shape[0] not in (1, pixels.shape[0]):
                raise ValueError(
                    f"image_mean / image_std have {mean.shape[0]} / {std.shape[0]} values for a {pixels.shape[0]}-channel "
                    "image; give one value per channel."
                )
            pixels = (pixels - mean) / std
        check_values(pixels)
        return pixels


class MarkedBatchFeature(BatchFeature):
    """The processor's output: a `BatchFeature` whose `to()` keeps the mark of padded pixel values (see `pad`), so
    that `model(inputs.to(device).pixel_values)` without the mask is refused on any device."""

    def to(self, *args, **kwargs) -> "MarkedBatchFeature":
        padded = getattr(self.get("pixel_values"), PADDED, False)
        super().to(*args, **kwargs)
        if padded:
            setattr(self["pixel_values"], PADDED, True)
        return self


def check_values(pixels: torch.Tensor) -> None:
    """Refuses processed pixels that hold NaN or infinity (a float64 input beyond float32's range too) or that lie
    far outside a normalised image's range: the model would return NaN, or features of a wrongly scaled image."""
    if not torch.isfinite(pixels).all():
        raise ValueError("The image holds NaN or infinite values (after conversion to float32); check how it was "
                         "decoded or computed.")
    peak = pixels.abs().max().item()
    if peak > MAX_PIXEL_MAGNITUDE:
        raise ValueError(
            f"The image's values reach {peak:.3g} after rescaling and normalising, far outside an image's range (about "
            "3): give pixels in 0..255 with the default rescale_factor, or in 0..1 with do_rescale=False (16-bit "
            "values: rescale_factor=1/65535)."
        )


def check_options(size: dict, patch_size, resample) -> None:
    """Raises a ValueError naming the field for a size, patch size or resampling filter the processor cannot use."""
    if isinstance(patch_size, bool) or not isinstance(patch_size, numbers.Integral) or patch_size < 1:
        raise ValueError(f"patch_size must be a positive int, got {patch_size!r}.")
    if resample not in RESAMPLE_MODES:
        raise ValueError(f"resample={resample!r} is not supported; use 0 (nearest), 2 (bilinear) or 3 (bicubic).")
    if not isinstance(size, dict) or set(size) not in SIZE_KEYS:
        raise ValueError(
            f"size={size!r} is not supported; give {{'shortest_edge': s}}, {{'longest_edge': s}}, "
            "{'max_patches': n} or {'height': h, 'width': w}."
        )
    for key, value in size.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"size[{key!r}] must be a positive int, got {value!r}.")
        limit = (MAX_IMAGE_SIDE // patch_size) ** 2 if key == "max_patches" else MAX_IMAGE_SIDE
        if value > limit:
            raise ValueError(f"size[{key!r}]={value} is over the limit of {limit} (images of at most {MAX_IMAGE_SIDE} "
                             "px per side, MAX_IMAGE_SIDE): give a smaller size.")
    if set(size) == {"height", "width"} and (size["height"] % patch_size or size["width"] % patch_size):
        snapped = {key: max(patch_size, round(value / patch_size) * patch_size) for key, value in size.items()}
        raise ValueError(
            f"size={size} is not a multiple of the patch size {patch_size}; use {snapped}, or "
            f"{{'shortest_edge': {min(size.values())}}} to keep the aspect ratio and snap automatically."
        )


def target_size(height: int, width: int, size: dict, patch: int) -> tuple[int, int]:
    """The output (height, width), both multiples of `patch` and at least one patch, for an input of this size."""
    if "height" in size:
        return size["height"], size["width"]
    if "max_patches" in size:
        # The largest grid with the input's aspect ratio and at most max_patches cells.
        scale = math.sqrt(size["max_patches"] * patch * patch / (height * width))
        rows, cols = max(1, math.floor(height * scale / patch)), max(1, math.floor(width * scale / patch))
        while rows * cols > size["max_patches"]:
            rows, cols = (rows - 1, cols) if rows >= cols and rows > 1 else (rows, max(1, cols - 1))
        return rows * patch, cols * patch
    edge = min(height, width) if "shortest_edge" in size else max(height, width)
    scale = next(iter(size.values())) / edge
    return max(patch, round(height * scale / patch) * patch), max(patch, round(width * scale / patch) * patch)


def to_image_list(images) -> list:
    """One image, a list of images or a (B, C, H, W) batch -> a list of single images."""
    if isinstance(images, (list, tuple)):
        return list(images)
    if getattr(images, "ndim", None) == 4:
        return list(images)
    return [images]


def to_channels_first(image, convert_rgb: bool) -> torch.Tensor:
    """A PIL image, or a (H, W, C) / (C, H, W) / (H, W) array or tensor -> (C, H, W) tensor, RGB if asked."""
    if hasattr(image, "convert") and hasattr(image, "tobytes"):  # a PIL image
        if image.getexif().get(EXIF_ORIENTATION, 1) != 1:  # stored sideways or mirrored: turned as its EXIF says
            from PIL import ImageOps  # PIL is installed: this is a PIL image

            image = ImageOps.exif_transpose(image)
        if image.mode == "F":
            raise ValueError(
                "A PIL image of mode 'F' (32-bit float) has no fixed range of values: save it with 8 or 16 bits per "
                "channel, or pass it as an array with a matching rescale_factor."
            )
        if image.mode in WIDE_PIL_MODES:  # 16-bit gray: scaled to 8 bits by 255 / 65535 (convert("RGB") clips)
            gray = torch.frombuffer(bytearray(image.convert("I").tobytes()), dtype=torch.int32)
            data = (gray.view(1, image.height, image.width).double() / 257).round().clamp(0, 255).to(torch.uint8)
            return data.expand(3, -1, -1) if convert_rgb else data
        if convert_rgb and image.mode != "RGB":
            image = image.convert("RGB")
        channels = len(image.getbands())
        data = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        return data.view(image.height, image.width, channels).permute(2, 0, 1)
    try:
        pixels = torch.as_tensor(image)
    except (TypeError, RuntimeError, ValueError) as error:
        raise ValueError(
            f"Cannot read an image from a {type(image).__name__}; pass PIL images, arrays or tensors."
        ) from error
    if pixels.ndim == 2:
        pixels = pixels[None]
    if pixels.ndim != 3:
        raise ValueError(f"An image must have 2 or 3 dimensions (H, W[, C]) or (C, H, W), got shape {tuple(pixels.shape)}.")
    if pixels.shape[0] not in (1, 3, 4) and pixels.shape[-1] in (1, 3, 4):
        pixels = pixels.permute(2, 0, 1)  # (H, W, C) -> (C, H, W)
    if pixels.shape[-2] == 0 or pixels.shape[-1] == 0:
        raise ValueError(f"Empty image of shape {tuple(pixels.shape)}.")
    if convert_rgb and pixels.shape[0] == 1:
        pixels = pixels.expand(3, -1, -1)
    elif convert_rgb and pixels.shape[0] == 4:
        pixels = pixels[:3]  # RGBA -> RGB, as PIL's convert("RGB") drops alpha
    return pixels


__all__ = ["LookWhereImageProcessor"]
