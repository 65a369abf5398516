"""Fine-tuned against its probe (or any two classifier folders) on your own held-out ImageFolder, image by image: each
one's accuracy, and the paired difference with its 95% bootstrap interval, resampling whole groups of images.

    python -m training.compare_finetuned runs/cats/best runs/cats_probe/best --data photos/heldout \\
        --groups '(.+)_\\d+$'

FIRST and SECOND are image-classification folders with the same classes: best/ or final/ of `python -m
training.finetune` (its probe: the same command with --epochs 0, e.g. `--recipe finetune-guarded --epochs 0`), each
scored at the image size and budget its run evaluated at (its training_recipe.json), or any VECA or LookWhere
classifier folder (at its config's image size and default budget). --data is an ImageFolder (one sub-folder per class)
of images that neither trained nor chose anything. --groups REGEX: the group of an image is the first group of REGEX in
its file name without suffix (as training.finetune's --val-groups), so that the crops of one photo count once in the
interval; without it each image is its own. --output writes the numbers with every image's outcome, to pair again later.
"""

import argparse
import os
import sys

from .arguments import HelpFormatter, parse_seed, run_as_command
from .finetune import COUNT, POSITIVE_COUNT, Parser

PROG = "python -m training.compare_finetuned"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("first", metavar="FIRST", help="a classifier folder, e.g. the fine-tuned run's best/")
    parser.add_argument("second", metavar="SECOND", help="a classifier folder, e.g. the probe run's best/")
    parser.add_argument("--data", required=True, help="the held-out ImageFolder both are scored on")
    parser.add_argument("--groups", default=None, metavar="REGEX",
                        help=r"resample whole groups: an image's group is the first group of REGEX in its file name "
                             r"without suffix, e.g. '(.+)_\d+$' (default: each image its own)")
    parser.add_argument("--resamples", type=POSITIVE_COUNT, default=2000, help="bootstrap resamples")
    parser.add_argument("--seed", type=parse_seed, default=0, help="seed of the resamples")
    parser.add_argument("--batch-size", type=POSITIVE_COUNT, default=8)
    parser.add_argument("--threads", type=COUNT, default=0, help="CPU threads of torch (0: torch's own choice)")
    parser.add_argument("--output", default=None, help="a JSON of the numbers and every image's outcome (new file)")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    """The command's arguments, a regular expression checked."""
    args = build_parser().parse_args(argv)
    if args.groups is not None:
        import re

        try:
            re.compile(args.groups)
        except re.error as error:
            raise ValueError(f"--groups is no regular expression ({error}): got {args.groups!r}.") from None
    return args


def scoring(folder: str) -> tuple:
    """(the classifier of `folder` in eval mode, the image side it is scored at, its budget kwargs): those its
    training.finetune run evaluated at (training_recipe.json), else its config's side and default budget."""
    import json

    from transformers import AutoModelForImageClassification

    import corevision_hf  # noqa: F401  (registers VECA and LookWhere with the Auto classes)
    from corevision_hf.cli import reading_weights
    from corevision_hf.loading import load_checked

    from .finetune import budgets
    from .finetune_output import SCRIPT

    with reading_weights(folder):
        model = load_checked(AutoModelForImageClassification, folder).eval()
    if model.config.model_type not in ("veca", "lookwhere"):
        raise ValueError(f"{folder} holds a {model.config.model_type} model: give a VECA or LookWhere classifier.")
    recipe = {}
    if os.path.isfile(os.path.join(folder, "training_recipe.json")):
        with open(os.path.join(folder, "training_recipe.json")) as f:
            recipe = json.load(f)
    if recipe.get("script") != SCRIPT:
        return model, model.config.image_size, {}
    args = argparse.Namespace(**recipe["args"])
    return model, args.image_size, budgets(args, model.config)[1]


def outcomes(folder: str, examples: list, classes: list[str], batch_size: int = 8) -> dict:
    """{"folder", "image_size", "budget", "accuracy", "correct" ("1" right, "0" wrong, one character an image),
    "predicted" (class indices)} of the classifier `folder` on the (path, label) `examples` of an ImageFolder with
    `classes`, in their order."""
    import torch

    from .labelled_folders import loader

    model, size, budget = scoring(folder)
    labels = [model.config.id2label[index] for index in range(model.config.num_labels)]
    if labels != classes:
        raise ValueError(f"{folder} predicts the classes {labels}, the held-out folder has {classes}: give a folder "
                         "of the same classes (sub-folder names).")
    print(f"scoring {folder} on {len(examples)} images at {size} px{f', {budget}' if budget else ''}", flush=True)
    predicted = []
    with torch.no_grad():
        for batch in loader(examples, size, batch_size, 0):
            predicted.append(model(batch["pixel_values"], **budget).logits.argmax(-1))
    predicted = torch.cat(predicted)
    correct = predicted == torch.tensor([label for _, label in examples])
    return {"folder": folder, "image_size": size, "budget": budget, "accuracy": correct.double().mean().item(),
            "correct": "".join("1" if right else "0" for right in correct.tolist()), "predicted": predicted.tolist()}


def paired_difference(first: str, second: str, groups: list, resamples: int, seed: int) -> dict:
    """{"mean", "low", "high", "half_width"} of first - second over the images (two outcome strings of `outcomes`),
    its 95% interval resampling whole `groups` (one key an image), `resamples` draws seeded by `seed`."""
    import torch

    from evaluation.paired_stats import group_draws, grouped_interval

    values = torch.tensor([int(a) - int(b) for a, b in zip(first, second)], dtype=torch.float64)
    return grouped_interval(values, *group_draws(groups, resamples, seed))


def compare(args) -> dict:
    """Scores both folders on --data and pairs them; returns the JSON --output writes."""
    from .finetune_output import SCRIPT
    from .labelled_folders import labelled_files, source_groups

    for folder in (args.first, args.second):
        if not os.path.isfile(os.path.join(folder, "config.json")):
            raise ValueError(f"{folder} is no classifier folder (no config.json): give best/ or final/ of a run of "
                             f"{SCRIPT}, or another save_pretrained folder.")
    examples, classes = labelled_files(args.data, train=False, flag="--data")
    groups = source_groups(examples, args.groups, "--groups") if args.groups else [path for path, _ in examples]
    first, second = (outcomes(folder, examples, classes, args.batch_size) for folder in (args.first, args.second))
    difference = paired_difference(first["correct"], second["correct"], groups, args.resamples, args.seed)
    return {"data": args.data, "groups": args.groups, "images": len(examples), "group_count": len(set(groups)),
            "resamples": args.resamples, "seed": args.seed, "first": first, "second": second,
            "difference": difference, "files": [os.path.relpath(path, args.data) for path, _ in examples],
            "group_keys": groups}


def main(argv=None) -> dict:
    """Runs the command; returns what --output writes."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.output is not None and os.path.lexists(args.output):
        raise ValueError(f"--output {args.output} exists: give a new file.")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    result = compare(args)
    grouping = f"{result['group_count']} groups by --groups '{args.groups}'" if args.groups else (
        f"{result['images']} images (no --groups: each image its own group)")
    for name in ("first", "second"):
        print(f"{name} {result[name]['folder']}: accuracy {result[name]['accuracy']:.4f} ({result['images']} images)")
    difference = result["difference"]
    print(f"first - second: {difference['mean']:+.4f} [{difference['low']:+.4f}, {difference['high']:+.4f}] (95% "
          f"paired bootstrap over {grouping}, {args.resamples} resamples)")
    if args.output is not None:
        from .finetune_output import write_json

        write_json(args.output, result)
        print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    run_as_command(main)
