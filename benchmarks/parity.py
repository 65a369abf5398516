"""Max abs difference between our converted models and the authors' own outputs, per model and output.

    python benchmarks/parity.py

Converts every checkpoint in tests/fixtures/parity (written by the authors' code on random weights) with the CLIs,
runs each at every size and budget the fixtures hold, and prints one row per model and output kind; then LookWhere's
dense fill alone at full grid size (tests/fixtures/parity/lookwhere_fill): where the authors' result is well defined,
against their function with a stable sort, and its tie cells. Also written to benchmarks/results/parity.json.
tests/test_parity.py asserts the same comparisons (<= 1e-4).
"""

import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_parity import (  # noqa: E402  (the test module owns the fixture reading)
    FILL_INDEX,
    FILL_OUTPUTS,
    FIXTURES,
    LOOKWHERE_INDEX,
    LOOKWHERE_OUTPUTS,
    TOLERANCE,
    VECA_INDEX,
    VECA_OUTPUTS,
    full_size_fill,
    lookwhere_outputs,
    veca_outputs,
)

from corevision_hf import LookWhereModel, VecaModel  # noqa: E402
from corevision_hf.convert import lookwhere as convert_lookwhere  # noqa: E402
from corevision_hf.convert import veca as convert_veca  # noqa: E402


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


def main() -> None:
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
    path = ROOT / "benchmarks" / "results" / "parity.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
