"""Cost and quality of a VECA or LookWhere checkpoint at every budget: what a user needs to choose one.

    python -m evaluation.evaluate_budgets outputs/veca/final --budgets 8 16 32 64 --resolutions 224 448 \
        --teacher facebook/dinov3-vits16-pretrain-lvd1689m --agreement-data photos/ --probe-data pets/ \
        --segmentation-data ade-mini/ --output-dir outputs/veca/eval --card --repo-id org/veca-small

Budgets are core counts for VECA; for LookWhere, patch counts (k: integers) or fractions of the grid (k_ratio:
decimals). For every budget:
- cost at each of --resolutions: analytic GFLOPs (corevision_hf.veca_flops / lookwhere_flops), the latency of a
  batch of --batch-size on this device (median and interquartile range over --latency-runs runs, every budget,
  size and the teacher timed in turn, run by run), throughput, and peak memory above the weights; the latency
  warnings (a spread above 25% of the median, a larger input that came out faster: a busy machine) are printed,
  recorded and shown on the card and the plot;
- whether training drew it: VECA, a core count nested dropout drew (config.training_budgets); LookWhere, a k at
  --quality-resolution within the [k_min, k_max] of the checkpoint's training_recipe.json (unknown without one);
- quality at --quality-resolution (default: the first resolution): CLS and patch cosine to --teacher on the images
  of --agreement-data (mean, standard deviation and standard error over the images), and the same centred on the
  teacher's mean token (which a model outputting that mean scores 0 on) with R^2: the mean over the training crops
  from the checkpoint's teacher_mean.safetensors, else over these images' own teacher tokens (the JSON's
  "agreement_centre" says which); linear-probe accuracy (frozen
  pooled output, logistic regression) on --probe-data (train/<class>/*, val/<class>/*); linear segmentation mIoU
  (per-patch linear head on frozen patch features) on --segmentation-data ({train,val}/images/*,
  {train,val}/masks/*.png, 255 = ignore).
LookWhere with --k-mass M [M ...] (budgets per image: each image keeps the fewest patches holding that share of the
selector's softmax mass): the mean, standard deviation and range of the analytic GFLOPs per image, and the mean k,
over the --agreement-data images at --quality-resolution (`corevision_hf.selector_maps` / `mass_gflops`), into the
JSON's "k_mass_costs" and the card.
The dense teacher is timed at the same resolutions in the same run; with --optimize-for-cpu both are timed (and
evaluated) with the CPU opt-in `corevision_hf.optimize_for_cpu`, which the card then names. Accuracy and mIoU come
from the package's `evaluate` modules (corevision_hf.metrics). Writes OUT/evaluation.json, read by
publishing.publish and the model card, and OUT/evaluation.png (quality against cost). With --card, also
OUT/README.md: the model card (publishing.model_card) with this evaluation's budget table (and with --task-table, a
task benchmark's table beside it), so that one command regenerates it. A file of those names that exists is kept
unless --force, which replaces only files this package wrote (OUT's manifest lists them).
"""

import argparse
import functools
import json
import os
import platform
import sys
import time
from pathlib import Path

import evaluate
import torch
import torch.nn.functional as F
import transformers
from transformers import AutoConfig, AutoModel

from corevision_hf.cli import HelpFormatter
import corevision_hf
from corevision_hf.agreement import (
    CENTRED_MEASURES,
    agreement,
    cost_entry,
    features,
    model_flops,
    teacher_flops,
    teacher_input,
    teacher_patch_size,
    teacher_targets,
)
from corevision_hf.atomic import atomic_path
from corevision_hf.cli import reading_weights, run
from corevision_hf.cpu import optimize_for_cpu
from corevision_hf.loading import load_checked
from corevision_hf.lookwhere.budget_lookwhere import kept_for_mass, num_kept
from training.teacher_mean import FILE as TEACHER_MEAN_FILE
from training.teacher_mean import load_teacher_mean
from corevision_hf.images import to_display
from corevision_hf.measure import alternated_latency, latency_warnings, peak_memory_mib, return_freed_memory_to_the_os
from corevision_hf.metrics import ACCURACY, MEAN_IOU
from corevision_hf.offline import check_hub_reachable
from corevision_hf.outputs import check_file_output, record
from corevision_hf.visualize import (
    patch_features,
    plot_cores,
    plot_evaluation,
    plot_feature_pca,
    plot_kept_patches,
)
from publishing.model_card import EVALUATION_FORMAT, read_recipe, read_task_table, render_card
from training.checkpointing import check_export
from training.teacher import load_teacher

