"""A VECA or LookWhere model against its dense teacher, at every budget: one table and one plot.

    python -m corevision_hf.compare out/lookwhere-dinov2 facebook/dinov2-with-registers-base --data photos/ \
        --resolution 518 --output compare.png

For each budget (VECA: the budgets the checkpoint was trained at, `config.training_budgets`; LookWhere: k_ratio
0.05, 0.1, 0.2, 0.4 and 1; or --budgets) and for the teacher: CLS and patch cosine to the teacher (mean and spread
over the images of --data, each resized to --resolution x --resolution, the teacher's input resized so that its
patch grid is the model's), the same centred and R^2 (`corevision_hf.agreement`: the teacher's mean token subtracted
from both sides, so that a model outputting it scores 0; here the mean over these images, as compare has no training
crops), the latency of one image (median and interquartile range over --runs calls, every
budget and the teacher timed in turn) and the analytic GFLOPs (`corevision_hf.flops`). The table goes to stdout
(markdown), with a warning under it when the latencies are not to be trusted (a large spread, or a cheaper budget
that came out slower: a busy machine); the plot (quality against GFLOPs, latency per budget) to --output, written
under a temporary name and renamed (an existing file only with --force, and only one this package wrote).
"""

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModel
from transformers.utils import logging as transformers_logging

from .cli import HelpFormatter
from .agreement import (
    agreement,
    cost_entry,
    features,
    model_flops,
    teacher_flops,
    teacher_input,
    teacher_patch_size,
    teacher_targets,
)
from .cli import USER_ERRORS, reading_weights, run
from .extract import IMAGE_EXTENSIONS
from .images import open_image, to_pixel_values
from .loading import load_checked
from .measure import alternated_latency, latency_warnings
from .offline import check_hub_reachable
from .outputs import check_file_output, record_file, refuse_overlap


LOOKWHERE_K_RATIOS = (0.05, 0.1, 0.2, 0.4, 1.0)
TABLE_MEASURES = {"cls_cosine": "CLS cosine", "patch_cosine": "patch cosine", "cls_centred_cosine": "CLS centred",
                  "patch_centred_cosine": "patch centred", "cls_r2": "CLS R²", "patch_r2": "patch R²"}
CENTRED_NOTE = ("centred: the mean of these images' teacher tokens (compare has no training crops) subtracted from "
                "both sides; R² = 1 - SSE / SST about that mean. A model that outputs the mean token scores 0 on "
                "both.")
BATCH_SIZE = 8  # images per forward for the cosines (latency is timed on one image)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m corevision_hf.compare", description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("model", help="VECA or LookWhere: folder or hub id")
    parser.add_argument("teacher", help="the dense ViT it was distilled or converted from: folder or hub id")
    parser.add_argument("--data", required=True, help="folder of images (any nesting)")
    parser.add_argument("--budgets", nargs="+", type=float, default=None,
                        help="VECA: core counts; LookWhere: k_ratio fractions (default: see above)")
    parser.add_argument("--resolution", type=int, default=None, help="square side in pixels (default: image_size)")
    parser.add_argument("--runs", type=int, default=7,
                        help="timed calls per budget and of the teacher, in turn (default: %(default)s)")
    parser.add_argument("--output", required=True, help="the plot: a .png, .pdf or .svg file")
    parser.add_argument("--force", action="store_true", help="replace a plot that this package wrote before")
    return parser.parse_args(argv)


def budgets_of(config, asked: list[float] | None) -> tuple[str, list]:
    """("num_cores" | "k_ratio", the budgets, largest first), checked against the config."""
    if config.model_type == "veca":
        values = asked or config.training_budgets
        bad = [b for b in values if b != int(b) or not 1 <= b <= config.num_cores]
        if bad:
            raise ValueError(f"--budgets {bad}: VECA budgets are whole numbers of cores, 1..{config.num_cores}.")
        return "num_cores", sorted({int(b) for b in values}, reverse=True)
    values = asked or LOOKWHERE_K_RATIOS
    bad = [b for b in values if not 0 < b <= 1]
    if bad:
        raise ValueError(f"--budgets {bad}: LookWhere budgets are k_ratio fractions in (0, 1].")
    return "k_ratio", sorted(set(values), reverse=True)


