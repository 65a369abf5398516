"""Images of different sizes in one batch: the processor pads them and returns a pixel mask, both models take it, and
each image gets the features it gets alone, up to float32 rounding: within 2e-6 of the largest magnitude of the
features compared (README); pipelines batch mixed sizes the same way."""

import pytest
import torch
from conftest import save_tiny_model_folders, tiny_lookwhere_config, tiny_veca_config
from PIL import Image
from transformers import pipeline

from corevision_hf import (
    LookWhereForImageClassification,
    LookWhereForSemanticSegmentation,
    LookWhereModel,
    VecaForImageClassification,
    VecaImageProcessor,
    VecaModel,
)
from corevision_hf.finite import check_forward_mask
from corevision_hf.lookwhere.modeling_lookwhere import interpolation_weights


# The README's bound: a padded image's features differ from its own by float32 rounding, which grows with the features'
# magnitude (a trained model's reach tens: 1e-5 absolute did not hold there), so the bound is relative to it.
RELATIVE = 2e-6


def assert_same_features(batched: torch.Tensor, alone: torch.Tensor) -> None:
    """Within RELATIVE of the largest magnitude of `alone`."""
    torch.testing.assert_close(batched, alone, atol=RELATIVE * alone.abs().max().item(), rtol=0)


def padded_batch(images: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    batch = VecaImageProcessor().pad(images)
    return batch["pixel_values"], batch["pixel_mask"]


@pytest.fixture
def images() -> list[torch.Tensor]:
    """Three normalised images of different shapes, in multiples of 8 px (patches of 4 and 8)."""
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(3, h, w, generator=generator) for h, w in ((24, 40), (40, 16), (32, 32))]


def crop_patches(patch_tokens: torch.Tensor, grid: tuple[int, int], own: tuple[int, int]) -> torch.Tensor:
    """(Hp * Wp, D) patch tokens on the padded grid -> (hp * wp, D) on the image's own grid."""
    return patch_tokens.unflatten(0, grid)[: own[0], : own[1]].flatten(0, 1)


def test_the_processor_pads_with_a_mask_only_when_sizes_differ():
    processor = VecaImageProcessor(size={"shortest_edge": 16}, patch_size=8)
    photos = [Image.new("RGB", (40, 20), "red"), Image.new("RGB", (20, 40), "blue")]
    batch = processor(photos)
    assert batch.pixel_values.shape == (2, 3, 32, 32) and batch.pixel_mask.shape == (2, 32, 32)
    assert batch.pixel_mask[0, :16].all() and not batch.pixel_mask[0, 16:].any()  # 16 x 32 px, padded below
    assert batch.pixel_mask[1, :, :16].all() and not batch.pixel_mask[1, :, 16:].any()  # 32 x 16 px, padded right
    assert (batch.pixel_values[0, :, 16:] == 0).all()
    assert "pixel_mask" not in processor(photos[:1]) and "pixel_mask" not in processor([photos[0]] * 2)
    assert processor(photos, return_tensors="np")["pixel_mask"].shape == (2, 32, 32)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("num_cores", [3, None])
