"""The one latency and memory harness: evaluation, calibration, the demo page, the examples and the benchmarks all
time and measure through these functions: medians of runs after warm-up calls, runs alternated between models so that
a busy machine slows all alike, the device synchronised around each call (docs/speed.md states the protocol behind
each figure)."""

import ctypes
import os
import statistics
import time

import torch


def threads_to_use(asked: int | None, default: int | None = None) -> int:
    """Torch's CPU threads for a script: `asked` (its --threads) when given, else OMP_NUM_THREADS when it is a whole
    number, else `default` (every core when None), so that a shared machine can hold a run to its share."""
    if asked is not None:
        return asked
    environment = os.environ.get("OMP_NUM_THREADS", "")
    if environment.isdigit() and int(environment) > 0:
        return int(environment)
    return os.cpu_count() if default is None else default


def synchronize(device: str) -> None:
    """Waits for a GPU's queued kernels, so that the clock reads what they took; nothing on a CPU."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str) -> float:
    """Seconds one call of fn() takes, with the device synchronised around it."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


@torch.inference_mode()
def median_latency_ms(forward, device: str, runs: int, warmup: int = 2) -> float:
    """Median wall time of `forward()` over `runs` calls after `warmup` calls, in milliseconds."""
    for _ in range(warmup):
        forward()
    return 1e3 * statistics.median(timed(forward, device) for _ in range(runs))


def alternate(fns: dict, device: str, warmup: int, runs: int) -> dict:
    """Warms every fn up, then times them in turn, run by run, so that drift hits all alike. Returns name -> seconds."""
    times = {name: [] for name in fns}
    with torch.inference_mode():
        for fn in fns.values():
            for _ in range(warmup):
                fn()
        for _ in range(runs):
            for name, fn in fns.items():
                times[name].append(timed(fn, device))
    return times


# An interquartile range above this fraction of the median: the runs disagree, and so would a rerun.
NOISY_SPREAD = 0.25


def spread_ms(seconds: list[float]) -> dict:
    """Timed runs (seconds) -> {"latency_ms": median, "latency_iqr_ms": interquartile range, "runs"}, in ms."""
    ms = [1e3 * s for s in seconds]
    q1, median, q3 = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else ms * 3
    return {"latency_ms": median, "latency_iqr_ms": q3 - q1, "runs": len(ms)}


def alternated_latency(fns: dict, device: str, runs: int, warmup: int = 2) -> dict:
    """`alternate`'s runs of every fn, each summarised by `spread_ms`: name -> {"latency_ms", "latency_iqr_ms", ...}."""
    return {name: spread_ms(times) for name, times in alternate(fns, device, warmup, runs).items()}


def latency_warnings(latencies: dict) -> list[str]:
    """What makes latencies untrustworthy, one line each: a spread (IQR) above NOISY_SPREAD of its median, and a model
    that came out faster on a larger input. `latencies` maps (model label, input size in px) to a `spread_ms` dict;
    the sizes of one label are compared in increasing order. Both usually mean that the machine was busy."""
    warnings = []
    for (label, size), latency in latencies.items():
        if latency["latency_iqr_ms"] > NOISY_SPREAD * latency["latency_ms"]:
            warnings.append(f"{label} at {size} px: the spread (IQR {latency['latency_iqr_ms']:.3g} ms) exceeds "
                            f"{NOISY_SPREAD:.0%} of the median {latency['latency_ms']:.3g} ms")
    for label in dict.fromkeys(label for label, _ in latencies):
        sizes = sorted(size for other, size in latencies if other == label)
        for smaller, larger in zip(sizes, sizes[1:]):
            fast, slow = latencies[label, larger]["latency_ms"], latencies[label, smaller]["latency_ms"]
            if fast < slow:
                warnings.append(f"{label} came out faster at {larger} px ({fast:.3g} ms) than at {smaller} px "
                                f"({slow:.3g} ms)")
    return warnings


def rss_kib(field: str) -> int:
    """A field of /proc/self/status in KiB: "VmRSS" (resident now) or "VmHWM" (the peak since the last reset)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _glibc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def return_freed_memory_to_the_os() -> bool:
    """Tells glibc to serve every new block over 64 kB with mmap, so that freeing it shrinks the resident set and
    the kernel's peak-RSS mark tracks live tensors. It slows later allocations down: call it after all timing."""
    libc = _glibc()
    m_mmap_threshold = -3
    return libc is not None and bool(libc.mallopt(m_mmap_threshold, 64 * 1024))


@torch.inference_mode()
def peak_memory_mib(forward, device: str, warm: bool = True) -> float:
    """Memory of one `forward()` above what was resident before it, in MiB: CUDA's allocator peak, or on Linux the
    process's peak RSS after resetting the kernel's mark. `warm`: one call first, so that one-time work (kernels,
    packed weights) is not counted; `warm=False` measures a first call, one-time work included."""
    if warm:
        forward()
    if str(device).startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        forward()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)  # pages freed into the heap would be reused unseen by the RSS mark
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = rss_kib("VmRSS")
    forward()
    return (rss_kib("VmHWM") - base) / 1024


__all__ = [
    "NOISY_SPREAD", "alternate", "alternated_latency", "latency_warnings", "median_latency_ms", "peak_memory_mib",
    "return_freed_memory_to_the_os", "rss_kib", "spread_ms", "synchronize", "timed",
]
