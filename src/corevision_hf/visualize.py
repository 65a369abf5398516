"""Pictures of what VECA and LookWhere see, for the demo, the model card and the demo page (matplotlib).

- `plot_feature_pca`: dense features as RGB (their first three principal components, the DINOv2-style picture),
  one column per model or budget, colours fitted on the first column so that columns are comparable.
- `plot_cores`: where VECA's active cores ended up (`out.core_coordinates`), over the photo, per budget.
- `plot_kept_patches`: LookWhere's selector map and the patches it kept (`out.selected_indices`), per budget.
- `plot_evaluation`: quality against cost per budget from an evaluation JSON (evaluation.evaluate_budgets), with
  the dense teacher as the reference and the spread over images as error bars.

Every function returns a `matplotlib.figure.Figure` (no pyplot state, so it is safe in a web server's threads);
`save_figure` writes one, `figure_to_image` turns one into a PIL image.

As a command, `python -m corevision_hf.visualize MODEL IMAGE --output OUT.png` draws one photo through a model
(`--help` for the options).
"""

import argparse
import io
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import AutoModel  # the package's import registered VECA and LookWhere with it
from transformers.utils import logging as transformers_logging

from .atomic import follow_umask
from .cli import HelpFormatter
from .cli import reading_weights, run
from .finite import check_forward_finite
from .images import open_image, to_display, to_pixel_values
from .loading import load_checked
from .offline import check_hub_reachable
from .outputs import check_file_output, record_file, refuse_overlap
from .tokens import patch_tokens

try:
    from matplotlib import colormaps, patheffects
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle
except ImportError:
    if __name__ != "__main__":
        raise
    # the command line's one-line answer; an import by a program keeps the ImportError
    print("error: corevision_hf.visualize draws with matplotlib: pip install matplotlib (or pip install "
          "'corevision-hf[demo]')", file=sys.stderr)
    sys.exit(2)


TITLE_SIZE = 11
LABEL_SIZE = 9


def patch_features(output, grid: tuple[int, int]) -> torch.Tensor:
    """The patch tokens of a model output laid out on its (Hp, Wp) grid: (B, Hp, Wp, D), float32 on CPU. Works for
    VECA, LookWhere with the dense fill and DINOv2 / DINOv3 outputs; a grid that does not match the output's patch
    tokens is a ValueError (`corevision_hf.tokens.patch_tokens`)."""
    patches = patch_tokens(output, grid).detach().float().cpu()
    return patches.reshape(len(patches), *grid, -1)


class PCAColors:
    """Three principal components of a set of features, mapped to RGB in [0, 1].

    Fitted once (on a reference, e.g. the teacher's features of a photo) and applied to others of the same width,
    so that the same colour means the same direction in feature space across pictures. Each vector is L2-normalised
    first: a student distilled with a cosine loss matches its teacher's directions, not its norms."""

    def __init__(self, features: torch.Tensor):
        """features: (..., D) with at least 3 vectors; D is the feature width."""
        flat = F.normalize(features.reshape(-1, features.shape[-1]).double(), dim=-1)
        self.mean = flat.mean(0)
        _, _, vectors = torch.linalg.svd(flat - self.mean, full_matrices=False)
        self.components = vectors[:3]  # (3, D); a sign is arbitrary, so fix it by the projection's skew
        projected = (flat - self.mean) @ self.components.T
        signs = torch.where(projected.pow(3).mean(0) < 0, -1.0, 1.0).double()
        self.components = self.components * signs[:, None]
        projected = projected * signs
        # 1st-99th percentiles, not the extremes: a few outlier patches would otherwise wash every colour out
        self.low = torch.quantile(projected, 0.01, dim=0)
        self.high = torch.quantile(projected, 0.99, dim=0)

    @property
    def width(self) -> int:
        return self.mean.numel()

    def __call__(self, features: torch.Tensor) -> np.ndarray:
        """(..., D) -> RGB array (..., 3) in [0, 1]."""
        projected = (F.normalize(features.double(), dim=-1) - self.mean) @ self.components.T
        rgb = (projected - self.low) / (self.high - self.low).clamp_min(1e-12)
        return rgb.clamp(0, 1).float().numpy()


