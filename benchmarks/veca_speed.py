"""VECA-B against transformers' DINOv3 ViT-B/16: forward latency, peak memory and achieved GFLOP/s.

Both models are random-init, batch 1, built in one process. Each resolution warms both up, then alternates
DINOv3, VECA(C=64), VECA(C=16), VECA(C=8) run by run, so drift hits all of them alike; medians are reported
and the ratio of medians is the figure that carries across machines. Peak memory is measured for each
configuration in a fresh process. Writes a JSON file and a log-log plot.

    python benchmarks/veca_speed.py                                   # CPU, fp32, 256..2048 px
    python benchmarks/veca_speed.py --device cuda --dtype bf16 --attn sdpa flash_attention_2 \
        --resolutions 512 1024 2048 4096 --out benchmarks/results/veca_gpu
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
from transformers import DINOv3ViTConfig, DINOv3ViTModel

from corevision_hf import VecaConfig, VecaModel, dense_vit_flops, veca_flops


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dinov3_base_config(attn: str) -> DINOv3ViTConfig:
    """DINOv3 ViT-B/16 as released: 4 registers, plain GELU MLP of 3072, RoPE."""
    return DINOv3ViTConfig(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        patch_size=16,
        num_register_tokens=4,
        attn_implementation=attn,
    )


def build(name: str, attn: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "dinov3":
        model = DINOv3ViTModel(dinov3_base_config(attn))
    else:
        model = VecaModel(VecaConfig.from_preset("base", attn_implementation=attn))
    return model.to(device=device, dtype=dtype).eval()


def flops(name: str, config, resolution: int, num_cores: int | None) -> int:
    if name == "dinov3":
        return dense_vit_flops(
            resolution,
            hidden_size=config.hidden_size,
            num_hidden_layers=config.num_hidden_layers,
            intermediate_size=config.intermediate_size,
            patch_size=config.patch_size,
            num_prefix_tokens=1 + config.num_register_tokens,
        )
    return veca_flops(config, resolution, num_cores=num_cores)


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(model, pixel_values, num_cores, device) -> float:
    kwargs = {} if num_cores is None else {"num_cores": num_cores}
    synchronize(device)
    start = time.perf_counter()
    model(pixel_values, **kwargs)
    synchronize(device)
    return time.perf_counter() - start


def matmul_gflops(device: str, dtype: torch.dtype, runs: int = 5) -> float:
    """The machine's large-matmul rate in the same run: the ceiling a ViT forward can approach."""
    a = torch.randn(4096, 4096, device=device, dtype=dtype)
    b = torch.randn(4096, 4096, device=device, dtype=dtype)
    times = []
    for _ in range(runs + 1):
        synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * 4096**3 / statistics.median(times[1:]) / 1e9


def peak_memory_mib(name: str, attn: str, resolution: int, num_cores, device: str, dtype_name: str) -> float:
    """Peak memory of one forward, in a fresh process; model weights excluded."""
    command = [sys.executable, __file__, "--probe-memory", name, attn, str(resolution), str(num_cores or 0)]
    command += ["--device", device, "--dtype", dtype_name]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def probe_memory(name, attn, resolution, num_cores, device, dtype_name) -> None:
    torch.set_num_threads(os.cpu_count())
    model = build(name, attn, device, DTYPES[dtype_name])
    pixel_values = torch.randn(1, 3, resolution, resolution, device=device, dtype=DTYPES[dtype_name])
    kwargs = {"num_cores": num_cores} if num_cores else {}
    with torch.inference_mode():
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            model(pixel_values, **kwargs)
            print((torch.cuda.max_memory_allocated() - base) / 2**20)
        else:
            # Reset the kernel's peak-RSS mark so that building the model does not count, then read it back.
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            base = rss_kib("VmRSS")
            model(pixel_values, **kwargs)
            print((rss_kib("VmHWM") - base) / 1024)


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


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