from .probes import (
    IGNORE_INDEX,
    classification_folder,
    fit_linear_classifier,
    fit_linear_segmenter,
    image_files,
    load_image,
    load_mask,
    segmentation_folder,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("checkpoint", help="a save_pretrained folder (e.g. OUT/final of a distillation) or a hub id")
    parser.add_argument("--budgets", nargs="+", required=True, help="VECA: core counts; LookWhere: k or k_ratio values")
    parser.add_argument("--resolutions", nargs="+", type=int, default=[224], help="square sizes to measure cost at")
    parser.add_argument("--quality-resolution", type=int, default=None, help="size for quality (default: the first)")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--teacher", default=None,
                        help="for agreement and as the cost reference (default: the teacher in training_recipe.json)")
    parser.add_argument("--agreement-data", default=None, help="image folder for CLS / patch cosine to the teacher")
    parser.add_argument("--probe-data", default=None, help="train/<class>/* and val/<class>/* for the linear probe")
    parser.add_argument("--segmentation-data", default=None, help="{train,val}/images/* and {train,val}/masks/*.png")
    parser.add_argument("--k-mass", nargs="+", type=float, default=None,
                        help="LookWhere: k_mass values whose GFLOPs over the --agreement-data images are reported")
    parser.add_argument("--picture-resolution", type=int, default=None,
                        help="size of features.png and where.png (default: the largest resolution)")
    parser.add_argument("--batch-size", type=int, default=1, help="batch for latency and throughput")
    parser.add_argument("--latency-runs", type=int, default=10,
                        help="timed forwards per budget and resolution, alternated (default: %(default)s)")
    parser.add_argument("--eval-batch-size", type=int, default=16, help="batch for feature extraction")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--optimize-for-cpu", action="store_true",
                        help="the checkpoint and the teacher with corevision_hf.optimize_for_cpu (CPU, float32)")
    parser.add_argument("--card", action="store_true", help="also render the model card as OUT/README.md")
    parser.add_argument("--task-table", default=None,
                        help="a task benchmark's table for the card and the JSON (publishing.model_card's "
                             "TASK_TABLE_FORMAT; e.g. benchmarks.sparse_recognition_veca's)")
    parser.add_argument("--repo-id", default=None, help="with --card: the hub repo (org/name) the card is for")
    parser.add_argument("--force", action="store_true",
                        help="replace the files of an earlier evaluation in OUT (only files this package wrote)")
    return parser.parse_args(argv)


# ---------------------------------------------------------------- checks (everything before any work starts)


def checkpoint_config(checkpoint: str):
    """The checkpoint's config; a local folder must also hold weights."""
    if Path(checkpoint).exists():
        check_export(checkpoint)
    check_hub_reachable(checkpoint)
    try:
        config = AutoConfig.from_pretrained(checkpoint)
    except OSError as error:
        raise ValueError(f"Could not read a config from {checkpoint!r}: {error}") from error
    if config.model_type not in ("veca", "lookwhere"):
        raise ValueError(f"{checkpoint!r} is a {config.model_type!r} model; this evaluates VECA and LookWhere.")
    return config


