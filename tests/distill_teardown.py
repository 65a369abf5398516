"""Does a two-process distillation always exit? Repeats a tiny 2-process CPU run and counts the ones that hang.

    python -m tests.distill_teardown              # from the repository root: 10 runs
    python -m tests.distill_teardown --runs 30

Each run is `accelerate launch --config_file training/configs/cpu_2proc.yaml -m tests.distill_hooks check-teardown`
(training.distill_veca) on a tiny random teacher and 8 random images, 4 steps; a run still alive --timeout seconds
after it started counts as hung (and is killed). Before the fix (training.loop drops the prepared model and
training.checkpointing `finish` frees the accelerator's before the process group goes down) about one run in six hung
at exit, in a race between two threads: counting hangs, six runs catch a revert of the fix only 1 - (5/6)^6 = 67% of
the time, and 99% would take 26 runs (about 8 minutes on 2 cores). The check-teardown hook instead fails every run
whose teardown could hang (exit status 3, one line on stderr): tests/test_training_teardown.py needs one run.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import TINY_VECA  # the tiny VECA of every command-line test

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds after which a run counts as hung")
    parser.add_argument("--scratch-dir", type=Path, default=ROOT / "outputs" / "distill_teardown")
    return parser.parse_args(argv)


def prepare(scratch: Path) -> tuple[Path, Path]:
    """A tiny random DINOv2 teacher and 8 random images in a fresh scratch folder."""
    import numpy as np
    import torch
    from PIL import Image
    from transformers import Dinov2Config, Dinov2Model

    marker = scratch / ".distill-teardown"
    if scratch.exists():
        if not marker.exists():
            raise SystemExit(f"error: {scratch} exists and was not made by this script; choose another --scratch-dir.")
        shutil.rmtree(scratch)
    (scratch / "images").mkdir(parents=True)
    marker.touch()
    torch.manual_seed(0)
    config = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, patch_size=8,
                          image_size=32)
    Dinov2Model(config).save_pretrained(scratch / "teacher")
    rng = np.random.default_rng(0)
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(scratch / "images" / f"{i}.jpg")
    return scratch / "teacher", scratch / "images"


def kill_workers(output_dir: Path) -> None:
    """Kills this run's workers (torchrun may start them in sessions of their own): the processes whose command line
    names the run's output folder."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(output_dir).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            continue


def main(argv=None) -> None:
    args = parse_args(argv)
    teacher, images = prepare(args.scratch_dir)
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    hung, failed, seconds = 0, 0, []
    for run in range(args.runs):
        output_dir = args.scratch_dir / f"run{run}"
        command = [
            sys.executable, "-m", "accelerate.commands.launch", "--config_file", "training/configs/cpu_2proc.yaml",
            "-m", "tests.distill_hooks", "check-teardown", "--teacher", str(teacher), "--data", str(images),
            "--output-dir", str(output_dir), "--config-overrides", TINY_VECA, "--image-size", "32", "--batch-size", "2",
            "--max-steps", "4", "--log-with", "none",
        ]
        start = time.perf_counter()
        # a session of its own, so that a hung launcher and its workers are killed together
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   start_new_session=True)
        try:
            _, stderr = process.communicate(timeout=args.timeout)
            outcome = "ok" if process.returncode == 0 else f"failed (exit {process.returncode})"
            failed += process.returncode != 0
            if process.returncode:  # the processes' one-line errors (the launcher's report follows them), or the tail
                text = stderr.decode(errors="replace")
                print("\n".join(line for line in text.splitlines() if line.startswith("error:")) or text[-2000:])
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            kill_workers(output_dir)
            process.wait()
            outcome, hung = "HUNG", hung + 1
        seconds.append(time.perf_counter() - start)
        print(f"  run {run + 1}/{args.runs}: {outcome}, {seconds[-1]:.1f} s, final/ exported: "
              f"{(output_dir / 'final' / 'model.safetensors').exists()}", flush=True)
    shutil.rmtree(args.scratch_dir)
    print(f"  {args.runs} runs: {hung} hung, {failed} failed (a shared machine: times vary)")


if __name__ == "__main__":
    main()