def plot_feature_pca(rows: list[tuple[np.ndarray, dict[str, torch.Tensor]]], title: str | None = None) -> Figure:
    """PCA pictures of dense features next to each photo.

    Args:
        rows: one per photo: (the photo as an RGB array (H, W, 3) in [0, 1], {panel title: features (Hp, Wp, D)}),
            panels in display order. Each row's colours are fitted on its first panel (put the teacher, or the
            largest budget, first); a panel of another width gets colours of its own, and its title says so.
        title: the figure's title.

    Returns:
        A figure with one row per photo: the photo, then one PCA picture per panel.
    """
    columns = 1 + max(len(panels) for _, panels in rows)
    figure = Figure(figsize=(2.7 * columns, 2.9 * len(rows) + (0.5 if title else 0)), layout="constrained")
    axes = figure.subplots(len(rows), columns, squeeze=False)
    for row, (photo, panels) in zip(axes, rows):
        row[0].imshow(photo)
        row[0].set_title("photo", fontsize=TITLE_SIZE)
        reference = None
        for axis, (name, features) in zip(row[1:], panels.items()):
            if reference is None:
                reference = PCAColors(features)
            colors = reference if features.shape[-1] == reference.width else PCAColors(features)
            # nearest-neighbour upsampling keeps the patch grid visible at the photo's aspect ratio
            axis.imshow(colors(features), interpolation="nearest", extent=(0, photo.shape[1], photo.shape[0], 0))
            suffix = "" if colors is reference else "\n(own colours: other width)"
            axis.set_title(name + suffix, fontsize=TITLE_SIZE)
        for axis in row:
            axis.set_xticks([])
            axis.set_yticks([])
        for axis in row[1 + len(panels) :]:
            axis.set_visible(False)
    if title:
        figure.suptitle(title, fontsize=TITLE_SIZE + 1)
    figure.text(0.5, 0.0, "colours: the first 3 principal components of the first panel's features, as R, G, B",
                ha="center", va="bottom", fontsize=LABEL_SIZE - 1, color="0.3")
    return figure


def plot_cores(photo: np.ndarray, coordinates: dict[str, torch.Tensor], title: str | None = None) -> Figure:
    """VECA's core positions over the photo, one panel per budget.

    Args:
        photo: RGB array (H, W, 3) in [0, 1].
        coordinates: {panel title: core coordinates (C, 2)}, (x, y) in (-1, 1) as in `out.core_coordinates[i]`.
        title: the figure's title.

    Returns:
        A figure; each core is a dot coloured by its index in the bank (one colour scale for all panels).
    """
    most = max(len(c) for c in coordinates.values())
    norm, cmap = Normalize(0, max(most - 1, 1)), colormaps["viridis"]
    height, width = photo.shape[:2]
    figure = Figure(figsize=(3.0 * len(coordinates) + 0.9, 3.4 + (0.4 if title else 0)), layout="constrained")
    axes = figure.subplots(1, len(coordinates), squeeze=False)[0]
    for axis, (name, xy) in zip(axes, coordinates.items()):
        xy = xy.detach().float().cpu()
        axis.imshow(photo)
        pixels_x = (xy[:, 0] + 1) / 2 * width
        pixels_y = (xy[:, 1] + 1) / 2 * height
        axis.scatter(pixels_x, pixels_y, c=np.arange(len(xy)), cmap=cmap, norm=norm, s=46, edgecolors="white",
                     linewidths=1.2, clip_on=False, zorder=3)
        if len(xy) <= 16:  # numbers stay legible up to about 16 cores
            for index, (x, y) in enumerate(zip(pixels_x.tolist(), pixels_y.tolist())):
                axis.annotate(str(index), (x, y), xytext=(4, 3), textcoords="offset points", fontsize=7, color="white",
                              fontweight="bold", path_effects=_outline())
        # a margin around the photo, so cores at the border are drawn whole
        margin = 0.06 * max(height, width)
        axis.set_xlim(-margin, width + margin)
        axis.set_ylim(height + margin, -margin)
        on_border = int(((xy.abs() > 0.95).any(-1)).sum())
        axis.set_title(f"{name}\n{on_border} of {len(xy)} within 2.5% of the border", fontsize=TITLE_SIZE)
        axis.set_xticks([])
        axis.set_yticks([])
    colorbar = figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, shrink=0.85, pad=0.02)
    colorbar.set_label("core index (order in the bank)", fontsize=LABEL_SIZE)
    if title:
        figure.suptitle(title, fontsize=TITLE_SIZE + 1)
    return figure


