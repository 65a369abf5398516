"""Validation during training (--eval-every): agreement with the teacher on held-out images over the authors' grid of
budgets and resolutions. The grid average, `score`, picks the `best/` checkpoint.

A cell (resolution, budget) holds the mean over images of the CLS cosine (student pooler_output vs teacher token 0)
and of the patch cosine (student patch tokens vs the teacher's last Hp * Wp tokens, mean over patches), as
`corevision_hf.agreement.per_image_agreement` computes them; given the teacher's mean tokens over the training crops
(the centre), also the centred cosines and R^2, which the score then averages: a student that outputs the mean token
scores 0 on them, where its raw cosine is already high. Both models put the patch tokens last: VECA
[active cores; patches], LookWhere [prefix; filled grid].
"""

import itertools
import math

import torch
from accelerate.utils import extract_model_from_parallel
from torch.utils.data import DataLoader

from corevision_hf.agreement import (
    per_image_agreement, r_squared, teacher_input, teacher_patch_size, teacher_targets,
)

from .data import build_dataset, collate

SUMMED = ("cls_cosine", "patch_cosine")  # per-image values summed over a cell's images
CENTRED_SUMS = ("cls_centred_cosine", "patch_centred_cosine", "cls_sse", "cls_sst", "patch_sse", "patch_sst")
MEANS = ("cls_cosine", "patch_cosine", "cls_centred_cosine", "patch_centred_cosine")  # reported as means over images


class HeldOutAgreement:
    """Agreement with the teacher on the first images of `source` (a folder or `datasets` name, read as
    `build_dataset(train=False)` reads it: resize and centre crop, unreadable images skipped), in fixed order.

    budget_name: "num_cores" (VECA) or "k" (LookWhere); budgets and resolutions span the grid. augment: whose eval
    resize and crop (`training.data.AUGMENTATIONS`; the authors' recipes validate with their own).
    With several processes (`accelerator`), each evaluates its own ceil(max_images / num_processes) images and the
    sums are reduced, so every process returns the same numbers. The folder is listed here, once per resolution.
    """

    def __init__(self, source: str, budget_name: str, budgets: list[int], resolutions: list[int], batch_size: int,
                 max_images: int = 64, accelerator=None, augment: str = "simple"):
        self.source, self.budget_name, self.budgets, self.resolutions = source, budget_name, budgets, resolutions
        self.batch_size, self.accelerator = batch_size, accelerator
        rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
        self.datasets = {}
        for resolution in resolutions:
            dataset, _ = build_dataset(source, image_size=resolution, train=False, process_index=rank,
                                       num_processes=world, augment=augment)
            self.datasets[resolution] = dataset.select(range(min(len(dataset), math.ceil(max_images / world))))

    def __call__(self, student: torch.nn.Module, teacher: torch.nn.Module, centre: tuple | None = None) -> dict:
        """student: possibly wrapped by `accelerator.prepare`, called as student(pixel_values, **{budget_name: b});
        run in eval mode and put back in its mode. teacher: frozen, run once per image and resolution. centre: the
        teacher's (mean CLS (D,), mean patch token (D,)) over the training crops (training.teacher_mean), or None.

        Returns {"score", "score_measure", "grid": one row per (resolution, budget), {"resolution", budget_name,
        "images", "cls_cosine", "patch_cosine"} and with a centre "cls_centred_cosine", "patch_centred_cosine" (means
        over images), "cls_r2" and "patch_r2" (over the images' pooled sums: 1 - sum SSE / sum SST)}. With a centre the
        score is the mean over cells of (cls_centred_cosine + patch_centred_cosine) / 2 (score_measure "centred
        cosine"), which a student outputting the mean token scores 0 on; without, of (cls_cosine + patch_cosine) / 2
        ("cosine"), which the mean token already wins largely.
        """
        patch = extract_model_from_parallel(student).config.patch_size
        for resolution in self.resolutions:
            if resolution % patch:
                raise ValueError(f"Validation resolution {resolution} is not a multiple of the student's patch size "
                                 f"{patch}.")
        device = next(student.parameters()).device
        measures = SUMMED + (CENTRED_SUMS if centre is not None else ())
        # per cell: each measure's sum over images, and the images; summed on the device, read once at the end
        sums = torch.zeros(len(self.resolutions), len(self.budgets), len(measures) + 1, device=device)
        was_training = student.training
        student.eval()
        try:
            with torch.no_grad():
                for row, resolution in enumerate(self.resolutions):
                    self._add_resolution(sums[row], student, teacher, resolution, patch, measures, centre)
        finally:
            student.train(was_training)
        if self.accelerator is not None and self.accelerator.num_processes > 1:
            sums = self.accelerator.reduce(sums, "sum")
        cells = itertools.product(self.resolutions, self.budgets)
        rows = [self._row(resolution, budget, dict(zip(measures, values)), values[-1])
                for (resolution, budget), values in zip(cells, sums.flatten(0, 1).tolist())]
        pair = ("cls_centred_cosine", "patch_centred_cosine") if centre is not None else ("cls_cosine", "patch_cosine")
        score = sum((row[pair[0]] + row[pair[1]]) / 2 for row in rows) / len(rows)
        return {"score": score, "score_measure": "centred cosine" if centre is not None else "cosine", "grid": rows}

    def _add_resolution(self, sums, student, teacher, resolution, patch, measures, centre) -> None:
        """Adds every budget's per-image sums at `resolution` to `sums` (budgets, measures + images)."""
        device = sums.device
        teacher_device = next(teacher.parameters()).device
        grid = (resolution // patch, resolution // patch)
        loader = DataLoader(self.datasets[resolution], batch_size=self.batch_size, collate_fn=collate)
        for batch in loader:
            pixel_values = batch["pixel_values"]
            if not len(pixel_values):  # every image of the batch was unreadable
                continue
            images = teacher_input(pixel_values.to(teacher_device), teacher_patch_size(teacher), patch)
            targets = tuple(t.to(device) for t in teacher_targets(teacher, images, grid))
            pixel_values = pixel_values.to(device)
            for column, budget in enumerate(self.budgets):
                output = student(pixel_values, **{self.budget_name: budget})
                patches = output.last_hidden_state[:, -grid[0] * grid[1]:].float()
                values = per_image_agreement(output.pooler_output.float(), patches, targets, centre)
                sums[column, :-1] += torch.stack([values[name].sum() for name in measures])
                sums[column, -1] += len(pixel_values)

    def _row(self, resolution: int, budget: int, sums: dict, images: float) -> dict:
        """One grid row from a cell's sums over its images."""
        if images == 0:
            raise ValueError(f"The held-out images {self.source} hold no readable image: give a folder of images "
                             "that can be decoded.")
        row = {"resolution": resolution, self.budget_name: budget, "images": int(images)}
        row.update({name: sums[name] / images for name in MEANS if name in sums})
        if "cls_sse" in sums:
            for part in ("cls", "patch"):
                sse, sst = torch.tensor(sums[f"{part}_sse"]), torch.tensor(sums[f"{part}_sst"])
                row[f"{part}_r2"] = r_squared(sse, sst).item()
        return row
