"""Fine-tuned against probe on held-out images: the paired bootstrap of runs of `python -m training.finetune`.

    python -m experiments.finetune_rotation.finetune_rotation --pair grouped RUN_FT RUN_PROBE \
        [--pair NAME RUN_FT RUN_PROBE ...] [--groups '(.+)_\\d+$']

Each RUN is an --output-dir of `training.finetune` with --eval-data (RUN_PROBE: the same command with --epochs 0). For
each run it reads the best epoch and its validation accuracy, and predicts every held-out image with best/ at the run's
evaluation budget (checked against the run's own held-out accuracy); with --fine-tuned final, RUN_FT's final/ (the last
epoch: a recipe fixed in advance, for when validation cannot choose) instead of its best/. For each pair it resamples
the held-out images with replacement (--resamples, seeded), the same draw for both runs, and reports the fine-tuned
minus probe held-out accuracy with its 95% percentile interval. With --groups REGEX it resamples whole groups instead
(the first group of REGEX in the file name without suffix, as training.finetune's --val-groups: every crop of one photo,
both ways up), since several crops of one photo are not independent draws. The JSON (default under outputs/) holds the
runs' commands, the --setup commands that made their inputs, and each run's held-out predictions (classes, and as a
string "1": right, in file order) with the files they are of. --hindsight-probes 1e-2,1,... refits RUN_PROBE's probe at
each penalty on its training images and scores it on the held-out images, with the fine-tuned minus it: how much of a
difference comes from the penalty validation chose (a diagnosis; choosing by it would be choosing on held-out data);
beside it, each penalty's 5-fold cross-validated accuracy on the training images (whole --groups to a fold), the
choice that looks at training images only.
With --heldout DIR every run is scored on the ImageFolder DIR instead of its own --eval-data: photos that no run, and
no choice, has seen (examples/gcompris_photos.py, then examples/rotation_task.py --heldout-photos).
With --groups it also gives each group's accuracy for both runs and counts the groups a run gives one class for every
image: on the rotation task, a photo it calls upright (or upside down) whichever way up it is shown, which can only
score one half.
"""

import argparse
import json
import os
import shlex
import sys

from corevision_hf.cli import HelpFormatter


def run_result(folder: str, threads: int, weights: str = "best", heldout: str | None = None) -> dict:
    """{"command", "weights", "best_epoch", "wise_ft", "validation_accuracy", "heldout_accuracy", "heldout_correct",
    "heldout_predicted", "heldout_files"} of the `weights` folder (best/ or final/) of one finetune run (best_epoch: its
    epoch; wise_ft: the --wise-ft mix it is, or None; heldout_correct: "1" or "0" for each held-out image, in file
    order), on the run's --eval-data or on the ImageFolder `heldout`."""
    import torch
    from transformers import AutoModelForImageClassification

    from corevision_hf.loading import load_checked
    from training import finetune

    torch.set_num_threads(threads)
    needed = [os.path.join(folder, name) for name in ("run.json", f"{weights}/validation.json")]
    if not all(os.path.isfile(path) for path in needed):
        raise ValueError(f"{folder} is no finished run of training.finetune (it needs "
                         f"{', '.join(os.path.relpath(path, folder) for path in needed)}).")
    args = argparse.Namespace(**json.load(open(os.path.join(folder, "run.json")))["args"])
    if heldout is None and args.eval_data is None:
        raise ValueError(f"{folder} was run without --eval-data: give --heldout DIR to score it.")
    kept = os.path.join(folder, weights)
    validation = json.load(open(os.path.join(kept, "validation.json")))
    scored = os.path.join(kept, "heldout.json")  # the folder the run scored held-out (--evaluate), checked against
    recorded = json.load(open(scored)) if os.path.isfile(scored) else None
    model = load_checked(AutoModelForImageClassification, kept).eval()
    budget = finetune.budgets(args, model.config)[1]
    if heldout is not None:  # another held-out set than the run's: nothing recorded to check against
        args.eval_data, recorded = heldout, None
    examples, classes = finetune.labelled_files(args.eval_data, train=False)
    labels = [model.config.id2label[index] for index in range(model.config.num_labels)]
    if classes != labels:
        raise ValueError(f"{args.eval_data} has the classes {classes}, {kept} predicts {labels}: give an ImageFolder "
                         "with the run's classes.")
    correct, predicted = [], []
    print(f"scoring {kept} on the {len(examples)} images of {args.eval_data}", flush=True)
    for batch in finetune.loader(examples, args.image_size, 8, 0):
        with torch.no_grad():
            logits = model(batch["pixel_values"], **budget).logits
        predicted += logits.argmax(-1).tolist()
        correct += (logits.argmax(-1) == batch["labels"]).tolist()
    accuracy = sum(correct) / len(correct)
    if recorded and abs(accuracy - recorded["accuracy"]) > 1e-9:
        raise RuntimeError(f"{kept} scores {accuracy:.4f} held-out now, {recorded['accuracy']:.4f} in heldout.json.")
    card = open(os.path.join(kept, "README.md")).read()
    command = card.split("Command: `", 1)[1].split("`\n", 1)[0]
    return {"command": command, "weights": weights, "best_epoch": validation["epoch"],
            "wise_ft": validation.get("wise_ft"),
            "validation_accuracy": validation["accuracy"],
            "heldout_accuracy": accuracy, "heldout_correct": "".join(str(int(c)) for c in correct),
            "heldout_predicted": predicted,
            "heldout_files": [os.path.relpath(path, args.eval_data) for path, _ in examples]}


