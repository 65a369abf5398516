"""LookWhere's per-image budget `k_mass`: each image keeps the fewest patches, best first, whose softmax(selector_map)
mass reaches k_mass; a batch keeps its largest count, the unused slots -1, and each image gets the features it gets
alone (within the mixed-size bound); heads, masks and the elastic ONNX graph agree with the single-image path."""

import math

import numpy as np
import pytest
import torch
from conftest import tiny_lookwhere_config
from test_mixed_sizes import assert_same_features, crop_patches, padded_batch

from corevision_hf import LookWhereBackbone, LookWhereConfig, LookWhereForImageClassification, LookWhereModel
from corevision_hf.lookwhere.budget_lookwhere import kept_for_mass


def peaked(model):
    """`model` with its selector map multiplied by each image's top-left pixel value: an image that starts with a
    large value has a peaked map (few patches hold the mass), one that starts near 0 a flat one. The factor is read
    from the image itself, so an image alone and in a batch gets the same map."""

    def scale(module, args, output):
        tokens, selector_map = output
        return tokens, selector_map * args[0][:, :1, 0, 0].float()

    model.selector.register_forward_hook(scale)
    return model


def hand_count(logits: list[float], k_mass: float) -> int:
    """The rule by hand: softmax, sort descending, add masses until k_mass is reached."""
    weights = [math.exp(value - max(logits)) for value in logits]
    masses = sorted((weight / sum(weights) for weight in weights), reverse=True)
    total = 0.0
    for count, mass in enumerate(masses, start=1):
        total += mass
        if total >= k_mass:
            return count
    return len(masses)


@pytest.fixture
def model() -> LookWhereModel:
    torch.manual_seed(0)
    return peaked(LookWhereModel(tiny_lookwhere_config()).eval())


def images_with_scales(scales, sizes=((32, 32),) * 3) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    images = [torch.randn(3, h, w, generator=generator) for h, w in sizes]
    for image, scale in zip(images, scales):
        image[:, 0, 0] = scale
    return images


def test_the_mass_rule_on_a_hand_computed_map():
    logits = [math.log(p) for p in (0.05, 0.5, 0.15, 0.3)]
    for k_mass, expected in ((0.1, 1), (0.4, 1), (0.7, 2), (0.9, 3), (0.97, 4), (1.0, 4)):
        assert hand_count(logits, k_mass) == expected
        assert kept_for_mass(torch.tensor([logits]), k_mass).tolist() == [expected], k_mass


@torch.no_grad()
def test_the_model_keeps_the_hand_computed_count_of_its_own_selector_map(model):
    images = torch.stack(images_with_scales((1.0, 8.0, 30.0)))
    for k_mass in (0.2, 0.5, 0.9, 1.0):
        out = model(images, k_mass=k_mass)
        expected = [hand_count(row.tolist(), k_mass) for row in out.selector_map.double()]
        assert out.num_kept.tolist() == expected
        assert out.selected_indices.shape[1] == max(expected)
        for row, count, scores in zip(out.selected_indices, expected, out.selector_map):
            assert (row[count:] == -1).all() and torch.equal(row[:count], row[:count].sort().values)
            assert set(row[:count].tolist()) == set(scores.topk(count).indices.tolist())  # the best first


@torch.no_grad()
def test_images_with_different_maps_keep_different_counts(model):
    counts = model(torch.stack(images_with_scales((0.5, 5.0, 50.0))), k_mass=0.6).num_kept.tolist()
    assert counts[0] > counts[1] > counts[2] >= 1  # the flattest map keeps the most
    assert model(torch.stack(images_with_scales((0.5, 5.0, 50.0))), k_mass=1.0).num_kept.tolist() == [64] * 3


