"""GPU readiness in one script: attention backends agree, and bf16 speed and memory against the dense teachers.

1. Agreement: the same weights under each attention backend this machine can run (eager, sdpa, flash_attention_2
   when CUDA and the flash-attn package are there), for VECA and LookWhere: fp32 within 1e-4 of eager, fp16 / bf16
   within 2e-2 of eager in the same dtype (flash_attention_2 runs fp16 / bf16 only). LookWhere is compared on its
   selector map, its CLS token and, where the backends kept the same patches, its dense output.
2. Speed (CUDA only): bf16, batch 1, medians of alternated runs; VECA-B (64 and 16 cores) against DINOv3-B/16 at
   1024 / 2048 / 4096 px and LookWhere-B (k_ratio 0.1) against DINOv2-B/14 with registers at 518 / 1036 / 2072 px,
   per backend, with the peak GPU memory of one forward above the weights.
3. Distillation (CUDA only): two bf16 steps of each training script on every GPU under training/configs/fsdp.yaml
   (FSDP 2, sharded checkpoint at step 2, the gathered export), tiny students from a tiny random teacher, on the
   shipped photos: exit status 0, finite losses, and an export that loads.

On a machine without CUDA it runs what a CPU can (fp32 agreement of eager and sdpa, small models with --quick) and
says what it skipped. Exit status 1 if any agreement check fails.

    python -m benchmarks.gpu_check                 # on a GPU machine: writes outputs/benchmarks/gpu.json
    python -m benchmarks.gpu_check --quick         # tiny models, agreement only (what the CPU test runs)
"""

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys

import torch
from transformers import DINOv3ViTModel, Dinov2WithRegistersConfig, Dinov2WithRegistersModel

from benchmarks.common import alternate, dinov2_base_config, dinov3_base_config, forward_peak_memory_mib
from corevision_hf.cli import HelpFormatter
from corevision_hf import LookWhereConfig, LookWhereModel, VecaConfig, VecaModel

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}
TINY = {
    "veca": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, patch_size=8,
                 num_cores=8, image_size=64),
    "lookwhere": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, patch_size=8,
                      selector_depth=1, selector_image_size=32, image_size=64),
}


def backends(device: str, dtype: torch.dtype) -> tuple[list[str], list[str]]:
    """(backends to run, reasons for the ones skipped) on this device and dtype."""
    run, skipped = ["eager", "sdpa"], []
    if device != "cuda":
        skipped.append("flash_attention_2: needs a CUDA GPU")
    elif dtype == torch.float32:
        skipped.append("flash_attention_2 in fp32: flash attention runs fp16 / bf16 only")
    elif importlib.util.find_spec("flash_attn") is None:
        skipped.append("flash_attention_2: the flash-attn package is not installed (pip install flash-attn)")
    else:
        run.append("flash_attention_2")
    return run, skipped


