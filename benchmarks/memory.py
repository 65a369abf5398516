"""Resident memory of VECA-B and LookWhere-B after loading and during one high-resolution forward, default path and
the CPU opt-in (`optimize_for_cpu`), next to the dense teachers (DINOv3-B/16, DINOv2-B/14 with registers).

Each configuration runs in a fresh process, which reports (from /proc/self/status, MiB):
- baseline: after importing torch, transformers and corevision_hf (the interpreter and its libraries);
- after load: after `from_pretrained` of a saved random-init checkpoint (fp32) and one read of every weight (they
  are memory-mapped from the file, resident only once read);
- peak: the highest resident size during one forward at the resolution (VmHWM, reset after loading);
- after forward: what stays resident (the opt-in keeps its packed copy of every linear weight).
The check the model files are held to: default after-load - baseline <= 1.1 x the parameter bytes (one copy).

    python -m benchmarks.memory                       # writes benchmarks/results/memory_cpu.json
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModel, DINOv3ViTModel, Dinov2WithRegistersModel

from benchmarks.common import ROOT, dinov2_base_config, dinov3_base_config, rss_kib
from corevision_hf.cli import HelpFormatter
from corevision_hf.measure import threads_to_use
import corevision_hf  # noqa: F401  (registers VECA and LookWhere with the Auto classes)
from corevision_hf import LookWhereConfig, LookWhereModel, VecaConfig, VecaModel, optimize_for_cpu

# name -> (builder, patch size, call keyword arguments)
MODELS = {
    "VECA-B": (lambda: VecaModel(VecaConfig.from_preset("base")), 16, {"num_cores": 16}),
    "DINOv3-B": (lambda: DINOv3ViTModel(dinov3_base_config()), 16, {}),
    "LookWhere-B": (lambda: LookWhereModel(LookWhereConfig.from_preset("base")), 14, {"k_ratio": 0.1}),
    "DINOv2-B": (lambda: Dinov2WithRegistersModel(dinov2_base_config()), 14, {}),
}


def mib(kib: int) -> float:
    return kib / 1024


def probe(folder: str, name: str, optimized: bool, resolution: int) -> dict:
    """Runs in the fresh process: load, forward once, report resident sizes."""
    torch.set_num_threads(threads_to_use(None))  # OMP_NUM_THREADS, else every core
    baseline = rss_kib("VmRSS")
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    if optimized:
        optimize_for_cpu(model)
    with torch.inference_mode():  # safetensors are memory-mapped: read every weight once so that all are resident
        for tensor in model.state_dict().values():
            tensor.sum()
    after_load = rss_kib("VmRSS")
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    _, patch, call = MODELS[name]
    side = resolution // patch * patch
    pixel_values = torch.randn(1, 3, side, side)
    with open("/proc/self/clear_refs", "w") as f:  # peak from here on
        f.write("5")
    with torch.inference_mode():
        model(pixel_values, **call)
    return {
        "model": name,
        "path": "optimize_for_cpu" if optimized else "default",
        "resolution": side,
        "parameters_mib": parameter_bytes / 2**20,
        "baseline_mib": mib(baseline),
        "after_load_mib": mib(after_load),
        "load_over_baseline_mib": mib(after_load - baseline),
        "load_over_baseline_per_parameter_byte": (after_load - baseline) * 1024 / parameter_bytes,
        "peak_mib": mib(rss_kib("VmHWM")),
        "after_forward_mib": mib(rss_kib("VmRSS")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--resolution", type=int, default=1024, help="forward size (snapped down to the patch size)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--out", default="outputs/benchmarks/memory_cpu.json")
    parser.add_argument("--probe", nargs=3, metavar=("FOLDER", "MODEL", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.probe:
        folder, name, path = args.probe
        print(json.dumps(probe(folder, name, path == "optimize_for_cpu", args.resolution)))
        return

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            folder = os.path.join(scratch, name)
            torch.manual_seed(0)
            MODELS[name][0]().save_pretrained(folder)
            paths = ["default", "optimize_for_cpu"]
            for path in paths:
                command = [sys.executable, "-m", "benchmarks.memory", "--probe", folder, name, path, "--resolution",
                           str(args.resolution)]
                result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
                row = json.loads(result.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(
                    f"{name:12s} {path:17s} {row['resolution']:5d}px  parameters {row['parameters_mib']:6.0f} MiB  "
                    f"baseline {row['baseline_mib']:5.0f}  after load {row['after_load_mib']:5.0f} "
                    f"(+{row['load_over_baseline_mib']:4.0f}, {row['load_over_baseline_per_parameter_byte']:.2f}x "
                    f"parameters)  peak {row['peak_mib']:5.0f}  after forward {row['after_forward_mib']:5.0f} MiB",
                    flush=True,
                )
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"torch": torch.__version__, "threads": threads_to_use(None), "rows": rows}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
