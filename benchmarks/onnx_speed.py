"""onnxruntime (CPU) against our PyTorch path, for VECA-B and LookWhere-B exported by `corevision_hf.export`, and the
elastic graph (the budget an input) against the fixed graph of each budget.

Random-init base-size models (speed does not depend on the weights), fp32, batch 1, one process: each model is
exported once per budget with dynamic height and width, and once elastic; then at each budget and resolution the
PyTorch model (with the CPU opt-in `optimize_for_cpu`, inference mode), the fixed graph and the elastic graph are warmed
up and timed in alternation; medians and their ratios are reported. The machine may be shared with other jobs:
absolute seconds drift, the same-run ratios carry over.

    python -m benchmarks.onnx_speed    # VECA-B C=64, 16 at 512 / 1024 px, LookWhere-B k_ratio 0.1, 0.5 at 518 / 1036 px
"""

import argparse
import json
import os
import statistics
import tempfile

import onnxruntime
import torch

from benchmarks.common import alternate
from corevision_hf.cli import HelpFormatter
from corevision_hf.measure import threads_to_use
from corevision_hf import LookWhereConfig, LookWhereModel, VecaConfig, VecaModel, optimize_for_cpu
from corevision_hf.export import BUDGET_INPUTS, budget_for, check_onnx, export_onnx


def build(name: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "veca":
        return VecaModel(VecaConfig.from_preset("base", **overrides)).eval()
    return LookWhereModel(LookWhereConfig.from_preset("base", **overrides)).eval()


# Per model: the resolutions, and the budgets (the first the config's default).
PLAN = {
    "veca": (((512, 512), (1024, 1024)), [{"num_cores": 64}, {"num_cores": 16}]),
    "lookwhere": (((518, 518), (1036, 1036)), [{"k_ratio": 0.1}, {"k_ratio": 0.5}]),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--runs", type=int, nargs=2, default=[5, 3], help="timed runs at the small / large size")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--output", default=os.path.join("outputs", "benchmarks", "onnx_cpu.json"))
    return parser.parse_args()


def export_graphs(name: str, model, folder: str, sizes, budgets: list[dict]) -> tuple[str, list[str], list[dict]]:
    """(the elastic graph, the fixed graph of each budget, each budget's {graph: max abs diff at the small size}):
    `model` exported to `folder` as `python -m corevision_hf.export` would, and checked against itself."""
    # As `python -m corevision_hf.export` loads it: VECA's token chunks would freeze the sequence length
    # into the graph, so the exported copy runs its MLP unchunked; the PyTorch row keeps the default.
    export_model = build(name, **({"chunk_size_feed_forward": 0} if name == "veca" else {}))
    export_model.load_state_dict(model.state_dict())
    elastic = export_onnx(export_model, os.path.join(folder, f"{name}_elastic.onnx"),
                          budget_for(model.config, elastic=""))
    fixed = [export_onnx(export_model, os.path.join(folder, f"{name}_{i}.onnx"), budget)
             for i, budget in enumerate(budgets)]
    checks = [{graph: check_onnx(model, path, budget, [(1, 3, *sizes[0])])[0]["max_abs_diff"]
               for graph, path in (("fixed", fixed_path), ("elastic", elastic))}
              for budget, fixed_path in zip(budgets, fixed)]
    return elastic, fixed, checks


def time_budget(args, name: str, model, budget: dict, session, elastic_session, sizes, check: dict) -> list[dict]:
    """The rows of one budget: at each size the PyTorch model, the fixed graph and the elastic graph timed in
    alternation (medians and their ratios), each row printed as it comes."""
    rows = []
    ((budget_name, value),) = budget.items()
    budget_feed = {budget_name: torch.tensor(value, dtype=BUDGET_INPUTS[budget_name]).numpy()}
    for (height, width), runs in zip(sizes, args.runs):
        pixel_values = torch.randn(1, 3, height, width)
        feed = {"pixel_values": pixel_values.numpy()}
        times = alternate(
            {
                "pytorch": lambda: model(pixel_values, **budget),
                "onnxruntime": lambda: session.run(None, feed),
                "elastic": lambda: elastic_session.run(None, {**feed, **budget_feed}),
            },
            "cpu", args.warmup, runs,
        )
        row = {
            "model": f"{name} {budget}",
            "resolution": f"{height}x{width}",
            "pytorch_s": statistics.median(times["pytorch"]),
            "onnxruntime_s": statistics.median(times["onnxruntime"]),
            "elastic_s": statistics.median(times["elastic"]),
            "max_abs_diff_at_small_size": check["fixed"],
            "elastic_max_abs_diff_at_small_size": check["elastic"],
            "runs": runs,
        }
        row["pytorch_over_onnxruntime"] = row["pytorch_s"] / row["onnxruntime_s"]
        row["elastic_over_fixed"] = row["elastic_s"] / row["onnxruntime_s"]
        rows.append(row)
        print(
            f"{row['model']:<28} {row['resolution']:>9}  PyTorch {row['pytorch_s']:.3f} s  "
            f"onnxruntime {row['onnxruntime_s']:.3f} s  elastic {row['elastic_s']:.3f} s  "
            f"PyTorch / ORT {row['pytorch_over_onnxruntime']:.2f}x  elastic / fixed "
            f"{row['elastic_over_fixed']:.2f}x  (max abs diff {check['fixed']:.1e}, elastic "
            f"{check['elastic']:.1e})",
            flush=True,
        )
    return rows


def main() -> None:
    args = parse_args()
    torch.set_num_threads(threads_to_use(None))  # OMP_NUM_THREADS, else every core

    rows = []
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads_to_use(None)
    with tempfile.TemporaryDirectory() as folder:
        for name, (sizes, budgets) in PLAN.items():
            model = build(name)
            elastic, fixed, checks = export_graphs(name, model, folder, sizes, budgets)
            optimize_for_cpu(model)
            elastic_session = onnxruntime.InferenceSession(elastic, options, providers=["CPUExecutionProvider"])
            for budget, fixed_path, check in zip(budgets, fixed, checks):
                session = onnxruntime.InferenceSession(fixed_path, options, providers=["CPUExecutionProvider"])
                rows.extend(time_budget(args, name, model, budget, session, elastic_session, sizes, check))
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(
            {
                "threads": threads_to_use(None),
                "torch": torch.__version__,
                "onnxruntime": onnxruntime.__version__,
                "note": "one process, runs alternated (PyTorch, fixed graph, elastic graph), medians; the machine may "
                        "have been shared",
                "rows": rows,
            },
            f,
            indent=2,
        )
    print(f"wrote {os.path.relpath(args.output)}")


if __name__ == "__main__":
    main()
