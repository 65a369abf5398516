"""The models' own image processor: aspect ratio kept, sides snapped to patch multiples, batches padded."""

import pathlib

import numpy as np
import pytest
import torch
from PIL import Image

from corevision_hf.lookwhere.image_processing_lookwhere import LookWhereImageProcessor
from corevision_hf.veca.image_processing_veca import VecaImageProcessor, target_size


MEAN, STD = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])


def photo(width: int, height: int, colour=(200, 100, 50)) -> Image.Image:
    return Image.new("RGB", (width, height), colour)


@pytest.mark.parametrize(
    "size, expected",
    [
        ({"shortest_edge": 224}, (224, 294)),  # 480 -> 224, 640 -> 298.7 -> 21 patches of 14
        ({"longest_edge": 448}, (336, 448)),  # 640 -> 448, 480 -> 336 = 24 patches
        ({"max_patches": 100}, (112, 154)),  # 8 x 11 = 88 <= 100 at the 3:4 aspect ratio
        ({"height": 140, "width": 280}, (140, 280)),
    ],
)
def test_resize_keeps_aspect_ratio_and_snaps_to_patches(size, expected):
    processor = VecaImageProcessor(patch_size=14, size=size)
    pixel_values = processor(photo(640, 480), return_tensors="pt").pixel_values
    assert tuple(pixel_values.shape) == (1, 3, *expected)


def test_max_patches_is_never_exceeded():
    for height, width in [(480, 640), (100, 1000), (1000, 37), (14, 14)]:
        rows, cols = (side // 16 for side in target_size(height, width, {"max_patches": 50}, 16))
        assert 1 <= rows * cols <= 50


def test_values_are_rescaled_and_normalised():
    pixel_values = VecaImageProcessor(patch_size=8, size={"height": 16, "width": 24})(photo(30, 20)).pixel_values
    expected = (torch.tensor([200, 100, 50]) / 255 - MEAN) / STD
    torch.testing.assert_close(pixel_values[0, :, 5, 7], expected)


def test_a_tiny_image_gets_at_least_one_patch():
    pixel_values = VecaImageProcessor(patch_size=14, size={"shortest_edge": 3})(photo(3, 2)).pixel_values
    assert tuple(pixel_values.shape) == (1, 3, 14, 14)


def test_mixed_sizes_are_padded_not_squashed():
    processor = VecaImageProcessor(patch_size=8, size={"shortest_edge": 16})
    wide, tall = photo(64, 32, (10, 20, 30)), photo(32, 48, (90, 80, 70))
    batch = processor([wide, tall]).pixel_values
    alone = [processor(image).pixel_values[0] for image in (wide, tall)]
    assert tuple(alone[0].shape) == (3, 16, 32) and tuple(alone[1].shape) == (3, 24, 16)
    assert tuple(batch.shape) == (2, 3, 24, 32)
    torch.testing.assert_close(batch[0, :, :16, :32], alone[0])
    torch.testing.assert_close(batch[1, :, :24, :16], alone[1])
    assert batch[0, :, 16:].abs().max() == 0 and batch[1, :, :, 16:].abs().max() == 0
    with pytest.raises(ValueError, match="do_pad=True"):
        processor([wide, tall], do_pad=False)


def test_arrays_tensors_and_grayscale():
    processor = VecaImageProcessor(patch_size=8, size={"height": 16, "width": 16})
    reference = processor(photo(16, 16)).pixel_values
    hwc = torch.tensor([200, 100, 50], dtype=torch.uint8).expand(16, 16, 3).clone()
    torch.testing.assert_close(processor(hwc).pixel_values, reference)
    torch.testing.assert_close(processor(hwc.permute(2, 0, 1)[None]).pixel_values, reference)  # a (B, C, H, W) batch
    torch.testing.assert_close(processor(hwc.numpy()).pixel_values, reference)
    gray = processor(Image.new("L", (16, 16), 128)).pixel_values
    torch.testing.assert_close(gray[0, :, 0, 0], (torch.full((3,), 128) / 255 - MEAN) / STD)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"size": {"height": 100, "width": 224}}, r"not a multiple of the patch size 14; use \{'height': 98"),
        ({"size": {"shortest_edge": 0}}, r"size\['shortest_edge'\] must be a positive int"),
        ({"size": {"edge": 224}}, "size=.* is not supported"),
        ({"resample": 5}, "resample=5 is not supported"),
        ({"patch_size": 0}, "patch_size must be a positive int"),
    ],
)
def test_bad_settings_are_one_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VecaImageProcessor(**{"patch_size": 14, **kwargs})
    with pytest.raises(ValueError, match=message):  # the same checks for per-call overrides
        VecaImageProcessor(patch_size=14)(photo(28, 28), **kwargs)


