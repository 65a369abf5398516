"""VECA-B against transformers' DINOv3 ViT-B/16: forward latency, peak memory and achieved GFLOP/s.

Both models are random-init, batch 1, built in one process. Each resolution warms both up, then alternates
DINOv3, VECA(C=64), VECA(C=16), VECA(C=8) run by run, so drift hits all of them alike; medians are reported
and the ratio of medians is the figure that carries across machines. Peak memory is measured for each
configuration in a fresh process. Writes a JSON file and a log-log plot.

Two VECA paths on CPU: the CPU opt-in, `corevision_hf.optimize_for_cpu(model)` (linear layers on oneDNN with
prepacked weights), at every budget, and the default model (plain `nn.Linear`, what the hub files run anywhere) at
the full bank. Speed-ups are against the stock transformers DINOv3; `--teacher-opt-in` adds DINOv3 given the same
opt-in.

    python -m benchmarks.veca_speed                                   # CPU, fp32, 256..2048 px
    python -m benchmarks.veca_speed --resolutions 1024 2048 --budgets 64 16 --no-memory   # the README's rows
    python -m benchmarks.veca_speed --device cuda --dtype bf16 --attn sdpa flash_attention_2 \
        --resolutions 512 1024 2048 4096 --out benchmarks/results/veca_gpu
"""

import argparse
import math
import statistics

import torch
from transformers import DINOv3ViTModel

from benchmarks.common import (DTYPES, alternate, dinov3_base_config, forward_peak_memory_mib, in_fresh_process,
                               matmul_ceiling, speed_model, write_speed_results)
from corevision_hf.cli import HelpFormatter
from corevision_hf.measure import threads_to_use
from corevision_hf import VecaConfig, VecaModel, dense_vit_flops, veca_flops

LABELS = {"dinov3": "DINOv3-B", "dinov3_cpu": "DINOv3-B, optimize_for_cpu (reference)",
          "veca_cpu": "VECA-B, optimize_for_cpu", "veca": "VECA-B"}


def build(name: str, attn: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    return speed_model(name, lambda: DINOv3ViTModel(dinov3_base_config(attn)),
                       lambda: VecaModel(VecaConfig.from_preset("base", attn_implementation=attn)), device, dtype)


def flops(name: str, config, resolution: int, num_cores: int | None) -> int:
    if name.startswith("dinov3"):
        return dense_vit_flops(
            resolution,
            hidden_size=config.hidden_size,
            num_hidden_layers=config.num_hidden_layers,
            intermediate_size=config.intermediate_size,
            patch_size=config.patch_size,
            num_prefix_tokens=1 + config.num_register_tokens,
        )
    return veca_flops(config, resolution, num_cores=num_cores)


def forward_fn(model, pixel_values, num_cores):
    kwargs = {} if num_cores is None else {"num_cores": num_cores}
    return lambda: model(pixel_values, **kwargs)


def probe_memory(name, attn, resolution, num_cores, device, dtype_name) -> None:
    model = build(name, attn, device, DTYPES[dtype_name])
    pixel_values = torch.randn(1, 3, resolution, resolution, device=device, dtype=DTYPES[dtype_name])
    print(forward_peak_memory_mib(forward_fn(model, pixel_values, num_cores or None), device))


def runs_for(resolution: int, device: str, runs: int) -> tuple[int, int]:
    """(warm-up, timed) runs: fewer at 2048 px and above on CPU, where one DINOv3 forward takes a minute."""
    if device == "cpu" and resolution >= 2048:
        return 1, 3
    return 2, runs


def log_log_slope(rows, label, low, high) -> float | None:
    points = {r["resolution"]: r for r in rows if r["model"] == label}
    if low == high or low not in points or high not in points:
        return None
    a, b = points[low], points[high]
    return math.log(b["latency_s"] / a["latency_s"]) / math.log(b["num_patches"] / a["num_patches"])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--resolutions", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--budgets", type=int, nargs="+", default=[64, 16, 8])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per configuration (3 at >= 2048 px on CPU)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--attn", nargs="+", default=["sdpa"], help="attention backends to compare")
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process peak-memory probes")
    parser.add_argument("--teacher-opt-in", action="store_true", help="also time DINOv3 with optimize_for_cpu (CPU)")
    parser.add_argument("--out", default="outputs/benchmarks/veca_cpu", help="output prefix for .json and .png")
    parser.add_argument("--probe-memory", nargs=4, metavar=("MODEL", "ATTN", "RES", "CORES"), help=argparse.SUPPRESS)
    return parser.parse_args()


