import pytest
import torch
from conftest import tiny_veca_config
from transformers import AutoBackbone, AutoModel, AutoModelForImageClassification

from corevision_hf import VecaBackbone, VecaConfig, VecaForImageClassification, VecaModel, veca_flops
from corevision_hf.veca.modeling_veca import apply_rotary, rope_inverse_frequencies


def test_output_layout(tiny_model, images):
    out = tiny_model(images, num_cores=3, output_hidden_states=True)
    num_patches = (24 // 8) * (40 // 8)
    assert out.last_hidden_state.shape == (2, 3 + num_patches, 64)
    torch.testing.assert_close(out.pooler_output, out.last_hidden_state[:, 0])
    assert out.core_coordinates.shape == (2, 3, 2)
    assert out.core_coordinates.abs().max() < 1
    assert len(out.hidden_states) == tiny_model.config.num_hidden_layers + 1
    assert tiny_model(images).last_hidden_state.shape[1] == 8 + num_patches  # None = the whole bank


# flex attention compiles its kernels on the CPU (tens of seconds on a fresh machine): a system run
BACKENDS = ["sdpa", pytest.param("flex_attention", marks=pytest.mark.slow)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_cores", [1, 3, 8])
@pytest.mark.parametrize("size", [(24, 40), (32, 16)])
@torch.no_grad()
def test_attention_backends_agree(tiny_model, num_cores, size, backend):
    images = torch.randn(2, 3, *size)
    tiny_model.set_attn_implementation("eager")  # forwards only: flex has no CPU backward
    expected = tiny_model(images, num_cores=num_cores).last_hidden_state
    tiny_model.set_attn_implementation(backend)
    torch.testing.assert_close(tiny_model(images, num_cores=num_cores).last_hidden_state, expected, atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("num_cores", [1, 5])
def test_budget_equals_truncated_bank(tiny_model, images, num_cores):
    """num_cores=C is exactly a model whose bank holds only the first C cores."""
    truncated = VecaModel(tiny_veca_config(num_cores=num_cores)).eval()
    state = tiny_model.state_dict()
    state["embeddings.core_bank.cores"] = state["embeddings.core_bank.cores"][:, :num_cores]
    state["embeddings.core_bank.coordinates"] = state["embeddings.core_bank.coordinates"][:num_cores]
    truncated.load_state_dict(state)
    expected = truncated(images)
    actual = tiny_model(images, num_cores=num_cores)
    torch.testing.assert_close(actual.last_hidden_state, expected.last_hidden_state, atol=0, rtol=0)
    torch.testing.assert_close(actual.core_coordinates, expected.core_coordinates, atol=0, rtol=0)


@torch.no_grad()
def test_eager_attention_maps_follow_core_periphery_pattern(tiny_model, images):
    """Every layer's attention, recomputed by hand from that layer's own input: a patch's row is the softmax of its
    query against the active cores' keys alone (zero over the patches and the inactive cores), a core's row the
    softmax against the active cores' and every patch's keys; the layer's output is those weights times the values."""
    tiny_model.set_attn_implementation("eager")
    num_cores, heads, head_dim = 3, 4, 16
    calls = []  # (attention module, its positional inputs, its output), one per layer
    hooks = [layer.attention.register_forward_hook(lambda module, args, output: calls.append((module, args, output)))
             for layer in tiny_model.encoder.layers]
    try:
        out = tiny_model(images, num_cores=num_cores, output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    seq_len = out.last_hidden_state.shape[1]
    assert len(calls) == len(out.attentions) == tiny_model.config.num_hidden_layers
    for (module, (hidden_states, cores, angles), (layer_output, _)), attn in zip(calls, out.attentions):
        assert cores == num_cores and attn.shape == (2, heads, seq_len, seq_len)
        query, key, value = (proj(hidden_states).view(2, seq_len, heads, head_dim)
                             for proj in (module.q_proj, module.k_proj, module.v_proj))
        query, key = apply_rotary(torch.stack([query, key], dim=2), angles).unbind(2)
        query, key, value = (x.transpose(1, 2) for x in (query, key, value))  # (B, H, L, head_dim)
        scores = query @ key.transpose(-1, -2) / head_dim**0.5  # every query against every key
        expected = torch.zeros_like(attn)
        expected[:, :, :num_cores] = scores[:, :, :num_cores].softmax(-1)  # cores: active cores and all patches
        expected[:, :, num_cores:, :num_cores] = scores[:, :, num_cores:, :num_cores].softmax(-1)  # patches: cores
        torch.testing.assert_close(attn, expected, atol=1e-6, rtol=1e-5)
        mixed = (expected @ value).transpose(1, 2).reshape(2, seq_len, heads * head_dim)
        torch.testing.assert_close(layer_output, module.o_proj(mixed), atol=1e-5, rtol=1e-5)


def test_gradients_reach_every_parameter(images):
    torch.manual_seed(0)
    model = VecaModel(tiny_veca_config(output_projection_size=48)).train()
    out = model(images, num_cores=4)
    (out.last_hidden_state.square().mean() + out.pooler_output.mean()).backward()
    cores_grad = model.embeddings.core_bank.cores.grad
    assert cores_grad[:, :4].abs().sum() > 0 and torch.all(cores_grad[:, 4:] == 0)  # inactive cores get nothing
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert param.grad.abs().sum() > 0, name


def test_coordinate_augmentation_only_in_training(tiny_model, images):
    torch.testing.assert_close(tiny_model(images).last_hidden_state, tiny_model(images).last_hidden_state)
    tiny_model.train()
    torch.manual_seed(0)
    first = tiny_model(images).last_hidden_state
    torch.manual_seed(1)
    assert not torch.allclose(first, tiny_model(images).last_hidden_state)


def test_core_coordinates_start_spread_out(tiny_model):
    coordinates = torch.tanh(tiny_model.embeddings.core_bank.coordinates.detach())
    assert coordinates.abs().max() <= 0.95
    assert coordinates[0].norm() < 0.2  # core 0 (the CLS core) starts near the centre
    assert torch.pdist(coordinates[:4]).min() > 0.5  # every prefix is spread out


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(pixel_values=torch.randn(1, 1, 32, 32)), "channels"),
        (dict(pixel_values=torch.randn(1, 3, 30, 32)), "multiple of the patch size"),
        (dict(pixel_values=torch.randn(3, 32, 32)), "batch"),
        (dict(pixel_values=torch.zeros(1, 3, 32, 32, dtype=torch.uint8)), "floating-point"),
        (dict(pixel_values=torch.randn(1, 3, 32, 32), num_cores=0), "out of range"),
        (dict(pixel_values=torch.randn(1, 3, 32, 32), num_cores=9), "out of range"),
        (dict(pixel_values=torch.randn(1, 3, 32, 32), num_cores=2.0), "must be an int"),
        (dict(pixel_values=torch.randn(1, 3, 32, 32), num_cores=True), "must be an int"),
        (dict(pixel_values=torch.randn(1, 3, 32, 32), num_cores="4"), "must be an int"),
    ],
)
def test_bad_input_is_a_clear_error(tiny_model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_model(**kwargs)


def test_config_validation_and_presets():  # configs from explicit values: what the checks see
    with pytest.raises(ValueError, match="divisible by 4"):
        VecaConfig(hidden_size=72, num_attention_heads=12)
    with pytest.raises(ValueError, match="Unknown VECA preset"):
        VecaConfig.from_preset("huge")
    with pytest.raises(ValueError, match="outside 1..num_cores"):
        VecaConfig(num_cores=16, training_budgets=[8, 32], training_budget_weights=[1, 1])
    base = VecaConfig.from_preset("base")
    assert (base.hidden_size, base.num_hidden_layers, base.intermediate_size, base.num_cores) == (768, 12, 2048, 64)
    assert base.training_budgets == [8, 16, 24, 32, 40, 48, 56, 64]
    assert base.training_budget_weights == [1, 1, 2, 2, 3, 3, 4, 4]
    assert VecaConfig.from_preset("small").intermediate_size == 1024
    assert VecaConfig.from_preset("large").intermediate_size == 2730
    assert VecaConfig.from_preset("large", num_cores=32).num_cores == 32


@pytest.mark.parametrize("width", [32, 48, 64, 384, 768, 1024])
def test_the_swiglu_width_is_the_references(width):
    """8/3 of the token width, rounded down: what the VECA reference's int(width * mlp_ratio), mlp_ratio = 2.66667,
    gives (85, 128, 170, 1024, 2048, 2730)."""
    from corevision_hf.veca.configuration_veca import swiglu_intermediate_size

    assert swiglu_intermediate_size(width) == int(width * 2.66667)


def test_rope_zeroes_either_end_of_the_spectrum():
    """head_dim 32: 8 frequencies per axis, 1 / 100^(i / 8) for i = 0..7; a quarter of them (2) are zeroed, the
    lowest (the reference default) or the highest (its variant)."""
    expected = 1.0 / 100.0 ** (torch.arange(8) / 8)
    low = rope_inverse_frequencies(tiny_veca_config(num_attention_heads=2, rope_zero_fraction=0.25))  # width 64
    high = rope_inverse_frequencies(
        tiny_veca_config(num_attention_heads=2, rope_zero_fraction=0.25, rope_zero_from="high")
    )
    torch.testing.assert_close(low, torch.cat([expected[:6], torch.zeros(2)]))
    torch.testing.assert_close(high, torch.cat([torch.zeros(2), expected[2:]]))
    with pytest.raises(ValueError, match='rope_zero_from must be "low" or "high"'):
        VecaConfig(rope_zero_from="middle")


def test_patch_embedding_norm(images):
    config = tiny_veca_config(patch_embedding_norm=True)
    model = VecaModel(config).eval()
    with torch.no_grad():
        model.embeddings.patch_embeddings.norm.weight.mul_(3.0)
        tokens = model.embeddings.patch_embeddings(images)
    raw = model.embeddings.patch_embeddings.projection(images).flatten(2).transpose(1, 2)
    torch.testing.assert_close(tokens, 3.0 * torch.nn.functional.layer_norm(raw, (64,), eps=config.layer_norm_eps))


def test_flops_match_hand_count(tiny_config):
    # 32 x 32 image, patch 8 -> N = 16, C = 8, L = 24, d = 64, h = 96, 2 layers.
    per_layer = 8 * 24 * 64 * 64 + 4 * 64 * (8 * 8 + 2 * 16 * 8) + 6 * 24 * 64 * 96
    expected = 2 * per_layer + 1 * 2 * 8 * 64 * 2 + 2 * 16 * 64 * 3 * 64
    assert veca_flops(tiny_config, 32) == expected
    assert veca_flops(tiny_config, 32, num_cores=4) < expected


def test_classification_head(tiny_config, images):
    config = tiny_veca_config(num_labels=5)
    model = VecaForImageClassification(config)
    out = model(images, labels=torch.tensor([1, 4]), num_cores=2)
    assert out.logits.shape == (2, 5)
    assert out.loss.ndim == 0 and out.loss > 0
    assert isinstance(AutoModelForImageClassification.from_config(config), VecaForImageClassification)


def test_backbone_feature_maps(images):
    config = tiny_veca_config(out_indices=[1, 2])
    backbone = AutoBackbone.from_config(config)
    assert isinstance(backbone, VecaBackbone)
    out = backbone(images, num_cores=3)
    assert [tuple(f.shape) for f in out.feature_maps] == [(2, 64, 3, 5)] * 2
    assert out.hidden_states is None


def test_auto_model_from_config(tiny_config):
    assert isinstance(AutoModel.from_config(tiny_config), VecaModel)


def test_training_utilities(tiny_config, images):
    """Gradient checkpointing, bf16 autocast and model.to(dtype) all run and agree with the plain model."""
    torch.manual_seed(0)
    model = VecaModel(tiny_config).eval()
    reference = model(images, num_cores=4).last_hidden_state
    model.activation_checkpointing_enable()
    model.train()
    model.config.pos_embed_shift = model.config.pos_embed_rescale = None  # deterministic training forward
    checkpointed = model(images, num_cores=4).last_hidden_state
    checkpointed.sum().backward()
    torch.testing.assert_close(checkpointed, reference)
    assert model.embeddings.core_bank.coordinates.grad is not None
    model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = model(images, num_cores=4).last_hidden_state
    assert torch.nn.functional.cosine_similarity(autocast.float(), reference, dim=-1).min() > 0.98
    half = model.to(torch.bfloat16)(images, num_cores=4).last_hidden_state
    assert half.dtype == torch.bfloat16
    assert torch.nn.functional.cosine_similarity(half.float(), reference, dim=-1).min() > 0.95


@pytest.mark.slow  # compiles (aot_eager)
def test_torch_compile(tiny_model, images):
    compiled = torch.compile(tiny_model, backend="aot_eager", fullgraph=False)
    torch.testing.assert_close(compiled(images, num_cores=4).last_hidden_state, tiny_model(images, num_cores=4).last_hidden_state)


@pytest.mark.parametrize("head", [VecaModel, VecaForImageClassification, VecaBackbone], ids=lambda head: head.__name__)
def test_return_dict_false_gives_the_dict_outputs_tuple(images, head):
    torch.manual_seed(0)
    model = head(tiny_veca_config(num_labels=3)).eval()
    as_tuple = head(tiny_veca_config(num_labels=3, return_dict=False)).eval()  # as from_pretrained(..., that)
    as_tuple.load_state_dict(model.state_dict())
    expected = model(images, output_hidden_states=[0, -1]).to_tuple()
    for outputs in (as_tuple(images, output_hidden_states=[0, -1]),
                    model(images, output_hidden_states=[0, -1], return_dict=False)):
        assert isinstance(outputs, tuple) and len(outputs) == len(expected)
        for got, want in zip(outputs, expected):
            torch.testing.assert_close(got, want, atol=0, rtol=0)
    if head is VecaModel:
        torch.testing.assert_close(as_tuple.get_intermediate_layers(images, n=2),
                                   model.get_intermediate_layers(images, n=2))
