"""Does the conversion read what its teacher reads? A pilot on the task's canvases before any long run (issue #67):
VECA from the offline DINOv2-S by `training.convert_veca.convert` on TRAIN training canvases at 518 px, then the linear
probe (evaluation.readers.probe, the task's decays, the last VAL training canvases held out to choose one) on
[pooled ; mean patch] of the dense teacher and of the student at C = 8 and 64, after each stage, on TEST test canvases
(the "single" variant, 56 px digits, seed 1, as benchmarks.sparse_recognition_veca). Accuracies with 95% bootstrap
intervals over canvases, paired differences against the dense teacher.

    python -m experiments.veca_conversion.task_probe --train 96 --val 32 --test 200 --stage1-steps 150 \
        --stage2-steps 150 --out experiments/veca_conversion/results/task_probe.json
"""

import argparse
import json
import time
from pathlib import Path

import torch

from corevision_hf.offline import load_dinov2_small_teacher
from evaluation.canvases import Split
from evaluation.paired_stats import bootstrap_rows, interval
from evaluation.readers import probe
from evaluation.sparse_digits import CELL, make_canvases
from training import conversion
from training.conversion import table_record

DECAYS = [1e-4, 1e-3, 1e-2, 1e-1]


def canvases(count: int, split: str) -> Split:
    return Split.of_canvases(make_canvases(count, variant="single", split=split, seed=1, digit_size=56, strokes=0,
                                           canvas_size=518), 518 // CELL)


@torch.no_grad()
def features(forward, split: Split, batch_size: int = 8) -> torch.Tensor:
    return torch.cat([forward(pixels) for _, pixels in split.batches(batch_size)])


def teacher_features(teacher):
    def forward(pixels):
        hidden = teacher(pixel_values=pixels).last_hidden_state
        return torch.cat([hidden[:, 0], hidden[:, 1:].mean(1)], -1).float()
    return forward


def student_features(student, num_cores: int):
    def forward(pixels):
        output = student(pixels, num_cores=num_cores)
        return torch.cat([output.pooler_output, output.last_hidden_state[:, num_cores:].mean(1)], -1).float()
    return forward


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("train", 96), ("val", 32), ("test", 200), ("stage1-steps", 150), ("stage2-steps", 150),
                          ("batch-size", 2), ("lora-rank", 0), ("seed", 0)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--stage1-lr", type=float, default=3e-3)
    parser.add_argument("--stage2-lr", type=float, default=2e-5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.num_cores = 64
    torch.set_num_threads(2)
    start = time.perf_counter()
    teacher, _ = load_dinov2_small_teacher()
    train, test = canvases(args.train, "train"), canvases(args.test, "test")
    fit_rows = slice(0, args.train - args.val)
    train_pixels = torch.cat([pixels for _, pixels in train.batches(16)])
    report = {"args": vars(args) | {"out": str(args.out)}, "lines": {}}
    rows = bootstrap_rows(args.test, 1000, 0)

    def line(name, forward):
        result = probe(features(forward, train), train.labels, features(forward, test), args.val, DECAYS)
        correct = (result["predictions"] == test.labels).float()
        report["lines"][name] = {"accuracy": interval(correct, rows), "correct": correct.tolist(),
                                 "val_accuracy": result["val_accuracy"][result["weight_decay"]]}
        dense = report["lines"].get("dense teacher")
        if dense:
            report["lines"][name]["minus_dense"] = interval(correct - torch.tensor(dense["correct"]), rows)
        print(f"{name}: {report['lines'][name]['accuracy']}  ({time.perf_counter() - start:.0f} s)", flush=True)

    line("dense teacher", teacher_features(teacher))
    from corevision_hf import veca_from_teacher

    fit = train_pixels[fit_rows]

    def batch(step: int) -> torch.Tensor:
        order = torch.randperm(len(fit), generator=torch.Generator().manual_seed(args.seed + step // len(fit)))
        first = (step * args.batch_size) % len(fit)
        return fit[order[torch.arange(first, first + args.batch_size) % len(fit)]]

    torch.manual_seed(args.seed)
    student = veca_from_teacher(teacher, num_cores=64, image_size=518).float()
    report["seeded"] = conversion.seed_core_bank(student, teacher, fit.split(args.batch_size), seed=args.seed)
    val_pixels = train_pixels[-2:]
    val_targets = conversion.teacher_targets(teacher, val_pixels)
    report["stages"] = {}
    for name in ("start", "stage1", "stage2"):
        began = time.perf_counter()
        losses = []
        if name == "stage1":
            losses = conversion.attention_transfer(student, teacher, batch, args.stage1_steps, args.stage1_lr, args.seed)
        elif name == "stage2":
            student, losses = conversion.end_to_end(student, teacher, batch, args.stage2_steps, args.stage2_lr,
                                                    args.seed, args.lora_rank or None)
        report["stages"][name] = {"time_s": time.perf_counter() - began, "losses": losses,
                                  **table_record(student, teacher, val_targets, val_pixels, [8, 64], print)}
        for cores in (8, 64):
            line(f"VECA {name} C={cores}", student_features(student.eval(), cores))
    report["time_s"] = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