def parse_budgets(config, budgets: list[str], resolutions: list[int]) -> tuple[str, list]:
    """("num_cores" | "k" | "k_ratio", ascending budgets), each checked against the config and every resolution."""
    try:
        values = [float(b) if "." in b else int(b) for b in budgets]
    except ValueError as error:
        raise ValueError(f"Budgets must be numbers, got {budgets}.") from error
    if config.model_type == "veca":
        name = "num_cores"
        bad = [b for b in values if not isinstance(b, int) or not 1 <= b <= config.num_cores]
        allowed = f"whole numbers of cores from 1 to the bank's {config.num_cores}"
    elif all(isinstance(b, float) for b in values):
        name = "k_ratio"
        bad = [b for b in values if not 0 < b <= 1]
        allowed = "fractions in (0, 1] (k_ratio)"
    elif all(isinstance(b, int) for b in values):
        name = "k"
        fewest = min(r // config.patch_size for r in resolutions) ** 2
        bad = [b for b in values if not 1 <= b <= fewest]
        allowed = f"patch counts from 1 to {fewest} (the grid at {min(resolutions)} px), or decimals for k_ratio"
    else:
        raise ValueError(f"Mixed budgets {budgets}: give all k as integers or all k_ratio as decimals.")
    if bad:
        raise ValueError(f"Unknown budget(s) {bad} for this {config.model_type} checkpoint: budgets are {allowed}.")
    return name, sorted(values)


def check_resolutions(config, sizes: dict[str, list[int]]) -> None:
    """Every size of each option ({"--resolutions": [...], ...}) is a positive multiple of the patch size; the
    error names the first option with one that is not, and the nearest sizes that are."""
    patch = config.patch_size
    for option, values in sizes.items():
        bad = sorted({r for r in values if r <= 0 or r % patch})
        if bad:
            nearest = sorted({max(patch, round(r / patch) * patch) for r in bad})
            raise ValueError(f"{option} {' '.join(map(str, bad))}: not a positive multiple of the patch size {patch}; "
                             f"use e.g. {' '.join(map(str, nearest))}.")


def output_width(config) -> int:
    return getattr(config, "output_projection_size", None) or config.hidden_size


def trained(model, budget_name: str, budget, recipe: dict | None, resolution: int) -> bool | None:
    """Whether training drew this budget. VECA: a core count in `config.training_budgets` (nested dropout). LookWhere:
    its k on the `resolution` grid (as the model counts it) lies in the recipe's [k_min, k_max], the range
    training.distill_lookwhere draws k from; None without a recipe that records it, or of a model not distilled (0
    steps: the task benchmark's teacher copy, whose recipe keeps the unused range among its arguments)."""
    config = model.config
    if config.model_type == "veca":
        return budget in config.training_budgets
    args = (recipe or {}).get("args") or {}
    if args.get("k_min") is None or args.get("k_max") is None or recipe.get("steps") == 0:
        return None
    side = resolution // config.patch_size
    k = num_kept(model.config, (side, side), **{budget_name: budget})
    return args["k_min"] <= k <= args["k_max"]


# ---------------------------------------------------------------- cost


# ---------------------------------------------------------------- quality


def probe_accuracy(train: tuple, val: tuple, num_classes: int) -> float:
    """train / val: (pooled features (N, D), labels (N,)) -> top-1 accuracy of a linear head fitted on train."""
    head = fit_linear_classifier(*train, num_classes)
    metric = evaluate.load(ACCURACY)
    metric.add_batch(predictions=head(val[0]).argmax(-1).tolist(), references=val[1].tolist())
    return metric.compute()["accuracy"]


def segmentation_miou(train: tuple, val: tuple, num_labels: int) -> float:
    """train: (patch features (N, D, Hp, Wp), masks (N, S, S)); val: (patch features, list of full-size masks)."""
    head = fit_linear_segmenter(*train, num_labels)
    metric = evaluate.load(MEAN_IOU)
    for grid_features, mask in zip(val[0], val[1]):
        logits = F.interpolate(head(grid_features[None]), size=mask.shape, mode="bilinear", align_corners=False)
        # int32: datasets' Image feature would warn that it downcasts int64 label maps
        metric.add_batch(predictions=[logits[0].argmax(0).int().numpy()], references=[mask.int().numpy()])
    return float(metric.compute(num_labels=num_labels, ignore_index=IGNORE_INDEX)["mean_iou"])


def as_grid(patches: torch.Tensor, size: int, patch_size: int) -> torch.Tensor:
    """(N, Hp * Wp, D) -> (N, D, Hp, Wp)."""
    side = size // patch_size
    return patches.transpose(1, 2).reshape(len(patches), -1, side, side)


# ---------------------------------------------------------------- report


PICTURES = {"features": "features.png", "where": "where.png"}
PICTURE_IMAGES = 2  # agreement images drawn in features.png


@torch.inference_mode()
def draw_pictures(model, teacher, config, files: list, budget_name: str, budgets: list, size: int, device, dtype) -> dict:
    """{picture name: figure}: `features` (PCA of the dense features of the first agreement images, the teacher's
    then every budget's, largest first) and `where` (VECA: the cores' positions; LookWhere: the selector map and the
    kept patches; per budget, on the first image)."""
    grid = (size // config.patch_size, size // config.patch_size)
    rows, where = [], {}
    for index, path in enumerate(files[:PICTURE_IMAGES]):
        pixels = load_image(path, size)[None]
        panels = {}
        if teacher is not None:
            teacher_output = teacher(teacher_input(pixels, teacher_patch_size(teacher), config.patch_size).to(device, dtype))
            panels["teacher"] = patch_features(teacher_output, grid)[0]
        for budget in sorted(budgets, reverse=True):
            output = model(pixels.to(device, dtype), **{budget_name: budget})
            label = f"{budget} cores" if budget_name == "num_cores" else f"{budget_name} {budget}"
            panels[label] = patch_features(output, grid)[0]
            if index == 0:
                where[label] = output.core_coordinates[0] if config.model_type == "veca" else output.selected_indices[0]
                selector_map = None if config.model_type == "veca" else output.selector_map[0]
        rows.append((to_display(pixels[0]), panels))
    photo = rows[0][0]
    name = Path(files[0]).name
    figures = {"features": plot_feature_pca(
        rows, f"{config.model_type}: dense features at {size} px, colours fitted on the "
              f"{'teacher' if teacher is not None else 'largest budget'}")}
    if config.model_type == "veca":
        figures["where"] = plot_cores(photo, where, f"VECA: where the active cores ended up ({name}, {size} px)")
    else:
        figures["where"] = plot_kept_patches(photo, selector_map, where, grid,
                                             f"LookWhere: selector map and kept patches ({name}, {size} px)")
    return figures


class Progress:
    """Timestamped progress lines: the evaluation runs for minutes and says what it is doing."""

    def __init__(self):
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        print(f"[{time.perf_counter() - self.start:6.1f} s] {message}", flush=True)


def main(argv=None) -> dict:
    args = parse_args(argv)
    progress = Progress()
    output = Path(args.output_dir)
    check_arguments(args, output)

    # Checks: the checkpoint, the budgets, the sizes, every dataset and the teacher, before any work.
    config = checkpoint_config(args.checkpoint)
    resolutions = sorted(set(args.resolutions))
    quality_resolution = args.quality_resolution or args.resolutions[0]
    picture_resolution = args.picture_resolution or max(resolutions)
    check_resolutions(config, {"--resolutions": resolutions, "--quality-resolution": [quality_resolution],
                               "--picture-resolution": [picture_resolution]})
    budget_name, budgets = parse_budgets(config, args.budgets, [*resolutions, quality_resolution])
    if args.k_mass and config.model_type != "lookwhere":
        raise ValueError(f"--k-mass is LookWhere's per-image budget; a {config.model_type} checkpoint has none.")
    data = {
        "agreement": image_files(args.agreement_data) if args.agreement_data else None,
        "probe": classification_folder(args.probe_data) if args.probe_data else None,
        "segmentation": segmentation_folder(args.segmentation_data) if args.segmentation_data else None,
    }
    task_table = read_task_table(args.task_table) if args.task_table else None
    recipe = read_recipe(args.checkpoint)
    teacher_name = args.teacher or (recipe or {}).get("teacher")
    if data["agreement"] and not teacher_name:
        raise ValueError("--agreement-data needs --teacher (the checkpoint has no training_recipe.json naming one).")
    dtype = getattr(torch, args.dtype)
    teacher, model = load_models(args, config, teacher_name, dtype, bool(data["agreement"]), progress,
                                 f"loading {args.checkpoint} ({config.model_type}); budgets ({budget_name}): {budgets}")

    report = new_report(args, config, model, teacher_name, budget_name, budgets, resolutions, quality_resolution,
                        data["agreement"])
    if task_table:
        report["task_table"] = task_table
    forwards, costs = measure_cost(args, config, model, teacher, report, recipe, dtype, progress)
    measure_quality(args, config, model, teacher, report, data, dtype, progress)
    if args.k_mass:
        report["k_mass_costs"] = k_mass_costs(config, model, data["agreement"], args.k_mass,
                                              report["quality_resolution"], args.device, dtype, progress)
    if args.device.startswith("cuda") or (platform.system() == "Linux" and return_freed_memory_to_the_os()):
        progress("peak memory of one forward per budget and resolution")  # last: it changes the allocator's ways
        for key, forward in forwards.items():
            costs[key]["peak_memory_mib"] = peak_memory_mib(forward, args.device)
    for entry in report["results"]:
        print(f"{budget_name}={entry['budget']}: " + ", ".join(
            f"{r} px {c['gflops']:.3g} GFLOPs {c['latency_ms']:.1f} ms (IQR {c['latency_iqr_ms']:.1f}) "
            f"{c['peak_memory_mib'] or 0:.0f} MiB" for r, c in entry["cost"].items()
        ))
    for line in report["latency_warnings"]:
        print(f"latency warning: {line}; the latencies are not to be trusted: rerun on an idle machine", flush=True)
    write_outputs(args, output, config, model, teacher, report, recipe, data["agreement"], picture_resolution, dtype,
                  progress)
    return report


def check_arguments(args, output: Path) -> None:
    """The combinations of flags that cannot work, and outputs that would replace a user's files."""
    written = ["evaluation.json", "evaluation.png", *(PICTURES.values() if args.agreement_data else []),
               *(["README.md"] if args.card else [])]
    for name in written:
        check_file_output(str(output / name), args.force)
    if args.repo_id and not args.card:
        raise ValueError("--repo-id names the model card's repo: add --card, or leave --repo-id out.")
    if args.dtype == "float16" and args.device == "cpu":
        raise ValueError("--dtype float16 is for GPUs: the CPU lacks some of its operations (antialiased resizing of the "
                         "teacher's input); use --dtype bfloat16 or float32 there.")
    if args.k_mass is not None and not args.agreement_data:
        raise ValueError("--k-mass costs vary over images: give the images to measure them on with --agreement-data.")
    if args.k_mass is not None and not all(0 < m <= 1 for m in args.k_mass):
        raise ValueError(f"--k-mass {args.k_mass}: each k_mass is a share of the selector's mass, in (0, 1].")
    if args.optimize_for_cpu and (args.device != "cpu" or args.dtype != "float32"):
        raise ValueError(f"--optimize-for-cpu speeds up float32 on the CPU only, not --device {args.device} --dtype "
                         f"{args.dtype}: add --device cpu --dtype float32, or leave --optimize-for-cpu out.")


def load_models(args, config, teacher_name, dtype, for_agreement: bool, progress, checkpoint_line: str) -> tuple:
    """(teacher or None, checkpoint), on the device, in eval mode; the teacher must be the checkpoint's width when
    agreement is measured."""
    progress(f"loading the teacher {teacher_name}" if teacher_name else "no teacher: cost of the checkpoint only")
    teacher = None
    if teacher_name:
        with reading_weights(teacher_name):
            teacher = load_teacher(teacher_name, dtype).to(args.device)
    if teacher is not None and for_agreement and teacher.config.hidden_size != output_width(config):
        raise ValueError(
            f"The teacher's width {teacher.config.hidden_size} differs from the student's output width "
            f"{output_width(config)}: agreement needs the teacher the checkpoint was distilled from."
        )
    progress(checkpoint_line)
    with reading_weights(args.checkpoint):
        model = load_checked(AutoModel, args.checkpoint, dtype=dtype).to(args.device).eval()
    if args.optimize_for_cpu:
        optimize_for_cpu(model)
        if teacher is not None:
            optimize_for_cpu(teacher)
    return teacher, model


def new_report(args, config, model, teacher_name, budget_name, budgets, resolutions, quality_resolution,
               agreement_files) -> dict:
    """The evaluation JSON before any measurement: what was evaluated, where and how."""
    return {
        "format": EVALUATION_FORMAT,
        "model_type": config.model_type,
        "checkpoint": args.checkpoint,
        "parameters": sum(p.numel() for p in model.parameters()),
        "budget_name": budget_name,
        "budgets": budgets,
        "resolutions": resolutions,
        "quality_resolution": quality_resolution,
        "environment": {
            "device": args.device,
            "device_name": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda")
            else platform.processor() or platform.machine(),
            "dtype": args.dtype,
            "batch_size": args.batch_size,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "corevision_hf": corevision_hf.__version__,
            "optimize_for_cpu": args.optimize_for_cpu,
        },
        "teacher": teacher_name,
        "datasets": {
            "agreement": Path(args.agreement_data).name if args.agreement_data else None,
            "probe": Path(args.probe_data).name if args.probe_data else None,
            "segmentation": Path(args.segmentation_data).name if args.segmentation_data else None,
        },
        "agreement_images": len(agreement_files) if agreement_files else 0,
        "agreement_centre": None,
        "teacher_cost": None,
        "latency_warnings": [],
        "pictures": {},
        "results": [],
    }


def measure_cost(args, config, model, teacher, report, recipe, dtype, progress) -> tuple[dict, dict]:
    """FLOPs and latency of every budget and size and of the dense teacher, on the same random batch, timed in turn;
    fills the report's results (quality still empty). Returns (forwards, costs), both keyed (budget or "teacher",
    resolution), for the memory measured last."""
    budget_name, budgets, resolutions = report["budget_name"], report["budgets"], report["resolutions"]
    inputs = {r: torch.randn(args.batch_size, 3, r, r, generator=torch.Generator().manual_seed(r)) for r in resolutions}
    forwards = {}
    for r in resolutions:
        pixels = inputs[r].to(args.device, dtype)
        for budget in budgets:
            forwards[budget, r] = functools.partial(model, pixels, **{budget_name: budget})
        if teacher is not None:
            forwards["teacher", r] = functools.partial(teacher, teacher_input(pixels, teacher_patch_size(teacher),
                                                                              config.patch_size))
    progress(f"cost: {len(forwards)} forwards (budgets, sizes{' and the teacher' if teacher is not None else ''}) "
             f"timed in turn, {args.latency_runs} runs each")
    latencies = alternated_latency(forwards, args.device, args.latency_runs)
    costs = {}
    for (budget, r), forward in forwards.items():
        if budget == "teacher":  # on the teacher's own grid-matched input
            flops = teacher_flops(teacher, *forward.args[0].shape[-2:])
        else:
            flops = model_flops(config, r, budget_name, budget)
        costs[budget, r] = cost_entry(flops, latencies[budget, r], args.batch_size)
    report["latency_warnings"] = latency_warnings({
        ("the teacher" if budget == "teacher" else f"{budget_name}={budget}", r): latency
        for (budget, r), latency in latencies.items()
    })
    if teacher is not None:
        report["teacher_cost"] = {str(r): costs["teacher", r] for r in resolutions}
    for budget in budgets:
        report["results"].append({"budget": budget,
                                  "trained": trained(model, budget_name, budget, recipe, report["quality_resolution"]),
                                  "cost": {str(r): costs[budget, r] for r in resolutions},
                                  "quality": dict.fromkeys([*AGREEMENT_KEYS, "probe_accuracy", "segmentation_miou"])})
    return forwards, costs


AGREEMENT_KEYS = [name + suffix for name in ("cls_cosine", "patch_cosine", *CENTRED_MEASURES)
                  for suffix in ("", "_std", "_se")] + ["cls_r2"]


def agreement_centre(checkpoint: str, targets: tuple) -> tuple[tuple, str]:
    """(the centre of the centred measures, where it comes from): the teacher's mean CLS and patch token over the
    training crops from the checkpoint folder's teacher_mean.safetensors, else over the evaluation images' own teacher
    targets (CLS (N, D), patches (N, P, D))."""
    centre = load_teacher_mean(checkpoint, targets[0].shape[-1]) if os.path.isdir(checkpoint) else None
    if centre is not None:
        return centre, "training crops"
    return (targets[0].mean(0), targets[1].mean((0, 1))), "evaluation images"


def k_mass_costs(config, model, files: list, masses: list[float], size: int, device, dtype, progress) -> list[dict]:
    """For each k_mass, {"k_mass", "resolution", "images", "mean", "std", "min", "max" (GFLOPs per image),
    "num_kept_mean"} over the images of `files` at `size` px (one selector pass per image)."""
    progress(f"k_mass costs at {size} px over {len(files)} images: {masses}")
    images = [load_image(f, size)[None].to(device, dtype) for f in files]
    maps = corevision_hf.selector_maps(model, images)
    rows = []
    for k_mass in masses:
        kept = [int(kept_for_mass(scores[None], k_mass)[0]) for scores, _ in maps]
        spread = corevision_hf.gflops_spread(corevision_hf.mass_gflops(config, maps, k_mass))
        rows.append({"k_mass": k_mass, "resolution": size, **spread, "num_kept_mean": sum(kept) / len(kept)})
    return rows


def measure_quality(args, config, model, teacher, report, data: dict, dtype, progress) -> None:
    """Agreement with the teacher, linear-probe accuracy and segmentation mIoU of every budget, into the report's
    results. Every image is loaded once; features are recomputed per budget."""
    size, budget_name = report["quality_resolution"], report["budget_name"]
    agreement_files, probe, segmentation = data["agreement"], data["probe"], data["segmentation"]
    if agreement_files or probe or segmentation:
        progress(f"quality at {size} px: loading images" + (" and the teacher's targets" if agreement_files else ""))
    if agreement_files:
        agreement_images = torch.stack([load_image(f, size) for f in agreement_files])
        grid = (size // config.patch_size, size // config.patch_size)
        teacher_pixels = teacher_input(agreement_images, teacher_patch_size(teacher), config.patch_size)
        targets = [teacher_targets(teacher, teacher_pixels[i : i + args.eval_batch_size].to(args.device, dtype), grid)
                   for i in range(0, len(teacher_pixels), args.eval_batch_size)]
        targets = tuple(torch.cat([t[j].float().cpu() for t in targets]) for j in range(2))
        centre, report["agreement_centre"] = agreement_centre(args.checkpoint, targets)
        if report["agreement_centre"] == "evaluation images":
            progress(f"{args.checkpoint} holds no {TEACHER_MEAN_FILE}: the centred measures subtract the mean of "
                     "these images' teacher tokens")
    if probe:
        probe_splits, classes = probe
        probe_images = {s: torch.stack([load_image(p, size) for p, _ in pairs]) for s, pairs in probe_splits.items()}
        probe_labels = {s: torch.tensor([label for _, label in pairs]) for s, pairs in probe_splits.items()}
    if segmentation:
        seg_images = {s: torch.stack([load_image(p, size) for p, _ in pairs]) for s, pairs in segmentation.items()}
        train_masks = torch.stack([load_mask(m, size) for _, m in segmentation["train"]])
        val_masks = [load_mask(m) for _, m in segmentation["val"]]
        labels = torch.cat([train_masks.flatten(), *(m.flatten() for m in val_masks)])
        num_labels = int(labels[labels != IGNORE_INDEX].max()) + 1
    extract = dict(batch_size=args.eval_batch_size, device=args.device, dtype=dtype)
    for entry in report["results"]:
        budget, quality = {budget_name: entry["budget"]}, entry["quality"]
        if agreement_files:
            quality.update(agreement(*features(model, agreement_images, budget, **extract), targets, centre))
        if probe:
            pooled = {s: features(model, images, budget, **extract)[0] for s, images in probe_images.items()}
            quality["probe_accuracy"] = probe_accuracy(
                (pooled["train"], probe_labels["train"]), (pooled["val"], probe_labels["val"]), len(classes)
            )
        if segmentation:
            grids = {s: as_grid(features(model, images, budget, **extract)[1], size, config.patch_size)
                     for s, images in seg_images.items()}
            quality["segmentation_miou"] = segmentation_miou((grids["train"], train_masks), (grids["val"], val_masks),
                                                             num_labels)
        if any(v is not None for v in quality.values()):
            progress(f"quality {budget_name}={entry['budget']}: "
                     + ", ".join(f"{k} {v:.4f}" for k, v in quality.items()
                                 if v is not None and not k.endswith(("_std", "_se"))))


def write_outputs(args, output: Path, config, model, teacher, report, recipe, agreement_files, picture_resolution,
                  dtype, progress) -> None:
    """The pictures, the plot, the JSON and the card, each under a temporary name renamed when complete: an
    interrupted run never leaves a half-written file behind."""
    figures = {}
    if agreement_files:
        progress(f"pictures at {picture_resolution} px: {', '.join(PICTURES.values())}")
        figures = draw_pictures(model, teacher, config, agreement_files, report["budget_name"], report["budgets"],
                                picture_resolution, args.device, dtype)
        report["pictures"] = {name: PICTURES[name] for name in figures}
    figures["evaluation"] = plot_evaluation(report)
    writers = [(PICTURES.get(name, "evaluation.png"), functools.partial(figure.savefig, dpi=110, format="png"))
               for name, figure in figures.items()]  # the format named: a temporary name has no extension to pick it
    writers.append(("evaluation.json", lambda path: Path(path).write_text(json.dumps(report, indent=2))))
    if args.card:
        card = render_card(config, report, recipe, repo_id=args.repo_id, pictures=report["pictures"])
        writers.append(("README.md", lambda path: card.save(path)))
    output.mkdir(parents=True, exist_ok=True)  # only now: a run that fails earlier leaves no empty folder
    for name, write in writers:
        with atomic_path(output / name) as temporary:
            write(temporary)
    record(str(output), [name for name, _ in writers], keep=True)
    progress(f"wrote {output}/: " + ", ".join(name for name, _ in writers))


def cli(argv=None) -> int:
    """The command line: a bad input ends in one line on stderr and exit status 2."""
    return run(main, argv)


if __name__ == "__main__":
    sys.exit(cli())
