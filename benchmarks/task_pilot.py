"""The pilot that chose sparse_recognition_veca's canvases: can the dense teacher read the digits at all?

    python -m benchmarks.task_pilot                     # the pilot of docs/tasks.md (about 8 minutes, 2 threads)
    python -m benchmarks.task_pilot --smoke --teacher TINY_DINOV2_FOLDER    # tiny sizes (the test)

For each (--strokes, --digit-sizes) setting: --train canvases of the single variant from seed --seed (1: the task's
runs use seed 0, so the pilot never sees their canvases, and it makes no test canvases at all), the teacher once per
canvas at full resolution, and the frozen-feature probe of benchmarks.sparse_recognition fit on all but the last --val
canvases. Printed and written: the validation accuracy at each of the probe's weight decays, for the teacher's CLS,
its mean patch token and both ([CLS ; mean patch], the task's features). Chance is 0.1.

Writes --out-dir/task_pilot.json.
"""

import argparse
import sys
import time
import types
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the training package is importable from the repository root only
    sys.exit(f"error: from the repository root run: python -m benchmarks.task_pilot {' '.join(sys.argv[1:])}")

import torch  # noqa: E402

from corevision_hf.cli import HelpFormatter, error_line  # noqa: E402
from corevision_hf.measure import threads_to_use  # noqa: E402
from training.checkpointing import write_json  # noqa: E402

from .common import restoring_threads  # noqa: E402
from .distill_quality import load_teacher_model  # noqa: E402
from .sparse_recognition import check_canvas_arguments, probe, task_splits, teacher_pass  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = [(50, 28), (50, 56), (50, 84), (0, 28), (0, 56)]  # (strokes, digit size) of the pilot in docs/tasks.md
SMOKE = dict(canvas_size=112, settings=[(4, 14), (0, 14)], train=16, val=6)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--teacher", default="offline-dinov2-small",
                        help="offline-dinov2-small, or a DINOv2 save_pretrained folder")
    parser.add_argument("--strokes", type=int, nargs="+", default=None,
                        help="scribble strokes per canvas (with --digit-sizes: every pair; default: the pilot's "
                             f"settings {SETTINGS})")
    parser.add_argument("--digit-sizes", type=int, nargs="+", default=None, help="digit sizes in px")
    parser.add_argument("--train", type=int, default=120, help="canvases per setting (validation included)")
    parser.add_argument("--val", type=int, default=40, help="of those, the last ones the probe is measured on")
    parser.add_argument("--seed", type=int, default=1, help="the canvases' seed (the task's runs use 0)")
    parser.add_argument("--canvas-size", type=int, default=518, help="canvas side in px, a multiple of 14")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--probe-decays", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2, 1e-1])
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: OMP_NUM_THREADS if set, else every core)")
    parser.add_argument("--smoke", action="store_true", help=f"tiny sizes: {SMOKE}")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "outputs" / "task_pilot", help="results folder")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if (args.strokes is None) != (args.digit_sizes is None):
        parser.error("give --strokes and --digit-sizes together (every pair is a setting), or neither.")
    args.settings = (SETTINGS if args.strokes is None
                     else [(strokes, size) for strokes in args.strokes for size in args.digit_sizes])
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    check_canvas_arguments(parser, args)
    return args


def main(argv=None) -> dict:
    """The pilot, called as a command or from Python; the caller's torch thread count is restored afterwards."""
    return restoring_threads(pilot, argv)


def pilot(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(threads_to_use(args.threads))
    try:
        teacher, source = load_teacher_model(args.teacher)
    except (ValueError, OSError) as error:
        raise SystemExit(error_line(error)) from None
    width = teacher.config.hidden_size
    features = {"cls": slice(0, width), "mean patch": slice(width, 2 * width), "both": slice(0, 2 * width)}
    started, rows = time.perf_counter(), []
    print(f"teacher {source}; {args.train} canvases per setting, the last {args.val} for validation, seed {args.seed}; "
          "validation accuracy of the probe (chance 0.1) at each weight decay", flush=True)
    for strokes, digit_size in args.settings:
        canvases = types.SimpleNamespace(canvas_size=args.canvas_size, seed=args.seed, background="black",
                                         digit_size=digit_size, strokes=strokes, train=args.train, test=1)
        try:
            split = task_splits(canvases, "single")["train"]
        except ValueError as error:
            raise SystemExit(error_line(error)) from None
        both = teacher_pass(teacher, split, args.batch_size, keep_patches=False)["features"]
        for name, part in features.items():
            scores = probe(both[:, part], split.labels, both[:1, part], args.val, args.probe_decays)["val_accuracy"]
            rows.append({"strokes": strokes, "digit_size": digit_size, "features": name,
                         "val_accuracy": {str(decay): score for decay, score in scores.items()},
                         "best": max(scores.values())})
            print(f"  strokes {strokes:3d}, digits {digit_size:3d} px, {name:10s}: "
                  + "  ".join(f"{score:.3f}" for score in scores.values())
                  + f"  ({time.perf_counter() - started:.0f} s so far)", flush=True)
    report = {"teacher": source, "rows": rows, "train": args.train, "validation": args.val, "seed": args.seed,
              "canvas_size": args.canvas_size, "probe_decays": args.probe_decays,
              "command": f"python -m benchmarks.task_pilot {' '.join(args.argv)}".strip(),
              "total_time_s": time.perf_counter() - started}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(str(args.out_dir / "task_pilot.json"), report)
    print(f"  wrote {args.out_dir / 'task_pilot.json'}", flush=True)
    return report


if __name__ == "__main__":
    main()