def plot(rows, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for label in dict.fromkeys(r["model"] for r in rows):
        points = sorted((r["num_patches"], r["latency_s"]) for r in rows if r["model"] == label)
        ax.plot(*zip(*points), marker="o", label=label, linestyle="--" if label.startswith("DINOv3") else "-")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("patches per image")
    ax.set_ylabel("forward latency (s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resolutions", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--budgets", type=int, nargs="+", default=[64, 16, 8])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per configuration (3 at >= 2048 px on CPU)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--attn", nargs="+", default=["sdpa"], help="attention backends to compare")
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process peak-memory probes")
    parser.add_argument("--out", default="benchmarks/results/veca_cpu", help="output prefix for .json and .png")
    parser.add_argument("--probe-memory", nargs=4, metavar=("MODEL", "ATTN", "RES", "CORES"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.probe_memory:
        name, attn, resolution, cores = args.probe_memory
        probe_memory(name, attn, int(resolution), int(cores), args.device, args.dtype)
        return

    torch.set_num_threads(os.cpu_count())
    dtype = DTYPES[args.dtype]
    peak = matmul_gflops(args.device, dtype)
    print(f"device {args.device}, {args.dtype}, {torch.get_num_threads()} threads; 4096^3 matmul: {peak:.0f} GFLOP/s")

    rows = []
    for attn in args.attn:
        models = {"dinov3": build("dinov3", attn, args.device, dtype), "veca": build("veca", attn, args.device, dtype)}
        variants = [("dinov3", None)] + [("veca", c) for c in args.budgets]
        for resolution in args.resolutions:
            pixel_values = torch.randn(1, 3, resolution, resolution, device=args.device, dtype=dtype)
            warmup, runs = runs_for(resolution, args.device, args.runs)
            times = {variant: [] for variant in variants}
            with torch.inference_mode():
                for variant in variants:
                    for _ in range(warmup):
                        timed(models[variant[0]], pixel_values, variant[1], args.device)
                for _ in range(runs):
                    for variant in variants:
                        times[variant].append(timed(models[variant[0]], pixel_values, variant[1], args.device))
            dense_latency = statistics.median(times[("dinov3", None)])
            for (name, cores), samples in times.items():
                latency = statistics.median(samples)
                model_flops = flops(name, models[name].config, resolution, cores)
                label = "DINOv3-B" if name == "dinov3" else f"VECA-B C={cores}"
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
                    row["peak_memory_mib"] = peak_memory_mib(name, attn, resolution, cores, args.device, args.dtype)
                rows.append(row)
                memory = f"{row['peak_memory_mib']:9.0f}" if "peak_memory_mib" in row else "        -"
                print(
                    f"{resolution:5d}px {label:22s} {latency:8.3f} s  x{row['dinov3_over_this']:5.2f} vs DINOv3  "
                    f"{row['gflops']:8.1f} GFLOP  {row['achieved_gflops_per_s']:6.0f} GFLOP/s "
                    f"({100 * row['fraction_of_matmul_peak']:3.0f}% of matmul)  {memory} MiB",
                    flush=True,
                )
        del models

    slopes = {}
    labels = dict.fromkeys(r["model"] for r in rows)
    low, high = (512, 2048) if {512, 2048} <= set(args.resolutions) else (min(args.resolutions), max(args.resolutions))
    for label in labels:
        slope = log_log_slope(rows, label, low, high)
        if slope is not None:
            slopes[label] = slope
            print(f"log-log slope of latency vs patches, {low}-{high} px, {label}: {slope:.3f}")

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    summary = {
        "device": args.device,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "matmul_gflops_per_s": peak,
        "slopes": {"range_px": [low, high], **slopes},
        "rows": rows,
    }
    with open(args.out + ".json", "w") as f:
        json.dump(summary, f, indent=2)
    plot(rows, args.out + ".png", f"VECA-B vs DINOv3-B, batch 1, {args.device} {args.dtype}")
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
