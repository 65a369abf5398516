"""How LookWhere-S's extractor learns to read sparse tokens by label-free distillation on the task's canvases (#57
item 4): a learning curve over distillation steps.

evaluation.task_student's `distil_student` (its map-only selector phase, then the joint distillation) run on the
benchmark's training canvases less the last 80 of each variant, keeping a checkpoint every `--every` steps. At each
checkpoint, on the single variant at k_ratio 0.1, the attentive probe (LookWhere's reader, fixed in advance; its weight
decay chosen on the last 60 fitting canvases) is fitted on the fitting canvases' extractor tokens and measured on the 80
validation canvases, for two selections: the selector's cells and the digits' own cells (the extractor's ceiling).
The dense teacher at 518 px, read by the same probe on the same canvases, is the line to reach. No test canvas is drawn.
Point 0 is the teacher's copy beside the map-trained selector. `--extractor-prefix extractor`: the extractor's own
global tokens (LookWhereConfig.extractor_prefix) instead of the selector's.

    python -m experiments.extractor_curve.extractor_curve --steps 800 --every 100
"""

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from benchmarks.sparse_recognition import parse_args as task_args
from corevision_hf import lookwhere_from_teacher
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from evaluation.canvases import VARIANTS, task_splits
from evaluation.lookwhere_features import lookwhere_features, selector_maps_of
from evaluation.paired_stats import bootstrap_rows, interval
from evaluation.readers import attentive_probe
from evaluation.selections import coverage, selection_scores, top_cells
from evaluation.sparse_digits import CELL
from evaluation.task_student import SELECTOR_DEPTH, distil_student
from evaluation.teacher_passes import TeacherPasses, pass_record, tokens_of
from evaluation.teachers import load_teacher_model

INNER_VAL = 60  # of the fitting canvases, the last ones choose the probe's weight decay


def head(split, first: int, last: int):
    """Canvases first..last-1 of a Split."""
    part = copy.copy(split)
    part.images, part.labels = split.images[first:last], split.labels[first:last]
    part.label_cells, part.digit_ink = split.label_cells[first:last], split.digit_ink[first:last]
    return part


def read(model, fit, val, task, rows) -> dict:
    """The attentive probe's validation accuracy on the selector's and the digits' cells at k_ratio 0.1."""
    k = kept_for_ratio(0.1, (task.canvas_size // CELL) ** 2)
    out = {}
    selector = {name: selector_maps_of(model, split, task.batch_size) for name, split in (("fit", fit), ("val", val))}
    for kind in ("selector", "digits"):
        tokens = {}
        for name, split in (("fit", fit), ("val", val)):
            chosen = top_cells(selection_scores(kind, split, selector[name][1], {}, task.seed + (name == "val")), k)
            tokens[name] = lookwhere_features(model, split, chosen, selector[name][0], task.batch_size)[1]
            if name == "val":
                covered = float(coverage(chosen, split.label_cells).mean())
        probed = attentive_probe(tokens["fit"], fit.labels, tokens["val"], INNER_VAL, task.attentive_decays, task.seed)
        correct = (probed["predictions"] == val.labels).float()
        out[kind] = {"accuracy": interval(correct, rows), "covered": covered, "correct": correct.int().tolist()}
    return out


def checkpoint_state(folder: Path) -> dict:
    """A checkpoint's weights; the extractor's own global tokens, which a run of 2026-12-06 saved as `cls_token` (no
    registers) before they were named `prefix_tokens`, under today's name."""
    state = load_file(str(folder / "model.safetensors"))
    if "extractor.cls_token" in state:
        state["extractor.prefix_tokens"] = state.pop("extractor.cls_token")
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--points", type=int, nargs="+", default=[100, 200, 400, 800])
    parser.add_argument("--extractor-prefix", default="selector", choices=["selector", "extractor"])
    parser.add_argument("--reuse", action="store_true",
                        help="read the checkpoints of the last run in outputs/extractor_curve_scratch, do not train")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="experiments/extractor_curve/extractor_curve.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    scratch = Path("outputs/extractor_curve_scratch")
    task = task_args(["--pilot", "benchmarks/results/task_pilot.json", "--steps", str(args.steps),
                      "--scratch-dir", str(scratch), "--extractor-prefix", args.extractor_prefix])
    teacher, source = load_teacher_model(task.teacher)
    passes = TeacherPasses(task.cache_dir, teacher, task.batch_size)
    fit_count = task.train - task.val
    train, targets, single = [], [], None
    for variant in VARIANTS:
        split = task_splits(task, variant)["train"]
        record = pass_record(passes.get(split, split.key, task.canvas_size))
        train.append(head(split, 0, fit_count))
        targets.append({"cls": record["cls"][:fit_count], "patches": record["patches"][:fit_count],
                        "maps": {q: m[:fit_count] for q, m in record["maps"].items()}})
        if variant == "single":
            single = (head(split, 0, fit_count), head(split, fit_count, task.train), tokens_of(record))
    fit, val, teacher_tokens = single
    rows = bootstrap_rows(len(val), 2000, 0)
    dense = attentive_probe(teacher_tokens[:fit_count], fit.labels, teacher_tokens[fit_count:], INNER_VAL,
                            task.attentive_decays, task.seed)
    dense_correct = (dense["predictions"] == val.labels).float()
    results = {"teacher": source, "fit_canvases": fit_count, "val_canvases": len(val), "steps": args.steps,
               "selector_steps": task.selector_steps, "lr": task.lr, "batch_size": task.batch_size,
               "dense_teacher": {"accuracy": interval(dense_correct, rows), "correct": dense_correct.int().tolist()},
               "points": []}
    print(f"dense teacher, attentive probe, validation: {results['dense_teacher']['accuracy']}", flush=True)
    results["extractor_prefix"] = args.extractor_prefix
    untrained = lookwhere_from_teacher(teacher, selector_depth=SELECTOR_DEPTH, selector_image_size=task.selector_size,
                                       extractor_prefix=args.extractor_prefix)
    if not args.reuse:
        started = time.perf_counter()
        distil_student(task, teacher, train, targets, "cls", args.threads, checkpoint_every=args.every)
        results["train_time_s"] = time.perf_counter() - started
    for step in [0, *args.points]:
        model = copy.deepcopy(untrained)
        state = checkpoint_state(scratch / "checkpoints" / f"checkpoint_{max(args.points)}")
        if step == 0:  # the teacher's copy beside the map-trained selector, frozen while the extractor trained
            model.load_state_dict({name: value for name, value in state.items() if name.startswith("selector.")},
                                  strict=False)
        else:
            model.load_state_dict(checkpoint_state(scratch / "checkpoints" / f"checkpoint_{step}"))
        point = {"steps": step, **read(model.float().eval(), fit, val, task, rows)}
        results["points"].append(point)
        print(f"step {step}: selector {point['selector']['accuracy']['mean']:.3f} (covers "
              f"{point['selector']['covered']:.2f}), digits {point['digits']['accuracy']['mean']:.3f}", flush=True)
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
