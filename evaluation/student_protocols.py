"""The two protocols that train the sparse-recognition task's LookWhere-S (benchmarks.sparse_recognition
--student-protocol), and the choice between them on validation canvases (`train_student`):

- "copy": the student the benchmark's options describe, by default the committed protocol: the teacher's unchanged
  copy as extractor with its own CLS as global token, beside a selector that learns the teacher's map alone and then
  stays frozen (chosen on black canvases: experiments/extractor_curve);
- "paper": the paper's recipe, joint what-where distillation: the selector's global tokens handed to the extractor,
  selector and extractor distilled together from the start (the extractor frozen for its first
  --freeze-extractor-steps, then warmed up), PAPER_STEPS steps on the training canvases and the training pool's photos;
- "choose": both, and the one whose selector cells (k_ratio 0.1) the attentive probe, LookWhere's reader, reads best
  on the validation canvases of the single variant (the training canvases' last --val; ties: "copy", the fewer
  steps). Every candidate is distilled label-free on the same training images, validation canvases among them, and
  none is ever read on a test canvas."""

import argparse
import shutil
import time

import torch

from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from evaluation.canvases import PhotoSplit
from evaluation.lookwhere_features import lookwhere_features, selector_maps_of
from evaluation.readers import attentive_probe, probe
from evaluation.selections import coverage, top_cells
from evaluation.sparse_digits import CELL, photo_paths
from evaluation.task_student import MAIN_K_RATIO, distil_student
from evaluation.teacher_passes import pass_record
from training.checkpointing import delete_run_files

PROTOCOLS = ("copy", "paper")
# The paper's distillation steps: the longest of experiments/extractor_curve's curves (still rising there at 400).
PAPER_STEPS = 400
CHOICE_RULE = ("the best validation accuracy of the attentive probe (LookWhere's reader) on each candidate's selector "
               "cells at k_ratio 0.1, single variant (ties: copy)")


def protocol_args(args, protocol: str, scratch_dir) -> argparse.Namespace:
    """The benchmark's arguments as the student of `protocol` is distilled with them, into `scratch_dir`: "copy" as
    given; "paper" with --paper-steps joint steps from the start and the selector's global tokens."""
    settings = {"scratch_dir": scratch_dir}
    if protocol == "paper":
        settings.update(steps=args.paper_steps, selector_steps=0, joint_selector=True, extractor_prefix="selector")
    return argparse.Namespace(**{**vars(args), **settings})


def training_images(args, protocol: str, passes, splits: dict, teacher_out: dict) -> tuple[list, list]:
    """What the student of `protocol` distils on: the training canvases of every variant (their teacher passes), and
    for "paper" the training pool's photos too (centre crops at the canvas size, their passes cached by `passes`)."""
    train = [splits[variant]["train"] for variant in splits]
    targets = [teacher_out[variant, "train"] for variant in splits]
    if protocol == "paper":
        photos = PhotoSplit.of_paths(photo_paths("train", args.extra_photos), args.canvas_size)
        train.append(photos)
        targets.append(pass_record(passes.get(photos, photos.key, args.canvas_size)))
    return train, targets


def train_student(args, teacher, passes, splits: dict, teacher_out: dict, query: str, threads: int, progress):
    """The student of --student-protocol, distilled label-free (evaluation.task_student's `distil_student`); with
    "choose", each protocol's in --scratch-dir/candidates/NAME, the one validation picks copied to --scratch-dir/final.
    Returns (the student, its untrained start, the JSON's record of every candidate and the choice)."""
    names = PROTOCOLS if args.student_protocol == "choose" else (args.student_protocol,)
    candidates, record = {}, {}
    for name in names:
        run_args = protocol_args(args, name, args.scratch_dir if len(names) == 1
                                 else args.scratch_dir / "candidates" / name)
        train, targets = training_images(args, name, passes, splits, teacher_out)
        started = time.perf_counter()
        torch.manual_seed(args.seed)  # each candidate from the same start (its map head's draw)
        candidates[name] = distil_student(run_args, teacher, train, targets, query, threads)
        record[name] = {"recipe": recipe_record(run_args, candidates[name][0]), "images": sum(map(len, train)),
                        "photos": sum(len(s) for s in train if isinstance(s, PhotoSplit)),
                        "train_time_s": time.perf_counter() - started}
        progress(f"    {name}: {run_args.steps} distillation steps, {run_args.selector_steps} map-only steps")
    chosen = names[0]
    if len(names) > 1:
        for name in names:
            record[name]["validation"] = validation_reading(candidates[name][0], splits["single"]["train"], args)
        chosen = max(names, key=lambda n: (max(record[n]["validation"]["attentive"].values()), -names.index(n)))
        keep_chosen(args.scratch_dir, args.scratch_dir / "candidates" / chosen)
        progress(f"    chosen on validation: {chosen} ("
                 + ", ".join(f"{n} {max(record[n]['validation']['attentive'].values()):.3f}" for n in names) + ")")
    summary = {"asked": args.student_protocol, "chosen": chosen, "candidates": record,
               **({"rule": CHOICE_RULE} if len(names) > 1 else {})}
    return *candidates[chosen], summary


def recipe_record(run_args, student) -> dict:
    """What the JSON keeps of a candidate's recipe (the extractor is frozen for its first steps only where the selector
    trains beside it: evaluation.task_student's `distil_student`)."""
    joint = run_args.joint_selector or run_args.selector_steps == 0
    return {"steps": run_args.steps, "selector_steps": run_args.selector_steps, "lr": run_args.lr,
            "joint_selector": joint, "freeze_extractor_steps": run_args.freeze_extractor_steps if joint else 0,
            "extractor_prefix": student.config.extractor_prefix, "selector_size": run_args.selector_size,
            "selector_map_antialias": student.config.selector_map_antialias, "batch_size": run_args.batch_size}


def validation_reading(student, train, args) -> dict:
    """Both readers of the student's selector cells at k_ratio 0.1 on the validation canvases (`train`'s last --val,
    each reader fitted on the others, as the lines' readers are), and the share of the label's cells those cells keep
    there: {"linear": {decay: accuracy}, "attentive": {decay: accuracy}, "label_cell_coverage"}."""
    global_tokens, maps = selector_maps_of(student, train, args.batch_size)
    chosen = top_cells(maps, kept_for_ratio(MAIN_K_RATIO, (args.canvas_size // CELL) ** 2))
    features, tokens = lookwhere_features(student, train, chosen, global_tokens, args.batch_size)
    linear = probe(features, train.labels, features[:1], args.val, args.probe_decays)
    attentive = attentive_probe(tokens, train.labels, tokens[:1], args.val, args.attentive_decays, args.seed)
    return {"linear": linear["val_accuracy"], "attentive": attentive["val_accuracy"],
            "label_cell_coverage": float(coverage(chosen[-args.val:], train.label_cells[-args.val:]).mean())}


def keep_chosen(scratch_dir, candidate_dir) -> None:
    """The chosen candidate's export copied to `scratch_dir`/final (what make tasks' model card reads), after an
    earlier run's files there are cleared."""
    delete_run_files(str(scratch_dir))
    partial = scratch_dir / "final.partial"
    if partial.exists():
        shutil.rmtree(partial)  # left by a run that died while copying
    shutil.copytree(candidate_dir / "final", partial)
    partial.rename(scratch_dir / "final")
