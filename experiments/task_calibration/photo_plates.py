"""Study (#68 item 3, 2026-12-07): digits on photos that a frozen reader can find. The pilot of the product's photo
canvases (the white digit blended by the maximum) found no setting where the dense teacher reads the digit; this
tries two changes written down in LOG.md before running, on the pilot's own seed-1 canvases, readers and rule:

- plate: the digit on its own black square (its box), the photo everywhere else;
- dim: the maximum of the digit and half the photo's brightness (--brightness: another fraction of it; 22:10 UTC).

    python -m experiments.task_calibration.photo_plates --out experiments/task_calibration/photo_plates.json

It runs benchmarks.task_pilot's own measure on canvases made here from the product's black and photo canvases (the
same digits, layouts and photo crops), in a cache of its own (the product's cache key does not know these modes).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import task_pilot
from corevision_hf import lookwhere_from_teacher
from evaluation.canvases import Split
from evaluation.sparse_digits import CELL, make_canvases, photo_background
from evaluation.task_arguments import GCOMPRIS_PHOTOS
from evaluation.task_student import SELECTOR_DEPTH, line_costs
from evaluation.teacher_passes import TeacherPasses
from evaluation.teachers import load_teacher_model

MODES = ("plate", "dim")


def canvases(mode: str, digit_size: int, count: int, seed: int, extra: Path, size: int = 518,
             brightness: float = 0.5) -> Split:
    """Seed `seed`'s single-digit training canvases in `mode` (dim: the photo at `brightness` of its own), as a Split
    keyed for a cache of this study alone."""
    common = dict(variant="single", split="train", seed=seed, digit_size=digit_size, strokes=0, canvas_size=size)
    black = make_canvases(count, background="black", **common)
    images = np.empty_like(black.images)
    for i in range(count):
        photo = photo_background(seed, "train", "single", digit_size, size, i, extra)
        if mode == "plate":
            images[i] = photo
            for _, y, x, _ in black.layout[i]:
                images[i, y : y + digit_size, x : x + digit_size] = black.images[i, y : y + digit_size,
                                                                                  x : x + digit_size]
        else:
            # at 0.5 the first study's canvases bit for bit (and its cached passes): photo // 2, not rounded
            faint = photo // 2 if brightness == 0.5 else np.round(photo * brightness).astype(photo.dtype)
            images[i] = np.maximum(black.images[i], faint)
    black.images = images
    key = {"study": "photo_plates", "mode": mode, **common, "count": count,
           **({"brightness": brightness} if mode == "dim" and brightness != 0.5 else {})}
    return Split.of_canvases(black, size // CELL, key)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("experiments/task_calibration/photo_plates.json"))
    parser.add_argument("--cache-dir", type=Path, default=Path("outputs/task_cache_photo_plates"))
    parser.add_argument("--digit-sizes", type=int, nargs="+", default=[28, 42])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--brightness", type=float, nargs="+", default=[0.5],
                        help="dim: the photo's brightness under the digits, a fraction of its own (each a setting)")
    parser.add_argument("--train", type=int, default=None, help="canvases per setting (default: the pilot's 400)")
    parser.add_argument("--lines", nargs="+", choices=("dense", "equal_flops"), default=["dense", "equal_flops"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pilot = task_pilot.parse_args([])   # the pilot's own numbers: 400 canvases, 80 validation, seed 1, its decays
    pilot.train = args.train or pilot.train   # validation stays the last 80
    teacher, source = load_teacher_model(pilot.teacher)
    student = lookwhere_from_teacher(teacher, selector_depth=SELECTOR_DEPTH, selector_image_size=pilot.selector_size)
    _, equal_size = line_costs(pilot, teacher, student)
    passes = TeacherPasses(args.cache_dir, teacher, pilot.batch_size)
    started, rows = time.perf_counter(), []
    for mode in args.modes:
        for digit_size, brightness in [(d, b) for d in args.digit_sizes for b in args.brightness]:
            split = canvases(mode, digit_size, pilot.train, pilot.seed, GCOMPRIS_PHOTOS, brightness=brightness)
            sizes = {line: size for line, size in (("dense", pilot.canvas_size), ("equal_flops", equal_size))
                     if line in args.lines}
            row = {"mode": mode, "strokes": 0, "digit_size": digit_size, "brightness": brightness,
                   **task_pilot.read_split(pilot, passes, split, sizes)}
            if len(args.lines) == 2:
                row["gap"] = row["dense"]["best"] - row["equal_flops"]["best"]
            rows.append(row)
            print(f"{mode} {brightness} {digit_size} px, {pilot.train} canvases: "
                  + ", ".join(f"{line} {row[line]['best']:.3f}" for line in args.lines)
                  + (f", gap {row['gap']:+.3f}" if "gap" in row else "")
                  + f" ({time.perf_counter() - started:.0f} s)", flush=True)
    choice = task_pilot.choose(rows, pilot.min_dense, pilot.min_gap) if len(args.lines) == 2 else None
    report = {"teacher": source, "rows": rows, "choice": choice, "train": pilot.train, "validation": pilot.val,
              "seed": pilot.seed, "equal_flops_size": equal_size, "total_time_s": time.perf_counter() - started,
              "command": "python -m experiments.task_calibration.photo_plates " + " ".join(argv or sys.argv[1:])}
    args.out.write_text(json.dumps(report, indent=1))
    print(f"chosen: {choice and choice['chosen']}", flush=True)
    return report


if __name__ == "__main__":
    main()