@pytest.mark.parametrize(
    "inputs, kwargs, message",
    [
        (photo(20, 28), {"do_resize": False}, "not a multiple of the patch size 14 and do_resize=False"),
        ([], {}, "No images were given"),
        (torch.full((3, 28, 28), float("nan")), {}, "NaN or infinite"),
        (torch.zeros(3, 0, 28), {}, "Empty image"),
        (torch.zeros(2, 3, 4, 28, 28), {}, "must have 2 or 3 dimensions"),
        ("not an image", {}, "Cannot read an image"),
        (photo(28, 28), {"sizes": 3}, r"Unknown image processor arguments \['sizes'\]"),
        (photo(28, 28), {"return_tensors": "tf"}, "return_tensors='tf' is not supported; use 'pt' .* or 'np'"),
    ],
)
def test_bad_inputs_are_one_clear_error(inputs, kwargs, message):
    with pytest.raises(ValueError, match=message):
        VecaImageProcessor(patch_size=14)(inputs, **kwargs)


@pytest.mark.parametrize("processor_class", [VecaImageProcessor, LookWhereImageProcessor])
def test_numpy_output_equals_torch_output(processor_class):
    processor = processor_class(patch_size=8, size={"shortest_edge": 16})
    images = [photo(64, 32, (10, 20, 30)), photo(32, 48, (90, 80, 70))]  # padded batch
    as_numpy = processor(images, return_tensors="np").pixel_values
    assert isinstance(as_numpy, np.ndarray) and as_numpy.dtype == np.float32
    np.testing.assert_array_equal(as_numpy, processor(images, return_tensors="pt").pixel_values.numpy())


def test_save_and_load_round_trip(tmp_path):
    processor = VecaImageProcessor(patch_size=14, size={"longest_edge": 518}, image_mean=[0.5] * 3)
    processor.save_pretrained(tmp_path)
    loaded = VecaImageProcessor.from_pretrained(tmp_path)
    assert loaded.to_dict() == processor.to_dict()
    overridden = VecaImageProcessor.from_pretrained(tmp_path, size={"shortest_edge": 28})
    assert tuple(overridden(photo(64, 32)).pixel_values.shape) == (1, 3, 28, 56)


def test_lookwhere_processor_is_the_checked_copy():
    """Each hub repo carries its own processor file: LookWhere's is VECA's with the model name substituted, marked on
    its first line so that tools/check_copies.py (tests/test_copies.py) keeps it equal."""
    package = pathlib.Path(__file__).parents[1] / "src" / "corevision_hf"
    source = (package / "veca" / "image_processing_veca.py").read_text()
    marker, _, copy = (package / "lookwhere" / "image_processing_lookwhere.py").read_text().partition("\n")
    assert marker == ("# Copied from corevision_hf.veca.image_processing_veca with Veca->LookWhere, VECA->LookWhere, "
                      "veca->lookwhere")
    assert copy == source.replace("Veca", "LookWhere").replace("VECA", "LookWhere").replace("veca", "lookwhere"), (
        "run tools/check_copies.py --fix"
    )


@pytest.mark.parametrize("processor_class", [VecaImageProcessor, LookWhereImageProcessor])
def test_a_size_over_the_limit_is_one_error_naming_it(processor_class):
    over = "is over the limit of {} (images of at most 16384 px per side, MAX_IMAGE_SIDE): give a smaller size."
    for size, limit in [({"shortest_edge": 100000}, 16384), ({"height": 100000, "width": 224}, 16384),
                        ({"max_patches": 2 * 1024**2}, 1024**2)]:
        with pytest.raises(ValueError) as error:
            processor_class(patch_size=16, size=size)
        key = next(key for key, value in size.items() if value > 16384 or key == "max_patches")
        assert str(error.value) == f"size[{key!r}]={size[key]} " + over.format(limit)
        with pytest.raises(ValueError) as error:  # the same per call
            processor_class(patch_size=16)(photo(32, 32), size=size)
        assert str(error.value) == f"size[{key!r}]={size[key]} " + over.format(limit)
    cases = [  # sizes within the limit that would still make a side longer than it
        ({"size": {"shortest_edge": 8192}}, photo(32, 8), "A 8x32 image would be processed at 8192x32768 px"),
        ({"do_resize": False}, torch.zeros(3, 16, 16400, dtype=torch.uint8),
         "A 16x16400 image would be processed at 16x16400 px"),
    ]
    for kwargs, image, said in cases:
        with pytest.raises(ValueError) as error:
            processor_class(patch_size=16)(image, **kwargs)
        assert str(error.value) == (f"{said}, over the limit of 16384 px per side (MAX_IMAGE_SIDE): give a smaller "
                                    "size, e.g. {'longest_edge': 16384}, or resize the image first.")