def plot_kept_patches(
    photo: np.ndarray, selector_map: torch.Tensor, kept: dict[str, torch.Tensor], grid: tuple[int, int],
    title: str | None = None,
) -> Figure:
    """LookWhere's selector map and the patches it kept, over the photo.

    Args:
        photo: RGB array (H, W, 3) in [0, 1].
        selector_map: the selector's scores (Hp * Wp,), `out.selector_map[i]`.
        kept: {panel title: kept patch indices (k,)}, `out.selected_indices[i]` per budget.
        grid: (Hp, Wp).
        title: the figure's title.

    Returns:
        A figure: the selector map with its colour scale, then per budget the photo with unkept patches dimmed and
        kept ones outlined.
    """
    height, width = photo.shape[:2]
    rows, columns = grid
    patch_h, patch_w = height / rows, width / columns
    figure = Figure(figsize=(3.0 * (1 + len(kept)) + 0.9, 3.3 + (0.4 if title else 0)), layout="constrained")
    axes = figure.subplots(1, 1 + len(kept), squeeze=False)[0]
    scores = selector_map.detach().float().cpu().reshape(rows, columns).numpy()
    axes[0].imshow(photo)
    heat = axes[0].imshow(scores, cmap="magma", alpha=0.65, extent=(0, width, height, 0), interpolation="nearest")
    axes[0].set_title("selector map", fontsize=TITLE_SIZE)
    colorbar = figure.colorbar(heat, ax=axes[0], shrink=0.85, pad=0.02)
    colorbar.set_label("selector score (logit)", fontsize=LABEL_SIZE)
    for axis, (name, indices) in zip(axes[1:], kept.items()):
        mask = np.zeros(rows * columns, dtype=bool)
        mask[indices.detach().cpu().numpy()] = True
        dimmed = photo * 0.25 + 0.75 * 0.5  # unkept patches: a flat grey wash, so the kept ones stand out
        shown = _patch_mask_image(mask.reshape(rows, columns), height, width)
        axis.imshow(np.where(shown[..., None], photo, dimmed))
        for index in np.flatnonzero(mask):
            r, c = divmod(int(index), columns)
            axis.add_patch(Rectangle((c * patch_w, r * patch_h), patch_w, patch_h, fill=False, edgecolor="#ffcc00",
                                     linewidth=0.8))
        axis.set_title(f"{name}\nkept {mask.sum()} of {mask.size} patches ({mask.mean():.0%})", fontsize=TITLE_SIZE)
    for axis in axes:
        axis.set_xticks([])
        axis.set_yticks([])
    if title:
        figure.suptitle(title, fontsize=TITLE_SIZE + 1)
    return figure


QUALITY_LABELS = {
    "cls_cosine": "CLS cosine to the teacher",
    "patch_cosine": "patch cosine to the teacher",
    "probe_accuracy": "linear-probe accuracy",
    "segmentation_miou": "linear segmentation mIoU",
}


def plot_latency_panel(axis, report: dict, budgets: list) -> None:
    """The last panel of `plot_evaluation`: latency per budget at every resolution (median; bars as long as the
    interquartile range), the teacher's as dashed lines; the latency warnings, when there are any, in red."""
    results, teacher_cost = report["results"], report.get("teacher_cost") or {}
    positions = range(len(budgets))
    for index, r in enumerate(report["resolutions"]):
        latency = [entry["cost"][str(r)]["latency_ms"] for entry in results]
        spread = [entry["cost"][str(r)].get("latency_iqr_ms") for entry in results]
        axis.errorbar(positions, latency, yerr=None if None in spread else [s / 2 for s in spread], fmt="o-",
                      color=f"C{index}", capsize=3, label=f"{r} px")
        teacher_latency = (teacher_cost.get(str(r)) or {}).get("latency_ms")
        if teacher_latency:
            axis.axhline(teacher_latency, color=f"C{index}", linestyle="--", linewidth=1, label=f"teacher, {r} px")
    axis.set_xticks(list(positions), [str(b) for b in budgets])
    axis.set_xlabel(report["budget_name"], fontsize=LABEL_SIZE)
    axis.set_ylabel("latency per batch (ms; median, bars: IQR)", fontsize=LABEL_SIZE)
    if report.get("latency_warnings"):
        axis.set_title("not to be trusted: the machine was busy\n(latency_warnings in evaluation.json)", color="red",
                       fontsize=LABEL_SIZE)
    axis.set_ylim(0, None)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=LABEL_SIZE - 1)


