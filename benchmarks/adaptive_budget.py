"""What a per-image budget buys at equal cost: LookWhere's `k_mass` against a fixed `k_ratio` on the held-out photos.

    python -m benchmarks.adaptive_budget           # the LookWhere-S that `make quality` distils (its best checkpoint)
    python -m benchmarks.adaptive_budget --model DIR --teacher offline-dinov2-small --resolution 224

1. Model and teacher: --model, a LookWhere folder (default: LookWhere-S from the teacher, seed 0 of `make quality`),
   loaded with `corevision_hf.loading.load_checked`; --teacher, the teacher it was distilled from.
2. Photos at --resolution px, loaded as the model cards load them (evaluation.probes.load_image: squash resize,
   bicubic, no crop), two disjoint sets:
   - calibration: assets/wallpaper_photos/val/ (6), the only photos the choice of k_mass looks at;
   - held out: assets/heldout/ (21), where everything reported is measured.
3. Cost points: each fixed k_ratio of --k-ratios costs the same analytic GFLOPs on every photo of one size; its
   adaptive twin is the largest k_mass whose mean GFLOPs over the calibration photos do not exceed that
   (`corevision_hf.k_mass_for_target`, an exact bisection over the running masses). Its mean and spread on the
   held-out photos are reported beside: the calibration never sees them, so they may differ from the fixed cost.
4. Agreement with the teacher per held-out photo, both ways: CLS and patch cosine (raw), their centred twins and
   patch R^2 (`corevision_hf.agreement.per_image_agreement`). The centre is the teacher's mean tokens over the
   training crops (teacher_mean.safetensors in --model, tensors "cls" and "patch"); without that file, the teacher's
   mean tokens over the training photos (assets/photos/, assets/wallpaper_photos/train/) at --resolution, and the
   JSON says which. Adaptive minus fixed, paired over photos, with its 95% interval (benchmarks.quality_stats: t on
   photos - 1 df): the adaptive budget wins where the interval lies above 0, loses where it lies below, else ties.
5. The distribution of k over the held-out photos at each matched k_mass, the fixed k beside it, and the paired
   differences with their intervals: --plot.

Writes --out (JSON) and --plot (PNG); nothing is trained.
"""

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import torch

import corevision_hf
from benchmarks import quality_stats as stats
from corevision_hf import LookWhereModel, gflops_spread, k_mass_for_target, lookwhere_flops, mass_gflops
from corevision_hf.agreement import (
    features, per_image_agreement, teacher_input, teacher_patch_size, teacher_targets,
)
from corevision_hf.cli import HelpFormatter, reading_weights, run
from corevision_hf.loading import load_checked
from corevision_hf.lookwhere.budget_lookwhere import kept_for_mass, kept_for_ratio
from evaluation.probes import image_files, load_image
from evaluation.teachers import TEACHER, load_teacher_model
from training.checkpointing import write_json
from training.data import HELDOUT_PHOTOS, TRAIN_PHOTOS, VAL_PHOTOS

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "outputs" / "distill_quality" / "seed0" / "LookWhere-S_from_teacher" / "best"
CENTRE_FILE = "teacher_mean.safetensors"
MEASURES = ("cls_cosine", "patch_cosine", "cls_centred_cosine", "patch_centred_cosine", "patch_r2")
LABELS = {"cls_cosine": "CLS cos", "patch_cosine": "patch cos", "cls_centred_cosine": "CLS centred",
          "patch_centred_cosine": "patch centred", "patch_r2": "patch R^2"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adaptive_budget", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--model", type=Path, default=MODEL, help="a LookWhere save_pretrained folder")
    parser.add_argument("--teacher", default=TEACHER, help="offline-dinov2-small, or a DINOv2 save_pretrained folder")
    parser.add_argument("--resolution", type=int, default=224, help="the photos' side in px")
    parser.add_argument("--k-ratios", type=float, nargs="+", default=[0.1, 0.25, 0.5],
                        help="the fixed budgets, one cost point each")
    parser.add_argument("--heldout-photos", type=Path, default=HELDOUT_PHOTOS, help="where agreement is measured")
    parser.add_argument("--calibration-photos", type=Path, default=VAL_PHOTOS,
                        help="where each k_mass is matched to its fixed k_ratio's cost (not the held-out photos)")
    parser.add_argument("--centre-photos", type=Path, nargs="+", default=TRAIN_PHOTOS,
                        help=f"where the centre comes from without {CENTRE_FILE} in --model")
    parser.add_argument("--batch-size", type=int, default=8, help="photos per forward")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmarks" / "adaptive_budget.json",
                        help="the results (JSON)")
    parser.add_argument("--plot", type=Path, default=ROOT / "outputs" / "benchmarks" / "adaptive_budget.png",
                        help="k over the photos and the paired differences")
    args = parser.parse_args(argv)
    if not all(0 < ratio <= 1 for ratio in args.k_ratios):
        parser.error(f"--k-ratios {args.k_ratios}: each is a fraction of the grid, in (0, 1].")
    if not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: no saved model there (no config.json); `make quality` writes the default "
                     "one, or give a LookWhere save_pretrained folder.")
    for name in ("out", "plot"):
        path = getattr(args, name)
        if path == parser.get_default(name):  # the default folder is made; a folder the user names must exist
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.parent.is_dir():
            parser.error(f"the folder of {path} does not exist; create it first.")
    return args


