"""Does `--recipe finetune-guarded` ever lose to its own probe? Three task types, two image sizes, paired over photos.

    python examples/gcompris_photos.py              # once: the 121 photos of Debian's gcompris-qt-data (44 MB)
    python -m benchmarks.finetune_tasks --output benchmarks/results/finetune_tasks.json    # make finetune-tasks

The rule, the tasks and what is met were written down before the first run (experiments/finetune_rule/LOG.md,
2026-12-07):

1. Photos: those of --photos (examples/gcompris_photos.py), each of a category by its GCompris activity (CATEGORIES).
   Per category, in a seeded order: the first 30 % held out, the next 20 % validate, the rest train; one split for
   every task, so that no held-out photo trains or validates anywhere.
2. Tasks (ImageFolders under --work-dir/tasks/TASK/{train,val,heldout}, crops saved at 224 px, seeded):
   semantic (the photo's category), orientation (every crop upright and upside down), colour (every crop as it is,
   warmer and cooler: CASTS). Training crops are 60-100 % of a photo's shorter side, the others 80-100 %.
3. Lines, at each --sizes image size: the probe, `python -m training.finetune MODEL --recipe finetune-guarded
   --epochs 0`, and the recipe, the same without --epochs 0; both with --val-data (the validation crops) and
   --val-groups (a photo's crops are one group). Beside them, not judged: the recipe's final/ (its last epoch).
4. Scored on the held-out crops image by image (training.compare_finetuned.outcomes); `difference` is recipe minus
   probe, its 95 % paired bootstrap interval over whole held-out photos. Met when every mean difference is at least
   -0.02 and no interval lies entirely below 0.

--model: a LookWhere or VECA folder (default: LookWhere-S from the offline DINOv2-S, built into --work-dir when
missing). A finished run in --work-dir/runs is reused (its best/ and choice.json are there): delete the folder to start
anew. --smoke: a tiny run for the tests (one crop a photo, one epoch at lr 1e-3, --sizes 32,48 unless given).
The JSON holds the setup, one entry per task and size (`task`, `image_size`, `probe`, `recipe`, `final`, `difference`,
`kept` and the run's choice, the commands, each held-out file with its photo and each line's outcome per image, "1"
right) and whether the rule is met.
"""

import argparse
import os
import random
import shlex
import sys
import time
from pathlib import Path

from corevision_hf.cli import HelpFormatter, run

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("semantic", "orientation", "colour")
# a category's GCompris activities (the first part of the file names examples/gcompris_photos.py writes)
CATEGORIES = {"animals": ("erase", "explore_farm_animals", "explore_world_animals"),
              "monuments": ("explore_monuments",), "music": ("explore_world_music",), "sea": ("clickgame",)}
CASTS = {"neutral": (1.0, 1.0, 1.0), "warm": (1.15, 1.0, 0.85), "cool": (0.85, 1.0, 1.15)}  # red, green, blue gains
TRAIN_CROPS = {"semantic": 8, "orientation": 4, "colour": 3}  # crops of each training photo: 8, 8 and 9 images
EVAL_CROPS = 4  # crops of each validation and held-out photo
HELD_OUT, VALIDATION = 0.3, 0.2  # shares of each category's photos
CROP_SIDE = 224
GROUPS = r"(.+)_\d+$"  # an image's photo: its file name less the crop number
RULE = ("met when every mean difference (recipe - probe, held-out) is at least -0.02 and no 95 % interval (paired "
        "bootstrap over held-out photos) lies entirely below 0; written down in experiments/finetune_rule/LOG.md "
        "before the first run")