def variants(args) -> list[tuple[str, int | None]]:
    """(model name, cores) pairs timed at each size: DINOv3 and VECA at every budget."""
    if args.device != "cpu":  # the opt-in is a CPU one
        return [("dinov3", None)] + [("veca", c) for c in args.budgets]
    # on a CPU, the opt-in at every budget and the default path at the full bank
    timed = [("dinov3", None)] + [("veca_cpu", c) for c in args.budgets] + [("veca", max(args.budgets))]
    return timed + [("dinov3_cpu", None)] if args.teacher_opt_in else timed


def measure(args, attn: str, dtype: torch.dtype, peak: float) -> list[dict]:
    """One row per size and variant, DINOv3 and VECA timed alternately in one process; prints each row."""
    timed = variants(args)
    models = {name: build(name, attn, args.device, dtype) for name in dict.fromkeys(n for n, _ in timed)}
    rows = []
    for resolution in args.resolutions:
        pixel_values = torch.randn(1, 3, resolution, resolution, device=args.device, dtype=dtype)
        warmup, runs = runs_for(resolution, args.device, args.runs)
        fns = {variant: forward_fn(models[variant[0]], pixel_values, variant[1]) for variant in timed}
        times = alternate(fns, args.device, warmup, runs)
        dense_latency = statistics.median(times[("dinov3", None)])
        for (name, cores), samples in times.items():
            row = timing_row(args, models[name].config, name, cores, attn, resolution, samples, dense_latency, peak)
            rows.append(row)
            memory = f"{row['peak_memory_mib']:9.0f}" if "peak_memory_mib" in row else "        -"
            print(
                f"{resolution:5d}px {row['model']:48s} {row['latency_s']:8.3f} s  x{row['dinov3_over_this']:5.2f} vs "
                f"DINOv3  {row['gflops']:8.1f} GFLOP  {row['achieved_gflops_per_s']:6.0f} GFLOP/s "
                f"({100 * row['fraction_of_matmul_peak']:3.0f}% of matmul)  {memory} MiB",
                flush=True,
            )
    return rows


def timing_row(args, config, name, cores, attn, resolution, samples, dense_latency, peak) -> dict:
    latency = statistics.median(samples)
    model_flops = flops(name, config, resolution, cores)
    label = LABELS[name] if cores is None else LABELS[name].replace("VECA-B", f"VECA-B C={cores}")
    if len(args.attn) > 1:
        label += f" [{attn}]"
    row = {
        "model": label,
        "attn": attn,
        "resolution": resolution,
        "num_patches": (resolution // 16) ** 2,
        "num_cores": cores,
        "latency_s": latency,
        "latency_runs_s": samples,
        "gflops": model_flops / 1e9,
        "achieved_gflops_per_s": model_flops / latency / 1e9,
        "fraction_of_matmul_peak": model_flops / latency / 1e9 / peak,
        "dinov3_over_this": dense_latency / latency,
    }
    if not args.no_memory:
        row["peak_memory_mib"] = in_fresh_process(
            "benchmarks.veca_speed",
            [name, attn, str(resolution), str(cores or 0), "--device", args.device, "--dtype", args.dtype],
        )
    return row


def slopes_of(rows: list[dict], resolutions: list[int]) -> dict:
    """The log-log slope of latency against patches of each model, 512-2048 px when measured (else the range)."""
    low, high = (512, 2048) if {512, 2048} <= set(resolutions) else (min(resolutions), max(resolutions))
    slopes = {}
    for label in dict.fromkeys(r["model"] for r in rows):
        slope = log_log_slope(rows, label, low, high)
        if slope is not None:
            slopes[label] = slope
            print(f"log-log slope of latency vs patches, {low}-{high} px, {label}: {slope:.3f}")
    return {"range_px": [low, high], **slopes}


def main() -> None:
    args = parse_args()
    torch.set_num_threads(threads_to_use(None))  # OMP_NUM_THREADS, else every core
    if args.probe_memory:
        name, attn, resolution, cores = args.probe_memory
        probe_memory(name, attn, int(resolution), int(cores), args.device, args.dtype)
        return

    dtype = DTYPES[args.dtype]
    peak = matmul_ceiling(args.device, args.dtype)
    rows = [row for attn in args.attn for row in measure(args, attn, dtype, peak)]
    write_speed_results(args, peak, rows, "VECA-B vs DINOv3-B", slopes=slopes_of(rows, args.resolutions))


if __name__ == "__main__":
    main()
