"""Where LookWhere-S's extractor loses the digit (#57 item 4): the same 137 cells (k_ratio 0.1) read by the attentive
probe from the dense teacher's own tokens and from the extractor's, with each source of global tokens.

On the benchmark's single-variant training canvases, split as extractor_curve.py splits them (320 to fit the probe,
the last 80 to measure; no test canvas drawn). Lines:
- the dense teacher, all 1369 patch tokens (the line to reach);
- the dense teacher's tokens at the digits' cells only (CLS and the same 137 cells as the extractor's ceiling line):
  whether the kept cells hold the digit in the teacher's own pass, where they saw every patch;
- the extractor on the digits' cells, with as global tokens: the teacher's own layer-0 CLS (what its copy expects), the
  map-trained selector's (the method), and for the distilled student its own selector's;
- the same with the selector's cells.
--student was the committed run's of commit 84bc1f6 (outputs/sparse_recognition_scratch/final then: 100 map-only
selector steps, then 400 extractor steps with the selector frozen); the next committed run replaced that folder.

    python -m experiments.extractor_curve.readings
"""

import argparse
import copy
import json
from pathlib import Path

import torch

from benchmarks.sparse_recognition import parse_args as task_args
from corevision_hf import LookWhereModel, lookwhere_from_teacher
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from evaluation.canvases import task_splits
from evaluation.lookwhere_features import lookwhere_features, selector_maps_of
from evaluation.paired_stats import bootstrap_rows, interval
from evaluation.readers import attentive_probe
from evaluation.selections import coverage, selection_scores, top_cells
from evaluation.sparse_digits import CELL
from evaluation.task_student import SELECTOR_DEPTH
from evaluation.teacher_passes import TeacherPasses, pass_record, tokens_of
from evaluation.teachers import load_teacher_model

from .extractor_curve import INNER_VAL, head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--student", type=Path, default=Path("outputs/sparse_recognition_scratch/final"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="experiments/extractor_curve/readings.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = task_args(["--pilot", "benchmarks/results/task_pilot.json"])
    teacher, source = load_teacher_model(task.teacher)
    split = task_splits(task, "single")["train"]
    record = pass_record(TeacherPasses(task.cache_dir, teacher, task.batch_size).get(split, split.key,
                                                                                     task.canvas_size))
    fit_count = task.train - task.val
    fit, val = head(split, 0, fit_count), head(split, fit_count, task.train)
    dense_tokens = tokens_of(record)
    k = kept_for_ratio(0.1, (task.canvas_size // CELL) ** 2)
    rows = bootstrap_rows(len(val), 2000, 0)
    results = {"teacher": source, "student": str(args.student), "k": k, "fit_canvases": fit_count,
               "val_canvases": len(val), "lines": {}}

    def measure(name: str, fit_tokens: torch.Tensor, val_tokens: torch.Tensor) -> None:
        probed = attentive_probe(fit_tokens, fit.labels, val_tokens, INNER_VAL, task.attentive_decays, task.seed)
        correct = (probed["predictions"] == val.labels).float()
        results["lines"][name] = {"accuracy": interval(correct, rows), "correct": correct.int().tolist()}
        print(f"{name}: {results['lines'][name]['accuracy']}", flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1))

    measure("dense teacher, all patches", dense_tokens[:fit_count], dense_tokens[fit_count:])
    untrained = lookwhere_from_teacher(teacher, selector_depth=SELECTOR_DEPTH, selector_image_size=task.selector_size)
    student = LookWhereModel.from_pretrained(str(args.student)).float().eval()
    copy_with_map = copy.deepcopy(untrained).eval()
    copy_with_map.selector = student.selector  # the map-trained selector: frozen while the extractor was distilled
    globals_of = {name: selector_maps_of(student, s, task.batch_size) for name, s in (("fit", fit), ("val", val))}
    teacher_prefix = {name: untrained.selector.cls_token.detach().expand(len(s), -1, -1) for name, s in
                      (("fit", fit), ("val", val))}
    for kind in ("digits", "selector"):
        chosen = {name: top_cells(selection_scores(kind, s, globals_of[name][1], {}, task.seed + (name == "val")), k)
                  for name, s in (("fit", fit), ("val", val))}
        results[f"covered_{kind}"] = float(coverage(chosen["val"], val.label_cells).mean())
        if kind == "digits":
            kept = {name: torch.cat([dense_tokens[part, :1], torch.gather(
                dense_tokens[part, 1:], 1, chosen[name][..., None].expand(-1, -1, dense_tokens.shape[-1]))], dim=1)
                for name, part in (("fit", slice(0, fit_count)), ("val", slice(fit_count, None)))}
            measure("dense teacher, its tokens at the digits' cells", kept["fit"], kept["val"])
        for label, model, prefix in (
                ("teacher's copy, the teacher's layer-0 CLS", untrained, teacher_prefix),
                ("teacher's copy, the map-trained selector's global tokens", copy_with_map,
                 {name: globals_of[name][0] for name in ("fit", "val")}),
                ("distilled student, its selector's global tokens", student,
                 {name: globals_of[name][0] for name in ("fit", "val")})):
            tokens = {name: lookwhere_features(model, s, chosen[name], prefix[name], task.batch_size)[1]
                      for name, s in (("fit", fit), ("val", val))}
            measure(f"{label}, {kind} cells", tokens["fit"], tokens["val"])


if __name__ == "__main__":
    main()