@pytest.mark.parametrize("attention", ["flash_attention_2", "flash_attention_3", "flex_attention"])
@pytest.mark.parametrize("budget", [{"k_mass": 0.6}, {"k_mass": 0.6, "k": 20}, {"k_mass": torch.tensor(0.6)}, {}])
def test_k_mass_is_refused_by_name_with_attention_that_takes_no_float_mask(attention, budget):
    """k_mass masks each image's unused slots with an additive float mask: flash would read it as 0/1 padding."""
    torch.manual_seed(0)
    model = LookWhereModel(tiny_lookwhere_config(default_k_mass=None if budget else 0.6)).eval()
    model.config._attn_implementation = attention  # as loaded with it (needs a GPU or a compile here)
    with pytest.raises(ValueError, match=f"^k_mass needs eager or sdpa attention, not '{attention}'"):
        model(torch.randn(2, 3, 32, 32), **budget)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("cap", [{}, {"k": 20}, {"k_ratio": 0.3}])
@torch.no_grad()
def test_each_image_of_a_batch_gets_what_it_gets_alone(model, attn_implementation, cap):
    """Same size and padded mixed sizes: counts, kept cells, dense features, CLS and kept tokens equal the image's
    own call; a cap bounds each count and fixes the selection's width."""
    model.set_attn_implementation(attn_implementation)
    same_size = images_with_scales((0.5, 5.0, 50.0))
    mixed = images_with_scales((0.5, 5.0, 50.0), sizes=((24, 40), (40, 16), (32, 32)))
    for images, pixel_values, mask in ((same_size, torch.stack(same_size), {}),
                                       (mixed, *padded_batch(mixed))):
        mask = {"pixel_mask": mask} if isinstance(mask, torch.Tensor) else {}
        batched = model(pixel_values, k_mass=0.6, **cap, **mask)
        kept_only = model(pixel_values, k_mass=0.6, fill_dense=False, **cap, **mask)
        if "k" in cap:
            assert batched.selected_indices.shape[1] == 20
        grid = (pixel_values.shape[2] // 4, pixel_values.shape[3] // 4)
        for index, image in enumerate(images):
            alone = model(image[None], k_mass=0.6, **cap)
            own = (image.shape[1] // 4, image.shape[2] // 4)
            count = alone.num_kept.item()
            assert batched.num_kept[index].item() == count
            selected = batched.selected_indices[index, :count]
            assert (batched.selected_indices[index, count:] == -1).all()
            own_indices = (selected // grid[1]) * own[1] + selected % grid[1]
            assert torch.equal(own_indices, alone.selected_indices[0, :count])
            assert_same_features(batched.pooler_output[index], alone.pooler_output[0])
            assert_same_features(crop_patches(batched.patch_tokens[index], grid, own), alone.patch_tokens[0])
            assert_same_features(kept_only.last_hidden_state[index, 5 : 5 + count],
                                 alone.last_hidden_state[0, 5:][alone.selected_indices[0, :count]])


@torch.no_grad()
def test_a_cap_bounds_each_images_count(model):
    images = torch.stack(images_with_scales((0.5, 5.0, 50.0)))
    free = model(images, k_mass=0.8).num_kept
    capped = model(images, k_mass=0.8, k=12)
    assert torch.equal(capped.num_kept, free.clamp(max=12)) and capped.selected_indices.shape[1] == 12
    assert torch.equal(model(images, k_mass=0.8, k_ratio=0.25).num_kept, free.clamp(max=16))


@torch.no_grad()
def test_a_per_image_mass_tensor_is_each_images_number(model):
    images = torch.stack(images_with_scales((0.5, 5.0, 50.0)))
    masses = torch.tensor([0.3, 0.9, 0.5])
    counts = model(images, k_mass=masses).num_kept
    for index, mass in enumerate(masses.tolist()):
        assert counts[index] == model(images[index : index + 1], k_mass=mass).num_kept[0]


@torch.no_grad()
def test_heads_and_intermediate_layers_take_k_mass_and_agree_with_the_image_alone(model):
    images = images_with_scales((0.5, 5.0, 50.0))
    batch = torch.stack(images)
    torch.manual_seed(0)
    classifier = LookWhereForImageClassification(tiny_lookwhere_config(num_labels=3)).eval()
    classifier.lookwhere = model
    backbone = LookWhereBackbone(tiny_lookwhere_config(out_features=["stage3"])).eval()
    backbone.lookwhere = model
    logits = classifier(batch, k_mass=0.6).logits
    maps = backbone(batch, k_mass=0.6).feature_maps[0]
    layers = model.get_intermediate_layers(batch, n=2, k_mass=0.6)
    for index, image in enumerate(images):
        assert_same_features(logits[index], classifier(image[None], k_mass=0.6).logits[0])
        assert_same_features(maps[index], backbone(image[None], k_mass=0.6).feature_maps[0][0])
        for layer, alone in zip(layers, model.get_intermediate_layers(image[None], n=2, k_mass=0.6)):
            assert_same_features(layer[index], alone[0])
    # The base model's last layer is the backbone's map and the model's patch tokens.
    assert_same_features(maps.flatten(2).transpose(1, 2), model(batch, k_mass=0.6).patch_tokens)


@torch.no_grad()
def test_the_config_default_k_mass_applies_when_a_call_gives_no_budget():
    torch.manual_seed(0)
    model = peaked(LookWhereModel(tiny_lookwhere_config(default_k_mass=0.6)).eval())
    images = torch.stack(images_with_scales((0.5, 5.0, 50.0)))
    assert torch.equal(model(images).num_kept, model(images, k_mass=0.6).num_kept)
    assert model(images, k_ratio=0.25).num_kept.tolist() == [16] * 3  # a call's budget wins
    assert model(images, k=7).num_kept.tolist() == [7] * 3


@pytest.mark.parametrize(
    "k_mass, extra, message",
    [
        (0, {}, r"k_mass must be a number in \(0, 1\]"),
        (1.5, {}, r"k_mass must be a number in \(0, 1\]"),
        (float("nan"), {}, r"k_mass must be a number in \(0, 1\]"),
        (-0.2, {}, r"k_mass must be a number in \(0, 1\]"),
        (True, {}, r"k_mass must be a number in \(0, 1\]"),
        ("0.5", {}, r"k_mass must be a number in \(0, 1\]"),
        (torch.tensor([0.5, 0.5]), {}, r"k_mass as a tensor must be floating point of shape \(\) or \(3,\)"),
        (torch.tensor(1), {}, r"k_mass as a tensor must be floating point"),
        (torch.tensor([0.5, 1.5, 0.5]), {}, r"k_mass must lie in \(0, 1\] for every image"),
        (torch.tensor(float("nan")), {"k": 5}, r"k_mass must lie in \(0, 1\] for every image"),
        (0.5, {"max_gflops": 1.0}, r"k_mass=0.5 and max_gflops=1.0 each choose the budget: give one"),
    ],
)
def test_a_bad_k_mass_is_one_clear_error(model, k_mass, extra, message):
    with pytest.raises(ValueError, match=message) as error:
        model(torch.randn(3, 3, 32, 32), k_mass=k_mass, **extra)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"default_k_mass": 0}, r"default_k_mass must lie in \(0, 1\]"),
        ({"default_k_mass": float("nan")}, r"default_k_mass must lie in \(0, 1\]"),
        ({"default_k_mass": 0.5, "default_k": 8}, r"default_k_mass=0.5 and default_k=8 are both set"),
        ({"default_k_mass": 0.5, "default_max_gflops": 1.0}, r"default_k_mass=0.5 and default_max_gflops=1.0 are both set"),
    ],
)
def test_a_bad_default_k_mass_is_one_clear_error(fields, message):
    with pytest.raises(ValueError, match=message):
        LookWhereConfig(**fields)


