"""The pilot that calibrates the sparse-recognition canvases: where does resolution decide the label?

    python -m benchmarks.task_pilot                     # the pilot of docs/tasks.md (make task-pilot runs it)
    python -m benchmarks.task_pilot --background photo  # the pilot of the canvases on photos
    python -m benchmarks.task_pilot --smoke --teacher TINY_DINOV2_FOLDER    # tiny sizes (the test)

For each (--strokes, --digit-sizes) setting: --train canvases of the single variant from seed --seed (1: the task's
runs use seed 0, so the pilot never sees their canvases, and it makes no test canvases at all), on --background (with
photo: crops of the training pool's photos alone, --extra-photos among them). The teacher runs once
per canvas at the canvas size and once at the size whose GFLOPs fit LookWhere's at k_ratio 0.1 (the teacher at equal
FLOPs), both cached (evaluation.teacher_passes). Each is read by both readers of the task (evaluation.readers), fitted
on all but the last --val canvases: the linear probe on [CLS ; mean patch] and the attentive probe on the tokens.
Printed and written: the validation accuracy of each reader at each weight decay (chance 0.1), and the choice:

- a setting qualifies when the dense teacher's best validation accuracy is at least --min-dense (0.5) and the teacher
  at equal FLOPs's best is at least --min-gap (0.15) below it;
- of those, the one of the largest gap (ties: the first listed); with none, no choice (the JSON says so).

Writes --out-dir/task_pilot.json (--background photo: task_pilot_photos.json).
"""

import argparse
import sys
import time
import types
from pathlib import Path

import torch

from benchmarks.common import restoring_threads
from corevision_hf import lookwhere_from_teacher
from corevision_hf.cli import HelpFormatter, run
from corevision_hf.measure import threads_to_use
from evaluation.canvases import photo_pool_record, task_splits
from evaluation.readers import attentive_probe, probe
from evaluation.task_arguments import (GCOMPRIS_PHOTOS, check_canvas_arguments, check_canvas_setting,
                                       check_extra_photos, check_folders)
from evaluation.task_student import SELECTOR_DEPTH, check_teacher, line_costs
from evaluation.teacher_passes import TeacherPasses, pass_record, tokens_of
from evaluation.teachers import load_teacher_model
from training.arguments import parse_seed
from training.checkpointing import write_json

ROOT = Path(__file__).resolve().parents[1]
# (strokes, digit size) of the pilots in docs/tasks.md, by background; on photos the clutter is the photo's, so no
# scribbles, and larger digits than on black, where the dense teacher read 28 px digits at 0.50, the rule's floor
SETTINGS = {"black": [(0, 28), (0, 35), (0, 42)], "photo": [(0, 28), (0, 42), (0, 56)]}
SMOKE = dict(canvas_size=112, settings=[(4, 14), (0, 14)], train=16, val=6, selector_size=28)
RESULTS = {"black": "task_pilot.json", "photo": "task_pilot_photos.json"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--teacher", default="offline-dinov2-small",
                        help="offline-dinov2-small, or a DINOv2 save_pretrained folder")
    parser.add_argument("--strokes", type=int, nargs="+", default=None,
                        help="scribble strokes per canvas (with --digit-sizes: every pair; default: the pilot's "
                             f"settings of --background {SETTINGS})")
    parser.add_argument("--digit-sizes", type=int, nargs="+", default=None, help="digit sizes in px")
    # the benchmark's own numbers (benchmarks.sparse_recognition): the readers see as many canvases as they will there
    parser.add_argument("--train", type=int, default=400, help="canvases per setting (validation included)")
    parser.add_argument("--val", type=int, default=80, help="of those, the last ones the readers are measured on")
    parser.add_argument("--seed", type=parse_seed, default=1, help="the canvases' seed (the task's runs use 0)")
    parser.add_argument("--canvas-size", type=int, default=518, help="canvas side in px, a multiple of 14")
    parser.add_argument("--background", default="black", choices=list(SETTINGS),
                        help="under the digits: black, or crops of the training pool's photos")
    parser.add_argument("--extra-photos", type=Path, default=GCOMPRIS_PHOTOS,
                        help="with --background photo: the folder of more photos the task's pools take theirs from")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--selector-size", type=int, default=154,
                        help="LookWhere's selector input in px: with k_ratio 0.1, what the equal-FLOPs size matches")
    parser.add_argument("--probe-decays", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2, 1e-1])
    parser.add_argument("--attentive-decays", type=float, nargs="+", default=[1e-3, 1e-1])
    parser.add_argument("--min-dense", type=float, default=0.5, help="the dense teacher's least validation accuracy")
    parser.add_argument("--min-gap", type=float, default=0.15,
                        help="the least gap between the dense teacher and the teacher at equal FLOPs")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: OMP_NUM_THREADS if set, else every core)")
    parser.add_argument("--smoke", action="store_true", help=f"tiny sizes: {SMOKE}")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "outputs" / "task_pilot", help="results folder")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / "outputs" / "task_cache",
                        help="the teacher's passes, kept between runs")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if (args.strokes is None) != (args.digit_sizes is None):
        parser.error("give --strokes and --digit-sizes together (every pair is a setting), or neither.")
    args.settings = (SETTINGS[args.background] if args.strokes is None
                     else [(strokes, size) for strokes in args.strokes for size in args.digit_sizes])
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    check_canvas_arguments(parser, args)
    for strokes, digit_size in args.settings:
        check_canvas_setting(parser, args.canvas_size, digit_size, strokes)
    check_folders(parser, args)
    if args.background == "photo":
        check_extra_photos(parser, args.extra_photos)
    return args


