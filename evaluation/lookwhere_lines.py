"""LookWhere's lines of one variant of the sparse-recognition task (benchmarks.sparse_recognition): the cells each
selection keeps (SELECTIONS: the selector's, random, the centre, each teacher map, the digits' own), their label-cell
coverage, both readers of the extractor's tokens on them, `k_mass`, and the fine-tuned lines, beside
evaluation.task_lines' teacher lines (`LookWhereMeasure`); a line's name (`line_name`)."""

import copy
import json
from pathlib import Path

import numpy as np
import torch

from corevision_hf import lookwhere_flops
from corevision_hf.flops import k_mass_for_target
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from evaluation.finetune_protocol import FineTuned, Resume
from evaluation.lookwhere_features import extracted_features, k_mass_features, lookwhere_features, selector_maps_of
from evaluation.selections import coverage, random_scores, selection_scores, top_cells
from evaluation.sparse_digits import CELL
from evaluation.task_lines import DENSE, EQUAL, Measure
from evaluation.task_student import K_RATIOS, MAIN_K_RATIO
from training.teacher import MAP_QUERIES

SELECTIONS = ("selector", "random", "centre", *(f"oracle_{query}" for query in MAP_QUERIES), "digits")


class LookWhereMeasure(Measure):
    """evaluation.task_lines' lines of one variant (the teacher's two, and any `add`ed), with LookWhere's: per
    selection the label cells it kept (`covered`) and what it chose (`chosen`, for the picture), probed
    (`lookwhere_lines`, `k_mass_line`) or measured for coverage alone (`coverage_only`), and fine-tuned
    (`finetune_lines`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cells = (self.args.canvas_size // CELL) ** 2
        self.coverage_only = {}

    def selection(self, name: str) -> dict:
        """A LookWhere selection's line, probed or not: its `chosen` cells and `covered` shares."""
        return self.lines.get(name) or self.coverage_only[name]

    def lookwhere_lines(self, model, model_name: str, lines: dict) -> None:
        """The coverage of every selection at every k_ratio, and both readers of the selections in `lines`
        ({k_ratio: kinds}); random: --random-draws draws at k_ratio 0.1 (each its own probes; per canvas, the mean
        over draws), one elsewhere. Fine-tuning starts from draw 0's linear head."""
        batch = self.args.batch_size
        selector = {split: selector_maps_of(model, getattr(self, split), batch) for split in ("train", "test")}
        for ratio in K_RATIOS:
            for kind in SELECTIONS:
                probed = kind in lines.get(ratio, ())
                draws = self.args.random_draws if kind == "random" and ratio == MAIN_K_RATIO else 1
                parts = [self.selection_line(model, selector, ratio, kind, draw, probed) for draw in range(draws)]
                name = line_name(model_name, ratio, kind)
                if probed:
                    self.heads[name] = parts[0].pop("head")
                (self.lines if probed else self.coverage_only)[name] = merged_draws(parts)

    def selection_line(self, model, selector: dict, ratio: float, kind: str, draw: int, probed: bool) -> dict:
        """One draw of a selection: the cells it keeps on the test canvases, their label-cell coverage, and when
        `probed` the readers of the extractor's tokens on those cells (training canvases: their own draws)."""
        k = kept_for_ratio(ratio, self.cells)
        chosen = {split: top_cells(selection_scores(kind, getattr(self, split), selector[split][1],
                                                    getattr(self, f"teacher_{split}")["maps"],
                                                    self.args.seed + (split == "test"), draw), k)
                  for split in ("train", "test")}
        part = {"gflops": self.costs[ratio], "k": k, "chosen": chosen["test"],
                "covered": coverage(chosen["test"], self.test.label_cells)}
        if not probed:
            return part
        (train_features, train_tokens), (test_features, test_tokens) = (
            lookwhere_features(model, getattr(self, split), chosen[split], selector[split][0], self.args.batch_size)
            for split in ("train", "test"))
        return {**part, **self.read(train_features, test_features, train_tokens, test_tokens)}

    def k_mass_line(self, student) -> None:
        """`k_mass` at the mean GFLOPs of k_ratio 0.1, calibrated on the training canvases' selector maps."""
        size = (self.args.canvas_size,) * 2
        calibration = [(m, size) for m in selector_maps_of(student, self.train, self.args.batch_size)[1]]
        k_mass = k_mass_for_target(student.config, calibration, self.costs[MAIN_K_RATIO])
        train_features, _ = k_mass_features(student, self.train, k_mass, self.args.batch_size)
        test_features, kept = k_mass_features(student, self.test, k_mass, self.args.batch_size)
        gflops = float(np.mean([lookwhere_flops(student.config, *size, k=int(n)) / 1e9 for n in kept]))
        self.add(f"LookWhere-S k_mass {k_mass:.4g}", train_features, test_features, gflops, k_mass=k_mass,
                 mean_k=float(kept.double().mean()))

    def finetune_lines(self, student, teacher, resume_dir: Path | None = None) -> dict:
        """The fine-tuning protocol: LookWhere-S at k_ratio 0.1 on its selector's cells and on random cells (draw
        0), the selector frozen, and the teacher at equal FLOPs and dense; each head starts from that line's probe.
        With `resume_dir`, each line keeps its last finished epoch there (evaluation.finetune_protocol's `Resume`), so
        that a killed run goes on from it."""
        grid, k = self.args.canvas_size // CELL, kept_for_ratio(MAIN_K_RATIO, self.cells)
        out = {}
        for kind in ("selector", "random"):
            name = line_name("LookWhere-S", MAIN_K_RATIO, kind)

            def features_of(backbone, rows, pixels, seed, kind=kind):
                with torch.no_grad():  # the selector stays frozen
                    global_tokens, selector_map = backbone.selector(pixels, (grid, grid), None)
                scores = selector_map if kind == "selector" else random_scores(rows, grid * grid, seed)
                return extracted_features(backbone, pixels, top_cells(scores, k), global_tokens)

            model = copy.deepcopy(student)
            model.selector.requires_grad_(False)
            print(f"      {name}", flush=True)
            out[name] = self.finetuned(FineTuned(features_of, model, self.heads[name]), self.lines[name]["gflops"],
                                       self.resume(resume_dir, name))
        for name in (EQUAL, DENSE):  # the dense teacher last: some 12 times an epoch of LookWhere's
            print(f"      {name}", flush=True)
            out[name] = self.finetune_teacher(teacher, name, self.resume(resume_dir, name))
        return out

    def resume(self, resume_dir: Path | None, name: str) -> Resume | None:
        """Where line `name` of this variant keeps its fine-tuning's last epoch (named by the line, the variant and
        the training canvases), or None."""
        if resume_dir is None:
            return None
        return Resume(resume_dir / f"{self.variant} {name}.pt".replace(" ", "_"),
                      {"line": name, "variant": self.variant, "canvases": json.dumps(self.train.key, sort_keys=True)})


def merged_draws(parts: list[dict]) -> dict:
    """One line from the draws of a selection: draw 0's cells, and per canvas the mean coverage and, per reader, the
    mean correctness over the draws (each draw's own accuracy and 0/1 correctness kept beside)."""
    line = {**parts[0], "covered": torch.stack([p["covered"] for p in parts]).mean(0)}
    if "readers" not in line:
        return line
    line["readers"] = {}
    for reader, first in parts[0]["readers"].items():
        per_draw = [p["readers"][reader]["correct"] for p in parts]
        line["readers"][reader] = {**first, "correct": torch.stack(per_draw).mean(0)}
        if len(parts) > 1:
            line["readers"][reader].update(correct_per_draw=per_draw,
                                           per_draw_accuracy=[float(c.mean()) for c in per_draw])
    line["correct"] = line["readers"]["linear"]["correct"]
    if len(parts) > 1:
        line["draws"] = len(parts)
    return line


def line_name(model_name: str, ratio: float, kind: str) -> str:
    return f"{model_name} k_ratio {ratio} {kind}"
