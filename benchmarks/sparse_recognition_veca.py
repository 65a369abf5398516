"""VECA on the sparse-recognition task: what each core budget keeps, from a pretrained ViT and from scratch.

    python -m benchmarks.sparse_recognition_veca            # make tasks-veca: the committed run (docs/tasks.md)
    python -m benchmarks.sparse_recognition_veca --quick    # a smaller look: results under outputs/tasks_veca_quick/
    python -m benchmarks.sparse_recognition_veca --smoke --teacher TINY_DINOV2_FOLDER    # tiny sizes (the test)

The task, the teacher's pass, the frozen-probe protocol and the bootstrap are benchmarks.sparse_recognition's:
1. Canvases of --variants (518 px; by default 56 px digits without scribbles, see DIGIT_SIZE); the teacher once per
   canvas at full resolution, its [CLS ; mean patch] features and its CLS and patch tokens (the students' targets).
2. Two students distilled label-free on the training canvases of every variant by training.loop's `distill` with
   VECA's recipe (training.distill_veca: its loss, lr and weight decay; one core budget per step drawn from
   --cores by nested dropout), the same --steps each: VECA from the teacher (`veca_from_teacher`: the teacher's
   shapes and weights, a new bank of max(--cores) cores) and VECA-Ti from scratch (--scratch-width / -depth / -heads,
   an output projection to the teacher's width).
3. Lines, features = [pooled ; mean patch token]: each student at every C of --cores, and the teacher dense at the
   canvas size and at the largest 14 px multiple whose GFLOPs fit VECA from the teacher at the largest C (equal
   FLOPs). Frozen features + a linear probe, its weight decay chosen on the last --val training canvases. On the
   first variant, VECA from the teacher also fine-tuned end to end at --finetune-cores (sparse_recognition's
   protocol: the head starts from the probe's, the epoch is chosen on the validation canvases).
4. Accuracy on the test canvases with 95% bootstrap intervals (paired for differences and ratios), GFLOPs
   (corevision_hf.veca_flops, analytic), ms per canvas (batch 1, alternated, --threads threads); the goals on the
   first of --variants, met or missed.

Writes --out-dir/sparse_recognition_veca.json and sparse_recognition_veca_card.json (VECA from the teacher's
per-budget task table, which `evaluation.evaluate_budgets --task-table` puts on its model card; make tasks-veca does);
the students' runs go to --scratch-dir (replaced).
"""

import argparse
import copy
import os
import platform
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the training package is importable from the repository root only
    sys.exit("error: from the repository root run: python -m benchmarks.sparse_recognition_veca "
             f"{' '.join(sys.argv[1:])}")

import torch  # noqa: E402

import corevision_hf  # noqa: E402
from corevision_hf import VecaConfig, VecaModel, veca_flops, veca_from_teacher  # noqa: E402
from corevision_hf.agreement import teacher_flops  # noqa: E402
from corevision_hf.cli import HelpFormatter, error_line  # noqa: E402
from corevision_hf.measure import alternated_latency, threads_to_use  # noqa: E402
from evaluation.sparse_digits import CELL  # noqa: E402
from evaluation.where_check import bootstrap_rows, interval  # noqa: E402
from publishing.model_card import TASK_TABLE_FORMAT  # noqa: E402
from training.arguments import training_parser  # noqa: E402
from training.checkpointing import write_json  # noqa: E402
from training.data import DataStats  # noqa: E402
from training.loop import distill, start  # noqa: E402
from training.losses import veca_loss  # noqa: E402
from training.schedule import draw  # noqa: E402

from .common import restoring_threads  # noqa: E402
from .distill_quality import equal_flops_resolution, load_teacher_model  # noqa: E402
from .sparse_recognition import (DENSE, EQUAL, VARIANTS, CanvasDataset, FineTuned, Measure,  # noqa: E402
                                 add_task_arguments, finish_task_arguments, ratio_interval, resized, task_splits,
                                 teacher_pass)

