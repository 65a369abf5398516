"""The CPU opt-in (`optimize_for_cpu`): same outputs as the default path, weights repacked when they change, nothing
of it saved; and the default model keeps one copy of its weights."""

import copy
import json
import pickle

import pytest
import torch
from conftest import tiny_lookwhere_config, tiny_veca_config
from transformers import AutoModel

from corevision_hf import LookWhereModel, VecaModel, optimize_for_cpu, restore_default_linear
from corevision_hf.cpu import PrepackedLinear, onednn_prepacking_available

needs_onednn = pytest.mark.skipif(not onednn_prepacking_available(), reason="this torch build has no oneDNN prepacked linear")


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(0))


def test_default_models_hold_plain_linear_layers_and_no_packed_copies(images):
    for model, call in ((VecaModel(tiny_veca_config()).eval(), {}), (LookWhereModel(tiny_lookwhere_config()).eval(), {"k": 20})):
        with torch.no_grad():
            model(images, **call)
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert linears and all(type(m) is torch.nn.Linear for m in linears)
        assert not any("_packed" in vars(m) for m in linears)


@needs_onednn
def test_veca_prepacked_matches_default_and_follows_weight_changes(images):
    torch.manual_seed(0)
    model = VecaModel(tiny_veca_config(chunk_size_feed_forward=4, output_projection_size=48)).eval()
    with torch.no_grad():
        default = model(images, num_cores=3).last_hidden_state  # MLP over 4-token chunks: strided inputs
    optimize_for_cpu(model)
    with torch.no_grad():
        packed = model(images, num_cores=3).last_hidden_state
    linears = [m for m in model.modules() if isinstance(m, PrepackedLinear)]
    layers = model.config.num_hidden_layers  # q k v o fc1 fc2 per block, the output projection, the coordinate heads
    assert len(linears) == 6 * layers + 1 + (layers - 1) and all(m._packed is not None for m in linears)
    torch.testing.assert_close(packed, default, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # an updated weight is repacked, never served stale
        model.encoder.layers[0].mlp.fc1.weight.mul_(2)
        updated = model(images, num_cores=3).last_hidden_state
    assert not torch.allclose(updated, default, atol=1e-3)
    with torch.enable_grad():  # parameters that need gradients take F.linear
        torch.testing.assert_close(updated, model(images, num_cores=3).last_hidden_state, atol=1e-5, rtol=1e-5)
    fc2 = model.encoder.layers[1].mlp.fc2  # a replaced parameter is repacked too
    fc2.weight = torch.nn.Parameter(fc2.weight.detach() * 3)
    with torch.no_grad():
        replaced = model(images, num_cores=3).last_hidden_state
    with torch.enable_grad():
        torch.testing.assert_close(replaced, model(images, num_cores=3).last_hidden_state, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # copies and pickles drop the packed weights (a oneDNN tensor cannot be copied)
        torch.testing.assert_close(copy.deepcopy(model)(images, num_cores=3).last_hidden_state, replaced)
        torch.testing.assert_close(pickle.loads(pickle.dumps(model))(images, num_cores=3).last_hidden_state, replaced)
    restore_default_linear(model)
    assert all(type(m) is torch.nn.Linear and "_packed" not in vars(m) for m in linears)
    with torch.no_grad():
        torch.testing.assert_close(model(images, num_cores=3).last_hidden_state, replaced, atol=1e-5, rtol=1e-5)


@needs_onednn
def test_lookwhere_prepacked_matches_default(images):
    torch.manual_seed(0)
    model = LookWhereModel(tiny_lookwhere_config()).eval()
    with torch.no_grad():
        default = model(images, k=20)
        optimize_for_cpu(model)
        packed = model(images, k=20)
    assert all(m._packed is not None for m in model.modules() if isinstance(m, PrepackedLinear))
    torch.testing.assert_close(packed.selected_indices, default.selected_indices)
    torch.testing.assert_close(packed.last_hidden_state, default.last_hidden_state, atol=1e-5, rtol=1e-5)


@needs_onednn
def test_optimized_model_saves_what_the_default_saves(tmp_path, images):
    model = VecaModel(tiny_veca_config()).eval()
    model.save_pretrained(tmp_path / "default")
    optimize_for_cpu(model)
    with torch.no_grad():
        expected = model(images).last_hidden_state
    model.save_pretrained(tmp_path / "optimized")
    config = json.loads((tmp_path / "optimized" / "config.json").read_text())
    assert "prepack_cpu_weights" not in config
    assert (tmp_path / "default" / "model.safetensors").read_bytes() == (tmp_path / "optimized" / "model.safetensors").read_bytes()
    reloaded = AutoModel.from_pretrained(tmp_path / "optimized").eval()
    assert all(type(m) is torch.nn.Linear for m in reloaded.modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(images).last_hidden_state, expected, atol=1e-5, rtol=1e-5)


def test_cpu_opt_in_chunks_veca_mlp_and_resizes_lookwhere_positions_by_matrices(images):
    """The hub models run VECA's MLP at once and resize LookWhere's position table with F.interpolate; the opt-in
    chunks the MLP (1024 tokens, here 4) and resizes by matrix products, with the same outputs, and restore undoes it."""
    from corevision_hf.cpu import CPU_MLP_CHUNK, MatrixPositionResize, resize_position_table_by_matrices
    from corevision_hf.lookwhere.modeling_lookwhere import resize_position_table

    torch.manual_seed(0)
    veca = VecaModel(tiny_veca_config()).eval()
    assert {layer.chunk_size_feed_forward for layer in veca.encoder.layers} == {0}
    with torch.no_grad():
        default = veca(images).last_hidden_state
        optimize_for_cpu(veca)
        assert {layer.chunk_size_feed_forward for layer in veca.encoder.layers} == {CPU_MLP_CHUNK}
        for layer in veca.encoder.layers:
            layer.chunk_size_feed_forward = 4  # several chunks of this tiny sequence, the last one shorter
            layer._chunked_for_cpu = True
        torch.testing.assert_close(veca(images).last_hidden_state, default, atol=1e-5, rtol=1e-5)
    restore_default_linear(veca)
    assert {layer.chunk_size_feed_forward for layer in veca.encoder.layers} == {0}

    table = torch.randn(1, 8 * 8, 16, generator=torch.Generator().manual_seed(1))
    for grid, antialias in (((5, 11), False), ((12, 3), True)):
        torch.testing.assert_close(resize_position_table_by_matrices(table, grid, antialias),
                                   resize_position_table(table, grid, antialias), atol=2e-6, rtol=0)
    lookwhere = LookWhereModel(tiny_lookwhere_config()).eval()
    with torch.no_grad():
        default = lookwhere(images, k=20).last_hidden_state
        optimize_for_cpu(lookwhere)
        assert isinstance(lookwhere.extractor.embeddings, MatrixPositionResize)
        torch.testing.assert_close(lookwhere(images, k=20).last_hidden_state, default, atol=1e-5, rtol=1e-5)
    restore_default_linear(lookwhere)
    assert not isinstance(lookwhere.extractor.embeddings, MatrixPositionResize)
