"""Parity with the authors' code: checkpoints in their formats (tests/fixtures/parity, written by their code on random
weights, with the outputs their code computes) convert with our CLIs and reproduce those outputs, in this package
and through hub code in a process that cannot import it. See tests/fixtures/parity/README.md. The fixture reading and
our outputs under the fixtures' keys are benchmarks/parity.py's, which reports the same comparisons."""

import json
from pathlib import Path

import pytest
import torch

from benchmarks.parity import (FILL_INDEX, FILL_OUTPUTS, FIXTURES, LOOKWHERE_INDEX, LOOKWHERE_OUTPUTS, VECA_INDEX,
                               VECA_OUTPUTS, full_size_fill, lookwhere_outputs, veca_outputs)
from corevision_hf import LookWhereModel, VecaModel
from corevision_hf.convert import lookwhere as convert_lookwhere
from corevision_hf.convert import veca as convert_veca

from conftest import load_without_package


TOLERANCE = 1e-4  # max abs difference allowed; float32 on both sides, measured ~1e-6


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, Path]:
    """Every fixture checkpoint converted with the command-line entry points: {name: hub folder}."""
    root = tmp_path_factory.mktemp("parity")
    folders = {}
    for name in VECA_INDEX:
        folders[name] = root / f"veca-{name}"
        convert_veca.main([str(FIXTURES / "veca" / f"{name}.pt"), str(folders[name])])
    for name in LOOKWHERE_INDEX:
        folders[name] = root / f"lookwhere-{name}"
        convert_lookwhere.main([str(FIXTURES / "lookwhere" / f"lookwhere_{name}.pt"), str(folders[name])])
    return folders


def assert_matches_reference(ours: dict, reference: dict) -> None:
    assert ours, "nothing compared"
    for key, value in ours.items():
        expected = reference[key]
        if key.endswith("selected_indices"):  # the same set of kept patches
            assert torch.equal(value, expected.sort(dim=-1).values), key
            continue
        assert value.shape == expected.shape, key
        difference = (value.float() - expected).abs().max().item()
        assert difference <= TOLERANCE, f"{key}: max abs difference {difference:.2e}"


@pytest.mark.parametrize("name", sorted(VECA_INDEX))
def test_veca_matches_reference(converted, name):
    model = VecaModel.from_pretrained(converted[name]).eval()
    assert_matches_reference(veca_outputs(model, name), VECA_OUTPUTS)


@pytest.mark.parametrize("name", sorted(LOOKWHERE_INDEX))
def test_lookwhere_matches_reference(converted, name):
    model = LookWhereModel.from_pretrained(converted[name]).eval()
    assert_matches_reference(lookwhere_outputs(model, name), LOOKWHERE_OUTPUTS)


def test_converted_configs_record_the_checkpoints_settings(converted):
    tiny = VecaModel.config_class.from_pretrained(converted["tiny"])
    assert (tiny.num_attention_heads, tiny.num_hidden_layers, tiny.num_cores, tiny.output_projection_size) == (2, 2, 16, 96)
    assert (tiny.rope_zero_fraction, tiny.rope_zero_from, tiny.patch_embedding_norm) == (0.125, "low", False)
    assert tiny.training_budgets == [8, 16] and tiny.layer_norm_eps == 1e-5
    variant = VecaModel.config_class.from_pretrained(converted["tiny_variant"])
    assert (variant.num_attention_heads, variant.num_hidden_layers, variant.output_projection_size) == (4, 3, None)
    assert (variant.rope_zero_fraction, variant.rope_zero_from, variant.patch_embedding_norm) == (0.25, "high", True)
    assert variant.training_budgets == [8, 16, 24] and variant.training_budget_weights == [1.0, 1.0, 2.0]
    dinov2 = LookWhereModel.config_class.from_pretrained(converted["dinov2"])
    assert (dinov2.num_register_tokens, dinov2.use_swiglu_ffn, dinov2.selector_antialias) == (4, False, False)
    franca = LookWhereModel.config_class.from_pretrained(converted["franca"])
    assert (franca.num_register_tokens, franca.use_swiglu_ffn, franca.intermediate_size) == (0, True, 192)