ROOT = Path(__file__).resolve().parents[1]
FROM_TEACHER = "VECA from teacher"
FROM_SCRATCH = "VECA-Ti from scratch"
CORES = (4, 8, 16, 32, 64)
# Digits of 56 px and no scribbles: the 28 px digits among scribbles of benchmarks.sparse_recognition leave the dense
# teacher's probe at chance, so no VECA goal could be decided there. Chosen by a pilot on seed 1's training canvases
# (validation accuracy only; docs/tasks.md), the run's seed 0 untouched.
DIGIT_SIZE, STROKES = 56, 0
CLASSES = 10  # digits 0-9: chance is 1 / CLASSES
CARD_TABLE = "sparse_recognition_veca_card.json"  # VECA from the teacher's task table, for its model card
RETENTION_CORES = (8, 64)  # veca_retention_c8: accuracy at C = 8 over accuracy at C = 64 (the paper's claim)
QUICK = dict(variants=["single"], train=24, val=8, test=16, steps=4, batch_size=4, cores=[8, 64], bootstrap=500,
             latency_runs=1, out_dir=ROOT / "outputs" / "tasks_veca_quick",
             scratch_dir=ROOT / "outputs" / "tasks_veca_quick" / "runs")
SMOKE = dict(variants=["single"], canvas_size=112, digit_size=14, strokes=4, train=16, val=6, test=8, steps=2,
             batch_size=4, cores=[8, 64], finetune_epochs=1, scratch_width=32, scratch_depth=2, scratch_heads=2,
             bootstrap=50, latency_runs=1)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    add_task_arguments(parser, digit_size=DIGIT_SIZE, strokes=STROKES)
    parser.add_argument("--variants", nargs="+", default=["single"], choices=VARIANTS,
                        help="task variants measured; the goals are the first one's")
    parser.add_argument("--cores", type=int, nargs="+", default=list(CORES),
                        help="core budgets trained (nested dropout) and measured; the bank holds the largest")
    parser.add_argument("--steps", type=int, default=100,
                        help="distillation steps of each student (the same); 0: both measured untrained, the "
                             "reference line of a trained run")
    parser.add_argument("--lr", type=float, default=4e-4, help="peak learning rate (training.distill_veca's)")
    parser.add_argument("--scratch-width", type=int, default=192, help="the from-scratch student's width (ViT-Ti)")
    parser.add_argument("--scratch-depth", type=int, default=12, help="its layers")
    parser.add_argument("--scratch-heads", type=int, default=3, help="its attention heads")
    parser.add_argument("--finetune-cores", type=int, default=8,
                        help="the budget at which VECA from the teacher is also fine-tuned (one of --cores)")
    parser.add_argument("--quick", action="store_true", help=f"a smaller look: {QUICK}")
    parser.add_argument("--smoke", action="store_true", help=f"tiny sizes: {SMOKE}")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "outputs" / "sparse_recognition_veca",
                        help="results folder (make tasks-veca gives benchmarks/results)")
    parser.add_argument("--scratch-dir", type=Path, default=ROOT / "outputs" / "sparse_recognition_veca_scratch",
                        help="the students' training runs (replaced)")
    args = finish_task_arguments(parser, argv, {"quick": QUICK, "smoke": SMOKE},
                                 counts=("scratch_width", "scratch_depth", "scratch_heads"))
    if args.steps < 0:
        parser.error(f"--steps {args.steps} must be at least 0 (0: the students untrained).")
    args.cores = sorted(set(args.cores))
    if args.cores[0] < 1:
        parser.error(f"--cores {args.cores}: core budgets are at least 1.")
    if args.finetune_cores not in args.cores:
        parser.error(f"--finetune-cores {args.finetune_cores} is not one of --cores {args.cores}.")
    return args


def line_name(model_name: str, num_cores: int) -> str:
    return f"{model_name} C={num_cores}"


# ---------------------------------------------------------------------------------------------------- the students


def new_students(args, teacher) -> dict:
    """{name: untrained VecaModel}: from the teacher's weights, and a ViT-Ti from scratch; both with a bank of
    max(--cores) cores, nested dropout over --cores (the budgets measured, so none is measured untrained)."""
    budgets = dict(num_cores=args.cores[-1], training_budgets=args.cores, image_size=args.canvas_size)
    torch.manual_seed(args.seed)
    from_teacher = veca_from_teacher(teacher, **budgets).float()
    width = teacher.config.hidden_size
    torch.manual_seed(args.seed)
    scratch = VecaModel(VecaConfig(
        hidden_size=args.scratch_width, num_hidden_layers=args.scratch_depth, num_attention_heads=args.scratch_heads,
        intermediate_size=int(args.scratch_width * 2.66667), patch_size=teacher.config.patch_size,
        output_projection_size=width if width != args.scratch_width else None, **budgets))
    return {FROM_TEACHER: from_teacher, FROM_SCRATCH: scratch}