def parse_args(argv=None) -> argparse.Namespace:
    from training.arguments import parse_seed

    parser = argparse.ArgumentParser(prog="python -m benchmarks.finetune_tasks", description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--photos", default=str(ROOT / "outputs" / "gcompris_photos"),
                        help="the photos, named {activity}-{name} (python examples/gcompris_photos.py)")
    parser.add_argument("--model", default=None,
                        help="a LookWhere or VECA folder (default: LookWhere-S from the offline DINOv2-S, built into "
                             "--work-dir/lookwhere-s-offline when missing)")
    parser.add_argument("--sizes", default=None, help="image sizes, comma-separated (default 112,224; --smoke 32,48)")
    parser.add_argument("--tasks", default=",".join(TASKS), help="the tasks, comma-separated")
    parser.add_argument("--work-dir", default=None,
                        help="task folders and runs (default outputs/finetune_tasks; --smoke: "
                             "outputs/finetune_tasks_smoke)")
    parser.add_argument("--output", default=None,
                        help="the JSON (default WORK_DIR/finetune_tasks.json; make finetune-tasks: the committed one)")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples of the held-out photos")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of torch (default: torch's own)")
    parser.add_argument("--seed", type=parse_seed, default=0, help="the split, the crops and the runs' --seed")
    parser.add_argument("--smoke", action="store_true", help="a tiny run for the tests")
    args = parser.parse_args(argv)
    args.sizes = [int(size) for size in (args.sizes or ("32,48" if args.smoke else "112,224")).split(",")]
    args.tasks = args.tasks.split(",")
    if unknown := sorted(set(args.tasks) - set(TASKS)):
        raise ValueError(f"--tasks {unknown[0]} is no task: choose from {', '.join(TASKS)}.")
    if args.resamples < 1 or min(args.sizes) < 1:
        raise ValueError("--resamples and --sizes must be positive.")
    work = "finetune_tasks_smoke" if args.smoke else "finetune_tasks"
    args.work_dir = Path(args.work_dir or ROOT / "outputs" / work)
    args.output = Path(args.output or args.work_dir / "finetune_tasks.json")
    return args


def category(path: Path) -> str | None:
    """The category of a photo by its activity (the file name up to the first "-"); None for another activity."""
    activity = path.stem.split("-", 1)[0]
    return next((name for name, activities in CATEGORIES.items() if activity in activities), None)


def photo_split(folder: str, seed: int) -> dict[str, list[tuple[Path, str]]]:
    """{"train", "val", "heldout": [(photo, category)]}: per category, the photos in a seeded order, the first
    HELD_OUT share (at least one) held out, the next VALIDATION share (at least one) for validation, the rest train."""
    photos = sorted(path for path in Path(folder).glob("*") if path.suffix.lower() in (".webp", ".jpg", ".png")
                    and category(path)) if Path(folder).is_dir() else []
    if not photos:
        raise ValueError(f"--photos {folder} holds no photos of the GCompris activities: run python "
                         "examples/gcompris_photos.py first (it downloads gcompris-qt-data, 44 MB), or give --photos.")
    split = {"train": [], "val": [], "heldout": []}
    for name in CATEGORIES:
        members = [path for path in photos if category(path) == name]
        random.Random(f"{seed}/{name}").shuffle(members)
        held, val = max(1, round(HELD_OUT * len(members))), max(1, round(VALIDATION * len(members)))
        if len(members) < held + val + 1:
            raise ValueError(f"--photos {folder} has {len(members)} photos of {name}: at least 3 are needed (held "
                             "out, validation, training).")
        split["heldout"] += [(path, name) for path in members[:held]]
        split["val"] += [(path, name) for path in members[held:held + val]]
        split["train"] += [(path, name) for path in members[held + val:]]
    return split


def labelled_crops(task: str, crop, name: str) -> list[tuple[str, object]]:
    """(class, image) of one crop in `task`: its category; upright and upside down; each colour cast."""
    import numpy as np
    from PIL import Image

    if task == "semantic":
        return [(name, crop)]
    if task == "orientation":
        return [("upright", crop), ("upside_down", crop.rotate(180))]
    pixels = np.asarray(crop, dtype=np.float32)
    cast = {name: np.clip(pixels * np.array(gains, dtype=np.float32), 0, 255).round() for name, gains in CASTS.items()}
    return [(name, Image.fromarray(made.astype(np.uint8))) for name, made in cast.items()]


