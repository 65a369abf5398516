"""Which "where" target finds small objects for a DINOv2 teacher: the check to run before training LookWhere.

    python -m evaluation.where_check --teacher offline-dinov2-small

LookWhere's selector learns to imitate a map of the teacher's last-layer attention (training.teacher's map targets,
`--map-queries`: the mean patch query "patches", the authors' token positions "authors", the CLS query "cls"). A
target worth distilling puts the objects that decide the label in its top cells. This command measures that on the
sparse-digits task's training canvases (evaluation.sparse_digits, train split: digits of the training pool, black
background, 518 px, canvases 0 to --canvases - 1 of each variant, "majority" and "single"), never the test canvases
that benchmarks.sparse_recognition scores on (test split): for each target, and for random cells (the mean of 3
draws per canvas), the share of the label digits' ink cells (label_ink > 0) that fall in the target's top 5%, 10% and
25% of cells, with a 95% bootstrap interval over canvases. It prints a table and one verdict line (the target with
the highest coverage at 10% on the majority canvases, and whether its interval lies above random's), and writes to
--out-dir (replacing files a run of it wrote there only with --force):
- where_check.json: the canvases it drew, the coverages (per canvas too), their intervals and the pick;
- where_check.png: each target over a few shipped photos and one training canvas, one row per target.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from evaluation.sparse_digits import CANVAS_SIZE, ROOT, make_canvases
from training.arguments import MAP_QUERIES, HelpFormatter, parse_seed

VARIANTS = ("majority", "single")
FRACTIONS = (0.05, 0.10, 0.25)  # top k% of the cells
PICK_FRACTION = 0.10
RANDOM_DRAWS = 3
BOOTSTRAP_RESAMPLES = 2000
DEFAULT_PHOTOS = ("astronaut.jpg", "chelsea.jpg", "coffee.jpg")  # of assets/photos/
BATCH = 8  # canvases per teacher forward
DIGIT_SIZE = 28  # the digits' side on the canvases measured (MNIST's own)
SPLIT = "train"  # a target is chosen on training canvases: the test canvases stay unseen until the benchmark scores
OUTPUTS = ("where_check.json", "where_check.png")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m evaluation.where_check", description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--teacher", required=True,
                        help="a DINOv2 teacher: hub id, save_pretrained folder, or offline-dinov2-small")
    parser.add_argument("--canvases", type=int, default=40, help="training canvases of each variant")
    parser.add_argument("--seed", type=parse_seed, default=0, help="the canvases', random cells' and bootstrap's seed")
    parser.add_argument("--out-dir", default=os.path.join("outputs", "where_check"),
                        help="where where_check.json and where_check.png go")
    parser.add_argument("--force", action="store_true",
                        help="replace where_check.json and where_check.png that this command wrote before")
    parser.add_argument("--photos", nargs="+", default=[str(ROOT / "assets" / "photos" / name) for name in
                                                        DEFAULT_PHOTOS], help="photos the targets are drawn over")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's CPU threads (default: OMP_NUM_THREADS, else 1)")
    args = parser.parse_args(argv)
    if os.path.lexists(args.out_dir) and not os.path.isdir(args.out_dir):
        raise ValueError(f"--out-dir {args.out_dir} is a file: give a folder (made if missing).")
    if args.canvases < 1:
        raise ValueError(f"--canvases must be at least 1, got {args.canvases}.")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}.")
    if missing := [photo for photo in args.photos if not os.path.isfile(photo)]:
        raise ValueError(f"--photos: {missing[0]} is not a file; give existing photo files.")
    return args


def teacher_maps(teacher, images: np.ndarray, patch: int) -> dict:
    """{target: (N, Hp * Wp) float32 map logits} of uint8 RGB images (N, S, S, 3), BATCH at a time."""
    import torch

    from corevision_hf.images import to_pixel_values
    from training.teacher import teacher_targets_and_maps

    grid = (images.shape[1] // patch, images.shape[2] // patch)
    parts = {query: [] for query in MAP_QUERIES}
    for first in range(0, len(images), BATCH):
        pixels = torch.stack([to_pixel_values(Image.fromarray(image)) for image in images[first : first + BATCH]])
        _, _, maps = teacher_targets_and_maps(teacher, pixels, grid, queries=MAP_QUERIES)
        for query, scores in maps.items():
            parts[query].append(scores.float())
    return {query: torch.cat(scores) for query, scores in parts.items()}


def measure(teacher, patch: int, args) -> dict:
    """{variant: {target or "random": {"top N%": {"mean", "low", "high", "half_width", "per_canvas"}}}} on the
    training canvases 0 to args.canvases - 1."""
    import torch

    from evaluation.paired_stats import bootstrap_rows, interval
    from evaluation.selections import coverage, top_cells

    size = CANVAS_SIZE // patch * patch
    rows = bootstrap_rows(args.canvases, BOOTSTRAP_RESAMPLES, args.seed)
    report = {}
    for variant in VARIANTS:
        canvases = make_canvases(args.canvases, variant=variant, split=SPLIT, seed=args.seed, digit_size=DIGIT_SIZE,
                                 canvas_size=size, cell=patch)
        label_cells = torch.from_numpy(canvases.label_ink).reshape(args.canvases, -1) > 0
        maps = teacher_maps(teacher, canvases.images, patch)
        generator = torch.Generator().manual_seed(args.seed * len(VARIANTS) + VARIANTS.index(variant))
        draws = torch.rand(RANDOM_DRAWS, *label_cells.shape, generator=generator)
        report[variant] = {target: {} for target in (*maps, "random")}
        for fraction in FRACTIONS:
            k = max(1, round(fraction * label_cells.shape[1]))
            shares = {target: coverage(top_cells(scores, k), label_cells) for target, scores in maps.items()}
            shares["random"] = torch.stack([coverage(top_cells(draw, k), label_cells) for draw in draws]).mean(0)
            for target, values in shares.items():
                report[variant][target][f"top {fraction:.0%}"] = {**interval(values, rows),
                                                                  "per_canvas": values.tolist()}
    return report


def pick(report: dict) -> dict:
    """The target with the highest mean coverage at PICK_FRACTION on the majority canvases, and whether its interval
    lies above random's (its lower bound above random's upper bound)."""
    key = f"top {PICK_FRACTION:.0%}"
    majority = report["majority"]
    best = max(MAP_QUERIES, key=lambda target: majority[target][key]["mean"])
    found, chance = majority[best][key], majority["random"][key]
    return {"target": best, "at": key, "coverage": found["mean"], "interval": [found["low"], found["high"]],
            "random": chance["mean"], "random_interval": [chance["low"], chance["high"]],
            "beats_random": found["low"] > chance["high"]}


def table(report: dict, canvases: int) -> str:
    """The coverages as a text table, one row per variant and target."""
    keys = [f"top {fraction:.0%}" for fraction in FRACTIONS]
    lines = [f"share of the label digits' ink cells in a target's top cells: mean [95% bootstrap interval] over "
             f"{canvases} training canvases per variant",
             f"{'variant':<9} {'target':<8} " + " ".join(f"{key:<19}" for key in keys)]
    for variant, targets in report.items():
        for target, values in targets.items():
            cells = [f"{values[key]['mean']:.2f} [{values[key]['low']:.2f}, {values[key]['high']:.2f}]" for key in keys]
            lines.append(f"{variant:<9} {target:<8} " + " ".join(f"{cell:<19}" for cell in cells))
    return "\n".join(lines)


def verdict(choice: dict, teacher: str) -> str:
    """One line: which target finds the objects for `teacher`, and by what margin over random cells."""
    numbers = (f"{choice['coverage']:.2f} [{choice['interval'][0]:.2f}, {choice['interval'][1]:.2f}] of the label ink "
               f"cells in its {choice['at']} on the majority canvases, random cells {choice['random']:.2f} "
               f"[{choice['random_interval'][0]:.2f}, {choice['random_interval'][1]:.2f}]")
    if choice["beats_random"]:
        return (f"verdict: --map-queries {choice['target']} finds the objects for {teacher}: {numbers} (its interval "
                "lies above random's).")
    return (f"verdict: no target finds the objects for {teacher} better than random cells; the best, "
            f"{choice['target']}: {numbers} (the intervals overlap).")


def draw(teacher, patch: int, photos: list[str], seed: int):
    """A figure: one row per target, its map (per-panel colour scale) over each photo and one majority canvas, whose
    label digits are outlined."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    from corevision_hf.images import open_image

    size = CANVAS_SIZE // patch * patch
    images = [np.asarray(open_image(photo).resize((size, size))) for photo in photos]
    canvas = make_canvases(1, split=SPLIT, seed=seed, digit_size=DIGIT_SIZE, canvas_size=size, cell=patch)
    images.append(canvas.images[0])
    maps = teacher_maps(teacher, np.stack(images), patch)
    names = [Path(photo).stem for photo in photos] + ["canvas (label: cyan)"]
    figure = Figure(figsize=(2.6 * len(images), 2.8 * len(MAP_QUERIES)), layout="constrained")
    axes = figure.subplots(len(MAP_QUERIES), len(images), squeeze=False)
    grid = size // patch
    for row, target in enumerate(MAP_QUERIES):
        for column, (image, name) in enumerate(zip(images, names)):
            axis = axes[row, column]
            axis.imshow(image)
            axis.imshow(maps[target][column].reshape(grid, grid).numpy(), cmap="magma", alpha=0.6,
                        extent=(0, size, size, 0), interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
            axis.set_title(name if row == 0 else "", fontsize=9)
        for digit_class, y, x, _ in canvas.layout[0]:
            edge = "#00e5ff" if digit_class == canvas.labels[0] else "#888888"  # the label's digits, the others
            axes[row, -1].add_patch(Rectangle((x, y), DIGIT_SIZE, DIGIT_SIZE, fill=False, edgecolor=edge, linewidth=1))
        axes[row, 0].set_ylabel(f"--map-queries {target}", fontsize=10)
    return figure


def main(argv=None) -> dict:
    """The command; returns the JSON report it wrote."""
    args = parse_args(argv)
    import torch  # only now: --help and bad arguments answer at once

    from corevision_hf.agreement import teacher_patch_size
    from corevision_hf.atomic import atomic_path, write_text_atomically
    from corevision_hf.measure import threads_to_use
    from corevision_hf.outputs import check_file_output, record
    from training.teacher import load_teacher

    out = Path(args.out_dir)
    for name in OUTPUTS:  # before any work: a report of an earlier check is kept unless --force
        check_file_output(str(out / name), args.force)

    torch.set_num_threads(threads_to_use(args.threads, default=1))
    teacher = load_teacher(args.teacher)  # not a DINOv2: teacher_targets_and_maps's ValueError
    patch = teacher_patch_size(teacher)
    coverages = measure(teacher, patch, args)
    choice = pick(coverages)
    report = {"teacher": args.teacher, "canvas_size": CANVAS_SIZE // patch * patch, "cell": patch,
              "canvases": args.canvases, "seed": args.seed, "split": SPLIT, "background": "black",
              "canvases_drawn": f"training canvases 0 to {args.canvases - 1} of each variant (evaluation.sparse_digits"
                                f".make_canvases(split={SPLIT!r}, seed={args.seed}): digits of the training pool), "
                                "never the test canvases benchmarks.sparse_recognition scores on (split 'test')",
              "random_draws": RANDOM_DRAWS, "bootstrap_resamples": BOOTSTRAP_RESAMPLES, "coverage": coverages,
              "pick": choice}
    print(table(coverages, args.canvases))
    print(verdict(choice, args.teacher))
    figure = draw(teacher, patch, args.photos, args.seed)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out / OUTPUTS[0], json.dumps(report, indent=2))
    with atomic_path(out / OUTPUTS[1]) as temporary:
        figure.savefig(temporary, dpi=100, format="png")
    record(str(out), list(OUTPUTS), keep=True)  # what --force may replace next time
    print(f"wrote {out / OUTPUTS[0]}, {out / OUTPUTS[1]}")
    return report


def cli(argv=None) -> int:
    """The command line: a bad input ends in one line on stderr and exit status 2."""
    try:
        main(argv)
    except (Exception, KeyboardInterrupt) as error:  # corevision_hf.cli (and torch) only now: --help answers at once
        from corevision_hf.cli import exit_status

        return exit_status(error)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
