"""What the benchmark scripts share beyond the harness in `corevision_hf.measure` (timing, alternation, memory): the
matmul ceiling, fresh-process probes, the latency plot and the speed benchmarks' result files."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from corevision_hf.measure import alternate, peak_memory_mib, rss_kib, timed  # noqa: F401  (the scripts' imports)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ROOT = Path(__file__).resolve().parents[1]
PHOTOS = ROOT / "assets" / "photos"  # the shipped photos the extraction and batching benchmarks run on
OUTPUTS = ROOT / "outputs" / "benchmarks"  # where a benchmark writes by default; benchmarks/results only when named


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