def hindsight_probes(folder: str, penalties: list[float], threads: int, pattern: str | None = None,
                     heldout: str | None = None) -> dict:
    """{penalty: {"training_cv_accuracy", "heldout_accuracy", "heldout_correct"}} of the linear probe of the finetune
    run in `folder` refitted at each penalty: on the run's training images (--data less its validation split, or all
    of it with --val-data), its features read at the run's evaluation budget by best/'s backbone, as the run fitted it.
    training_cv_accuracy: `cross_validated` over the training images, grouped by `pattern` (group_keys) when given: a
    choice of penalty that looks at training images only. Scored on the run's --eval-data, or on `heldout`."""
    import torch
    from transformers import AutoModelForImageClassification

    from corevision_hf.loading import load_checked
    from evaluation.probes import fit_linear_classifier
    from training import finetune

    torch.set_num_threads(threads)
    args = argparse.Namespace(**json.load(open(os.path.join(folder, "run.json")))["args"])
    model = load_checked(AutoModelForImageClassification, os.path.join(folder, "best")).eval()
    budget = finetune.budgets(args, model.config)[1]
    examples = finetune.labelled_files(args.data, train=True)[0]
    train = finetune.training_split(args, examples)[0]
    heldout = finetune.labelled_files(heldout or args.eval_data, train=False)[0]
    print(f"refitting the probe of {folder} at {len(penalties)} penalties (features of {len(train)} training and "
          f"{len(heldout)} held-out images)", flush=True)
    features, labels = finetune.head_features(model, finetune.loader(train, args.image_size, 8, 0), budget, "cpu")
    held, held_labels = finetune.head_features(model, finetune.loader(heldout, args.image_size, 8, 0), budget, "cpu")
    keys = group_keys([path for path, _ in train], pattern) if pattern else None
    result = {}
    for penalty in penalties:
        probe = fit_linear_classifier(features, labels, model.config.num_labels, penalty, per_feature=False)
        correct = (probe(held).argmax(-1) == held_labels).tolist()
        result[penalty] = {"training_cv_accuracy": cross_validated(features, labels, keys, penalty),
                           "heldout_accuracy": sum(correct) / len(correct),
                           "heldout_correct": "".join(str(int(c)) for c in correct)}
    return result


def cross_validated(features, labels, keys: list[str] | None, penalty: float, folds: int = 5) -> float:
    """Mean accuracy over `folds` folds of the probe (evaluation.probes.fit_linear_classifier at `penalty`) fitted on
    the other folds: whole groups to a fold (`keys`, one per row; None: each row its own), in a seeded order."""
    import random

    import torch

    from evaluation.probes import fit_linear_classifier

    keys = [str(index) for index in range(len(labels))] if keys is None else keys
    names = sorted(set(keys))
    random.Random(0).shuffle(names)
    accuracies = []
    for fold in range(folds):
        chosen = set(names[fold::folds])
        held = torch.tensor([key in chosen for key in keys])
        probe = fit_linear_classifier(features[~held], labels[~held], int(labels.max()) + 1, penalty, per_feature=False)
        accuracies.append((probe(features[held]).argmax(-1) == labels[held]).float().mean().item())
    return sum(accuracies) / folds