def load_photos(folders: list[Path], size: int) -> tuple[list[Path], torch.Tensor]:
    """The photos under `folders`, sorted, and their (N, 3, size, size) pixels."""
    paths = [path for folder in folders for path in image_files(str(folder))]
    return paths, torch.stack([load_image(path, size) for path in paths])


def targets_of(teacher, pixels: torch.Tensor, patch: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's CLS (N, D) and patch tokens (N, Hp * Wp, D) on the student's grid."""
    grid = (pixels.shape[-2] // patch, pixels.shape[-1] // patch)
    teacher_pixels = teacher_input(pixels, teacher_patch_size(teacher), patch)
    parts = [teacher_targets(teacher, teacher_pixels[start : start + batch_size], grid)
             for start in range(0, len(pixels), batch_size)]
    return torch.cat([cls for cls, _ in parts]), torch.cat([patches for _, patches in parts])


def teacher_centre(args, teacher, patch: int) -> tuple[tuple[torch.Tensor, torch.Tensor], str]:
    """The centre of the centred measures, (CLS (D,), patch (D,)), and where it came from."""
    stored = args.model / CENTRE_FILE
    if stored.is_file():
        from safetensors.torch import load_file

        tensors = load_file(str(stored))
        return (tensors["cls"].float(), tensors["patch"].float()), (
            f"{CENTRE_FILE} in the model folder: the teacher's mean tokens over the training crops")
    paths, pixels = load_photos(args.centre_photos, args.resolution)
    cls, patches = targets_of(teacher, pixels, patch, args.batch_size)
    folders = ", ".join(str(folder).replace(str(ROOT) + "/", "") for folder in args.centre_photos)
    return (cls.mean(0), patches.flatten(0, 1).mean(0)), (
        f"no {CENTRE_FILE} in the model folder: the teacher's mean tokens over the {len(paths)} training photos "
        f"({folders}) at {args.resolution} px, whole photos rather than the training crops")


def agreement_per_photo(model, pixels, budget: dict, targets, centre, batch_size: int) -> dict[str, list[float]]:
    pooled, patches = features(model, pixels, budget, batch_size, "cpu", torch.float32)
    values = per_image_agreement(pooled, patches, targets, centre)
    return {name: values[name].tolist() for name in MEASURES}


def verdict(difference: dict) -> str:
    """Adaptive minus fixed, with its 95% interval -> "wins", "loses" or "ties"."""
    return "wins" if difference["low"] > 0 else "loses" if difference["high"] < 0 else "ties"


def cost_point(model, ratio: float, maps: dict, pixels, targets, centre, args) -> dict:
    """One fixed k_ratio, its k_mass at the same mean GFLOPs on the calibration photos, and both compared per
    held-out photo."""
    config, size = model.config, args.resolution
    fixed_gflops = lookwhere_flops(config, size, size, k_ratio=ratio) / 1e9
    k_mass = k_mass_for_target(config, maps["calibration"], fixed_gflops)
    counts = [int(kept_for_mass(scores[None], k_mass)[0]) for scores, _ in maps["heldout"]]
    fixed = agreement_per_photo(model, pixels, {"k_ratio": ratio}, targets, centre, args.batch_size)
    adaptive = agreement_per_photo(model, pixels, {"k_mass": k_mass}, targets, centre, args.batch_size)
    measures = {}
    for name in MEASURES:
        difference = stats.paired_difference([adaptive[name]], [fixed[name]])
        measures[name] = {"fixed": stats.mean_interval([fixed[name]]), "adaptive": stats.mean_interval([adaptive[name]]),
                          "adaptive_minus_fixed": difference, "verdict": verdict(difference),
                          "per_photo": {"fixed": fixed[name], "adaptive": adaptive[name]}}
    return {
        "k_ratio": ratio,
        "k_fixed": kept_for_ratio(ratio, (size // config.patch_size) ** 2),
        "gflops_fixed": fixed_gflops,
        "k_mass": k_mass,
        "gflops_adaptive_calibration": gflops_spread(mass_gflops(config, maps["calibration"], k_mass)),
        "gflops_adaptive_heldout": gflops_spread(mass_gflops(config, maps["heldout"], k_mass)),
        "k_adaptive_heldout": counts,
        "measures": measures,
    }


def table(report: dict) -> str:
    """The results as the markdown table of docs/adaptive_budget.md: per cost point, adaptive - fixed [95% interval]
    and the verdict for each measure."""
    lines = [f"| fixed k_ratio (k of {report['patches']}) | GFLOPs | matched k_mass | held-out GFLOPs, adaptive: mean "
             "(sd; range) | " + " | ".join(LABELS[name] for name in MEASURES) + " |",
             "|---" * (4 + len(MEASURES)) + "|"]
    for point in report["points"]:
        spread = point["gflops_adaptive_heldout"]
        cells = [f"{point['k_ratio']:g} ({point['k_fixed']})", f"{point['gflops_fixed']:.3g}", f"{point['k_mass']:.3g}",
                 f"{spread['mean']:.3g} ({spread['std']:.2g}; {spread['min']:.3g} to {spread['max']:.3g})"]
        for name in MEASURES:
            d = point["measures"][name]["adaptive_minus_fixed"]
            cells.append(f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}] {point['measures'][name]['verdict']}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    """Left: k over the held-out photos at each matched k_mass, the fixed k as a line. Right: adaptive minus fixed
    per measure and cost point, with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from corevision_hf.visualize import save_figures_atomically

    points = report["points"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    largest = max(max(point["k_adaptive_heldout"]) for point in points)
    bins = range(0, largest + 2, max(1, math.ceil((largest + 1) / 40)))
    for colour, point in zip(colours, points):
        label = f"k_mass {point['k_mass']:.3g} (k_ratio {point['k_ratio']:g})"
        left.hist(point["k_adaptive_heldout"], bins=bins, alpha=0.6, color=colour, label=label)
        left.axvline(point["k_fixed"], color=colour, linestyle="--")
    left.set(xlabel=f"patches kept per photo (of {report['patches']})", ylabel="held-out photos",
             title="k per photo at matched mean cost (dashed: the fixed k)")
    left.legend(fontsize=8)
    width = 0.8 / len(points)
    for index, (colour, point) in enumerate(zip(colours, points)):
        positions = [m + (index - (len(points) - 1) / 2) * width for m in range(len(MEASURES))]
        differences = [point["measures"][name]["adaptive_minus_fixed"] for name in MEASURES]
        right.errorbar(positions, [d["mean"] for d in differences], yerr=[d["half_width"] for d in differences],
                       fmt="o", color=colour, capsize=3, label=f"{point['gflops_fixed']:.3g} GFLOPs")
    right.axhline(0, color="black", linewidth=0.8)
    right.set_xticks(range(len(MEASURES)), [LABELS[name] for name in MEASURES], fontsize=8)
    right.set(ylabel="adaptive - fixed (95% interval)", title=f"{len(points[0]['k_adaptive_heldout'])} held-out photos, "
              f"{report['resolution']} px")
    right.legend(fontsize=8)
    figure.tight_layout()
    save_figures_atomically({str(path): figure})
    plt.close(figure)


def benchmark(argv=None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    teacher, source = load_teacher_model(args.teacher)
    with reading_weights(str(args.model)):
        model = load_checked(LookWhereModel, str(args.model), dtype=torch.float32).eval()
    patch = model.config.patch_size
    if args.resolution % patch:
        raise ValueError(f"--resolution {args.resolution} is not a multiple of the model's patch size {patch}; use "
                         f"{max(patch, round(args.resolution / patch) * patch)}.")
    heldout_paths, pixels = load_photos([args.heldout_photos], args.resolution)
    calibration_paths, calibration = load_photos([args.calibration_photos], args.resolution)
    if {p.resolve() for p in heldout_paths} & {p.resolve() for p in calibration_paths}:
        raise ValueError("--calibration-photos share photos with --heldout-photos: calibrate on other photos.")
    print(f"{args.model}: {len(heldout_paths)} held-out photos, {len(calibration_paths)} calibration photos, "
          f"{args.resolution} px", flush=True)
    targets = targets_of(teacher, pixels, patch, args.batch_size)
    centre, centre_source = teacher_centre(args, teacher, patch)
    maps = {"heldout": corevision_hf.selector_maps(model, pixels[:, None]),
            "calibration": corevision_hf.selector_maps(model, calibration[:, None])}
    points = []
    for ratio in args.k_ratios:
        point = cost_point(model, ratio, maps, pixels, targets, centre, args)
        points.append(point)
        print(f"k_ratio {ratio:g} ({point['gflops_fixed']:.3g} GFLOPs) vs k_mass {point['k_mass']:.4g} (held-out mean "
              f"{point['gflops_adaptive_heldout']['mean']:.3g} GFLOPs): " + ", ".join(
                  f"{name} {m['adaptive_minus_fixed']['mean']:+.4f} [{m['adaptive_minus_fixed']['low']:+.4f}, "
                  f"{m['adaptive_minus_fixed']['high']:+.4f}] {m['verdict']}"
                  for name, m in point["measures"].items()), flush=True)
    report = {
        "benchmark": "adaptive_budget",
        "model": str(args.model).replace(str(ROOT) + "/", ""),
        "teacher": source,
        "resolution": args.resolution,
        "patches": (args.resolution // patch) ** 2,
        "heldout_photos": [p.name for p in heldout_paths],
        "calibration_photos": [str(p).replace(str(ROOT) + "/", "") for p in calibration_paths],
        "centre": centre_source,
        "matching": "k_mass: the largest whose mean GFLOPs over the calibration photos do not exceed the fixed "
                    "k_ratio's (corevision_hf.k_mass_for_target)",
        "interval": "adaptive - fixed per held-out photo, 95% interval, t on photos - 1 df (benchmarks.quality_stats)",
        "points": points,
        "environment": {"torch": torch.__version__, "corevision_hf": corevision_hf.__version__,
                        "machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_json(str(args.out), report)
    plot(report, args.plot)
    print(table(report))
    print(f"wrote {args.out} and {args.plot} in {report['seconds']:.0f} s", flush=True)
    return report


def main(argv=None) -> int:
    return run(benchmark, argv)


if __name__ == "__main__":
    sys.exit(main())