def compare(model, teacher, images: torch.Tensor, budget_name: str, budgets: list, runs: int) -> dict:
    """Measures the model at every budget and the teacher on `images` (N, 3, S, S); returns a report in the format
    of evaluation.evaluate_budgets (what `corevision_hf.visualize.plot_evaluation` draws)."""
    config, size, device = model.config, images.shape[-1], str(images.device)
    grid = (size // config.patch_size, size // config.patch_size)
    teacher_pixels = teacher_input(images, teacher_patch_size(teacher), config.patch_size)
    chunks = [teacher_targets(teacher, teacher_pixels[start : start + BATCH_SIZE], grid)
              for start in range(0, len(images), BATCH_SIZE)]
    targets = tuple(torch.cat([chunk[j] for chunk in chunks]) for j in range(2))
    centre = (targets[0].mean(0), targets[1].mean((0, 1)))  # these images' mean token: compare has no training crops
    one, teacher_one = images[:1], teacher_pixels[:1]
    forwards = {budget: (lambda kwargs: lambda: model(one, **kwargs))({budget_name: budget}) for budget in budgets}
    latencies = alternated_latency({**forwards, "teacher": lambda: teacher(teacher_one)}, device, runs)
    report = {
        "model_type": config.model_type, "budget_name": budget_name, "budgets": budgets, "resolutions": [size],
        "quality_resolution": size, "agreement_images": len(images), "agreement_centre": "evaluation images",
        "teacher_cost": {str(size): cost_entry(teacher_flops(teacher, *teacher_one.shape[-2:]), latencies["teacher"],
                                               1)},
        "environment": {"device": device, "dtype": "float32", "batch_size": 1}, "results": [],
        "latency_warnings": latency_warnings({("the teacher", size): latencies["teacher"]}),
    }
    for budget in budgets:
        kwargs = {budget_name: budget}
        report["results"].append({
            "budget": budget,
            "cost": {str(size): cost_entry(model_flops(config, size, budget_name, budget), latencies[budget], 1)},
            "quality": agreement(*features(model, images, kwargs, BATCH_SIZE, device, torch.float32), targets, centre),
        })
    # a budget is a larger input here: more cores or patches must not come out faster than fewer
    report["latency_warnings"] += latency_warnings({(budget_name, budget): latencies[budget] for budget in budgets})
    return report


def table(report: dict) -> str:
    """The report as a markdown table: one row per budget, then the teacher."""
    size = str(report["quality_resolution"])

    def spread(quality, name):
        std = quality.get(name + "_std")
        return f"{quality[name]:.3f}" + (f" ± {std:.3f}" if std is not None else "")

    lines = [f"| {report['budget_name']} | GFLOPs | ms, median (IQR) | " + " | ".join(TABLE_MEASURES.values()) + " |",
             "|---|---|---|" + "---|" * len(TABLE_MEASURES)]
    for entry in report["results"]:
        cost, quality = entry["cost"][size], entry["quality"]
        lines.append(f"| {entry['budget']} | {cost['gflops']:.2f} | {cost['latency_ms']:.1f} ({cost['latency_iqr_ms']:.1f}) "
                     "| " + " | ".join(spread(quality, name) for name in TABLE_MEASURES) + " |")
    teacher = report["teacher_cost"][size]
    lines.append(f"| teacher | {teacher['gflops']:.2f} | {teacher['latency_ms']:.1f} ({teacher['latency_iqr_ms']:.1f}) "
                 "| " + " | ".join("1" for _ in TABLE_MEASURES) + " |")
    lines.append(f"\n{CENTRED_NOTE}")
    lines += [f"\nlatency warning: {line}; the latencies are not to be trusted: rerun on an idle machine"
              for line in report["latency_warnings"]]
    return "\n".join(lines)


def main(argv=None) -> dict:
    """Runs the comparison; prints the table, writes the plot and returns the report."""
    args = parse_args(argv)
    try:  # before any work
        from .visualize import plot_evaluation, save_figures_atomically
    except ModuleNotFoundError as error:
        if error.name != "matplotlib":
            raise
        raise ImportError(
            "the plot needs matplotlib: pip install matplotlib (or pip install 'corevision-hf[demo]')"
        ) from None

    if args.output.rsplit(".", 1)[-1].lower() not in ("png", "pdf", "svg"):
        raise ValueError(f"--output {args.output!r}: give a .png, .pdf or .svg file name.")
    if not Path(args.output).resolve().parent.is_dir():
        raise FileNotFoundError(f"--output {args.output!r}: its folder does not exist.")
    refuse_overlap(args.output, args.data, args.model, args.teacher)
    check_file_output(args.output, args.force)
    if args.runs < 1:
        raise ValueError(f"--runs must be at least 1, got {args.runs}.")
    folder = Path(args.data)
    if not folder.is_dir():
        raise FileNotFoundError(f"--data {args.data}: no such folder.")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise ValueError(f"--data {args.data} holds no images.")
    transformers_logging.disable_progress_bar()
    for name in (args.model, args.teacher):
        check_hub_reachable(name)
    with reading_weights(args.model):
        model = load_checked(AutoModel, args.model, dtype=torch.float32).eval()
    config = model.config
    if config.model_type not in ("veca", "lookwhere"):
        raise ValueError(f"{args.model} is a {config.model_type!r} model; compare takes a VECA or LookWhere model.")
    budget_name, budgets = budgets_of(config, args.budgets)
    resolution = args.resolution or config.image_size
    if resolution < 1 or resolution % config.patch_size:
        raise ValueError(f"--resolution {resolution} is not a positive multiple of the patch size {config.patch_size}.")
    with reading_weights(args.teacher):
        teacher = load_checked(AutoModel, args.teacher, dtype=torch.float32).eval()
    width = getattr(config, "output_projection_size", None) or config.hidden_size
    if not hasattr(teacher.config, "patch_size") or teacher.config.hidden_size != width:
        raise ValueError(
            f"{args.teacher} is not a ViT of the model's width {width}: give the teacher it was distilled or converted "
            "from (a DINOv2 / DINOv3 of that width)."
        )
    images = torch.stack([to_pixel_values(open_image(file), resolution) for file in files])
    report = compare(model, teacher, images, budget_name, budgets, args.runs)
    report["model"], report["teacher"] = args.model, args.teacher
    save_figures_atomically({args.output: plot_evaluation(report)})
    record_file(args.output)
    print(table(report))
    print(f"wrote {args.output}")
    return report


def cli(argv=None) -> int:
    """The command line: a bad input (or no matplotlib) ends in one line on stderr and exit status 2."""
    return run(main, argv, errors=(*USER_ERRORS, ImportError))


if __name__ == "__main__":
    sys.exit(cli())