def paired_bootstrap(first: str, second: str, resamples: int, seed: int, groups: list[str] | None = None) -> dict:
    """Mean of first - second (strings of "1" right, "0" wrong, one character per image) over the images, and the
    2.5 / 97.5 percentiles of that mean over `resamples` draws with replacement (one draw for both runs): of the
    images, or with `groups` (one key per image) of whole groups, each draw's mean taken over the images it holds."""
    import numpy as np

    if len(first) != len(second) or (groups is not None and len(groups) != len(first)):
        raise ValueError(f"the runs were evaluated on different held-out sets ({len(first)} and {len(second)} images"
                         f"{f', {len(groups)} group keys' if groups is not None else ''}).")
    difference = np.array([int(c) for c in first], dtype=float) - np.array([int(c) for c in second], dtype=float)
    keys = range(len(difference)) if groups is None else groups
    number = {key: i for i, key in enumerate(dict.fromkeys(keys))}  # groups numbered in order of first appearance
    index = np.array([number[key] for key in keys])
    sums, counts = np.bincount(index, difference), np.bincount(index)  # per group
    draws = np.random.default_rng(seed).integers(0, len(number), size=(resamples, len(number)))
    means = sums[draws].sum(1) / counts[draws].sum(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"difference": float(difference.mean()), "interval_95": [float(low), float(high)],
            "resamples": resamples, "seed": seed, "images": len(difference),
            **({"groups": len(number)} if groups is not None else {})}


def per_group(runs: dict, groups: list[str]) -> dict:
    """{group: {"images", run: {"accuracy", "one_class"}}} for each run of `runs` (run_result's dicts over the same
    files, one key of `groups` per file); one_class: the run gave every image of the group the same class."""
    table = {}
    for index, key in enumerate(groups):
        table.setdefault(key, {"images": 0, **{name: {"correct": 0, "classes": set()} for name in runs}})
        table[key]["images"] += 1
        for name, outcome in runs.items():
            table[key][name]["correct"] += int(outcome["heldout_correct"][index])
            table[key][name]["classes"].add(outcome["heldout_predicted"][index])
    return {key: {"images": row["images"], **{name: {"accuracy": row[name]["correct"] / row["images"],
                                                     "one_class": len(row[name]["classes"]) == 1} for name in runs}}
            for key, row in table.items()}


def group_keys(files: list[str], pattern: str) -> list[str]:
    """The group of each held-out file, by training.finetune's --val-groups rule (`group_key`); a name `pattern` does
    not match is its own group."""
    from training.labelled_folders import group_key

    return [group_key(file, pattern) or os.path.splitext(os.path.basename(file))[0] for file in files]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.finetune_rotation.finetune_rotation",
                                     description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--pair", nargs=3, action="append", required=True, metavar=("NAME", "RUN_FT", "RUN_PROBE"))
    parser.add_argument("--fine-tuned", choices=("best", "final"), default="best",
                        help="RUN_FT's folder compared: best/ (chosen on validation) or final/ (the last epoch)")
    parser.add_argument("--hindsight-probes", default=None, metavar="PENALTY[,PENALTY...]",
                        help="also refit each RUN_PROBE's probe at these L2 penalties and score them held-out (a "
                             "diagnosis of the penalty validation chose, never a choice)")
    parser.add_argument("--heldout", default=None, metavar="DIR",
                        help="score every run on this ImageFolder instead of its own --eval-data (e.g. photos no run "
                             "was ever scored on)")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--groups", default=None, metavar="REGEX", help="resample whole groups of held-out images: "
                        "the first group of REGEX in the file name (e.g. '(.+)_\\d+$': every crop of one photo)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--setup", action="append", default=[], help="a command that made the runs' inputs, recorded")
    parser.add_argument("--output", default="outputs/finetune_rotation.json")
    return parser


def checked_penalties(parser: argparse.ArgumentParser, args) -> list[float] | None:
    """The --hindsight-probes penalties (None without it), once every argument is usable; else parser.error."""
    if args.resamples < 1 or args.threads < 1:
        parser.error("--resamples and --threads must be at least 1.")
    penalties = None
    if args.hindsight_probes is not None:
        from training.finetune import probe_penalties

        try:
            penalties = probe_penalties(args.hindsight_probes, "--hindsight-probes")
        except ValueError as error:
            parser.error(str(error))
    if args.groups is not None:
        import re

        try:
            re.compile(args.groups)
        except re.error as error:
            parser.error(f"--groups is no regular expression ({error}): got {args.groups!r}.")
    if args.heldout is not None and not os.path.isdir(args.heldout):
        parser.error(f"--heldout {args.heldout} is no folder.")
    return penalties


