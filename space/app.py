"""The demo page: what VECA and LookWhere see in a photo, and what they cost against the dense teacher.

    python space/app.py                       # http://127.0.0.1:7860 (needs `pip install -e ".[app]"`)
    python space/app.py --model outputs/demo/run/final --model org/veca-base --port 7861

Pick or upload a photo, a model (a random-init VECA-S or LookWhere-S, the checkpoint `make demo` distilled when
it exists, or any folder / hub id given with --model), a resolution and a budget, or a target in GFLOPs that picks
the largest budget that fits (`model(..., max_gflops=...)`). The page shows the dense features
as RGB (PCA) next to the dense teacher's, where VECA's cores sit or which patches LookWhere kept, and latency and
analytic GFLOPs against the teacher, measured on this machine in the same call.

The teacher is the checkpoint's own when its training_recipe.json names one that loads here (the demo's DINOv2-S);
otherwise a random-init DINOv2 of the model's width, depth and patch size, so cost compares like with like.
As a hub Space: this folder (app.py, requirements.txt, README.md) plus the package's src/corevision_hf/ copied next
to app.py (see the repository README, "The demo page").
"""

import argparse
import functools
import json
import os
from functools import lru_cache
from pathlib import Path

import gradio as gr
import torch
from PIL import Image
from transformers import AutoModel, Dinov2Config, Dinov2Model

from corevision_hf.cli import HelpFormatter, reading_weights
import corevision_hf
from corevision_hf import (
    LookWhereConfig,
    LookWhereModel,
    VecaConfig,
    VecaModel,
    dense_vit_flops,
    lookwhere_flops,
    optimize_for_cpu,
    veca_flops,
)
from corevision_hf.images import to_display, to_pixel_values
from corevision_hf.loading import load_checked
from corevision_hf.measure import alternated_latency, latency_warnings
from corevision_hf.visualize import figure_to_image, patch_features, plot_cores, plot_feature_pca, plot_kept_patches


HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# the repository's photos, or (in a Space) a photos/ folder uploaded next to app.py
PHOTOS = next((p for p in (ROOT / "assets" / "photos", HERE / "photos") if p.is_dir()), HERE / "photos")
DEMO_CHECKPOINT = ROOT / "outputs" / "demo" / "run" / "final"
RANDOM_VECA = "VECA-S/14, random init"
RANDOM_LOOKWHERE = "LookWhere-S/14, random init"
# multiples of both patch sizes in use (14 and 16), so every model takes every choice
RESOLUTIONS = [224, 448, 672, 896, 1120]
TIMED_RUNS = 5
# the largest photo the page takes: a 50 Mpx phone photo fits; preparing a larger one holds gigabytes of floats
MAX_PHOTO_MEGAPIXELS = 50


@lru_cache(maxsize=4)
def load_model(name: str) -> torch.nn.Module:
    """A VECA or LookWhere model in eval mode: a built-in random-init one, or a folder / hub id."""
    torch.manual_seed(0)
    if name == RANDOM_VECA:
        model = VecaModel(VecaConfig.from_preset("small", patch_size=14, num_cores=32, image_size=224))
    elif name == RANDOM_LOOKWHERE:
        model = LookWhereModel(LookWhereConfig.from_preset("small"))
    else:
        try:
            with reading_weights(name):
                model = load_checked(AutoModel, name)
        except ValueError as error:  # weights that cannot be loaded, or are not finite: one line on the page
            raise gr.Error(str(error)) from None
        if model.config.model_type not in ("veca", "lookwhere"):
            raise gr.Error(f"{name} is a {model.config.model_type!r} model; this page shows VECA and LookWhere.")
    return optimize_for_cpu(model.eval())  # the page runs on CPU: prepacked linear weights


@lru_cache(maxsize=4)
def load_teacher(name: str) -> tuple[torch.nn.Module, str]:
    """(the dense reference ViT, how it was chosen) for the model called `name`."""
    recipe = Path(name) / "training_recipe.json"
    if recipe.is_file():
        teacher = json.loads(recipe.read_text()).get("teacher")
        if teacher == "offline-dinov2-small":
            from corevision_hf.offline import DEFAULT_TEACHER_CACHE_DIR, load_dinov2_small_teacher

            try:
                return load_dinov2_small_teacher(cache_dir=str(ROOT / DEFAULT_TEACHER_CACHE_DIR))[0].eval(), \
                    "DINOv2-S/14, the checkpoint's teacher"
            except RuntimeError:
                pass  # no copy here: fall back to a random one of the same shape, said so on the page
    config = load_model(name).config
    width = config.hidden_size
    dense = Dinov2Config(hidden_size=width, num_hidden_layers=config.num_hidden_layers,
                         num_attention_heads=config.num_attention_heads, patch_size=config.patch_size,
                         mlp_ratio=4, image_size=config.image_size)
    torch.manual_seed(0)
    return Dinov2Model(dense).eval(), f"random-init DINOv2 ({width} wide, {config.num_hidden_layers} layers)"