def write_task(task: str, split: dict, folder: Path, smoke: bool) -> None:
    """The task's ImageFolders folder/{train,val,heldout}/{class}/{photo}_{crop}.png, written anew; each photo's crops
    drawn from (task, photo) alone."""
    import shutil

    from PIL import Image

    from corevision_hf.images import open_image

    shutil.rmtree(folder, ignore_errors=True)
    for side, photos in split.items():
        crops = (1 if smoke else TRAIN_CROPS[task]) if side == "train" else (1 if smoke else EVAL_CROPS)
        low = 0.6 if side == "train" else 0.8
        for path, name in photos:
            image, rng = open_image(path), random.Random(f"{task}/{path.name}")
            for index in range(crops):
                side_px = int(min(image.size) * rng.uniform(low, 1.0))
                left, top = rng.randint(0, image.width - side_px), rng.randint(0, image.height - side_px)
                crop = image.crop((left, top, left + side_px, top + side_px)).resize(
                    (CROP_SIDE, CROP_SIDE), Image.Resampling.BICUBIC)
                for label, made in labelled_crops(task, crop, name):
                    (folder / side / label).mkdir(parents=True, exist_ok=True)
                    made.save(folder / side / label / f"{path.stem}_{index}.png")


def default_model(work_dir: Path) -> str:
    """LookWhere-S from the offline DINOv2-S (its map head untrained), saved in work_dir once."""
    folder = work_dir / "lookwhere-s-offline"
    if not (folder / "config.json").is_file():
        from corevision_hf import lookwhere_from_teacher, save_model_folder
        from training.teacher import load_teacher

        print(f"building LookWhere-S from the offline DINOv2-S into {folder}", flush=True)
        save_model_folder(lookwhere_from_teacher(load_teacher("offline-dinov2-small")), str(folder))
    return str(folder)


def run_line(model: str, data: Path, size: int, output: Path, args, probe: bool) -> dict:
    """One run of training.finetune (`--recipe finetune-guarded`, with --epochs 0 for the probe), or the finished one
    already in `output`; returns {"command", "seconds" (None when reused), "choice"}."""
    import json

    from training import finetune

    argv = [model, "--recipe", "finetune-guarded", "--data", str(data / "train"), "--val-data", str(data / "val"),
            "--val-groups", GROUPS, "--image-size", str(size), "--output-dir", str(output), "--seed", str(args.seed)]
    argv += ["--batch-size", "4"] if args.smoke else []  # the probe's views are drawn per batch: one size for both
    argv += ["--epochs", "0"] if probe else (["--epochs", "1", "--lr", "1e-3"] if args.smoke else [])
    argv += ["--threads", str(args.threads)] if args.threads else []
    command = " ".join(["python", "-m", "training.finetune", *map(shlex.quote, argv)])
    seconds = None
    if finished(output, argv):
        print(f"reusing the finished run in {output}", flush=True)
    else:
        print(f"\n$ {command}", flush=True)
        started = time.perf_counter()
        finetune.main([*argv, "--overwrite"] if output.exists() else argv)
        seconds = time.perf_counter() - started
    with open(output / "choice.json") as f:
        return {"command": command, "seconds": seconds, "choice": json.load(f)}


def finished(output: Path, argv: list[str]) -> bool:
    """Whether `output` holds a finished run (best/, choice.json) of training.finetune with `argv`'s model, data,
    size, epochs, batch and seed (a run of other settings, such as a smoke run's, is made anew)."""
    import json

    from training import finetune

    if not ((output / "best" / "validation.json").is_file() and (output / "choice.json").is_file()):
        return False
    with open(output / "run.json") as f:
        done = json.load(f)["args"]
    wanted = vars(finetune.parse_args(argv))
    return all(done.get(name) == wanted[name] for name in ("checkpoint", "data", "val_data", "image_size", "epochs",
                                                           "batch_size", "seed", "recipe"))