def test_a_capped_k_mass_reads_nothing_on_the_host(model):
    from test_no_host_sync import host_reads

    images = torch.randn(2, 3, 32, 40)
    assert host_reads(lambda: model(images, k_mass=0.5, k_ratio=0.5)) == set()
    assert host_reads(lambda: model(images, k_mass=0.5, k=9, pixel_mask=torch.ones(2, 32, 40))) == set()


def test_the_elastic_graph_takes_k_mass_and_equals_pytorch(tmp_path, capsys):
    onnxruntime = pytest.importorskip("onnxruntime")
    from corevision_hf.export import main

    torch.manual_seed(0)
    plain = LookWhereModel(tiny_lookwhere_config()).eval()
    with torch.no_grad():  # a peaked map, driven by content alone, in the saved weights: counts vary over images
        plain.selector.map_head[-1].weight.mul_(40)
        plain.selector.embeddings.position_embeddings.zero_()
    plain.save_pretrained(tmp_path / "model")
    out = str(tmp_path / "elastic.onnx")
    assert main([str(tmp_path / "model"), out, "--elastic", "k_mass"]) == 0
    assert "k_mass=0.5" in capsys.readouterr().out  # the command checked it
    session = onnxruntime.InferenceSession(out, providers=["CPUExecutionProvider"])
    (budget,) = (graph_input for graph_input in session.get_inputs() if graph_input.name != "pixel_values")
    assert (budget.name, budget.type, budget.shape) == ("k_mass", "tensor(double)", [])
    pixel_values = torch.randn(3, 3, 32, 40, generator=torch.Generator().manual_seed(2))
    pixel_values[0], pixel_values[2, :, :16] = 0.5, 0.5  # a plain image, a half-plain one, a busy one
    counts = set()
    for k_mass in (0.01, 0.3, 0.7, 1.0):
        with torch.no_grad():
            expected = plain(pixel_values, k_mass=k_mass)
        counts.add(tuple(expected.num_kept.tolist()))
        actual = session.run(None, {"pixel_values": pixel_values.numpy(), "k_mass": np.array(k_mass)})
        torch.testing.assert_close(torch.from_numpy(actual[0]), expected.last_hidden_state, atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.from_numpy(actual[1]), expected.pooler_output, atol=1e-4, rtol=0)
    assert any(len(set(batch)) == 3 for batch in counts)  # three images, three counts, in one batch
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument, match="k_mass must lie in"):
        session.run(None, {"pixel_values": pixel_values.numpy(), "k_mass": np.array(1.5)})