def teacher_flops(teacher, resolution: int) -> int:
    config = teacher.config
    return dense_vit_flops(resolution, hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
                           intermediate_size=int(config.hidden_size * config.mlp_ratio), patch_size=config.patch_size,
                           num_prefix_tokens=1 + getattr(config, "num_register_tokens", 0))


@torch.inference_mode()
def run(photo: Image.Image | None, model_name: str, resolution: int, num_cores: int, k_ratio: float,
        target_gflops: float = 0.0, offered: tuple[str, ...] | None = None):
    """(PCA picture, cores / kept-patches picture, cost table in Markdown) for one photo; a `target_gflops` above 0
    replaces the budget controls with the largest budget whose analytic cost fits it. The page passes the models it
    offers as `offered`: any other name a client sends (a local path, a hub id) is refused, never loaded."""
    if photo is None:
        raise gr.Error("Pick or upload a photo first.")
    if offered is not None and model_name not in offered:
        raise gr.Error(f"{model_name!r} is not one of the models this page offers: pick one from the list.")
    if photo.width * photo.height > MAX_PHOTO_MEGAPIXELS * 1e6:
        raise gr.Error(f"This photo is {photo.width}x{photo.height} px ({photo.width * photo.height / 1e6:.0f} Mpx), "
                       f"more than the page's limit of {MAX_PHOTO_MEGAPIXELS} Mpx: resize it first.")
    model = load_model(model_name)
    teacher, teacher_source = load_teacher(model_name)
    config = model.config
    resolution = int(resolution)
    if resolution % config.patch_size:
        raise gr.Error(f"{resolution} px is not a multiple of the patch size {config.patch_size}.")
    pixels = to_pixel_values(photo, resolution)[None]
    grid = (resolution // config.patch_size,) * 2
    if target_gflops:
        budget = {"max_gflops": float(target_gflops)}
    elif config.model_type == "veca":
        budget = {"num_cores": min(int(num_cores), config.num_cores)}
    else:
        budget = {"k_ratio": float(k_ratio)}
    try:
        output = model(pixels, **budget)
    except ValueError as error:  # a target below the cheapest budget says which budget that is and what it costs
        raise gr.Error(str(error)) from error
    if config.model_type == "veca":  # the budget that ran, read from the output (a target chose it)
        cores = output.core_coordinates.shape[1]
        label, flops = f"{cores} cores", veca_flops(config, resolution, num_cores=cores)
    else:
        k = output.selected_indices.shape[1]
        label, flops = f"k {k} of {grid[0] * grid[1]}", lookwhere_flops(config, resolution, k=k)
    if target_gflops:
        label += f" (largest within {float(target_gflops):g} GFLOPs)"
    teacher_pixels = pixels if teacher.config.patch_size == config.patch_size else torch.nn.functional.interpolate(
        pixels, size=(grid[0] * teacher.config.patch_size,) * 2, mode="bicubic", align_corners=False)
    teacher_output = teacher(teacher_pixels)
    photo_rgb = to_display(pixels[0])

    features = plot_feature_pca(
        [(photo_rgb, {"teacher": patch_features(teacher_output, grid)[0], label: patch_features(output, grid)[0]})],
        title=f"dense features at {resolution} px, colours fitted on the teacher",
    )
    if config.model_type == "veca":
        where = plot_cores(photo_rgb, {label: output.core_coordinates[0]}, title="where the cores sit")
    else:
        where = plot_kept_patches(photo_rgb, output.selector_map[0], {label: output.selected_indices[0]}, grid,
                                  title="selector map and kept patches")

    # timed in turn, one warm-up each: the first call packs the weights (optimize_for_cpu) and builds oneDNN kernels
    latency = alternated_latency({"model": lambda: model(pixels, **budget), "teacher": lambda: teacher(teacher_pixels)},
                                 "cpu", TIMED_RUNS, warmup=1)
    model_ms, teacher_ms = latency["model"]["latency_ms"], latency["teacher"]["latency_ms"]
    dense = teacher_flops(teacher, teacher_pixels.shape[-1])
    table = "\n".join([
        f"| {resolution} px, {grid[0] * grid[1]} patches | GFLOPs (analytic) | latency (ms, median (IQR) of "
        f"{TIMED_RUNS}) |",
        "|---|---|---|",
        f"| {config.model_type}, {label} | {flops / 1e9:.2f} | {model_ms:.1f} ({latency['model']['latency_iqr_ms']:.1f}) |",
        f"| dense teacher: {teacher_source} | {dense / 1e9:.2f} | {teacher_ms:.1f} "
        f"({latency['teacher']['latency_iqr_ms']:.1f}) |",
        f"| **teacher / model** | **{dense / flops:.2f}x** | **{teacher_ms / model_ms:.2f}x** |",
    ])
    note = f"\n\nMeasured on this machine ({torch.get_num_threads()} threads, fp32, batch 1), in this call."
    warnings = latency_warnings({(name, resolution): value for name, value in latency.items()})
    if warnings:
        note += ("\n\n**Not to be trusted: the machine was busy** (" + "; ".join(warnings) + "). Run again when it "
                 "is idle.")
    return figure_to_image(features), figure_to_image(where), table + note


def build(models: list[str], default_photo: str | None = None, default_resolution: int = 448) -> gr.Blocks:
    examples = sorted(str(p) for p in PHOTOS.glob("*.jpg")) if PHOTOS.is_dir() else []
    default_photo = default_photo or (examples[0] if examples else None)
    with gr.Blocks(title="corevision_hf: VECA and LookWhere") as page:
        gr.Markdown("# VECA and LookWhere: what they see, what they cost\n"
                    "Efficient high-resolution ViTs from `corevision_hf`. Choose a photo, a model, a resolution and a "
                    "budget (cores for VECA, the fraction of patches kept for LookWhere), or a target in GFLOPs that "
                    "picks the largest budget that fits.")
        with gr.Row():
            with gr.Column(scale=1):
                photo = gr.Image(value=default_photo, type="pil", label="photo", height=260)
                if examples:
                    gr.Examples(examples, inputs=photo)
                model = gr.Dropdown(models, value=models[0], label="model",
                                    info="the models given with --model, and the built-in ones")
                resolution = gr.Dropdown(RESOLUTIONS, value=default_resolution, label="resolution (px)")
                num_cores = gr.Slider(1, 64, value=16, step=1, label="VECA: active cores (up to the bank's size)")
                k_ratio = gr.Slider(0.01, 1.0, value=0.1, step=0.01, label="LookWhere: k_ratio (fraction of patches)")
                target = gr.Slider(0, 200, value=0, step=0.1, label="or a target: GFLOPs per image (0: off)",
                                   info="runs the largest budget whose analytic cost at this resolution fits")
                button = gr.Button("Run", variant="primary")
            with gr.Column(scale=2):
                cost = gr.Markdown(elem_id="cost")
                # the figures carry their own titles
                features = gr.Image(label="dense features (PCA as RGB)", show_label=False, elem_id="features")
                where = gr.Image(label="cores / kept patches", show_label=False, elem_id="where")
        inputs, outputs = [photo, model, resolution, num_cores, k_ratio, target], [features, where, cost]
        run_offered = functools.partial(run, offered=tuple(models))
        button.click(run_offered, inputs, outputs)
        page.load(run_offered, inputs, outputs)  # the page opens with results, not empty boxes
    return page


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--model", action="append", default=[], help="a folder or hub id to offer (repeatable)")
    # a hub Space sets GRADIO_SERVER_NAME=0.0.0.0; locally the page is served to this machine only
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--resolution", type=int, default=448, choices=RESOLUTIONS, help="the initial resolution")
    args = parser.parse_args(argv)
    models = [*args.model, *([str(DEMO_CHECKPOINT)] if DEMO_CHECKPOINT.is_dir() else []), RANDOM_VECA,
              RANDOM_LOOKWHERE]
    print(f"corevision_hf {corevision_hf.__version__}: serving {len(models)} models on http://{args.host}:{args.port}")
    build(models, default_resolution=args.resolution).launch(server_name=args.host, server_port=args.port,
                                                             show_error=True)


if __name__ == "__main__":
    main()
