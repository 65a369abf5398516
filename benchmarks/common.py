"""Timing and memory helpers shared by the benchmark scripts (see ../shared/spec/measuring.md for the habits)."""

import statistics
import subprocess
import sys
import time

import torch


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str) -> float:
    """Seconds one call of fn() takes, with the device synchronised around it."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def alternate(fns: dict, device: str, warmup: int, runs: int) -> dict:
    """Warm every fn up, then time them in turn, run by run, so that drift hits all alike. Returns name -> times."""
    times = {name: [] for name in fns}
    with torch.inference_mode():
        for fn in fns.values():
            for _ in range(warmup):
                fn()
        for _ in range(runs):
            for name, fn in fns.items():
                times[name].append(timed(fn, device))
    return times


def matmul_gflops(device: str, dtype: torch.dtype, runs: int = 5) -> float:
    """The machine's large-matmul rate in the same run: the ceiling a ViT forward can approach."""
    a = torch.randn(4096, 4096, device=device, dtype=dtype)
    b = torch.randn(4096, 4096, device=device, dtype=dtype)
    times = [timed(lambda: torch.mm(a, b), device) for _ in range(runs + 1)]
    return 2 * 4096**3 / statistics.median(times[1:]) / 1e9


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def forward_peak_memory_mib(fn, device: str) -> float:
    """Peak memory of one call of fn() above what was resident before it (model weights excluded)."""
    with torch.inference_mode():
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn()
            return (torch.cuda.max_memory_allocated() - base) / 2**20
        # Reset the kernel's peak-RSS mark so that building the model does not count, then read it back.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = rss_kib("VmRSS")
        fn()
        return (rss_kib("VmHWM") - base) / 1024


def in_fresh_process(script: str, args: list[str]) -> float:
    """Runs `script --probe-memory ARGS` in a new Python and returns the number it prints last."""
    result = subprocess.run([sys.executable, script, "--probe-memory", *args], capture_output=True, text=True, check=True)
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

