"""Study (#68 item 3, 2026-12-07): can the pilot's rule be met on photos with the teacher fine-tuned, where its frozen
readers read a digit on a photo barely above chance?

On the pilot's canvases (seed 1, 400 single-digit canvases on the training pool's photos, the last 80 for
validation, no scribbles, --digit-size px digits), each teacher line is fine-tuned by the benchmark's protocol
(evaluation.finetune_protocol: from its linear probe's head, AdamW at 1e-5 / 1e-4, cosine over 12 epochs, patience 3,
batch 8, the epoch chosen on the 80 validation canvases): the dense teacher at 518 px, then the teacher at equal
FLOPs (the pilot's size). The rule, as the pilot's but on the fine-tuned lines: the dense teacher's best validation
accuracy at least 0.5 (epoch 0, the probe's head, among the epochs), the teacher at equal FLOPs at least 0.15 below.
Each finished epoch is kept (outputs/task_calibration_finetune), so a killed run goes on; --stopped writes the JSON of
the epochs a run stopped by hand has kept (photo_finetune_28.json: the dense line, stopped after epoch 3 by LOG.md's
rule).

    python -m experiments.task_calibration.photo_finetune --digit-size 28
    python -m experiments.task_calibration.photo_finetune --digit-size 28 --lines dense --stopped
"""

import argparse
import copy
import json
import time
import types
from pathlib import Path

import torch

from benchmarks import task_pilot
from corevision_hf import lookwhere_from_teacher
from evaluation.canvases import task_splits
from evaluation.finetune_protocol import FineTuned, Resume, finetune
from evaluation.readers import probe
from evaluation.task_student import SELECTOR_DEPTH, line_costs
from evaluation.teacher_passes import TeacherPasses, pass_record, resized, teacher_features
from evaluation.teachers import load_teacher_model

HERE = Path(__file__).resolve().parent
SCRATCH = Path("outputs/task_calibration_finetune")


def write_stopped(options, name: str, out: Path) -> None:
    """The JSON of the epochs a run stopped by hand has kept."""
    report = {"digit_size": options.digit_size, "train": options.train, "stopped_by_hand": True, "lines": {}}
    for line in options.lines:
        run = torch.load(SCRATCH / f"{name}_{line}.pt", weights_only=True)["run"]
        report["lines"][line] = {"val_accuracy": run["history"], "epoch": run["best"], "best": max(run["history"]),
                                 "steps": run["step"], "train_time_s": run["train_time_s"]}
    out.write_text(json.dumps(report, indent=1))


def finetune_line(line: str, size: int, teacher, splits: dict, pilot, protocol, name: str) -> dict:
    """One teacher line at `size` px fine-tuned by the protocol from its linear probe's head, resumed from its kept
    epochs."""
    train, started = splits["train"], time.perf_counter()
    record = pass_record(TeacherPasses(pilot.cache_dir, teacher, pilot.batch_size).get(train, train.key, size))
    linear = probe(record["features"], train.labels, record["features"][:1], pilot.val, pilot.probe_decays)
    print(f"{line} ({size} px): linear probe validation {max(linear['val_accuracy'].values()):.3f}", flush=True)

    def features_of(backbone, rows, pixels, seed):
        return teacher_features(backbone, pixels if size == 518 else resized(pixels, size))

    model = FineTuned(features_of, copy.deepcopy(teacher).float().requires_grad_(True), linear["head"])
    resume = Resume(SCRATCH / f"{name}_{line}.pt", {"canvases": str(train.key), "line": line, "size": size})
    result = finetune(model, train, splits["test"], protocol, pilot.val, resume)
    print(f"{line}: best validation {max(result['val_accuracy']):.3f} at epoch {result['epoch']}", flush=True)
    return {"size": size, "linear_val_accuracy": linear["val_accuracy"], "val_accuracy": result["val_accuracy"],
            "epoch": result["epoch"], "best": max(result["val_accuracy"]), "train_time_s": result["train_time_s"],
            "time_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--digit-size", type=int, default=28)
    parser.add_argument("--lines", nargs="+", default=["dense", "equal_flops"])
    parser.add_argument("--stopped", action="store_true", help="write the JSON of the kept epochs, run nothing")
    parser.add_argument("--train", type=int, default=400, help="canvases, the last 80 for validation (2026-12-08)")
    options = parser.parse_args()
    other_count = options.train != 400   # the pilot's count keeps the first run's names
    name = f"{options.digit_size}_{options.train}" if other_count else f"{options.digit_size}"
    extra = f" --train {options.train}" if other_count else ""
    out = HERE / f"photo_finetune_{name}.json"
    if options.stopped:
        return write_stopped(options, name, out)
    torch.set_num_threads(2)
    pilot = task_pilot.parse_args(["--background", "photo"])
    protocol = types.SimpleNamespace(finetune_lr=1e-5, finetune_epochs=12, finetune_patience=3, batch_size=8,
                                     seed=pilot.seed)
    teacher, source = load_teacher_model(pilot.teacher)
    student = lookwhere_from_teacher(teacher, selector_depth=SELECTOR_DEPTH, selector_image_size=pilot.selector_size)
    _, equal_size = line_costs(pilot, teacher, student)
    setting = types.SimpleNamespace(canvas_size=518, seed=pilot.seed, background="photo",
                                    extra_photos=pilot.extra_photos, digit_size=options.digit_size, strokes=0,
                                    train=options.train, test=1)
    splits = task_splits(setting, "single")
    report = json.loads(out.read_text()) if out.is_file() else {"lines": {}}
    report.pop("stopped_by_hand", None)
    for line in options.lines:
        size = 518 if line == "dense" else equal_size
        report["lines"][line] = finetune_line(line, size, teacher, splits, pilot, protocol, name)
        report.update(teacher=source, digit_size=options.digit_size, train=options.train, validation=pilot.val,
                      seed=pilot.seed, protocol=vars(protocol),
                      command=f"python -m experiments.task_calibration.photo_finetune --digit-size "
                              f"{options.digit_size}{extra}")
        out.write_text(json.dumps(report, indent=1))
    if {"dense", "equal_flops"} <= report["lines"].keys():
        dense, equal = report["lines"]["dense"]["best"], report["lines"]["equal_flops"]["best"]
        report["gap"], report["qualifies"] = dense - equal, dense >= 0.5 and dense - equal >= 0.15
        print(f"gap {report['gap']:+.3f}; qualifies: {report['qualifies']}", flush=True)
        out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