def plot_evaluation(report: dict) -> Figure:
    """Quality and latency against cost for every budget of an evaluation JSON (evaluation.evaluate_budgets).

    Quality panels: each measured metric against GFLOPs at the quality resolution, on a 0-1 scale with the dense
    teacher's GFLOPs as a vertical line (and, for the cosines, the teacher's agreement with itself, 1, as a
    horizontal one); error bars are one standard deviation over the images where several were measured. The last
    panel: latency per budget at every resolution (median; bars as long as the interquartile range), the teacher's
    as dashed lines; the evaluation's latency warnings, when it has any, in red under it.
    """
    results = report["results"]
    resolution = str(report["quality_resolution"])
    teacher_cost = report.get("teacher_cost") or {}
    metrics = [m for m in QUALITY_LABELS if any((r.get("quality") or {}).get(m) is not None for r in results)]
    figure = Figure(figsize=(4.0 * (len(metrics) + 1), 3.8), layout="constrained")
    axes = figure.subplots(1, len(metrics) + 1, squeeze=False)[0]
    gflops = [r["cost"][resolution]["gflops"] for r in results]
    teacher_gflops = (teacher_cost.get(resolution) or {}).get("gflops")
    right = 1.12 * max([*gflops, teacher_gflops or 0])
    budgets = [r["budget"] for r in results]
    colors = colormaps["viridis"](np.linspace(0.1, 0.85, len(results)))
    spread_label = f"mean ± sd over {report['agreement_images']} images" if report.get("agreement_images") else "mean ± sd"
    for axis, metric in zip(axes, metrics):
        points = [(g, r["quality"][metric], r["quality"].get(metric + "_std"), b, c)
                  for g, r, b, c in zip(gflops, results, budgets, colors) if r["quality"].get(metric) is not None]
        axis.plot([p[0] for p in points], [p[1] for p in points], "-", color="0.6", linewidth=1, zorder=1)
        # one colour per budget, named in the legend: budgets close in GFLOPs would overlap as text labels
        for x, y, spread, budget, color in points:
            axis.errorbar([x], [y], yerr=None if spread is None else [spread], fmt="o", color=color, capsize=3,
                          markersize=7, label=f"{budget}", zorder=2)
        has_spread = any(p[2] is not None for p in points)
        if teacher_gflops:
            cosine = metric.endswith("cosine")
            axis.axvline(teacher_gflops, color="0.35", linestyle="--", linewidth=1, label=None if cosine else "teacher")
            if cosine:  # the teacher agrees with itself: cosine 1 at its own cost
                axis.plot([teacher_gflops], [1.0], marker="*", markersize=13, color="0.35", linestyle="none",
                          label="teacher")
        axis.set_xlim(0, right)
        axis.set_ylim(min(0.0, min(p[1] for p in points) - 0.05), 1.05)
        axis.set_xlabel(f"GFLOPs per image at {resolution} px (dashed: the teacher)", fontsize=LABEL_SIZE)
        axis.set_ylabel(QUALITY_LABELS[metric] + (f"\n({spread_label})" if has_spread else ""), fontsize=LABEL_SIZE)
        axis.grid(alpha=0.3)
        axis.legend(title=report["budget_name"], fontsize=LABEL_SIZE - 1, title_fontsize=LABEL_SIZE - 1,
                    loc="lower left", ncols=2)
    plot_latency_panel(axes[-1], report, budgets)
    environment = report.get("environment") or {}
    figure.suptitle(
        f"{report['model_type']}: quality and cost per budget ({environment.get('device', '?')}, "
        f"{environment.get('dtype', '?')}, batch {environment.get('batch_size', '?')})",
        fontsize=TITLE_SIZE + 1,
    )
    return figure


