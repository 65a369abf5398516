"""How fast LookWhere's selector learns the teacher's map on the task's canvases, and at which input size (#57 item 3).

The selector alone (the teacher's first 3 blocks on a low-resolution copy, and the map head), trained on the map
loss alone (KL to the teacher's cached CLS map at 518 px): that loss is the only one the benchmark's selector map
learns from. Training canvases: the benchmark's own (seed 0, both variants), less the last 80 of each variant, which
are the validation canvases every number here is measured on; no test canvas is drawn.

Measured at each checkpoint, at k_ratio 0.1 (k = 137 of 1369 cells): the share of the label digit's cells the selector's
top k keeps, over the share the teacher's own full-resolution map keeps (the goal: at least 0.9); with the time per
step and the selector's GFLOPs.

    python -m experiments.selector_curve.selector_curve --sizes 154 224 308 --steps 0 100 300 1000 3000
"""

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.sparse_recognition import parse_args as task_args
from corevision_hf import LookWhereModel, lookwhere_from_teacher
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from evaluation.canvases import VARIANTS, task_splits
from evaluation.paired_stats import bootstrap_rows
from evaluation.selections import coverage, top_cells
from evaluation.sparse_digits import CELL
from evaluation.task_student import SELECTOR_DEPTH
from evaluation.teacher_passes import TeacherPasses, pass_record
from evaluation.teachers import load_teacher_model

K_RATIO = 0.1
MAP_WEIGHT = 0.1  # training.losses.lookwhere_loss's weight of the map KL


