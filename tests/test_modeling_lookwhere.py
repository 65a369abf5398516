import math
import textwrap

import pytest
import torch
from conftest import load_without_package, lookwhere_training_numerics, make_offline_hub_cache, tiny_lookwhere_config
from transformers import (
    AutoModel,
    Dinov2Config,
    Dinov2Model,
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersModel,
    Trainer,
    TrainingArguments,
)
from transformers.utils import logging as transformers_logging

from corevision_hf import (
    LookWhereBackbone,
    LookWhereConfig,
    LookWhereForImageClassification,
    LookWhereForSemanticSegmentation,
    LookWhereModel,
    lookwhere_flops,
    lookwhere_from_teacher,
    save_model_folder,
)
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from corevision_hf.lookwhere.modeling_lookwhere import (
    inverse_distance_fill,
    resize_position_table,
)


@pytest.fixture
def model() -> LookWhereModel:
    torch.manual_seed(0)
    return LookWhereModel(tiny_lookwhere_config()).eval()


@pytest.fixture
def pixel_values() -> torch.Tensor:
    """Two non-square images: an 8 x 12 high-resolution grid."""
    return torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1))


def plain_vit_run(extractor, pixel_values, prefix):
    """The extractor's weights as an ordinary ViT over every patch of the image, after `prefix`."""
    grid = (pixel_values.shape[2] // 4, pixel_values.shape[3] // 4)
    embeddings = extractor.embeddings
    tokens = embeddings.patch_embeddings(pixel_values) + embeddings.resize_positions(grid)
    hidden_states = torch.cat([prefix, tokens], dim=1)
    for layer in extractor.layers:
        hidden_states = layer(hidden_states)
    return extractor.norm(hidden_states)


def test_output_layout(model, pixel_values):
    out = model(pixel_values, output_hidden_states=True)
    num_patches, k = 8 * 12, int(0.25 * 96)
    assert out.last_hidden_state.shape == (2, 5 + num_patches, 32)  # like Dinov2WithRegistersModel: CLS, 4 registers
    torch.testing.assert_close(out.pooler_output, out.last_hidden_state[:, 0])
    assert out.selected_indices.shape == (2, k)
    assert torch.all(out.selected_indices.diff(dim=1) > 0) and out.selected_indices.max() < num_patches
    assert out.selector_map.shape == (2, num_patches)
    torch.testing.assert_close(out.selector_map.topk(k).indices.sort().values, out.selected_indices)
    # Hidden states are filled onto the grid like the output (the last one is before the final norm).
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    assert all(state.shape == (2, 5 + num_patches, 32) for state in out.hidden_states)
    kept = torch.cat([torch.arange(5).expand(2, -1), 5 + out.selected_indices], dim=1)[..., None].expand(-1, -1, 32)
    last = model.extractor.norm(out.hidden_states[-1])  # the fill averages, so only kept cells commute with the norm
    torch.testing.assert_close(last.gather(1, kept), out.last_hidden_state.gather(1, kept))
    sparse = model(pixel_values, k=7, fill_dense=False, output_hidden_states=True)
    assert sparse.last_hidden_state.shape == (2, 5 + 7, 32)
    assert sparse.hidden_states[0].shape == (2, 5 + 7, 32)


def test_all_patches_equal_a_plain_vit_run(model, pixel_values):
    out = model(pixel_values, k=96)
    global_tokens, _ = model.selector(pixel_values, (8, 12))
    expected = plain_vit_run(model.extractor, pixel_values, global_tokens)
    torch.testing.assert_close(out.last_hidden_state, expected, atol=1e-5, rtol=1e-5)
    # The order of kept tokens does not matter: each token carries its own position.
    order = torch.randperm(96)
    shuffled = model.extractor(pixel_values, order.expand(2, -1), global_tokens).last_hidden_state
    torch.testing.assert_close(shuffled[:, 5:], expected[:, 5:][:, order], atol=1e-5, rtol=1e-5)


def test_dense_fill_keeps_kept_cells_and_weights_by_inverse_distance():
    kept = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # cells 0 = (0, 0) and 8 = (2, 2) of a 3 x 3 grid
    dense = inverse_distance_fill(kept, torch.tensor([[0, 8]]), (3, 3), num_neighbors=5)
    torch.testing.assert_close(dense[0, 0], kept[0, 0])
    torch.testing.assert_close(dense[0, 8], kept[0, 1])
    torch.testing.assert_close(dense[0, 4], torch.tensor([0.5, 0.5]))  # the centre is equidistant
    near, far = 1.0, 1 / math.sqrt(5)  # cell 1 = (0, 1): distance 1 to (0, 0), sqrt(5) to (2, 2)
    torch.testing.assert_close(dense[0, 1], torch.tensor([near, far]) / (near + far))


def test_dense_fill_uses_only_the_nearest_neighbours():
    indices = torch.tensor([[0, 1, 2, 24]])  # a 5 x 5 grid; cell 24 is far from cell 5
    kept = torch.eye(4)[None]
    dense = inverse_distance_fill(kept, indices, (5, 5), num_neighbors=3)
    assert dense[0, 5, 3] == 0 and dense[0, 5, :3].sum() > 0.999


def test_dense_fill_breaks_distance_ties_by_priority():
    """Cells 0 and 2 of a 1 x 3 grid are equidistant from cell 1; with one neighbour the tie goes to the lower
    priority (the higher-scored patch), whatever the order of the kept tokens."""
    kept = torch.tensor([[[1.0], [2.0]]])
    for priority, winner in [([0, 1], 1.0), ([1, 0], 2.0)]:
        dense = inverse_distance_fill(kept, torch.tensor([[0, 2]]), (1, 3), 1, torch.tensor([priority]))
        assert dense[0, 1, 0] == winner
    # 5 nearest of 8 kept cells in a ring around the centre of a 3 x 3 grid: the 4 edge cells at distance 1, then
    # the best-ranked of the 4 corners at sqrt(2).
    ring = torch.tensor([[0, 1, 2, 3, 5, 6, 7, 8]])
    values = torch.arange(8.0)[None, :, None]
    corners_last_but_8 = torch.tensor([[3, 4, 2, 5, 6, 1, 7, 0]])  # cell 8 (value 7) is the best corner
    dense = inverse_distance_fill(values, ring, (3, 3), 5, corners_last_but_8)
    edges = values[0, [1, 3, 4, 6], 0]
    expected = (edges.sum() + 7.0 / math.sqrt(2)) / (4 + 1 / math.sqrt(2))
    torch.testing.assert_close(dense[0, 4, 0], expected)


def test_selector_antialias_is_a_config_choice(model, pixel_values):
    """The selector's low-resolution copy is antialiased or not as configured (converted checkpoints: not), and
    nothing else changes: without antialias the map equals the selector run on a plain bilinear resize."""
    size = model.config.selector_image_size
    with torch.no_grad():
        antialiased = model(pixel_values, k=4).selector_map
        model.config.selector_antialias = False
        plain = model(pixel_values, k=4).selector_map
        resized = torch.nn.functional.interpolate(pixel_values, size=(size, size), mode="bilinear", align_corners=False)
        model.config.selector_antialias = True  # a resize to the selector's own size is the identity either way
        _, by_hand = model.selector(resized, (8, 12))
    assert not torch.allclose(antialiased, plain)
    torch.testing.assert_close(plain, by_hand)


def test_swiglu_mlp_and_no_registers():
    """The Franca variant: packed SwiGLU MLP, CLS alone handed to the extractor."""
    config = tiny_lookwhere_config(use_swiglu_ffn=True, num_register_tokens=0)
    model = LookWhereModel(config).eval()
    fc1 = model.extractor.layers[0].mlp.fc1
    assert fc1.out_features == 2 * config.intermediate_size
    x = torch.randn(3, config.hidden_size)
    u, v = fc1(x).chunk(2, dim=-1)
    torch.testing.assert_close(model.extractor.layers[0].mlp(x), model.extractor.layers[0].mlp.fc2(torch.nn.functional.silu(u) * v))
    out = model(torch.randn(2, 3, 32, 32), k=4)
    assert out.last_hidden_state.shape[1] == 1 + (32 // config.patch_size) ** 2


def perturbed_teacher(teacher_class: str):
    """A tiny DINOv2 teacher, with 4 registers or without, its weights moved off their initial values."""
    torch.manual_seed(0)
    fields = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, mlp_ratio=2, patch_size=4, image_size=32)
    if teacher_class == "with_registers":
        teacher = Dinov2WithRegistersModel(Dinov2WithRegistersConfig(num_register_tokens=4, **fields)).eval()
    else:
        teacher = Dinov2Model(Dinov2Config(**fields)).eval()
    for param in teacher.parameters():  # layer scale and norms away from their identity init
        param.data += 0.05 * torch.randn_like(param)
    return teacher


@pytest.mark.parametrize("teacher_class", ["with_registers", "plain"])
@pytest.mark.parametrize("size", [32, 40])
def test_from_teacher_reproduces_the_teacher(teacher_class, size):
    teacher = perturbed_teacher(teacher_class)
    model = lookwhere_from_teacher(teacher, selector_depth=2, selector_image_size=12).eval()
    assert model.config.num_register_tokens == (4 if teacher_class == "with_registers" else 0)
    pixel_values = torch.randn(2, 3, size, size)
    with torch.no_grad():
        expected = teacher(pixel_values).last_hidden_state
        num_prefix = 1 + model.config.num_register_tokens
        teacher_prefix = teacher.embeddings(pixel_values)[:, :num_prefix]
        num_patches = (size // 4) ** 2
        indices = torch.arange(num_patches).expand(2, -1)
        actual = model.extractor(pixel_values, indices, teacher_prefix).last_hidden_state
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("teacher_class", ["with_registers", "plain"])
@pytest.mark.parametrize("size", [32, 40])
@torch.no_grad()
def test_own_prefix_from_teacher_keeping_every_patch_is_the_teacher(teacher_class, size):
    """extractor_prefix="extractor": the whole model, keeping every patch, gives the teacher's tokens; with the
    selector's global tokens handed over (the default) it does not."""
    teacher = perturbed_teacher(teacher_class)
    pixel_values = torch.randn(2, 3, size, size)
    expected = teacher(pixel_values).last_hidden_state
    every = (size // 4) ** 2
    own = lookwhere_from_teacher(teacher, selector_depth=2, selector_image_size=12, extractor_prefix="extractor").eval()
    torch.testing.assert_close(own(pixel_values, k=every).last_hidden_state, expected, atol=1e-5, rtol=1e-4)
    handed = lookwhere_from_teacher(teacher, selector_depth=2, selector_image_size=12).eval()
    assert (handed(pixel_values, k=every).last_hidden_state - expected).abs().max() > 1e-2


@pytest.mark.parametrize("registers", [0, 4])
@torch.no_grad()
def test_own_prefix_ignores_the_selectors_global_tokens(tmp_path, registers):
    """With extractor_prefix="extractor" the selector only scores: its CLS moves the map, not the kept tokens' values;
    the own tokens are saved and loaded (with no registers too: no empty tensor for save_pretrained to drop)."""
    torch.manual_seed(0)
    model = LookWhereModel(tiny_lookwhere_config(extractor_prefix="extractor", num_register_tokens=registers)).eval()
    pixel_values = torch.randn(2, 3, 32, 32)
    expected = model(pixel_values, k=64).last_hidden_state
    map_before = model(pixel_values, k=64).selector_map
    cls_token = model.selector.embeddings.cls_token
    cls_token.data += torch.randn_like(cls_token)  # a constant would vanish in the norms
    assert (model(pixel_values, k=64).selector_map - map_before).abs().max() > 1e-5  # the map is ~0.02 at init
    torch.testing.assert_close(model(pixel_values, k=64).last_hidden_state, expected, atol=0, rtol=0)
    prefix_tokens = model.extractor.embeddings.prefix_tokens
    prefix_tokens.data[:, 0] += torch.randn_like(prefix_tokens[:, 0])
    moved = model(pixel_values, k=64).last_hidden_state
    assert (moved - expected).abs().max() > 1e-2
    model.save_pretrained(tmp_path)
    loaded, info = LookWhereModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"], info
    loaded.eval()
    torch.testing.assert_close(loaded(pixel_values, k=64).last_hidden_state, moved, atol=0, rtol=0)


def test_own_prefix_on_a_checkpoint_without_its_tokens_is_refused(tmp_path):
    """A folder saved with the selector's prefix has no extractor prefix tokens: loading it with
    extractor_prefix="extractor" is refused in one message, not given random tokens; the folder loads as it was saved,
    and an own-prefix folder loads with either."""
    LookWhereModel(tiny_lookwhere_config()).save_pretrained(tmp_path / "selector")
    with pytest.raises(ValueError, match="no extractor prefix tokens.*lookwhere_from_teacher"):
        LookWhereModel.from_pretrained(tmp_path / "selector", extractor_prefix="extractor")
    assert LookWhereModel.from_pretrained(tmp_path / "selector").config.extractor_prefix == "selector"
    LookWhereModel(tiny_lookwhere_config(extractor_prefix="extractor")).save_pretrained(tmp_path / "own")
    assert LookWhereModel.from_pretrained(tmp_path / "own").config.extractor_prefix == "extractor"


def test_extractor_prefix_must_be_known():
    with pytest.raises(ValueError, match="extractor_prefix='teacher' is not one of"):
        tiny_lookwhere_config(extractor_prefix="teacher")


@pytest.mark.parametrize("backend", ["sdpa", pytest.param("flex_attention", marks=pytest.mark.slow)])  # flex compiles
@pytest.mark.parametrize("k", [1, 10, 96])
@torch.no_grad()
def test_attention_backends_agree(model, pixel_values, k, backend):
    model.set_attn_implementation("eager")
    expected = model(pixel_values, k=k).last_hidden_state
    model.set_attn_implementation(backend)
    torch.testing.assert_close(model(pixel_values, k=k).last_hidden_state, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(k=0), "out of range"),
        (dict(k=97), "out of range"),
        (dict(k=2.5), "must be an int"),
        (dict(k_ratio=0.0), r"in \(0, 1\]"),
        (dict(k_ratio=1.5), r"in \(0, 1\]"),
        (dict(k=4, k_ratio=0.5), "k=4 and k_ratio=0.5 each choose the budget"),
    ],
)
def test_bad_budget_is_a_clear_error(model, pixel_values, kwargs, message):
    with pytest.raises(ValueError, match=message):
        model(pixel_values, **kwargs)


@pytest.mark.parametrize("k_ratio, kept", [(0.29, 29), (0.57, 57), (0.07, 7), (0.1, 10), (0.999, 99), (1.0, 100)])
def test_k_ratio_keeps_the_floor_of_its_decimal_share_of_the_grid(model, k_ratio, kept):
    """0.29 of a 10 x 10 grid keeps 29 patches, though the float product 0.29 * 100 is 28.999...: alone, as the second
    image of a padded batch (its own grid), and in the cost a target counts."""
    pixel_mask = torch.ones(2, 40, 48, dtype=torch.int64)
    pixel_mask[1, :, 40:] = 0
    with torch.no_grad():
        alone = model(torch.randn(1, 3, 40, 40), k_ratio=k_ratio, fill_dense=False)
        padded = model(torch.randn(2, 3, 40, 48), k_ratio=k_ratio, fill_dense=False, pixel_mask=pixel_mask)
    assert alone.selected_indices.shape[1] == kept
    assert int((padded.selected_indices[1] >= 0).sum()) == kept
    assert lookwhere_flops(model.config, 40, k_ratio=k_ratio) == lookwhere_flops(model.config, 40, k=kept)


def test_a_float32_ratio_keeps_what_its_decimal_keeps():
    # float32(0.29) is 0.28999999165..., times 100 is 8e-7 short of 29: a tolerance below a float32 ulp kept 28.
    assert kept_for_ratio(torch.tensor(0.29).item(), 100) == 29
    for patches in (7, 64, 100, 1369, 4096):
        for hundredths in range(1, 101):
            ratio = hundredths / 100
            assert kept_for_ratio(torch.tensor(ratio).item(), patches) == kept_for_ratio(ratio, patches) == max(
                1, hundredths * patches // 100), (ratio, patches)


@pytest.mark.parametrize(
    "pixel_values, message",
    [
        (torch.randn(1, 3, 30, 32), "multiple of the patch size"),
        (torch.randn(1, 1, 32, 32), "channels"),
        (torch.zeros(1, 3, 32, 32, dtype=torch.uint8), "floating-point"),
    ],
)
def test_bad_image_is_a_clear_error(model, pixel_values, message):
    with pytest.raises(ValueError, match=message):
        model(pixel_values)


def test_selector_learns_through_map_and_global_tokens(pixel_values):
    model = LookWhereModel(tiny_lookwhere_config())
    out = model(pixel_values)
    # weighted: a plain sum of a layer-normed output is a constant, whose gradient is rounding noise
    weights = torch.linspace(-1, 1, out.pooler_output.shape[-1])
    ((out.pooler_output * weights).sum() + out.selector_map.sum()).backward()
    assert model.selector.map_head[0].weight.grad.abs().sum() > 0
    assert model.selector.embeddings.cls_token.grad.abs().sum() > 0
    assert model.extractor.layers[0].attention.q_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("padded", [False, True], ids=["one_size", "pixel_mask"])
def test_backward_is_bit_identical_across_identical_passes(padded):
    # Advanced-index backward (index_put_ with accumulate) adds in parallel on a multi-threaded CPU: with the position
    # gather written that way, most of these passes differed in the last bits of the position table's gradient.
    torch.set_num_threads(2)  # restored by conftest's process_state_restored
    torch.manual_seed(0)
    model = LookWhereModel(tiny_lookwhere_config(hidden_size=64, image_size=148, num_hidden_layers=1)).train()
    pixel_values = torch.randn(8, 3, 148, 148, generator=torch.Generator().manual_seed(1))  # a 37 x 37 grid
    pixel_mask = torch.ones(8, 148, 148, dtype=torch.long)
    pixel_mask[::2, 128:] = 0  # every other image a 32 x 37 grid: positions gathered from each image's own table

    def gradients() -> dict:
        model.zero_grad(set_to_none=True)
        out = model(pixel_values, k=100, pixel_mask=pixel_mask if padded else None)
        out.last_hidden_state.square().mean().backward()
        return {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}

    first = gradients()
    for _ in range(10):
        again = gradients()
        assert all(torch.equal(again[name], grad) for name, grad in first.items()), [
            name for name, grad in first.items() if not torch.equal(again[name], grad)]


def test_classification_head_freezes_the_selector(pixel_values):
    model = LookWhereForImageClassification(tiny_lookwhere_config(num_labels=4))
    out = model(pixel_values, labels=torch.tensor([0, 3]), k=12)
    assert out.logits.shape == (2, 4) and out.loss > 0
    out.loss.backward()
    assert all(p.grad is None for p in model.lookwhere.selector.parameters())
    assert model.lookwhere.extractor.layers[-1].mlp.fc2.weight.grad is not None


def trainable_selector_parameters(model) -> int:
    return sum(p.numel() for p in model.lookwhere.selector.parameters() if p.requires_grad)


HEADS = [LookWhereForImageClassification, LookWhereForSemanticSegmentation, LookWhereBackbone]


@pytest.mark.parametrize("head", HEADS, ids=lambda head: head.__name__)
def test_every_heads_hidden_states_are_the_base_models_filled_onto_the_grid(pixel_values, head):
    torch.manual_seed(0)
    model = head(tiny_lookwhere_config(num_labels=4)).eval()
    with torch.no_grad():
        out = model(pixel_values, k=12, output_hidden_states=True)
        base = model.lookwhere(pixel_values, k=12, output_hidden_states=True)
    num_prefix = 1 + model.config.num_register_tokens
    assert [state.shape for state in base.hidden_states] == [(2, num_prefix + 8 * 12, 32)] * 4
    assert len(out.hidden_states) == len(base.hidden_states)
    for state, expected in zip(out.hidden_states, base.hidden_states):
        torch.testing.assert_close(state, expected, atol=0, rtol=0)


@pytest.mark.parametrize("head", [LookWhereModel, *HEADS], ids=lambda head: head.__name__)
def test_a_list_of_hidden_states_selects_those_of_all(pixel_values, head):
    # transformers 5 selects layers by index and leaves the others None: the fill must pass them through.
    torch.manual_seed(0)
    model = head(tiny_lookwhere_config(num_labels=3)).eval()
    every = model(pixel_values, output_hidden_states=True).hidden_states
    for chosen in ([-1], [0, 2]):
        states = model(pixel_values, output_hidden_states=chosen).hidden_states
        selected = [i % len(every) for i in chosen]
        assert [i for i, state in enumerate(states) if state is not None] == selected
        for i in selected:
            torch.testing.assert_close(states[i], every[i], atol=0, rtol=0)


@pytest.mark.parametrize("head", [LookWhereModel, *HEADS], ids=lambda head: head.__name__)
def test_return_dict_false_gives_the_dict_outputs_tuple(pixel_values, head):
    torch.manual_seed(0)
    model = head(tiny_lookwhere_config(num_labels=3)).eval()
    as_tuple = head(tiny_lookwhere_config(num_labels=3, return_dict=False)).eval()  # as from_pretrained(..., that)
    as_tuple.load_state_dict(model.state_dict())
    expected = model(pixel_values, output_hidden_states=True).to_tuple()
    for outputs in (as_tuple(pixel_values, output_hidden_states=True),
                    model(pixel_values, output_hidden_states=True, return_dict=False)):
        assert isinstance(outputs, tuple) and len(outputs) == len(expected)
        for got, want in zip(outputs, expected):
            torch.testing.assert_close(got, want, atol=0, rtol=0)
    if head is LookWhereModel:
        torch.testing.assert_close(as_tuple.get_intermediate_layers(pixel_values, n=2),
                                   model.get_intermediate_layers(pixel_values, n=2))


@pytest.mark.parametrize("head", HEADS, ids=lambda head: head.__name__)
def test_task_heads_keep_the_selector_frozen_however_they_are_made(tmp_path, head):
    """Built, loaded (from_pretrained replaces every parameter) and switched to training: no selector parameter
    trains and the selector stays in eval mode; the extractor trains."""
    torch.manual_seed(0)
    head(tiny_lookwhere_config(num_labels=3)).save_pretrained(tmp_path / "head")
    for model in (head(tiny_lookwhere_config(num_labels=3)), head.from_pretrained(tmp_path / "head")):
        model.train()
        assert trainable_selector_parameters(model) == 0
        assert not model.lookwhere.selector.training and model.lookwhere.extractor.training
        assert all(p.requires_grad for p in model.lookwhere.extractor.parameters())


def test_unfreezing_the_selector_is_explicit_and_logged_once(tmp_path, caplog):
    LookWhereForImageClassification(tiny_lookwhere_config(num_labels=3)).save_pretrained(tmp_path / "head")
    transformers_logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            models = [LookWhereForImageClassification.from_pretrained(tmp_path / "head", freeze_selector=False)
                      for _ in range(2)]
    finally:
        transformers_logging.disable_propagation()
    models[0].train()
    assert trainable_selector_parameters(models[0]) == sum(p.numel() for p in models[0].lookwhere.selector.parameters())
    assert models[0].lookwhere.selector.training
    lines = [r.getMessage() for r in caplog.records if "freeze_selector=False" in r.getMessage()]
    assert len(lines) <= 1  # once per process: an earlier test may have logged it already


def test_a_trainer_run_leaves_the_selector_bit_identical(tmp_path):
    """Fine-tuning a loaded classifier with the Trainer (weight decay on, a large learning rate) changes the
    extractor and the head and leaves every selector tensor as it was, bit for bit."""
    torch.manual_seed(0)
    LookWhereForImageClassification(tiny_lookwhere_config(num_labels=2, drop_path_rate=0.1)).save_pretrained(tmp_path / "head")
    model = LookWhereForImageClassification.from_pretrained(tmp_path / "head")
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    data = [{"pixel_values": torch.randn(3, 32, 32, generator=generator), "labels": i % 2} for i in range(8)]
    arguments = TrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2,
        weight_decay=0.1, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
    )
    Trainer(model=model, args=arguments, train_dataset=data).train()
    after = model.state_dict()
    selector = [name for name in before if name.startswith("lookwhere.selector.")]
    assert selector and all(torch.equal(before[name], after[name]) for name in selector)
    assert not torch.equal(before["classifier.weight"], after["classifier.weight"])
    assert not torch.equal(before["lookwhere.extractor.norm.weight"], after["lookwhere.extractor.norm.weight"])


def bilinear_weights(size: int, grid: int) -> torch.Tensor:
    """(size, grid): each output pixel's weights over the grid cells along one axis, for a bilinear resize with
    half-pixel centres (align_corners=False): pixel i samples grid position (i + 0.5) * grid / size - 0.5, clamped."""
    weights = torch.zeros(size, grid)
    for i in range(size):
        position = min(max((i + 0.5) * grid / size - 0.5, 0.0), grid - 1.0)
        low = math.floor(position)
        high = min(low + 1, grid - 1)
        weights[i, low] += 1 - (position - low)
        weights[i, high] += position - low
    return weights


@torch.no_grad()
def test_segmentation_head(pixel_values):
    """The logits are the per-patch logits of the filled grid, resized bilinearly to the image (recomputed by hand);
    the loss is the mean cross-entropy over the pixels not ignored, finite."""
    torch.manual_seed(0)
    model = LookWhereForSemanticSegmentation(tiny_lookwhere_config(num_labels=3)).eval()
    labels = torch.randint(0, 3, (2, 32, 48))
    labels[:, :8] = 255  # ignored
    out = model(pixel_values, labels=labels)
    assert out.logits.shape == (2, 3, 32, 48)

    filled = model.lookwhere(pixel_values, fill_dense=True).last_hidden_state[:, 1 + model.config.num_register_tokens:]
    per_patch = model.classifier(filled).unflatten(1, (8, 12))  # (B, Hp, Wp, labels): 32 x 48 px at patch 4
    expected = torch.einsum("yh,bhwc,xw->bcyx", bilinear_weights(32, 8), per_patch, bilinear_weights(48, 12))
    torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=1e-5)

    log_probs = expected.log_softmax(dim=1)
    kept = labels != 255
    picked = log_probs.gather(1, labels.clamp(max=2)[:, None])[:, 0]  # ignored pixels' values are left out below
    assert torch.isfinite(out.loss)
    torch.testing.assert_close(out.loss, -picked[kept].mean(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("swiglu, mlp", [(False, 4), (True, 6)])
def test_flops_match_hand_count(swiglu, mlp):
    """At 32 px, patch 4, k = 7: the selector sees a 12 px copy (3 x 3 patches + CLS + 4 registers = 14 tokens, 1
    block), its map head maps each of the 9 patches through 32 -> 128 -> 3 x 3 cells; the extractor runs 3 blocks on
    7 + 5 = 12 tokens. A plain MLP costs 4 L d h, a SwiGLU one (fc1 to 2h) 6 L d h."""
    config = tiny_lookwhere_config(use_swiglu_ffn=swiglu)
    d, h = 32, 64
    selector = 8 * 14 * d * d + 4 * d * 14 * 14 + mlp * 14 * d * h + 2 * 9 * d * 3 * 4 * 4
    map_head = 2 * 9 * (d * 4 * d + 4 * d * 3 * 3)
    extractor = 3 * (8 * 12 * d * d + 4 * d * 12 * 12 + mlp * 12 * d * h) + 2 * 7 * d * 3 * 4 * 4
    assert config.map_upsampling == 3
    assert lookwhere_flops(config, 32, k=7) == selector + map_head + extractor


def test_flops_fall_with_k():
    config = LookWhereConfig.from_preset("base")
    costs = [lookwhere_flops(config, 518, k=k) for k in (16, 136, 512)]
    assert costs == sorted(costs)
    assert config.grid_size == 37 and config.selector_grid_size == 11 and config.map_upsampling == 4


LOADER = textwrap.dedent(
    """
    import torch
    from transformers import AutoImageProcessor, AutoModel, AutoModelForImageClassification
    from transformers import AutoModelForSemanticSegmentation

    source, inputs_path, outputs_path = sys.argv[1:4]
    inputs = torch.load(inputs_path)
    model = AutoModel.from_pretrained(source, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    outputs = {k: model(inputs, k=k).last_hidden_state for k in (5, 96)}
    classifier = AutoModelForImageClassification.from_pretrained(source, trust_remote_code=True).eval()
    segmenter = AutoModelForSemanticSegmentation.from_pretrained(source, trust_remote_code=True).eval()
    outputs["classifier"] = classifier(inputs).logits
    outputs["segmenter"] = segmenter(inputs).logits
    # fine-tuning the hub code's heads trains no selector parameter
    outputs["trainable_selector"] = torch.tensor([
        sum(p.numel() for p in head.train().lookwhere.selector.parameters() if p.requires_grad)
        for head in (classifier, segmenter)
    ])
    outputs["processor_size"] = torch.tensor(AutoImageProcessor.from_pretrained(source, trust_remote_code=True).size["shortest_edge"])
    torch.save(outputs, outputs_path)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("via_hub_cache", [False, True])
def test_trust_remote_code_without_package(tmp_path, pixel_values, via_hub_cache):
    torch.manual_seed(0)  # with the numerics of the authors' training, which the hub code must follow too
    model = LookWhereModel(tiny_lookwhere_config(num_labels=3, **lookwhere_training_numerics())).eval()
    save_model_folder(model, tmp_path / "lookwhere")
    source, env = str(tmp_path / "lookwhere"), None
    if via_hub_cache:
        source, env = "org/lookwhere-tiny", make_offline_hub_cache(tmp_path, tmp_path / "lookwhere", "org/lookwhere-tiny")
    outputs = load_without_package(tmp_path, LOADER, source, pixel_values, env=env)
    with torch.no_grad():
        for k in (5, 96):
            torch.testing.assert_close(outputs[k], model(pixel_values, k=k).last_hidden_state, atol=0, rtol=0)
    assert outputs["classifier"].shape == (2, 3)
    assert outputs["trainable_selector"].tolist() == [0, 0]
    assert outputs["segmenter"].shape == (2, 3, 32, 48)
    assert outputs["processor_size"] == 32
    assert isinstance(AutoModel.from_pretrained(tmp_path / "lookwhere"), LookWhereModel)
