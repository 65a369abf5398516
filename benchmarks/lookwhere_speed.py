"""LookWhere-B (k_ratio 0.1) against transformers' Dinov2WithRegistersModel ViT-B/14 on the full image.

Both models are random-init, batch 1, built in one process; runs alternate between them and medians are
reported (the ratio of medians carries across machines). LookWhere's time includes the selector, the top-k,
the extractor and the dense fill; a second LookWhere row skips the fill (image-level output only). Peak memory
is measured per configuration in a fresh process. Writes a JSON file and a log-log plot.

Two LookWhere paths: the default model (plain `nn.Linear`, what the hub files run anywhere) and the CPU opt-in,
`corevision_hf.optimize_for_cpu(model)` (linear layers on oneDNN with prepacked weights). Speed-ups are against the
stock transformers DINOv2; a reference row gives DINOv2 the same opt-in (like for like).

    python -m benchmarks.lookwhere_speed                       # CPU, fp32, 518 and 1036 px
"""

import argparse
import statistics
import sys

import torch
from transformers import Dinov2WithRegistersModel

from benchmarks.common import (DTYPES, alternate, dinov2_base_config, forward_peak_memory_mib, in_fresh_process,
                               matmul_ceiling, speed_model, write_speed_results)
from corevision_hf.cli import HelpFormatter
from corevision_hf.measure import threads_to_use
from corevision_hf import LookWhereConfig, LookWhereModel, dense_vit_flops, lookwhere_flops
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio


def build(name: str, attn: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    return speed_model(name, lambda: Dinov2WithRegistersModel(dinov2_base_config(attn)),
                       lambda: LookWhereModel(LookWhereConfig.from_preset("base", attn_implementation=attn)),
                       device, dtype)


def forward_fn(name: str, model, pixel_values, k_ratio: float):
    if name.startswith("dinov2"):
        return lambda: model(pixel_values)
    return lambda: model(pixel_values, k_ratio=k_ratio, fill_dense=not name.endswith("_no_fill"))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--resolutions", type=int, nargs="+", default=[518, 1036])
    parser.add_argument("--k-ratio", type=float, default=0.1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--attn", default="sdpa")
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process peak-memory probes")
    parser.add_argument("--out", default="outputs/benchmarks/lookwhere_cpu", help="output prefix for .json and .png")
    parser.add_argument("--probe-memory", nargs=2, metavar=("MODEL", "RES"), help=argparse.SUPPRESS)
    return parser.parse_args()


def probe_memory(args, dtype: torch.dtype) -> None:
    """A fresh process's probe (--probe-memory MODEL RES): prints the peak memory of that model's forward at RES."""
    name, resolution = args.probe_memory[0], int(args.probe_memory[1])
    model = build(name.removesuffix("_no_fill"), args.attn, args.device, dtype)
    pixel_values = torch.randn(1, 3, resolution, resolution, device=args.device, dtype=dtype)
    print(forward_peak_memory_mib(forward_fn(name, model, pixel_values, args.k_ratio), args.device))


def model_labels(args) -> dict[str, str]:
    """{model name: row label}: on the CPU with the opt-in rows and DINOv2's reference row, elsewhere without."""
    labels = {
        "dinov2": "DINOv2-B/14 full image",
        "lookwhere_cpu": f"LookWhere-B k_ratio={args.k_ratio}, optimize_for_cpu",
        "lookwhere_cpu_no_fill": f"LookWhere-B k_ratio={args.k_ratio}, optimize_for_cpu, no fill",
        "lookwhere": f"LookWhere-B k_ratio={args.k_ratio}",
        "dinov2_cpu": "DINOv2-B/14, optimize_for_cpu (reference)",
    }
    if args.device != "cpu":  # the opt-in is a CPU one
        labels = {"dinov2": labels["dinov2"], "lookwhere": labels["lookwhere"],
                  "lookwhere_no_fill": f"LookWhere-B k_ratio={args.k_ratio}, no fill"}
    return labels


def model_flops(name: str, model, resolution: int, k_ratio: float) -> float:
    """The analytic FLOPs of one forward of model `name` at `resolution`."""
    if name.startswith("dinov2"):
        config = model.config
        return dense_vit_flops(
            resolution, hidden_size=768, num_hidden_layers=12, intermediate_size=3072, patch_size=14,
            num_prefix_tokens=1 + config.num_register_tokens,
        )
    return lookwhere_flops(model.config, resolution, k_ratio=k_ratio)


def resolution_rows(args, resolution: int, models: dict, labels: dict, dtype: torch.dtype) -> list[dict]:
    """The rows of one resolution: every model timed in alternation (medians), with FLOPs, the speed-up against
    DINOv2 and (unless --no-memory) the peak memory of a fresh process; each printed as it comes."""
    rows = []
    pixel_values = torch.randn(1, 3, resolution, resolution, device=args.device, dtype=dtype)
    fns = {name: forward_fn(name, model, pixel_values, args.k_ratio) for name, model in models.items()}
    times = alternate(fns, args.device, warmup=2, runs=args.runs)
    dense_latency = statistics.median(times["dinov2"])
    num_patches = (resolution // 14) ** 2
    for name, samples in times.items():
        latency = statistics.median(samples)
        flops = model_flops(name, models[name], resolution, args.k_ratio)
        row = {
            "model": labels[name],
            "resolution": resolution,
            "num_patches": num_patches,
            "k": None if name.startswith("dinov2") else kept_for_ratio(args.k_ratio, num_patches),
            "latency_s": latency,
            "latency_runs_s": samples,
            "gflops": flops / 1e9,
            "speedup_vs_dinov2": dense_latency / latency,
        }
        if not args.no_memory:
            row["peak_memory_mib"] = in_fresh_process(
                "benchmarks.lookwhere_speed", [name, str(resolution), "--device", args.device, "--dtype",
                                               args.dtype, "--attn", args.attn, "--k-ratio", str(args.k_ratio)]
            )
        rows.append(row)
        memory = f"{row['peak_memory_mib']:8.0f}" if "peak_memory_mib" in row else "       -"
        print(
            f"{resolution:5d}px {row['model']:58s} {latency:8.3f} s  x{row['speedup_vs_dinov2']:5.1f} vs DINOv2  "
            f"{row['gflops']:8.1f} GFLOP {memory} MiB",
            flush=True,
        )
    return rows


def main() -> None:
    args = parse_args()
    torch.set_num_threads(threads_to_use(None))  # OMP_NUM_THREADS, else every core
    dtype = DTYPES[args.dtype]

    if args.probe_memory:
        probe_memory(args, dtype)
        return

    peak = matmul_ceiling(args.device, args.dtype)
    labels = model_labels(args)
    models = {name: build(name, args.attn, args.device, dtype) for name in labels if not name.endswith("_no_fill")}
    for name in labels:
        if name.endswith("_no_fill"):
            models[name] = models[name.removesuffix("_no_fill")]
    rows = []
    for resolution in args.resolutions:
        rows.extend(resolution_rows(args, resolution, models, labels, dtype))
    write_speed_results(args, peak, rows, "LookWhere-B vs DINOv2-B", k_ratio=args.k_ratio)


if __name__ == "__main__":
    sys.exit(main())