def selector_gflops(config) -> float:
    """Multiply-adds x 2 of the selector's blocks and map head on its tokens (the patch embedding is small)."""
    d, tokens = config.hidden_size, (config.selector_image_size // config.patch_size) ** 2 + 1
    tokens += config.num_register_tokens
    mlp = config.intermediate_size if hasattr(config, "intermediate_size") else 4 * d
    block = tokens * (4 * d * d + 2 * d * mlp) + 2 * tokens * tokens * d
    head = (tokens - 1 - config.num_register_tokens) * (d * config.map_head_ratio * d
                                                       + config.map_head_ratio * d * config.map_upsampling ** 2)
    return 2 * (config.selector_depth * block + head) / 1e9


def curve_for_size(teacher, size: int, args, fit_pixels, fit_maps, grid, measure):
    """The selector of a student with a `size` px copy trained alone on the map loss, measured (`measure(selector)`)
    at each of `args.steps`: (the student, the curve's points)."""
    torch.manual_seed(0)
    student = lookwhere_from_teacher(teacher, selector_depth=SELECTOR_DEPTH, selector_image_size=size)
    selector = student.selector.float().train()
    optimizer = torch.optim.AdamW(selector.parameters(), lr=args.lr, weight_decay=0.05)
    warmup = 10
    generator = torch.Generator().manual_seed(0)
    curve, step, train_time = [], 0, 0.0
    for target in sorted(args.steps):
        started = time.perf_counter()
        while step < target:
            index = torch.randint(len(fit_pixels), (args.batch_size,), generator=generator)
            for group in optimizer.param_groups:
                group["lr"] = args.lr * min(1.0, (step + 1) / warmup)
            _, logits = selector(fit_pixels[index], grid, None)
            loss = MAP_WEIGHT * F.kl_div(F.log_softmax(logits.float(), dim=-1),
                                         F.log_softmax(fit_maps[index], dim=-1), log_target=True,
                                         reduction="batchmean")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(selector.parameters(), 1.0)
            optimizer.step()
            step += 1
        train_time += time.perf_counter() - started
        selector.eval()
        point = {"steps": step, **measure(selector), "train_time_s": train_time,
                 "time_per_step_s": train_time / max(step, 1)}
        selector.train()
        curve.append(point)
        print(f"size {size} step {step}: keeps {point['share']:.3f}, {point['ratio_to_teacher_map']:.2f} of the "
              f"teacher map's share, {point['time_per_step_s']:.3f} s a step", flush=True)
    return student, curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[154, 224, 308])
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 100, 300, 1000, 3000])
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reference", default="outputs/sparse_recognition_scratch/final",
                        help="a trained task student whose selector is measured on the same canvases (skipped if absent)")
    parser.add_argument("--out", default="experiments/selector_curve/selector_curve.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    task = task_args(["--pilot", "benchmarks/results/task_pilot.json"])
    teacher, source = load_teacher_model(task.teacher)
    passes = TeacherPasses(task.cache_dir, teacher, task.batch_size)
    cells = (task.canvas_size // CELL) ** 2
    k = kept_for_ratio(K_RATIO, cells)
    fit_pixels, fit_maps, val_pixels, val_maps, val_cells = [], [], [], [], []
    for variant in VARIANTS:
        split = task_splits(task, variant)["train"]
        maps = pass_record(passes.get(split, split.key, task.canvas_size), keep_patches=False)["maps"]["cls"]
        fit = task.train - task.val
        fit_pixels.append(split.pixels(slice(0, fit)))
        fit_maps.append(maps[:fit])
        val_pixels.append(split.pixels(slice(fit, task.train)))
        val_maps.append(maps[fit:])
        val_cells.append(split.label_cells[fit:])
    fit_pixels, fit_maps = torch.cat(fit_pixels), torch.cat(fit_maps).float()
    val_pixels, val_maps, val_cells = torch.cat(val_pixels), torch.cat(val_maps).float(), torch.cat(val_cells)
    teacher_share = coverage(top_cells(val_maps, k), val_cells)
    rows = bootstrap_rows(len(val_cells), 2000, 0)
    grid = (task.canvas_size // CELL,) * 2
    print(f"teacher {source}; {len(fit_pixels)} fitting and {len(val_pixels)} validation canvases; k {k}; the teacher "
          f"map keeps {teacher_share.mean():.3f} of the label's cells", flush=True)

    per_variant = len(val_cells) // len(VARIANTS)

    def shares(maps: torch.Tensor) -> dict:
        share = coverage(top_cells(maps, k), val_cells)
        ratio = share[rows].mean(1) / teacher_share[rows].mean(1)
        return {"share": float(share.mean()), "ratio_to_teacher_map": float(share.mean() / teacher_share.mean()),
                "ratio_interval": [float(ratio.quantile(0.025)), float(ratio.quantile(0.975))],
                **{f"share_{v}": float(share[i * per_variant:(i + 1) * per_variant].mean())
                   for i, v in enumerate(VARIANTS)}}

    @torch.inference_mode()
    def maps_of(selector) -> torch.Tensor:
        return torch.cat([selector(val_pixels[i:i + 16], grid, None)[1].float() for i in range(0, len(val_pixels), 16)])

    results = {"k": k, "k_ratio": K_RATIO, "fit_canvases": len(fit_pixels), "val_canvases": len(val_pixels),
               "teacher_map_share": float(teacher_share.mean()), "lr": args.lr, "batch_size": args.batch_size,
               "teacher": source, "curves": {},
               **{f"teacher_map_share_{v}": float(teacher_share[i * per_variant:(i + 1) * per_variant].mean())
                  for i, v in enumerate(VARIANTS)}}
    if Path(args.reference, "config.json").is_file():
        reference = LookWhereModel.from_pretrained(args.reference).float().eval()
        results["reference"] = {"folder": args.reference, "image_size": reference.config.selector_image_size,
                                **shares(maps_of(reference.selector))}
        print(f"reference {args.reference}: {results['reference']}", flush=True)
    for size in args.sizes:
        student, curve = curve_for_size(teacher, size, args, fit_pixels, fit_maps, grid,
                                        lambda selector: shares(maps_of(selector)))
        results["curves"][str(size)] = {"selector_gflops": selector_gflops(student.config), "points": curve}
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