def save_figure(figure: Figure, path: str, dpi: int = 110) -> None:
    """Writes the figure (PNG by the file's extension)."""
    figure.savefig(path, dpi=dpi)


def figure_to_image(figure: Figure, dpi: int = 100) -> Image.Image:
    """The figure rendered as an RGB PIL image."""
    buffer = io.BytesIO()
    FigureCanvasAgg(figure)
    figure.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    return Image.open(buffer).convert("RGB")


def _patch_mask_image(mask: np.ndarray, height: int, width: int) -> np.ndarray:
    """A (rows, columns) boolean patch mask -> (height, width) pixel mask."""
    rows = (np.arange(height) * mask.shape[0] // height)[:, None]
    columns = (np.arange(width) * mask.shape[1] // width)[None, :]
    return mask[rows, columns]


def _outline() -> list:
    return [patheffects.withStroke(linewidth=2, foreground="black")]


# ---------------------------------------------------------------- one photo through a model, and the command line

MODEL_NAMES = {"veca": "VECA", "lookwhere": "LookWhere"}


def model_pictures(model, image: Image.Image, budgets: list[dict], resolution: int) -> dict[str, Figure]:
    """Pictures of one photo through a VECA or LookWhere model, one panel per budget.

    Args:
        model: a `VecaModel` or `LookWhereModel`.
        image: a PIL image, resized as the models' image processor sizes it (`to_pixel_values` with the patch size):
            shorter side about `resolution`, aspect ratio kept, both sides snapped to patch multiples.
        budgets: one call's budget arguments per panel, e.g. `[{"num_cores": 16}, {"num_cores": 4}]` or
            `[{"k_ratio": 0.1}]`; `[{}]` is the model's default. Colours are fitted on the first panel.

    Returns:
        {"features": the PCA picture, and "cores" (VECA) or "kept" (LookWhere): where the budget went}.
    """
    config = model.config
    if config.model_type not in MODEL_NAMES:
        raise ValueError(f"{config.model_type!r} models are not drawn here; give a VECA or LookWhere model.")
    pixel_values = to_pixel_values(image, resolution, config.patch_size)[None].to(model.device, model.dtype)
    grid = (pixel_values.shape[-2] // config.patch_size, pixel_values.shape[-1] // config.patch_size)
    photo = to_display(pixel_values[0])
    outputs = {}
    with torch.inference_mode():
        for budget in budgets:
            output = model.eval()(pixel_values, **budget)
            if config.model_type == "veca":
                label = f"{output.core_coordinates.shape[1]} cores"
            else:
                label = f"k = {output.selected_indices.shape[1]}"
            outputs[label] = output
    title = f"{MODEL_NAMES[config.model_type]} at {pixel_values.shape[-1]} x {pixel_values.shape[-2]} px"
    features = {label: patch_features(out, grid)[0] for label, out in outputs.items()}
    pictures = {"features": plot_feature_pca([(photo, features)], title=f"{title}: dense features")}
    if config.model_type == "veca":
        coordinates = {label: out.core_coordinates[0] for label, out in outputs.items()}
        pictures["cores"] = plot_cores(photo, coordinates, title=f"{title}: where the cores sit")
    else:
        kept = {label: out.selected_indices[0] for label, out in outputs.items()}
        first = next(iter(outputs.values()))
        pictures["kept"] = plot_kept_patches(photo, first.selector_map[0], kept, grid, title=f"{title}: patches kept")
    return pictures


def picture_paths(output: str, names) -> dict[str, str]:
    """OUT.png -> {"features": OUT.png, "cores": OUT-cores.png, ...}: the first picture takes the name given."""
    stem, suffix = os.path.splitext(output)
    names = list(names)
    return {name: output if index == 0 else f"{stem}-{name}{suffix}" for index, name in enumerate(names)}


def save_figures_atomically(figures: dict[str, Figure]) -> None:
    """Writes {path: figure}: each to a temporary name next to its path, renamed only once all are drawn, so a
    failure leaves the files that were there before untouched and no partial picture behind."""
    written = {}
    try:
        for path, figure in figures.items():
            folder, name = os.path.split(os.path.abspath(path))
            handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
            os.close(handle)
            follow_umask(temporary)
            written[path] = temporary
            figure.savefig(temporary, dpi=110, format=os.path.splitext(path)[1][1:].lower())
        for path, temporary in written.items():
            os.replace(temporary, path)
    finally:
        for temporary in written.values():
            if os.path.exists(temporary):
                os.remove(temporary)


def main(argv: list[str] | None = None) -> dict[str, str]:
    """The command; returns {picture: path written}."""
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter,
        prog="python -m corevision_hf.visualize",
        description="Draws one photo through a VECA or LookWhere model: its dense features as RGB (3 principal "
                    "components), and where its budget went (VECA's cores, LookWhere's kept patches), one panel "
                    "per budget.",
    )
    parser.add_argument("model", help="model folder (or hub id)")
    parser.add_argument("image", help="photo file")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--num-cores", type=int, nargs="+", metavar="K",
                        help="VECA: core budgets, one panel each (default: the model's default_num_cores)")
    budget.add_argument("--k-ratio", type=float, nargs="+", metavar="R",
                        help="LookWhere: fractions of the patches kept, one panel each (default: the model's)")
    parser.add_argument("--resolution", type=int, metavar="S",
                        help="shorter side in pixels, snapped to patch multiples (default: the model's image_size)")
    parser.add_argument("--output", required=True, metavar="OUT.png",
                        help="the features picture; the other is written next to it as OUT-cores.png / OUT-kept.png")
    parser.add_argument("--force", action="store_true", help="replace pictures that this package wrote before")
    args = parser.parse_args(argv)

    if args.resolution is not None and args.resolution < 1:
        raise ValueError(f"--resolution must be a positive number of pixels, got {args.resolution}.")
    extension = os.path.splitext(args.output)[1].lower()
    if extension not in (".png", ".jpg", ".jpeg", ".pdf", ".svg"):
        raise ValueError(f"--output {args.output!r}: give a .png, .jpg, .pdf or .svg file name.")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        raise FileNotFoundError(f"--output {args.output!r}: its folder does not exist.")
    image = open_image(args.image)  # a missing or unreadable photo is one line before the model loads
    transformers_logging.disable_progress_bar()  # one model, loaded in a blink: its bar would only bury errors
    check_hub_reachable(args.model)
    with reading_weights(args.model):
        model = check_forward_finite(load_checked(AutoModel, args.model))
    model_type = model.config.model_type
    if (model_type == "veca" and args.k_ratio) or (model_type == "lookwhere" and args.num_cores):
        given, right = ("--k-ratio", "--num-cores") if args.k_ratio else ("--num-cores", "--k-ratio")
        raise ValueError(f"{given} does not apply to a {model_type} model; use {right}.")
    if args.num_cores:
        budgets = [{"num_cores": n} for n in sorted(args.num_cores, reverse=True)]
    elif args.k_ratio:
        budgets = [{"k_ratio": r} for r in sorted(args.k_ratio, reverse=True)]
    else:
        budgets = [{}]
    paths = picture_paths(args.output, ["features", "cores" if model_type == "veca" else "kept"])
    for path in paths.values():
        refuse_overlap(path, args.image, args.model)
        check_file_output(path, args.force)
    pictures = model_pictures(model, image, budgets, args.resolution or model.config.image_size)
    save_figures_atomically({paths[name]: figure for name, figure in pictures.items()})
    for path in paths.values():
        record_file(path)
    print("wrote " + ", ".join(paths.values()))
    return paths


def cli(argv: list[str] | None = None) -> int:
    """The command line: a bad input ends in one line on stderr and exit status 2."""
    return run(main, argv)


__all__ = [
    "PCAColors",
    "figure_to_image",
    "model_pictures",
    "patch_features",
    "plot_cores",
    "plot_evaluation",
    "plot_feature_pca",
    "plot_kept_patches",
    "save_figure",
]


if __name__ == "__main__":
    sys.exit(cli())
