"""Does the benchmark's joint distillation keep what the map-only selector phase learnt? (#57 item 3)

evaluation.task_student's `distil_student` run on the benchmark's training canvases less the last 80 of each variant,
then the selector's share of the label's cells at k_ratio 0.1 measured on those 80 + 80 validation canvases (as
selector_curve.py), for each `--selector-steps` / `--freeze-extractor-steps` setting given, the selector trained on in
the joint distillation (`--joint-selector`; the benchmark's default now freezes it after its map-only steps, which keeps
the map-only phase's share).

    python -m experiments.selector_curve.joint_check --settings 0,40 100,40 100,0
"""

import argparse
import copy
import json

import torch

from benchmarks.sparse_recognition import parse_args as task_args
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from evaluation.canvases import VARIANTS, task_splits
from evaluation.selections import coverage, top_cells
from evaluation.sparse_digits import CELL
from evaluation.task_student import distil_student
from evaluation.teacher_passes import TeacherPasses, pass_record
from evaluation.teachers import load_teacher_model


def head(split, count: int):
    """The first `count` canvases of a Split."""
    part = copy.copy(split)
    part.images, part.labels = split.images[:count], split.labels[:count]
    part.label_cells, part.digit_ink = split.label_cells[:count], split.digit_ink[:count]
    return part


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", default=["0,40", "100,40", "100,0"],
                        help="selector_steps,freeze_extractor_steps pairs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="experiments/selector_curve/joint_check.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for setting in args.settings:
        selector_steps, frozen = (int(v) for v in setting.split(","))
        # the paper's hand-over and 100 joint steps: the benchmark's defaults when this study ran
        task = task_args(["--pilot", "benchmarks/results/task_pilot.json", "--selector-steps", str(selector_steps),
                          "--freeze-extractor-steps", str(frozen), "--joint-selector", "--steps", "100",
                          "--extractor-prefix", "selector", "--scratch-dir", "outputs/selector_curve_scratch"])
        teacher, _ = load_teacher_model(task.teacher)
        passes = TeacherPasses(task.cache_dir, teacher, task.batch_size)
        fit = task.train - task.val
        train, targets, val_pixels, val_maps, val_cells = [], [], [], [], []
        for variant in VARIANTS:
            split = task_splits(task, variant)["train"]
            record = pass_record(passes.get(split, split.key, task.canvas_size))
            train.append(head(split, fit))
            targets.append({"cls": record["cls"][:fit], "patches": record["patches"][:fit],
                            "maps": {q: m[:fit] for q, m in record["maps"].items()}})
            val_pixels.append(split.pixels(slice(fit, task.train)))
            val_maps.append(record["maps"]["cls"][fit:].float())
            val_cells.append(split.label_cells[fit:])
        val_pixels, val_maps, val_cells = torch.cat(val_pixels), torch.cat(val_maps), torch.cat(val_cells)
        k = kept_for_ratio(0.1, (task.canvas_size // CELL) ** 2)
        grid = (task.canvas_size // CELL,) * 2
        teacher_share = float(coverage(top_cells(val_maps, k), val_cells).mean())
        student, _ = distil_student(task, teacher, train, targets, "cls", args.threads)
        with torch.inference_mode():
            maps = torch.cat([student.selector(val_pixels[i:i + 16], grid, None)[1].float()
                              for i in range(0, len(val_pixels), 16)])
        share = float(coverage(top_cells(maps, k), val_cells).mean())
        results.append({"selector_steps": selector_steps, "freeze_extractor_steps": frozen, "steps": task.steps,
                        "share": share, "teacher_map_share": teacher_share, "ratio": share / teacher_share})
        print(results[-1], flush=True)
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