@torch.no_grad()
def test_veca_image_in_a_padded_batch_equals_the_image_alone(images, attn_implementation, num_cores):
    torch.manual_seed(0)
    model = VecaModel(tiny_veca_config()).eval()
    model.set_attn_implementation(attn_implementation)
    pixel_values, pixel_mask = padded_batch(images)
    batched = model(pixel_values, pixel_mask=pixel_mask, num_cores=num_cores)
    grid = (pixel_values.shape[2] // 8, pixel_values.shape[3] // 8)
    for index, image in enumerate(images):
        alone = model(image[None], num_cores=num_cores)
        own = (image.shape[1] // 8, image.shape[2] // 8)
        assert_same_features(batched.pooler_output[index], alone.pooler_output[0])
        assert_same_features(batched.core_coordinates[index], alone.core_coordinates[0])
        assert_same_features(crop_patches(batched.patch_tokens[index], grid, own), alone.patch_tokens[0])


@torch.no_grad()
def test_veca_cores_never_attend_to_padding(images):
    torch.manual_seed(0)
    model = VecaModel(tiny_veca_config()).eval()
    model.set_attn_implementation("eager")
    pixel_values, pixel_mask = padded_batch(images)
    attentions = model(pixel_values, pixel_mask=pixel_mask, num_cores=4, output_attentions=True).attentions
    padding = torch.cat([torch.zeros(3, 4, dtype=torch.bool), pixel_mask[:, ::8, ::8].flatten(1) == 0], dim=1)
    for weights in attentions:  # (B, heads, L, L); rows 0..3 are the cores
        assert (weights[:, :, :4].permute(0, 2, 1, 3)[padding[:, None, None, :].expand(-1, 4, 4, -1)] == 0).all()
        assert weights[:, :, :4].sum(-1).sub(1).abs().max() < 1e-5


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize(
    "budget, fields",
    [
        ({}, {}),
        ({"k_ratio": 0.5}, {"selector_antialias": False, "interpolate_antialias": True}),
        ({"k": 7}, {}),
        ({"k_ratio": 1.0}, {"use_swiglu_ffn": True, "num_register_tokens": 0}),
    ],
)
@torch.no_grad()
def test_lookwhere_image_in_a_padded_batch_equals_the_image_alone(images, attn_implementation, budget, fields):
    """The dense output, the CLS token, the selector map, the kept cells and, without the fill, the kept tokens of
    each image of a padded batch are the image's alone; no kept cell and no fill neighbour lies in padding."""
    torch.manual_seed(0)
    model = LookWhereModel(tiny_lookwhere_config(**fields)).eval()
    model.set_attn_implementation(attn_implementation)
    pixel_values, pixel_mask = padded_batch(images)
    batched = model(pixel_values, pixel_mask=pixel_mask, **budget)
    kept_only = model(pixel_values, pixel_mask=pixel_mask, fill_dense=False, **budget)
    grid = (pixel_values.shape[2] // 4, pixel_values.shape[3] // 4)
    prefix = 1 + model.config.num_register_tokens
    for index, image in enumerate(images):
        alone = model(image[None], **budget)
        own = (image.shape[1] // 4, image.shape[2] // 4)
        selected = batched.selected_indices[index]
        selected = selected[selected >= 0]
        rows, columns = selected // grid[1], selected % grid[1]
        assert (rows < own[0]).all() and (columns < own[1]).all()  # never a padding cell
        assert torch.equal(rows * own[1] + columns, alone.selected_indices[0])
        assert (batched.selected_indices[index, len(selected):] == -1).all()  # unused slots last
        assert_same_features(crop_patches(batched.selector_map[index, :, None], grid, own)[:, 0],
                                   alone.selector_map[0])
        assert_same_features(batched.pooler_output[index], alone.pooler_output[0])
        assert_same_features(crop_patches(batched.patch_tokens[index], grid, own), alone.patch_tokens[0])
        assert_same_features(kept_only.last_hidden_state[index, prefix : prefix + len(selected)],
                                   alone.last_hidden_state[0, prefix:][alone.selected_indices[0]])


@pytest.mark.parametrize("model_class, config", [(VecaModel, tiny_veca_config), (LookWhereModel, tiny_lookwhere_config)])
@torch.no_grad()
def test_the_bound_holds_for_features_as_large_as_a_trained_models(images, model_class, config):
    """The final norm scaled by 30 (features reach about 100): the difference grows with them, the relative bound
    holds."""
    torch.manual_seed(0)
    model = model_class(config()).eval()
    (model.extractor.norm if model_class is LookWhereModel else model.norm).weight.mul_(30)
    pixel_values, pixel_mask = padded_batch(images)
    batched = model(pixel_values, pixel_mask=pixel_mask)
    patch = model.config.patch_size
    grid = (pixel_values.shape[2] // patch, pixel_values.shape[3] // patch)
    for index, image in enumerate(images):
        alone = model(image[None])
        assert alone.last_hidden_state.abs().max() > 50
        assert_same_features(batched.pooler_output[index], alone.pooler_output[0])
        own = (image.shape[1] // patch, image.shape[2] // patch)
        assert_same_features(crop_patches(batched.patch_tokens[index], grid, own), alone.patch_tokens[0])


@torch.no_grad()
def test_heads_take_the_mask(images):
    """VECA's classifier averages each image's own patches; LookWhere's heads run each image as alone, and the
    segmentation loss leaves padding out."""
    pixel_values, pixel_mask = padded_batch(images)
    torch.manual_seed(0)
    veca = VecaForImageClassification(tiny_veca_config(num_labels=3)).eval()
    lookwhere = LookWhereForImageClassification(tiny_lookwhere_config(num_labels=3)).eval()
    segmenter = LookWhereForSemanticSegmentation(tiny_lookwhere_config(num_labels=3)).eval()
    for head in (veca, lookwhere):
        logits = head(pixel_values, pixel_mask=pixel_mask).logits
        for index, image in enumerate(images):
            assert_same_features(logits[index], head(image[None]).logits[0])
    labels = torch.randint(0, 3, pixel_mask.shape, generator=torch.Generator().manual_seed(0))
    loss = segmenter(pixel_values, labels=labels, pixel_mask=pixel_mask).loss
    ignored = segmenter(pixel_values, labels=labels.masked_fill(pixel_mask == 0, 255), pixel_mask=pixel_mask).loss
    torch.testing.assert_close(loss, ignored)
    assert not torch.allclose(loss, segmenter(pixel_values, labels=labels, pixel_mask=torch.ones_like(pixel_mask)).loss)


@pytest.mark.parametrize("model_class, config", [(VecaModel, tiny_veca_config), (LookWhereModel, tiny_lookwhere_config)])
def test_a_mask_that_does_not_match_the_batch_is_one_clear_error(images, model_class, config):
    model = model_class(config()).eval()
    pixel_values, pixel_mask = padded_batch(images)
    with pytest.raises(ValueError, match=r"^pixel_mask has shape \(2, 40, 40\) but pixel_values is \(3, 3, 40, 40\)"):
        model(pixel_values, pixel_mask=pixel_mask[:2])
    model.set_attn_implementation("flex_attention")
    with pytest.raises(ValueError, match="pixel_mask needs eager or sdpa attention"):
        model(pixel_values, pixel_mask=pixel_mask)


@pytest.mark.parametrize("model_class, config", [(VecaModel, tiny_veca_config), (LookWhereModel, tiny_lookwhere_config)])
def test_a_padded_batch_without_its_mask_is_refused(model_class, config):
    """DINOv2's habit, model(inputs.pixel_values), on a batch the processor padded: one ValueError (the processor
    marks the tensor; forward reads the mark, no value), also after inputs.to(...); a batch of one size runs."""
    torch.manual_seed(0)
    model = model_class(config()).eval()
    processor = VecaImageProcessor(size={"shortest_edge": 16}, patch_size=model.config.patch_size)
    photos = [Image.new("RGB", (40, 20), "red"), Image.new("RGB", (20, 40), "blue")]
    inputs = processor(photos)
    message = r"^pixel_values is a batch the image processor padded to one size .* pixel_mask=inputs.pixel_mask\)\.$"
    for moved in (inputs, inputs.to("cpu"), inputs.to(torch.float32)):
        with pytest.raises(ValueError, match=message):
            model(moved.pixel_values)
    with torch.no_grad():
        model(**inputs)
        model(processor([photos[0], photos[0]]).pixel_values)  # one size: nothing padded, no mask needed


@pytest.mark.parametrize("model_class, config", [(VecaModel, tiny_veca_config), (LookWhereModel, tiny_lookwhere_config)])
def test_the_opt_in_mask_check_refuses_masks_the_model_would_misread(images, model_class, config):
    """An all-0 mask (read as the top-left patch), 1s that are not one rectangle at the top left, soft or scaled values and a rectangle
    that is not whole patches are each a ValueError naming the problem; the processor's mask, as bool too, passes."""
    torch.manual_seed(0)
    model = check_forward_mask(model_class(config()).eval())
    pixel_values, pixel_mask = padded_batch(images)
    empty, holed, ragged = pixel_mask.clone(), pixel_mask.clone(), pixel_mask.clone()
    empty[1] = 0
    holed[2, 8:16, 8:16] = 0
    ragged[0, :, 34:] = 0  # 34 px wide: not whole patches of 4 or 8
    with torch.no_grad():
        model(pixel_values, pixel_mask=pixel_mask)
        model(pixel_values, pixel_mask=pixel_mask.bool())
        for mask, message in [
            (empty, r"^pixel_mask of image 1 is all 0 \(no pixel of the image\)"),
            (holed, r"^pixel_mask of image 2 is not one rectangle of 1s at the top left"),
            (pixel_mask * 0.5, r"^pixel_mask holds the value 0.5; a mask is 1 on each image and 0 on its padding"),
            (pixel_mask * 7, r"^pixel_mask holds the value 7; a mask is 1 on each image"),
            (ragged, rf"^pixel_mask of image 0 covers 24x34 px, not whole {model.config.patch_size} px patches"),
        ]:
            with pytest.raises(ValueError, match=message):
                model(pixel_values, pixel_mask=mask)


@pytest.mark.parametrize("mode, antialias", [("bilinear", False), ("bilinear", True), ("bicubic", False),
                                             ("bicubic", True)])
def test_per_image_interpolation_weights_are_torchs(mode, antialias):
    """The weights LookWhere resizes each image of a padded batch with are F.interpolate's, for shrinking and
    growing, and zero past each image's own cells."""
    for source, target in [(1, 3), (5, 154), (16, 9), (37, 44), (100, 74), (44, 37)]:
        weights = interpolation_weights(torch.tensor([source]), torch.tensor([target]), source + 3, target + 2, mode,
                                        antialias)[0]
        identity = torch.eye(source)[None, None]
        expected = torch.nn.functional.interpolate(identity, size=(target, source), mode=mode, align_corners=False,
                                                   antialias=antialias)[0, 0]
        torch.testing.assert_close(weights[:target, :source], expected, atol=2e-6, rtol=0)
        assert not weights[target:].any() and not weights[:, source:].any()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return save_tiny_model_folders(tmp_path_factory.mktemp("models"))


@pytest.mark.parametrize("name, call", [("veca", {"num_cores": 3}), ("lookwhere", {"k_ratio": 0.5}),
                                        ("lookwhere", {"k_ratio": 0.5, "fill_dense": False}),
                                        ("lookwhere", {"k_mass": 0.5}), ("lookwhere", {"k_mass": 0.5, "fill_dense": False})])
def test_pipelines_batch_photos_of_different_sizes(folders, name, call):
    generator = torch.Generator().manual_seed(0)
    photos = [Image.frombytes("RGB", (w, h), bytes(torch.randint(0, 256, (h * w * 3,), generator=generator).tolist()))
              for h, w in ((30, 45), (45, 30), (32, 32), (20, 50))]
    pipe = pipeline("image-feature-extraction", model=folders[name], trust_remote_code=True)
    batched = pipe(photos, batch_size=3, return_tensors=True, **call)
    for photo, features in zip(photos, batched):
        assert_same_features(features, pipe(photo, return_tensors=True, **call))
    pooled = pipe(photos, batch_size=4, pool=True, return_tensors=True, **call)
    assert_same_features(torch.cat(pooled), torch.cat([pipe(p, pool=True, return_tensors=True, **call) for p in photos]))


@pytest.mark.parametrize("model_class, config", [(VecaModel, tiny_veca_config), (LookWhereModel, tiny_lookwhere_config)])
def test_an_all_zero_mask_reads_the_images_top_left_patch_instead_of_nan(images, model_class, config):
    """An image whose pixel_mask is all 0 (the processor never makes one; the opt-in check refuses it) has no pixel to
    read, which gave NaN (VECA): forward reads it as its top-left patch, finite, without reading the mask on the host;
    the other images are untouched."""
    torch.manual_seed(0)
    model = model_class(config()).eval()
    pixel_values, pixel_mask = padded_batch(images)
    empty, corner = pixel_mask.clone(), pixel_mask.clone()
    empty[1] = 0
    corner[1] = 0
    corner[1, : model.config.patch_size, : model.config.patch_size] = 1
    with torch.no_grad():
        read = model(pixel_values, pixel_mask=empty).last_hidden_state
        expected = model(pixel_values, pixel_mask=corner).last_hidden_state
    assert read.isfinite().all()
    torch.testing.assert_close(read, expected, atol=0, rtol=0)
