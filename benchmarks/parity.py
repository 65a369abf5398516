"""Max abs difference between our converted models and the authors' own outputs, per model and output.

    python benchmarks/parity.py                                      # writes outputs/benchmarks/parity.json
    python benchmarks/parity.py --out benchmarks/results/parity.json # the committed file

Converts every checkpoint in tests/fixtures/parity (written by the authors' code on random weights) with the CLIs,
runs each at every size and budget the fixtures hold, and prints one row per model and output kind; then LookWhere's
dense fill alone at full grid size (tests/fixtures/parity/lookwhere_fill): where the authors' result is well defined,
against their function with a stable sort, and its tie cells. Also written to --out as JSON.
tests/test_parity.py asserts the same comparisons (<= 1e-4).
"""

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from corevision_hf import LookWhereModel, VecaModel
from corevision_hf.convert import lookwhere as convert_lookwhere
from corevision_hf.convert import veca as convert_veca
from corevision_hf.lookwhere.modeling_lookwhere import inverse_distance_fill

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "parity"
TOLERANCE = 1e-4  # as tests/test_parity.py: what counts as a differing fill cell


def fixture_index(family: str) -> tuple[dict, dict]:
    path = FIXTURES / family / "reference_outputs.safetensors"
    with safe_open(path, "pt") as f:
        index = json.loads(f.metadata()["fixtures"])
    return index, load_file(path)


VECA_INDEX, VECA_OUTPUTS = fixture_index("veca")
LOOKWHERE_INDEX, LOOKWHERE_OUTPUTS = fixture_index("lookwhere")
FILL_INDEX, FILL_OUTPUTS = fixture_index("lookwhere_fill")


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


def differences(ours: dict, reference: dict) -> dict:
    """Output kind -> max abs difference over every size and budget (selected sets: number of differing sets)."""
    worst = defaultdict(float)
    for key, value in ours.items():
        kind = key.rsplit("/", 1)[1]
        if kind == "selected_indices":
            differing = int(not torch.equal(value, reference[key].sort(dim=-1).values))
            worst["selected sets differing"] = int(worst["selected sets differing"]) + differing
        else:
            worst[kind] = max(worst[kind], (value - reference[key]).abs().max().item())
    return dict(worst)


def fill_differences() -> dict:
    """The fill alone on 37x37 and 74x74 grids: max abs difference to the authors' `upsample_grid_nn` at cells whose
    5 nearest kept cells are unique and at tie cells, to the same function with a stable sort everywhere, how many
    cells are tie cells and at how many of them the released function (unstable argsort) picks other neighbours."""
    worst, totals = defaultdict(float), [0, 0, 0]  # tie cells, cells, tie cells where the released function differs
    for setting in FILL_INDEX:
        ours, ties = full_size_fill(setting)
        difference = (ours - FILL_OUTPUTS[f"{setting}/expected"]).abs()
        stable = (ours - FILL_OUTPUTS[f"{setting}/expected_stable"]).abs()
        for kind, value in [("dense where the 5 nearest are unique", difference[~ties].max()),
                            ("dense vs a stable sort", stable.max()), ("dense at tie cells", difference[ties].max())]:
            worst[kind] = max(worst[kind], value.item())
        differing = ((difference.amax(dim=-1) > TOLERANCE) & ties).sum().item()
        counts = [ties.sum().item(), ties.numel(), differing]
        worst[f"tie cells {setting}"] = f"{counts[0]} of {counts[1]} ({counts[0] / counts[1]:.1%}); {differing} differ"
        totals = [total + count for total, count in zip(totals, counts)]
    worst["tie cells, all settings"] = (
        f"{totals[0]} of {totals[1]} ({totals[0] / totals[1]:.1%}); {totals[2]} differ ({totals[2] / totals[1]:.1%})"
    )
    return dict(worst)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmarks" / "parity.json",
                        help="the JSON written (the committed one: benchmarks/results/parity.json)")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in VECA_INDEX:
            out = Path(folder) / f"veca-{name}"
            convert_veca.main([str(FIXTURES / "veca" / f"{name}.pt"), str(out)])
            results[f"veca/{name}"] = differences(veca_outputs(VecaModel.from_pretrained(out).eval(), name), VECA_OUTPUTS)
        for name in LOOKWHERE_INDEX:
            out = Path(folder) / f"lookwhere-{name}"
            convert_lookwhere.main([str(FIXTURES / "lookwhere" / f"lookwhere_{name}.pt"), str(out)])
            model = LookWhereModel.from_pretrained(out).eval()
            results[f"lookwhere/{name}"] = differences(lookwhere_outputs(model, name), LOOKWHERE_OUTPUTS)
    results["lookwhere/fill at full size"] = fill_differences()
    print("\n| model | output | max abs difference |\n|---|---|---|")
    for model, kinds in results.items():
        for kind, value in kinds.items():
            print(f"| {model} | {kind} | {value:.1e} |" if isinstance(value, float) else f"| {model} | {kind} | {value} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