def build(name: str, quick: bool, attn: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "veca":
        config = VecaConfig(**TINY["veca"]) if quick else VecaConfig.from_preset("base")
        model = VecaModel(config)
    elif name == "lookwhere":
        config = LookWhereConfig(**TINY["lookwhere"]) if quick else LookWhereConfig.from_preset("base")
        model = LookWhereModel(config)
    elif name == "dinov3":
        model = DINOv3ViTModel(dinov3_base_config())
    else:
        model = Dinov2WithRegistersModel(dinov2_base_config())
    model.set_attn_implementation(attn)
    return model.eval()


def agreement(name: str, device: str, dtype: torch.dtype, quick: bool) -> tuple[list[dict], list[str]]:
    """Max abs differences of each backend against eager on the same weights and images."""
    run, skipped = backends(device, dtype)
    model = build(name, quick, "eager").to(device=device, dtype=dtype)
    side = 4 * model.config.patch_size if quick else 448
    pixel_values = torch.randn(2, 3, side, side + model.config.patch_size, generator=torch.Generator().manual_seed(1))
    pixel_values = pixel_values.to(device=device, dtype=dtype)
    call = {"num_cores": model.config.num_cores // 2} if name == "veca" else {"k_ratio": 0.25}
    outputs = {}
    with torch.inference_mode():
        for attn in run:
            model.set_attn_implementation(attn)
            outputs[attn] = model(pixel_values, **call)
    rows = []
    reference = outputs["eager"]
    for attn in run[1:]:
        out = outputs[attn]
        if name == "veca":
            diffs = {"last_hidden_state": (out.last_hidden_state - reference.last_hidden_state).abs().max().item()}
        else:
            diffs = {
                "selector_map": (out.selector_map - reference.selector_map).abs().max().item(),
                "cls": (out.pooler_output - reference.pooler_output).abs().max().item(),
            }
            if torch.equal(out.selected_indices, reference.selected_indices):
                diffs["last_hidden_state"] = (out.last_hidden_state - reference.last_hidden_state).abs().max().item()
            else:
                skipped.append(f"{name} {attn} {dtype}: kept patches differ from eager's, dense output not compared")
        worst = max(diffs.values())
        rows.append({"model": name, "backend": attn, "dtype": str(dtype).removeprefix("torch."), "max_abs_diff": diffs,
                     "tolerance": TOLERANCE[dtype], "ok": worst <= TOLERANCE[dtype]})
        print(f"agreement {name:9s} {attn:17s} vs eager, {rows[-1]['dtype']:8s}: max abs diff {worst:.2e} "
              f"(tolerance {TOLERANCE[dtype]:.0e}) {'ok' if rows[-1]['ok'] else 'FAILED'}", flush=True)
    return rows, skipped


def speed(device: str, runs: int) -> list[dict]:
    """bf16 latency and peak memory of our models against the dense teachers, per backend."""
    rows = []
    plan = [("veca", "dinov3", 16, (1024, 2048, 4096), [{"num_cores": 64}, {"num_cores": 16}]),
            ("lookwhere", "dinov2", 14, (518, 1036, 2072), [{"k_ratio": 0.1}])]
    run, _ = backends(device, torch.bfloat16)
    for ours, dense, patch, resolutions, calls in plan:
        for attn in [b for b in run if b != "eager"]:  # eager materialises N x N attention maps: out of memory
            models = {name: build(name, False, attn).to(device=device, dtype=torch.bfloat16) for name in (ours, dense)}
            for resolution in resolutions:
                pixel_values = torch.randn(1, 3, resolution, resolution, device=device, dtype=torch.bfloat16)
                fns = {(dense, "{}"): lambda: models[dense](pixel_values)}
                for call in calls:
                    fns[(ours, json.dumps(call))] = (lambda c: lambda: models[ours](pixel_values, **c))(call)
                times = alternate(fns, device, warmup=2, runs=runs)
                dense_latency = statistics.median(times[(dense, "{}")])
                for (name, call), samples in times.items():
                    latency = statistics.median(samples)
                    row = {"model": name, "call": json.loads(call), "backend": attn, "resolution": resolution,
                           "num_patches": (resolution // patch) ** 2, "latency_ms": 1e3 * latency,
                           "speedup_vs_dense": dense_latency / latency,
                           "peak_memory_mib": forward_peak_memory_mib(fns[(name, call)], device)}
                    rows.append(row)
                    print(f"speed {name:9s} {call:20s} {attn:17s} {resolution:5d} px  {row['latency_ms']:9.2f} ms  "
                          f"x{row['speedup_vs_dense']:5.2f} vs {dense}  peak {row['peak_memory_mib']:8.0f} MiB", flush=True)
            models.clear()
            torch.cuda.empty_cache()
    return rows


def fsdp_distillation(folder: str) -> list[dict]:
    """Two bf16 steps of each training script under FSDP 2 on every GPU of this machine (a tiny random DINOv2 teacher,
    tiny students, batch 2 per GPU): whether each exited 0 with finite losses and an export that loads."""
    import subprocess
    import tempfile

    from transformers import AutoModel

    teacher = os.path.join(folder, "teacher")
    torch.manual_seed(0)
    Dinov2WithRegistersModel(Dinov2WithRegistersConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2, patch_size=8, image_size=64,
        num_register_tokens=4)).save_pretrained(teacher)
    common = ["--teacher", teacher, "--data", "assets/photos", "--max-steps", "2", "--batch-size", "2",
              "--image-size", "64", "--checkpoint-every", "2", "--mixed-precision", "bf16", "--log-with", "none"]
    scripts = {
        "training.distill_veca": ["--config-overrides", json.dumps(TINY["veca"])],
        "training.distill_lookwhere": ["--selector-depth", "1", "--selector-image-size", "32", "--k-min", "4",
                                       "--k-max", "16"],
    }
    rows = []
    for script, extra in scripts.items():
        output = tempfile.mkdtemp(dir=folder)
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "training/configs/fsdp.yaml",
                   "--num_processes", str(torch.cuda.device_count()), "-m", script, *common, *extra,
                   "--output-dir", output, "--overwrite"]
        result = subprocess.run(command, capture_output=True, text=True)
        losses = []
        if os.path.exists(os.path.join(output, "metrics.jsonl")):
            with open(os.path.join(output, "metrics.jsonl")) as f:
                losses = [json.loads(line)["loss"] for line in f]
        loads = result.returncode == 0 and AutoModel.from_pretrained(os.path.join(output, "final"),
                                                                     trust_remote_code=True) is not None
        ok = result.returncode == 0 and len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
        rows.append({"script": script, "returncode": result.returncode, "losses": losses, "ok": ok and loads,
                     "stderr_tail": result.stderr[-2000:] if not ok else ""})
        print(f"fsdp distillation {script}: {'ok' if ok and loads else 'FAILED'} (exit {result.returncode}, "
              f"losses {losses})", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny models, agreement only")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per configuration (GPU)")
    parser.add_argument("--out", default="outputs/benchmarks/gpu.json")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but this torch sees no CUDA GPU; run on a GPU machine or pass --device cpu",
              file=sys.stderr)
        return 2
    print(f"device {args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else 'no GPU'}), "
          f"torch {torch.__version__}", flush=True)

    rows, skipped = [], []
    dtypes = [torch.float32, torch.bfloat16] if args.device == "cuda" else [torch.float32]
    if args.device != "cuda":
        skipped.append("bf16 agreement and all timings: need a CUDA GPU")
    for dtype in dtypes:
        for name in ("veca", "lookwhere"):
            found, reasons = agreement(name, args.device, dtype, args.quick)
            rows += found
            skipped += [r for r in reasons if r not in skipped]
    timings = speed(args.device, args.runs) if args.device == "cuda" and not args.quick else []
    distillation = []
    if args.device == "cuda":
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            distillation = fsdp_distillation(folder)
    else:
        skipped.append("FSDP distillation: needs CUDA GPUs (accelerate runs FSDP on GPUs only)")
    if args.device == "cuda" and args.quick:
        skipped.append("timings: --quick")
    for reason in skipped:
        print(f"skipped: {reason}")
    if args.device == "cuda" and not args.quick:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "agreement": rows,
                       "speed": timings, "distillation": distillation, "skipped": skipped}, f, indent=2)
        print(f"wrote {args.out}")
    failed = [r for r in rows + distillation if not r["ok"]]
    print(f"{len(rows) - len(failed)} of {len(rows)} agreement checks passed")
    if distillation:
        print(f"{sum(r['ok'] for r in distillation)} of {len(distillation)} FSDP distillation runs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
