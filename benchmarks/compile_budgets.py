"""torch.compile of a VECA training step over many core budgets and image sizes: graphs compiled, and step times.

    python -m benchmarks.compile_budgets                       # VECA-S, inductor (long on a CPU: compiles dominate)
    python -m benchmarks.compile_budgets --backend aot_eager   # the graph counts alone, quickly

One forward and backward of VECA-S (batch --batch-size, random images) for every pair of --budgets x --sizes, in one
process, as the training loop runs them (budgets and sizes change from step to step), under three settings:
eager; torch.compile with `dynamic=True` (budgets and sizes symbols from the first step: what training.loop asks for);
torch.compile with torch's default (a value that changes is made a symbol at its first recompile). Reports per setting
the graphs compiled (torch._dynamo's unique graphs) and recompiles, the seconds of the first pass over the grid (the
compiles included) and the median seconds of a step in a second pass. Writes outputs/benchmarks/compile_budgets.json.
"""

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from corevision_hf.cli import HelpFormatter
from corevision_hf import VecaConfig, VecaModel

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 24, 32, 40, 48, 56, 64])
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 160, 192, 224], help="square image sizes (px)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmarks" / "compile_budgets.json")
    return parser.parse_args(argv)


def step(model, pixel_values: torch.Tensor, num_cores: int) -> None:
    model(pixel_values, num_cores=num_cores).last_hidden_state.square().mean().backward()


def run(model, args, images: dict) -> dict:
    """Two passes over the grid: the first (with its compiles) timed whole, the second step by step."""
    grid = [(size, budget) for size in args.sizes for budget in args.budgets]
    start = time.perf_counter()
    for size, budget in grid:
        step(model, images[size], budget)
    first_pass = time.perf_counter() - start
    times = []
    for size, budget in grid:
        start = time.perf_counter()
        step(model, images[size], budget)
        times.append(time.perf_counter() - start)
    stats = torch._dynamo.utils.counters["stats"]
    return {"graphs": stats["unique_graphs"], "recompiles": max(0, stats["unique_graphs"] - 1),
            "first_pass_s": round(first_pass, 2), "median_step_s": round(statistics.median(times), 4)}


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.manual_seed(0)
    config = VecaConfig.from_preset(args.preset, num_cores=max(args.budgets))
    images = {size: torch.randn(args.batch_size, 3, size, size) for size in args.sizes}
    # enough room for one graph per pair, so that the default's count is not capped by torch's limit
    torch._dynamo.config.recompile_limit = len(args.sizes) * len(args.budgets) + 2
    results = {}
    for name, dynamic in [("eager", None), ("compiled, dynamic=True", True), ("compiled, torch's default", None)]:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        model = VecaModel(config).train()
        if name != "eager":
            model = torch.compile(model, backend=args.backend, dynamic=dynamic)
        results[name] = run(model, args, images)
        print(f"{name:28s} {results[name]}", flush=True)
    record = {"backend": args.backend, "preset": args.preset, "budgets": args.budgets, "sizes": args.sizes,
              "batch_size": args.batch_size, "machine": platform.processor() or platform.machine(),
              "threads": torch.get_num_threads(), "torch": torch.__version__, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