def hindsight_rows(name: str, runs: dict, refitted: dict, args, groups) -> dict:
    """{penalty: the refitted probe's outcome with the fine-tuned minus it}, each printed as a line."""
    rows = {}
    for penalty, outcome in refitted.items():
        versus = paired_bootstrap(runs["fine_tuned"]["heldout_correct"], outcome["heldout_correct"],
                                  args.resamples, args.seed, groups)
        rows[f"{penalty:g}"] = {**outcome, "fine_tuned_minus_probe_heldout": versus}
        print(f"{name}: probe refitted at penalty {penalty:g}: training CV "
              f"{outcome['training_cv_accuracy']:.4f}; (hindsight) held-out "
              f"{outcome['heldout_accuracy']:.4f}; fine-tuned - it {versus['difference']:+.4f} "
              f"[{versus['interval_95'][0]:+.4f}, {versus['interval_95'][1]:+.4f}]")
    return rows


def compare_pair(name: str, fine_tuned: str, probe: str, args, penalties, scored: dict, hindsight: dict) -> dict:
    """One --pair's entry of the JSON: both runs' results, the paired bootstrap of fine-tuned minus probe, the
    hindsight probes and the per-group table when asked; its lines printed. `scored` and `hindsight` keep each
    RUN_PROBE's result and refitted probes for later pairs that share it."""
    if probe not in scored:
        scored[probe] = run_result(probe, args.threads, heldout=args.heldout)
    runs = {"fine_tuned": run_result(fine_tuned, args.threads, args.fine_tuned, args.heldout),
            "probe": scored[probe]}
    if runs["fine_tuned"]["heldout_files"] != runs["probe"]["heldout_files"]:
        raise ValueError(f"{fine_tuned} and {probe} were evaluated on different held-out images: give both the "
                         "same --eval-data.")
    groups = None if args.groups is None else group_keys(runs["probe"]["heldout_files"], args.groups)
    bootstrap = paired_bootstrap(runs["fine_tuned"]["heldout_correct"], runs["probe"]["heldout_correct"],
                                 args.resamples, args.seed, groups)
    pair = {**runs, "fine_tuned_minus_probe_heldout": bootstrap}
    for kind, outcome in runs.items():
        mix = f" mixed with the probe (WiSE-FT {outcome['wise_ft']:g})" if outcome["wise_ft"] is not None else ""
        print(f"{name} {kind}: {outcome['weights']}/, epoch {outcome['best_epoch']}{mix}, validation "
              f"{outcome['validation_accuracy']:.4f}, held-out {outcome['heldout_accuracy']:.4f}")
    print(f"{name}: fine-tuned - probe held-out {bootstrap['difference']:+.4f}, 95% interval "
          f"[{bootstrap['interval_95'][0]:+.4f}, {bootstrap['interval_95'][1]:+.4f}]"
          + (f" (resampling {bootstrap['groups']} groups)" if groups is not None else ""))
    if penalties:
        refitted = hindsight[probe] = hindsight.get(probe) or hindsight_probes(probe, penalties, args.threads,
                                                                                args.groups, args.heldout)
        pair["hindsight_probes"] = hindsight_rows(name, runs, refitted, args, groups)
    if groups is not None:
        pair["per_group"] = table = per_group(runs, groups)
        print(f"{name}: groups given one class for all their images: " + ", ".join(
            f"{sum(row[kind]['one_class'] for row in table.values())} of {len(table)} by the "
            f"{kind.replace('_', '-')}" for kind in runs))
    return pair


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    penalties = checked_penalties(parser, args)
    command = " ".join(["python", "-m", "experiments.finetune_rotation.finetune_rotation", *map(
        shlex.quote, sys.argv[1:] if argv is None else argv)])
    result = {"setup": args.setup, "heldout": args.heldout, "command": command, "pairs": {}}
    hindsight, scored = {}, {}  # RUN_PROBE: its refitted probes, and its result, for pairs that share it
    for name, fine_tuned, probe in args.pair:
        result["pairs"][name] = compare_pair(name, fine_tuned, probe, args, penalties, scored, hindsight)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    from corevision_hf.cli import run

    sys.exit(run(main))