@torch.no_grad()
def test_the_cost_of_a_k_mass_over_images_is_each_images_lookwhere_flops(model):
    from corevision_hf import gflops_spread, k_mass_for_target, lookwhere_flops, mass_gflops, selector_maps

    images = images_with_scales((0.5, 5.0, 50.0), sizes=((24, 40), (40, 16), (32, 32)))
    maps = selector_maps(model, images)
    gflops = mass_gflops(model.config, maps, 0.6)
    for image, cost in zip(images, gflops):
        count = model(image[None], k_mass=0.6).num_kept.item()
        assert cost == lookwhere_flops(model.config, image.shape[1], image.shape[2], k=count) / 1e9
    spread = gflops_spread(gflops)
    assert spread["min"] < spread["mean"] < spread["max"] and spread["std"] > 0 and spread["images"] == 3

    def mean(k_mass):
        return gflops_spread(mass_gflops(model.config, maps, k_mass))["mean"]

    for target in (mean(0.3), (mean(0.3) + mean(0.7)) / 2, mean(1.0) + 1):
        chosen = k_mass_for_target(model.config, maps, target)
        assert mean(chosen) <= target
        assert chosen == 1.0 or mean(min(1.0, chosen + 1e-9)) > target  # the largest that fits
    with pytest.raises(ValueError, match=r"max_gflops=1e-06 is below the cheapest mean cost on these images"):
        k_mass_for_target(model.config, maps, 1e-6)
