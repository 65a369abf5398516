"""What the benchmark scripts share beyond the harness in `corevision_hf.measure` (timing, alternation, memory): the
dense teachers they compare against, the matmul ceiling, fresh-process probes, the latency plot and the speed
benchmarks' result files."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from transformers import DINOv3ViTConfig, Dinov2WithRegistersConfig

from corevision_hf.cpu import optimize_for_cpu
from corevision_hf.measure import alternate, peak_memory_mib, rss_kib, timed  # noqa: F401  (the scripts' imports)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ROOT = Path(__file__).resolve().parents[1]
PHOTOS = ROOT / "assets" / "photos"  # the shipped photos the extraction and batching benchmarks run on
OUTPUTS = ROOT / "outputs" / "benchmarks"  # where a benchmark writes by default; benchmarks/results only when named


def dinov3_base_config(attn: str | None = None) -> DINOv3ViTConfig:
    """DINOv3 ViT-B/16 as released: 4 registers, plain GELU MLP of 3072, RoPE; `attn` the attention implementation
    (None: transformers' default)."""
    return DINOv3ViTConfig(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        patch_size=16,
        num_register_tokens=4,
        attn_implementation=attn,
    )


def dinov2_base_config(attn: str | None = None) -> Dinov2WithRegistersConfig:
    """DINOv2 ViT-B/14 with 4 registers as released, at 518 px; `attn` the attention implementation (None:
    transformers' default)."""
    return Dinov2WithRegistersConfig(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_ratio=4, patch_size=14, image_size=518,
        num_register_tokens=4, attn_implementation=attn,
    )


def speed_model(name: str, dense, student, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """A speed benchmark's model, built after seeding 0: `dense()` (the DINOv2 or DINOv3 it is compared with) for a
    name starting with "dino", else `student()`; in eval mode on `device` in `dtype`, given the CPU opt-in
    (`optimize_for_cpu`) where the name ends in "_cpu"."""
    torch.manual_seed(0)
    model = dense() if name.startswith("dino") else student()
    model = model.to(device=device, dtype=dtype).eval()
    return optimize_for_cpu(model) if name.endswith("_cpu") else model


def restoring_threads(run, argv=None):
    """run(argv) for a benchmark that sets torch's thread count itself, called as a command or from Python: the
    caller's thread count is restored afterwards."""
    threads = torch.get_num_threads()
    try:
        return run(argv)
    finally:
        torch.set_num_threads(threads)


def matmul_gflops(device: str, dtype: torch.dtype, runs: int = 5) -> float:
    """The machine's large-matmul rate in the same run: the ceiling a ViT forward can approach."""
    a = torch.randn(4096, 4096, device=device, dtype=dtype)
    b = torch.randn(4096, 4096, device=device, dtype=dtype)
    times = [timed(lambda: torch.mm(a, b), device) for _ in range(runs + 1)]
    return 2 * 4096**3 / statistics.median(times[1:]) / 1e9


def matmul_ceiling(device: str, dtype_name: str) -> float:
    """matmul_gflops for `dtype_name` (a key of DTYPES), printed with the device, dtype and thread count."""
    peak = matmul_gflops(device, DTYPES[dtype_name])
    print(f"device {device}, {dtype_name}, {torch.get_num_threads()} threads; 4096^3 matmul: {peak:.0f} GFLOP/s")
    return peak


def forward_peak_memory_mib(fn, device: str) -> float:
    """Peak memory of a first call of fn() above what was resident before it (model weights excluded; one-time work
    such as packed weights included, as a user's first call pays it)."""
    return peak_memory_mib(fn, device, warm=False)


def in_fresh_process(module: str, args: list[str]) -> float:
    """Runs `python -m MODULE --probe-memory ARGS` from the repository root in a new Python and returns the number it
    prints last."""
    result = subprocess.run([sys.executable, "-m", module, "--probe-memory", *args], cwd=ROOT, capture_output=True,
                            text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def plot_latency(rows: list[dict], path: str, title: str, x_key: str = "num_patches") -> None:
    """Log-log plot of latency against patches per image, one line per model label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for label in dict.fromkeys(r["model"] for r in rows):
        points = sorted((r[x_key], r["latency_s"]) for r in rows if r["model"] == label)
        dense = label.startswith(("DINOv2", "DINOv3"))
        ax.plot(*zip(*points), marker="o", label=label, linestyle="--" if dense else "-")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("patches per image")
    ax.set_ylabel("forward latency (s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)



def write_speed_results(args, peak: float, rows: list[dict], title: str, **extra) -> None:
    """Writes `args.out`.json (the run's device, dtype, threads, torch version and matmul rate `peak`, then `extra`,
    then the rows) and `args.out`.png (the rows' latency plot, titled `title` with the batch, device and dtype)."""
    out = args.out
    summary = {
        "device": args.device,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "matmul_gflops_per_s": peak,
        **extra,
        "rows": rows,
    }
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(summary, f, indent=2)
    plot_latency(rows, out + ".png", f"{title}, batch 1, {args.device} {args.dtype}")
    print(f"wrote {out}.json and {out}.png")