REMOTE_LOADER = """
import json
import torch
from transformers import AutoModel

folders, inputs_path, outputs_path = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
inputs = torch.load(inputs_path)
outputs = {}
for name, folder in folders.items():
    model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    for key, (pixel_values, budget) in inputs[name].items():
        with torch.no_grad():
            out = model(pixel_values, **budget)
        if "num_cores" in budget:
            outputs[key] = (out.last_hidden_state, out.pooler_output, out.core_coordinates)
        else:
            outputs[key] = (out.selector_map, out.selected_indices, out.pooler_output, out.last_hidden_state)
torch.save(outputs, outputs_path)
"""


@pytest.mark.slow
def test_hub_code_without_the_package_matches_reference(converted, tmp_path):
    """Each converted folder, loaded with trust_remote_code=True where `import corevision_hf` fails, reproduces the
    authors' outputs (one budget and size per model, the largest budget at the non-square size for VECA)."""
    inputs = {}
    for name, info in VECA_INDEX.items():
        size, budget = info["sizes"][-1], info["budgets"][-1]
        inputs[name] = {f"{name}/{size}/K{budget}": (VECA_OUTPUTS[f"{name}/{size}/pixel_values"], {"num_cores": budget})}
    for name, info in LOOKWHERE_INDEX.items():
        size, budgets = next(iter(info["sizes"].items()))
        images = LOOKWHERE_OUTPUTS[f"{name}/{size}/images_uint8"]
        inputs[name] = {f"{name}/{size}/k{budgets[0]}": ((images.float() / 255 - 0.5) / 0.25, {"k": budgets[0]})}
    folders = json.dumps({name: str(folder) for name, folder in converted.items()})
    results = load_without_package(tmp_path, REMOTE_LOADER, folders, inputs)

    ours = {}
    for key, result in results.items():
        name = key.split("/")[0]
        if name in VECA_INDEX:
            hidden, pooled, coordinates = result
            budget = int(key.rsplit("K", 1)[1])
            ours.update({f"{key}/cores": hidden[:, :budget], f"{key}/patches": hidden[:, budget:],
                         f"{key}/pooled": pooled, f"{key}/core_coordinates": coordinates})
        else:
            selector_map, indices, cls, hidden = result
            num_cells = LOOKWHERE_OUTPUTS[f"{key}/dense"].shape[1]
            ours.update({f"{key.rsplit('/', 1)[0]}/selector_map": selector_map, f"{key}/selected_indices": indices,
                         f"{key}/cls": cls, f"{key}/dense": hidden[:, -num_cells:]})
    assert len(ours) == 4 * len(VECA_INDEX) + 4 * len(LOOKWHERE_INDEX)
    assert_matches_reference(ours, {**VECA_OUTPUTS, **LOOKWHERE_OUTPUTS})


@pytest.mark.parametrize("setting", sorted(FILL_INDEX))
def test_full_size_fill_matches_reference(setting):
    """On 37x37 and 74x74 grids (518 and 1036 px) with k from 50 to 20 % of the grid, the fill computes what the
    authors' `upsample_grid_nn` computes wherever a cell's 5 nearest kept cells are unique, and what it computes
    with a stable sort everywhere: an equidistant tie goes to the higher-scored patch."""
    ours, ties = full_size_fill(setting)
    assert ties.sum(dim=-1).tolist() == FILL_INDEX[setting]["tie_cells"]  # 10-28 % of the grid
    expected = FILL_OUTPUTS[f"{setting}/expected"]
    torch.testing.assert_close(ours[~ties], expected[~ties], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(ours, FILL_OUTPUTS[f"{setting}/expected_stable"], atol=TOLERANCE, rtol=0)