def entry(task: str, size: int, data: Path, runs: dict, args) -> dict:
    """One task and size: each line scored on the held-out crops, recipe and final/ minus probe paired over photos."""
    from training.compare_finetuned import outcomes, paired_difference
    from training.labelled_folders import labelled_files, source_groups

    examples, classes = labelled_files(str(data / "heldout"), train=False, flag="held-out")
    photos = source_groups(examples, GROUPS, "the photo pattern")
    scored = {"probe": outcomes(str(runs["probe"]["folder"] / "best"), examples, classes),
              "recipe": outcomes(str(runs["recipe"]["folder"] / "best"), examples, classes),
              "final": outcomes(str(runs["recipe"]["folder"] / "final"), examples, classes)}
    versus = {name: paired_difference(scored[name]["correct"], scored["probe"]["correct"], photos, args.resamples,
                                      args.seed) for name in ("recipe", "final")}
    choice = runs["recipe"]["choice"]
    if choice["kept"] == "probe" and scored["recipe"]["correct"] != scored["probe"]["correct"]:
        raise RuntimeError(f"{task} at {size} px: the recipe kept its probe, yet its best/ and the probe run's differ: "
                           "the two probes are not the same.")
    return {"task": task, "image_size": size, "probe": scored["probe"]["accuracy"],
            "recipe": scored["recipe"]["accuracy"], "final": scored["final"]["accuracy"],
            "difference": versus["recipe"], "final_minus_probe": versus["final"], "kept": choice["kept"],
            "choice": choice, "classes": classes, "heldout_images": len(examples), "heldout_photos": len(set(photos)),
            "commands": {name: line["command"] for name, line in runs.items()},
            "seconds": {name: line["seconds"] for name, line in runs.items()},
            "heldout_files": [os.path.relpath(path, data / "heldout") for path, _ in examples], "photos": photos,
            "outcomes": {name: line["correct"] for name, line in scored.items()}}


def verdict(entries: list[dict]) -> dict:
    """Whether the rule is met, and the lines where the recipe's interval lies above 0 (gains kept)."""
    failing = [f"{line['task']} {line['image_size']}" for line in entries
               if line["difference"]["mean"] < -0.02 or line["difference"]["high"] < 0]
    kept = [f"{line['task']} {line['image_size']}" for line in entries if line["difference"]["low"] > 0]
    return {"rule": RULE, "met": not failing, "failing": failing, "gains_kept": kept}


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    from training.finetune_output import write_json

    if args.threads:
        torch.set_num_threads(args.threads)
    split = photo_split(args.photos, args.seed)
    model = args.model or default_model(args.work_dir)
    entries = []
    for task in args.tasks:
        data = args.work_dir / "tasks" / task
        write_task(task, split, data, args.smoke)
        for size in args.sizes:
            runs = {}
            for name in ("probe", "recipe"):
                folder = args.work_dir / "runs" / f"{task}_{size}" / name
                runs[name] = {**run_line(model, data, size, folder, args, probe=name == "probe"), "folder": folder}
            entries.append(entry(task, size, data, runs, args))
            line = entries[-1]
            print(f"{task} at {size} px: probe {line['probe']:.3f}, recipe {line['recipe']:.3f} (kept {line['kept']}), "
                  f"difference {line['difference']['mean']:+.3f} [{line['difference']['low']:+.3f}, "
                  f"{line['difference']['high']:+.3f}] over {line['heldout_photos']} photos", flush=True)
    given = sys.argv[1:] if argv is None else argv
    result = {"setup": {"command": " ".join(["python", "-m", "benchmarks.finetune_tasks", *map(shlex.quote, given)]),
                        "photos": args.photos, "model": model, "seed": args.seed, "smoke": args.smoke,
                        "sizes": args.sizes, "resamples": args.resamples, "categories": CATEGORIES, "casts": CASTS,
                        "split": {side: [path.name for path, _ in photos] for side, photos in split.items()}},
              "entries": entries, **verdict(entries)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_json(str(args.output), result)
    print(f"rule {'met' if result['met'] else 'NOT met'} ({RULE}); wrote {args.output}")
    return result


if __name__ == "__main__":
    sys.exit(run(main))
