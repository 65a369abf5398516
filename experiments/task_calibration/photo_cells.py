"""Study (#68 item 3, 2026-12-07): is the digit in the dense teacher's tokens on photos, where neither frozen reader
finds it? The linear probe of the pilot (same decays, the same 320 / 80 split) on the mean of the teacher's patch
tokens over the digit's own cells (an oracle of where), beside the pilot's readers, on the cached passes of the
pilot on black, the pilot on photos (the product's canvases) and photo_plates.py's plate and dim canvases.

    python -m experiments.task_calibration.photo_cells
"""

import json
import types
from pathlib import Path

import torch

from benchmarks import task_pilot
from evaluation.canvases import task_splits
from evaluation.readers import probe
from evaluation.task_arguments import GCOMPRIS_PHOTOS
from evaluation.teacher_passes import TeacherPasses
from evaluation.teachers import load_teacher_model
from experiments.task_calibration.photo_plates import canvases

OUT = Path("experiments/task_calibration/photo_cells.json")


def cells_accuracy(tensors: dict, split, pilot) -> float:
    cells = split.label_cells.float()   # (N, P): the digit's own cells
    patches = tensors["patches"].float()
    features = (patches * cells[..., None]).sum(1) / cells.sum(1, keepdim=True).clamp(min=1)
    fit = probe(features, split.labels, features[:1], pilot.val, pilot.probe_decays)
    return max(fit["val_accuracy"].values())


def main() -> None:
    torch.set_num_threads(2)
    pilot = task_pilot.parse_args([])
    teacher, _ = load_teacher_model(pilot.teacher)
    product = TeacherPasses(pilot.cache_dir, teacher, pilot.batch_size)
    study = TeacherPasses(Path("outputs/task_cache_photo_plates"), teacher, pilot.batch_size)
    rows = []
    for background in ("black", "photo"):
        setting = types.SimpleNamespace(canvas_size=518, seed=1, background=background, extra_photos=GCOMPRIS_PHOTOS,
                                        digit_size=28, strokes=0, train=400, test=1)
        split = task_splits(setting, "single")["train"]
        rows.append({"canvases": background, "digit_size": 28,
                     "digit_cells": cells_accuracy(product.get(split, split.key, 518), split, pilot)})
    for mode in ("plate", "dim"):
        split = canvases(mode, 28, 400, 1, GCOMPRIS_PHOTOS)
        rows.append({"canvases": mode, "digit_size": 28,
                     "digit_cells": cells_accuracy(study.get(split, split.key, 518), split, pilot)})
    for row in rows:
        print(f"{row['canvases']:6s} {row['digit_size']} px: the digit's cells read {row['digit_cells']:.3f}")
    OUT.write_text(json.dumps({"rows": rows, "validation": pilot.val, "train": pilot.train,
                               "command": "python -m experiments.task_calibration.photo_cells"}, indent=1))


if __name__ == "__main__":
    main()