def distil_student(args, name: str, student, teacher, train: list, targets: list[dict], threads: int):
    """`student` distilled label-free on the canvases `train` against the teacher's cached tokens (`targets`,
    parallel to `train`) by training.loop's `distill` with VECA's loss and nested dropout; returns the trained model
    (float32, eval) reloaded from its export."""
    config = student.config
    cls = torch.cat([t["cls"] for t in targets])
    patches = torch.cat([t["patches"] for t in targets])
    output_dir = args.scratch_dir / name.replace(" ", "_")
    # training.distill_veca's recipe: min_lr 5e-5 at its lr 4e-4, weight decay 0.015
    run_args = training_parser(__doc__, lr=args.lr, min_lr=args.lr / 8, weight_decay=0.015).parse_args([
        "--teacher", args.teacher, "--data", "sparse-recognition canvases", "--output-dir", str(output_dir),
        "--overwrite", "--batch-size", str(args.batch_size), "--max-steps", str(args.steps),
        "--warmup-steps", str(max(1, args.steps // 10)), "--checkpoint-every", str(args.steps),
        "--keep-checkpoints", "1", "--log-with", "none", "--seed", str(args.seed), "--num-workers", "0",
        "--log-every", str(max(1, args.steps // 5)),
    ])
    accelerator = start(run_args, "benchmarks.sparse_recognition_veca")

    def loss_fn(model, batch, step_draws):
        index, num_cores = batch["index"], step_draws["num_cores"]
        output = model(batch["pixel_values"], num_cores=num_cores)
        return veca_loss(output.pooler_output, output.last_hidden_state[:, num_cores:], cls[index],
                         patches[index].float())

    stats = DataStats()
    distill(accelerator, run_args, "benchmarks.sparse_recognition_veca", student, teacher,
            CanvasDataset(train, stats), stats,
            lambda step: {"num_cores": draw(config.training_budgets, config.training_budget_weights, args.seed,
                                            step)}, loss_fn)
    torch.set_num_threads(threads)  # the loop's start may set its own
    return VecaModel.from_pretrained(str(output_dir / "final")).float().eval()


def pooled_and_mean_patch(model, pixels: torch.Tensor, num_cores: int) -> torch.Tensor:
    """(B, 2D) [pooled ; mean patch token] of a VECA at `num_cores` cores: the features every line is probed on."""
    output = model(pixels, num_cores=num_cores)
    return torch.cat([output.pooler_output, output.last_hidden_state[:, num_cores:].mean(1)], -1).float()


@torch.inference_mode()
def veca_features(model, split, num_cores: int, batch_size: int) -> torch.Tensor:
    """(N, 2D) `pooled_and_mean_patch` of a VECA at `num_cores` cores on every canvas of `split`."""
    return torch.cat([pooled_and_mean_patch(model, pixels, num_cores) for _, pixels in split.batches(batch_size)])


# ---------------------------------------------------------------------------------------------------- the run


def main(argv=None) -> dict:
    """The benchmark, called as a command or from Python; the caller's torch thread count is restored afterwards."""
    return restoring_threads(benchmark, argv)


def benchmark(argv=None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    threads = threads_to_use(args.threads)
    torch.set_num_threads(threads)

    def progress(line: str) -> None:
        print(f"{line} ({time.perf_counter() - started:.0f} s so far)", flush=True)

    try:
        teacher, source = load_teacher_model(args.teacher)
    except (ValueError, OSError) as error:
        raise SystemExit(error_line(error)) from None
    print(f"torch {torch.__version__}, {threads} threads; teacher {source}; variants {', '.join(args.variants)}, each "
          f"{args.train} training ({args.val} of them validation) and {args.test} test canvases of {args.canvas_size} "
          f"px; cores {args.cores}", flush=True)

    progress("1/5 canvases, and the teacher at full resolution on each")
    splits = {variant: task_splits(args, variant) for variant in args.variants}
    teacher_out = {}
    for variant in args.variants:
        for split_name, split in splits[variant].items():
            teacher_out[variant, split_name] = teacher_pass(teacher, split, args.batch_size,
                                                            keep_patches=split_name == "train")
            progress(f"    {variant} {split_name}: {len(split)} canvases")

    students, training = train_students(args, teacher, splits, teacher_out, threads, progress)
    measured, fine_tuned, equal_size = measure_lines(args, teacher, students, splits, teacher_out, progress)
    progress(f"5/5 latency per canvas, batch 1, {threads} threads")
    latency = measure_latency(args, teacher, students, splits[args.variants[0]]["test"], equal_size)
    report = build_report(args, measured, fine_tuned, latency)
    report.update(teacher=source, teacher_equal_flops_size=equal_size,
                  teacher_equal_flops_to=line_name(FROM_TEACHER, args.cores[-1]), students=training,
                  command=f"python -m benchmarks.sparse_recognition_veca {' '.join(args.argv)}".strip(),
                  environment={"torch": torch.__version__, "corevision_hf": corevision_hf.__version__,
                               "threads": threads, "cpu_count": os.cpu_count(), "machine": platform.machine(),
                               "load_average_at_end": os.getloadavg() if hasattr(os, "getloadavg") else None},
                  args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "argv"},
                  total_time_s=time.perf_counter() - started)
    print_tables(report)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(str(args.out_dir / "sparse_recognition_veca.json"), report)
    write_json(str(args.out_dir / CARD_TABLE), task_table(report))
    print(f"  wrote {args.out_dir / 'sparse_recognition_veca.json'} and {CARD_TABLE}; total "
          f"{report['total_time_s'] / 60:.1f} min", flush=True)
    return report


def train_students(args, teacher, splits: dict, teacher_out: dict, threads: int, progress) -> tuple[dict, dict]:
    """Both students distilled on the training canvases of every variant: ({name: trained model}, {name: record})."""
    students, training = {}, {}
    for step, (name, untrained) in enumerate(new_students(args, teacher).items(), start=2):
        train_started = time.perf_counter()
        if args.steps == 0:  # the untrained start, the reference line of a trained run
            progress(f"{step}/5 {name}: untrained (--steps 0)")
            students[name] = untrained.float().eval()
        else:
            progress(f"{step}/5 {name} distilled label-free on the {len(args.variants) * args.train} training "
                     f"canvases, {args.steps} steps")
            students[name] = distil_student(args, name, untrained, teacher,
                                            [splits[v]["train"] for v in args.variants],
                                            [teacher_out[v, "train"] for v in args.variants], threads)
        training[name] = {"steps": args.steps, "train_time_s": time.perf_counter() - train_started, "lr": args.lr,
                          "batch_size": args.batch_size, "training_budgets": students[name].config.training_budgets,
                          "parameters": sum(p.numel() for p in students[name].parameters()),
                          **({"init_from_teacher": students[name].config.init_from_teacher}
                             if name == FROM_TEACHER else {})}
    return students, training


def measure_lines(args, teacher, students: dict, splits: dict, teacher_out: dict, progress
                  ) -> tuple[dict, dict, int]:
    """Per variant, sparse_recognition's Measure with the teacher's two lines and each student's at every C of
    --cores, and VECA from the teacher fine-tuned at --finetune-cores on the first variant; returns ({variant:
    Measure}, {fine-tuned line: its result}, the equal-FLOPs teacher's size in px: VECA from the teacher at the
    largest C)."""
    size = args.canvas_size
    gflops = {line_name(name, c): veca_flops(model.config, size, num_cores=c) / 1e9
              for name, model in students.items() for c in args.cores}
    costs = {"dense": teacher_flops(teacher, size, size) / 1e9}
    equal_size = equal_flops_resolution(teacher, gflops[line_name(FROM_TEACHER, args.cores[-1])], size)
    costs["equal"] = teacher_flops(teacher, equal_size, equal_size) / 1e9
    progress(f"4/5 the lines on each variant (the teacher at equal FLOPs runs at {equal_size} px)")
    measured = {}
    for variant in args.variants:
        task = Measure(args, variant, splits[variant], teacher_out, costs, equal_size)
        task.teacher_lines(teacher)
        progress(f"    {variant}: the teacher dense and at equal FLOPs")
        for name, model in students.items():
            for c in args.cores:
                task.add(line_name(name, c), veca_features(model, task.train, c, args.batch_size),
                         veca_features(model, task.test, c, args.batch_size), gflops[line_name(name, c)],
                         num_cores=c)
                progress(f"    {variant}: {line_name(name, c)}")
        measured[variant] = task
    first = measured[args.variants[0]]
    name = line_name(FROM_TEACHER, args.finetune_cores)
    progress(f"    {args.variants[0]}: {name} fine-tuned ({args.finetune_epochs} epochs)")
    fine_tuned = {name: fine_tune_line(first, students[FROM_TEACHER], args.finetune_cores, gflops[name])}
    return measured, fine_tuned, equal_size


def fine_tune_line(task: Measure, student, num_cores: int, gflops: float) -> dict:
    """The fine-tuning protocol (sparse_recognition's `finetune`): a copy of `student` and the head of its probe at
    `num_cores`, trained end to end at that budget; the epoch (0: the probe's head) chosen on the validation
    canvases."""
    backbone = copy.deepcopy(student).train().requires_grad_(True)
    head = task.heads[line_name(FROM_TEACHER, num_cores)]
    return task.finetuned(FineTuned(lambda model, rows, pixels, seed: pooled_and_mean_patch(model, pixels, num_cores),
                                    backbone, head), gflops)


def measure_latency(args, teacher, students: dict, split, equal_size: int) -> dict:
    """ms per canvas, batch 1, alternated runs (corevision_hf.measure): the teacher dense and at equal FLOPs (its
    resize included), each student at every C."""
    pixels = split.pixels(slice(0, 1))
    fns = {DENSE: lambda: teacher(pixels), EQUAL: lambda: teacher(resized(pixels, equal_size)),
           **{line_name(name, c): (lambda m=model, c=c: m(pixels, num_cores=c))
              for name, model in students.items() for c in args.cores}}
    return alternated_latency(fns, "cpu", args.latency_runs, warmup=1)


# ---------------------------------------------------------------------------------------------------- the report


def build_report(args, measured: dict, fine_tuned: dict, latency: dict) -> dict:
    """The JSON: per variant the probe lines (accuracy with its 95% interval, GFLOPs, ms per canvas), each student's
    retention at C = 8 of its largest C and the paired comparisons; on the first variant the fine-tuned line and its
    difference from its probe; the goals."""
    report = {"task": {"variants": args.variants, "canvas_size": args.canvas_size, "cell": CELL,
                       "digit_size": args.digit_size, "strokes": args.strokes, "background": args.background,
                       "train": args.train, "validation": args.val, "test": args.test, "seed": args.seed},
              "cores": args.cores, "variants": {}}
    low_c, full_c = RETENTION_CORES[0], args.cores[-1]
    for variant, task in measured.items():
        rows = bootstrap_rows(len(task.test), args.bootstrap, args.seed)
        lines = task.lines
        probe_rows = {name: {"accuracy": interval(line["correct"], rows), "gflops": line["gflops"],
                             "ms_per_canvas": latency.get(name, {}).get("latency_ms"),
                             **{key: line[key] for key in ("weight_decay", "num_cores", "size") if key in line}}
                      for name, line in lines.items()}
        retention = {name: ratio_interval(lines[line_name(name, low_c)]["correct"],
                                          lines[line_name(name, full_c)]["correct"], rows)
                     for name in (FROM_TEACHER, FROM_SCRATCH) if line_name(name, low_c) in lines}
        teacher_full, scratch_full = line_name(FROM_TEACHER, full_c), line_name(FROM_SCRATCH, full_c)
        comparisons = {f"{teacher_full} - {other}": interval(lines[teacher_full]["correct"] - lines[other]["correct"],
                                                             rows) for other in (DENSE, EQUAL, scratch_full)}
        report["variants"][variant] = {"probe": probe_rows, f"retention_c{low_c}": retention,
                                       "comparisons": comparisons}
        if variant == args.variants[0]:
            report["variants"][variant]["fine_tuned"] = {
                name: {"accuracy": interval(line["correct"], rows), "gflops": line["gflops"],
                       "ms_per_canvas": latency.get(name, {}).get("latency_ms"), "epoch": line["epoch"],
                       "val_accuracy": line["val_accuracy"], "train_time_s": line["train_time_s"],
                       "fine-tuned - probe": interval(line["correct"] - lines[name]["correct"], rows)}
                for name, line in fine_tuned.items()}
    report["goals"] = goals(report, args.variants[0])
    return report


def goals(report: dict, variant: str) -> list[dict]:
    """The issue's goals on `variant`, each met or missed, with the numbers that decide it."""
    result, full_c = report["variants"][variant], report["cores"][-1]
    low_c = RETENTION_CORES[0]
    retention = result[f"retention_c{low_c}"].get(FROM_TEACHER)
    teacher_full, scratch_full = line_name(FROM_TEACHER, full_c), line_name(FROM_SCRATCH, full_c)
    veca, dense = result["probe"][teacher_full], result["probe"][DENSE]
    versus_scratch = result["comparisons"][f"{teacher_full} - {scratch_full}"]
    # A ratio to, or a tie with, a line at chance says nothing: both goals need their reference above chance (the
    # lower end of its 95% interval above 1 / CLASSES), else they are missed as undecided.
    veca_above_chance = veca["accuracy"]["low"] > 1 / CLASSES
    dense_above_chance = dense["accuracy"]["low"] > 1 / CLASSES
    return [
        {"goal": "veca_retention_c8", "variant": variant,
         "met": retention is not None and full_c == RETENTION_CORES[1] and veca_above_chance
         and retention["ratio"] >= 0.96,
         "rule": f"{FROM_TEACHER}: frozen-probe accuracy at C = {low_c} / at C = {RETENTION_CORES[1]} >= 0.96, the "
                 f"C = {RETENTION_CORES[1]} line above chance",
         "value": {"ratio": retention, "largest_cores": full_c, "above_chance": veca_above_chance}},
        {"goal": "veca_vs_dense_teacher", "variant": variant,
         "met": dense_above_chance and veca["accuracy"]["mean"] >= dense["accuracy"]["mean"] - 0.05
         and veca["gflops"] < dense["gflops"],
         "rule": f"{teacher_full}: frozen-probe accuracy within 5 points of the dense teacher's (or above), at fewer "
                 "GFLOPs, the dense teacher above chance",
         "value": {"veca": veca["accuracy"], "teacher_dense": dense["accuracy"], "veca_gflops": veca["gflops"],
                   "teacher_dense_gflops": dense["gflops"], "teacher_dense_above_chance": dense_above_chance,
                   "difference": result["comparisons"][f"{teacher_full} - {DENSE}"]}},
        {"goal": "veca_from_teacher_vs_scratch", "variant": variant,
         "met": versus_scratch["mean"] > 2 * versus_scratch["half_width"],
         "rule": f"{teacher_full} - {scratch_full} (same steps): frozen-probe accuracy difference > 2 x its 95% "
                 "half-width", "value": versus_scratch},
    ]


def task_table(report: dict) -> dict:
    """The per-budget table of VECA from the teacher on the first variant, for its model card
    (publishing.model_card's TASK_TABLE_FORMAT; evaluation.evaluate_budgets --task-table puts it on the card)."""
    variant = report["task"]["variants"][0]
    result, full_c, size = report["variants"][variant], report["cores"][-1], report["task"]["canvas_size"]
    probe, low_c = result["probe"], RETENTION_CORES[0]
    full_accuracy = probe[line_name(FROM_TEACHER, full_c)]["accuracy"]["mean"]

    def cells(name: str, row: dict, of_full: str) -> list[str]:
        accuracy, ms = row["accuracy"], row["ms_per_canvas"]
        return [name, f"{row['gflops']:.1f}", "—" if ms is None else f"{ms:.0f}",
                f"{accuracy['mean']:.3f} [{accuracy['low']:.3f}, {accuracy['high']:.3f}]", of_full]

    rows = []
    for c in report["cores"]:
        row = probe[line_name(FROM_TEACHER, c)]
        if c == low_c and FROM_TEACHER in result[f"retention_c{low_c}"]:
            entry = result[f"retention_c{low_c}"][FROM_TEACHER]
            of_full = f"{entry['ratio']:.2f} [{entry['low']:.2f}, {entry['high']:.2f}]"
        else:
            of_full = f"{row['accuracy']['mean'] / full_accuracy:.2f}" if full_accuracy else "—"
        rows.append(cells(f"{c} cores, frozen + linear probe", row, of_full))
    for name, row in result.get("fine_tuned", {}).items():
        rows.append(cells(f"{name.split('C=')[-1]} cores, fine-tuned", row, "—"))
    rows.append(cells(f"the teacher, dense at {size} px, frozen + linear probe", probe[DENSE], "—"))
    rows.append(cells(f"the teacher at {report['teacher_equal_flops_size']} px (the GFLOPs of {full_c} cores), "
                      "frozen + linear probe", probe[EQUAL], "—"))
    task, steps = report["task"], report["students"][FROM_TEACHER]["steps"]
    caption = (
        f"The sparse-recognition task of corevision_hf's docs/tasks.md ({variant} variant): name the digit on a "
        f"{size} px canvas ({task['digit_size']} px digits, {task['strokes']} scribble strokes, background "
        f"{task['background']}); "
        f"{task['train']} training canvases ({task['validation']} of them choose the probe's weight decay and the "
        f"fine-tuned epoch) and {task['test']} test canvases, chance 0.1. Accuracy on the test canvases with its 95% "
        f"bootstrap interval; \"of {full_c} cores\": accuracy over that at {full_c} cores (at {low_c} cores with its "
        f"paired interval). Features: [pooled ; mean patch token]. This checkpoint was made from its teacher "
        + (f"(`veca_from_teacher`) and distilled label-free for {steps} steps on the training canvases only, so the "
           "agreement table above (photos) is off its training distribution. " if steps else
           "(`veca_from_teacher`) and not trained (its untrained start). ")
        + f"GFLOPs analytic; ms per canvas at batch 1, {report['environment']['threads']} threads, "
        f"{report['environment']['machine']} CPU, median of {report['args']['latency_runs']} alternated runs. "
        f"Reproduce: `{report['command']}`.")
    return {"format": TASK_TABLE_FORMAT, "title": "On a task: sparse recognition, per budget",
            "caption": caption, "header": ["budget", f"GFLOPs @ {size} px", "ms / canvas",
                                            "accuracy [95%]", f"of {full_c} cores"], "rows": rows}


def print_tables(report: dict) -> None:
    for variant, result in report["variants"].items():
        print(f"\n  {variant}: test accuracy [95% interval]   GFLOPs   ms/canvas")
        for name, row in result["probe"].items():
            accuracy, ms = row["accuracy"], row["ms_per_canvas"]
            print(f"    {name:32s} {accuracy['mean']:.3f} [{accuracy['low']:.3f}, {accuracy['high']:.3f}]   "
                  f"{row['gflops']:7.2f}   {'' if ms is None else format(ms, '.0f')}")
        for name, entry in result[f"retention_c{RETENTION_CORES[0]}"].items():
            print(f"    {name} retention C={RETENTION_CORES[0]} / C={report['cores'][-1]}: {entry['ratio']:.3f} "
                  f"[{entry['low']:.3f}, {entry['high']:.3f}]")
        for name, row in result.get("fine_tuned", {}).items():
            accuracy, difference = row["accuracy"], row["fine-tuned - probe"]
            print(f"    {name} fine-tuned (epoch {row['epoch']}): {accuracy['mean']:.3f} [{accuracy['low']:.3f}, "
                  f"{accuracy['high']:.3f}]; minus its probe {difference['mean']:+.3f} [{difference['low']:+.3f}, "
                  f"{difference['high']:+.3f}]")
        for name, entry in result["comparisons"].items():
            print(f"    {name}: {entry['mean']:+.3f} [{entry['low']:+.3f}, {entry['high']:+.3f}]")
    print()
    for goal in report["goals"]:
        print(f"  {'met   ' if goal['met'] else 'MISSED'} {goal['goal']}: {goal['rule']}")


if __name__ == "__main__":
    main()
