"""onnxruntime (CPU) against our PyTorch path, for VECA-B and LookWhere-B exported by `corevision_hf.export`.

Random-init base-size models (speed does not depend on the weights), fp32, batch 1, one process: each model is
exported once with dynamic height and width, then the ONNX graph and the PyTorch model (with the CPU opt-in
`optimize_for_cpu`, inference mode) are warmed up and timed in alternation at each resolution; medians and their ratio are
reported. The machine may be shared with other jobs: absolute seconds drift, the same-run ratios carry over.

    python benchmarks/onnx_speed.py            # VECA-B C=64 at 512 / 1024 px, LookWhere-B k_ratio 0.1 at 518 / 1036 px
"""

import argparse
import json
import os
import statistics
import tempfile

import onnxruntime
import torch
from common import alternate

from corevision_hf import LookWhereConfig, LookWhereModel, VecaConfig, VecaModel, optimize_for_cpu
from corevision_hf.export import budget_for, check_onnx, export_onnx


def build(name: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "veca":
        return VecaModel(VecaConfig.from_preset("base", **overrides)).eval()
    return LookWhereModel(LookWhereConfig.from_preset("base", **overrides)).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, nargs=2, default=[5, 3], help="timed runs at the small / large size")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results", "onnx_cpu.json"))
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count())

    rows = []
    plan = {"veca": ((512, 512), (1024, 1024)), "lookwhere": ((518, 518), (1036, 1036))}
    with tempfile.TemporaryDirectory() as folder:
        for name, sizes in plan.items():
            model = build(name)
            budget = budget_for(model.config)
            # As `python -m corevision_hf.export` loads it: VECA's token chunks would freeze the sequence length
            # into the graph, so the exported copy runs its MLP unchunked; the PyTorch row keeps the default.
            export_model = build(name, **({"chunk_size_feed_forward": 0} if name == "veca" else {}))
            export_model.load_state_dict(model.state_dict())
            path = export_onnx(export_model, os.path.join(folder, f"{name}.onnx"), budget)
            check = check_onnx(model, path, budget, [(1, 3, *sizes[0])])[0]["max_abs_diff"]
            optimize_for_cpu(model)
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = os.cpu_count()
            session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            for (height, width), runs in zip(sizes, args.runs):
                pixel_values = torch.randn(1, 3, height, width)
                feed = {"pixel_values": pixel_values.numpy()}
                times = alternate(
                    {"pytorch": lambda: model(pixel_values, **budget), "onnxruntime": lambda: session.run(None, feed)},
                    "cpu", args.warmup, runs,
                )
                row = {
                    "model": f"{name} {budget}",
                    "resolution": f"{height}x{width}",
                    "pytorch_s": statistics.median(times["pytorch"]),
                    "onnxruntime_s": statistics.median(times["onnxruntime"]),
                    "max_abs_diff_at_small_size": check,
                    "runs": runs,
                }
                row["pytorch_over_onnxruntime"] = row["pytorch_s"] / row["onnxruntime_s"]
                rows.append(row)
                print(
                    f"{row['model']:<28} {row['resolution']:>9}  PyTorch {row['pytorch_s']:.3f} s  "
                    f"onnxruntime {row['onnxruntime_s']:.3f} s  PyTorch / ORT {row['pytorch_over_onnxruntime']:.2f}x  "
                    f"(max abs diff {check:.1e})",
                    flush=True,
                )
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(
            {
                "threads": os.cpu_count(),
                "torch": torch.__version__,
                "onnxruntime": onnxruntime.__version__,
                "note": "one process, runs alternated, medians; the machine may have been shared",
                "rows": rows,
            },
            f,
            indent=2,
        )
    print(f"wrote {os.path.relpath(args.output)}")


if __name__ == "__main__":
    main()
