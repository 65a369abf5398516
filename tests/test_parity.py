"""Parity with the authors' code: checkpoints in their formats (tests/fixtures/parity, written by their code on random
weights, with the outputs their code computes) convert with our CLIs and reproduce those outputs, in this package
and through hub code in a process that cannot import it. See tests/fixtures/parity/README.md."""

import ast
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from corevision_hf import LookWhereModel, VecaModel
from corevision_hf.convert import lookwhere as convert_lookwhere
from corevision_hf.convert import veca as convert_veca
from corevision_hf.lookwhere.modeling_lookwhere import inverse_distance_fill

from conftest import load_without_package


FIXTURES = Path(__file__).parent / "fixtures" / "parity"
TOLERANCE = 1e-4  # max abs difference allowed; float32 on both sides, measured ~1e-6


def fixture_index(family: str) -> tuple[dict, dict]:
    path = FIXTURES / family / "reference_outputs.safetensors"
    with safe_open(path, "pt") as f:
        index = json.loads(f.metadata()["fixtures"])
    return index, load_file(path)


VECA_INDEX, VECA_OUTPUTS = fixture_index("veca")
LOOKWHERE_INDEX, LOOKWHERE_OUTPUTS = fixture_index("lookwhere")
FILL_INDEX, FILL_OUTPUTS = fixture_index("lookwhere_fill")  # the fill alone at full grid size


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


def veca_outputs(model, name: str) -> dict[str, torch.Tensor]:
    """Our outputs named as the fixture's keys: {name}/{H}x{W}/K{K}/{cores,patches,pooled,core_coordinates}."""
    outputs = {}
    for size in VECA_INDEX[name]["sizes"]:
        pixel_values = VECA_OUTPUTS[f"{name}/{size}/pixel_values"]
        for budget in VECA_INDEX[name]["budgets"]:
            with torch.no_grad():
                out = model(pixel_values, num_cores=budget)
            key = f"{name}/{size}/K{budget}"
            outputs[f"{key}/cores"] = out.last_hidden_state[:, :budget]
            outputs[f"{key}/patches"] = out.last_hidden_state[:, budget:]
            outputs[f"{key}/pooled"] = out.pooler_output
            outputs[f"{key}/core_coordinates"] = out.core_coordinates
    return outputs


def lookwhere_outputs(model, name: str) -> dict[str, torch.Tensor]:
    """Our outputs named as the fixture's keys; selected indices as sets (sorted), the reference's are by score."""
    outputs = {}
    for size, budgets in LOOKWHERE_INDEX[name]["sizes"].items():
        images = LOOKWHERE_OUTPUTS[f"{name}/{size}/images_uint8"]
        pixel_values = (images.float() / 255 - 0.5) / 0.25
        num_prefix = 1 + model.config.num_register_tokens
        grid = (pixel_values.shape[2] // model.config.patch_size,) * 2
        with torch.no_grad():
            prefix_tokens, _ = model.selector(pixel_values, grid)
        outputs[f"{name}/{size}/prefix_tokens"] = prefix_tokens
        for k in budgets:
            with torch.no_grad():
                out = model(pixel_values, k=k)
            outputs[f"{name}/{size}/selector_map"] = out.selector_map
            outputs[f"{name}/{size}/k{k}/selected_indices"] = out.selected_indices
            outputs[f"{name}/{size}/k{k}/cls"] = out.pooler_output
            outputs[f"{name}/{size}/k{k}/dense"] = out.last_hidden_state[:, num_prefix:]
    return outputs


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


def full_size_fill(setting: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Our fill of a lookwhere_fill fixture setting, called as the model calls it (kept cells in row-major order, their
    score rank as the tie-break): (B, N, D), and its tie cells (B, N) bool: cells not kept whose 5th and 6th nearest
    kept cells are equidistant, where the authors' unstable argsort decides which of them counts."""
    indices, values = FILL_OUTPUTS[f"{setting}/indices"], FILL_OUTPUTS[f"{setting}/values"]  # by descending score
    height, width = FILL_INDEX[setting]["grid"]
    num_neighbors = LookWhereModel.config_class().num_fill_neighbors
    row_major, rank = indices.sort(dim=-1)
    ours = inverse_distance_fill(values.gather(1, rank[..., None].expand_as(values)), row_major, (height, width),
                                 num_neighbors, rank)
    cells = torch.arange(height * width)
    rows, cols = (cells // width)[:, None], (cells % width)[:, None]
    squared = (rows - indices[:, None] // width) ** 2 + (cols - indices[:, None] % width) ** 2  # (B, N, k)
    nearest = squared.topk(num_neighbors + 1, dim=-1, largest=False).values  # (B, N, 6) squared distances
    kept = torch.zeros(ours.shape[:2], dtype=torch.bool).scatter(1, indices, True)
    return ours, (nearest[..., -2] == nearest[..., -1]) & ~kept


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


def test_the_parity_benchmark_reads_the_fixtures_as_these_tests_do():
    """benchmarks/parity.py stands alone with copies of the fixture reading above, each marked `# Same as
    tests/test_parity.py:<name>`: every copy equals its source here."""
    def definitions(path: Path) -> dict[str, str]:
        text = path.read_text()
        return {node.name: ast.get_source_segment(text, node) for node in ast.parse(text).body
                if isinstance(node, ast.FunctionDef)}

    benchmark = Path(__file__).resolve().parents[1] / "benchmarks" / "parity.py"
    copied = re.findall(r"^# Same as tests/test_parity.py:(\w+)", benchmark.read_text(), flags=re.M)
    ours, theirs = definitions(Path(__file__)), definitions(benchmark)
    assert sorted(copied) == ["fixture_index", "full_size_fill", "lookwhere_outputs", "veca_outputs"]
    for name in copied:
        assert theirs[name] == ours[name], f"benchmarks/parity.py:{name} drifted from tests/test_parity.py; change both"