def main(argv=None) -> dict:
    """The pilot, called as a command or from Python; the caller's torch thread count is restored afterwards."""
    return restoring_threads(pilot, argv)


def readers(train: dict, labels: torch.Tensor, args) -> dict:
    """Each reader's validation accuracy at each decay, on a teacher pass of the pilot's canvases."""
    linear = probe(train["features"], labels, train["features"][:1], args.val, args.probe_decays)
    tokens = tokens_of(train)
    attentive = attentive_probe(tokens, labels, tokens[:1], args.val, args.attentive_decays, args.seed)
    return {name: {str(decay): score for decay, score in fit["val_accuracy"].items()}
            for name, fit in (("linear", linear), ("attentive", attentive))}


def measure_setting(args, passes: TeacherPasses, strokes: int, digit_size: int, equal_size: int) -> dict:
    """One setting's row: both readers of the teacher dense and at equal FLOPs, and the best of each."""
    canvases = types.SimpleNamespace(canvas_size=args.canvas_size, seed=args.seed, background=args.background,
                                     extra_photos=args.extra_photos, digit_size=digit_size, strokes=strokes,
                                     train=args.train, test=1)
    split = task_splits(canvases, "single")["train"]
    row = {"strokes": strokes, "digit_size": digit_size,
           **read_split(args, passes, split, {"dense": args.canvas_size, "equal_flops": equal_size})}
    row["gap"] = row["dense"]["best"] - row["equal_flops"]["best"]
    return row


def read_split(args, passes: TeacherPasses, split, sizes: dict) -> dict:
    """{line: both readers' validation accuracies and their best} of the teacher's pass of `split` at each
    {line: size}."""
    row = {}
    for line, size in sizes.items():
        scores = readers(pass_record(passes.get(split, split.key, size)), split.labels, args)
        row[line] = {"val_accuracy": scores, "best": max(max(s.values()) for s in scores.values())}
    return row


def choose(rows: list[dict], min_dense: float, min_gap: float) -> dict:
    """The setting of the largest gap among those that qualify (ties: the first listed), or none."""
    qualified = [row for row in rows if row["dense"]["best"] >= min_dense and row["gap"] >= min_gap]
    rule = (f"the dense teacher's best validation accuracy >= {min_dense} and the teacher at equal FLOPs's >= "
            f"{min_gap} below it; of those, the largest gap (ties: the first listed)")
    if not qualified:
        return {"rule": rule, "chosen": None}
    best = max(qualified, key=lambda row: (row["gap"], -rows.index(row)))
    return {"rule": rule, "chosen": {"strokes": best["strokes"], "digit_size": best["digit_size"]}}


def pilot(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(threads_to_use(args.threads))
    teacher, source = load_teacher_model(args.teacher)
    check_teacher(teacher)
    student = lookwhere_from_teacher(teacher, selector_depth=SELECTOR_DEPTH, selector_image_size=args.selector_size)
    _, equal_size = line_costs(args, teacher, student)
    passes = TeacherPasses(args.cache_dir, teacher, args.batch_size)
    started, rows = time.perf_counter(), []
    print(f"teacher {source}; {args.train} canvases per setting, the last {args.val} for validation, seed {args.seed};"
          f" the teacher at {args.canvas_size} px and at {equal_size} px (equal FLOPs); best validation accuracy of "
          "each reader (chance 0.1)", flush=True)
    for strokes, digit_size in args.settings:
        rows.append(measure_setting(args, passes, strokes, digit_size, equal_size))
        print(f"  strokes {strokes:3d}, digits {digit_size:3d} px: "
              + "; ".join(f"{line} " + "  ".join(f"{reader} {max(scores.values()):.3f}"
                                                  for reader, scores in rows[-1][line]["val_accuracy"].items())
                          for line in ("dense", "equal_flops"))
              + f"; gap {rows[-1]['gap']:+.3f} ({time.perf_counter() - started:.0f} s so far)", flush=True)
    choice = choose(rows, args.min_dense, args.min_gap)
    print(f"  chosen: {choice['chosen']} ({choice['rule']})", flush=True)
    report = {"teacher": source, "rows": rows, "choice": choice, "train": args.train, "validation": args.val,
              "seed": args.seed, "canvas_size": args.canvas_size, "background": args.background,
              **({"photos": photo_pool_record(args.extra_photos, ("train",))} if args.background == "photo" else {}),
              "equal_flops_size": equal_size,
              "probe_decays": args.probe_decays, "attentive_decays": args.attentive_decays,
              "command": f"python -m benchmarks.task_pilot {' '.join(args.argv)}".strip(),
              "total_time_s": time.perf_counter() - started}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(str(args.out_dir / RESULTS[args.background]), report)
    print(f"  wrote {args.out_dir / RESULTS[args.background]}", flush=True)
    return report


if __name__ == "__main__":
    sys.exit(run(main))
