"""Elastic inference with VECA: one network, many core budgets, on real photos.

VECA's patches never attend to each other; an ordered bank of learned core tokens is the only route between
them, and any prefix of that bank can be chosen per call (`model(pixel_values, num_cores=C)`). This script
shows what the budget buys and costs. For each resolution and core budget it prints

  - the number of patches and the analytic forward GFLOPs (`corevision_hf.veca_flops`),
  - the ratio of those FLOPs to a dense ViT of the same size (every token attends to every token; 5 prefix
    tokens, SwiGLU MLP of the same width; `corevision_hf.dense_vit_flops`),
  - the median latency of one photo per call (CPU or GPU, torch.inference_mode),
  - how closely the outputs follow the full bank at the same resolution: mean cosine similarity of
    `pooler_output` (core 0) and of the patch tokens (the last N tokens of `last_hidden_state`).

The photos are the small set shipped in `assets/photos/` (see its LICENSES.md), each prepared by the package's one
image path (`corevision_hf.images.to_pixel_values`, the models' image processor): resized to a square resolution
(bicubic, aspect ratio not kept) and normalised with the ImageNet mean and std. Latency is timed by the package's
harness (`corevision_hf.measure.median_latency_ms`).

No trained VECA checkpoint exists yet, so the model is randomly initialised with a fixed seed: FLOPs and
latency are real, but the agreement columns only describe how an untrained network reacts to a smaller
budget, not the accuracy of a trained one.

    python examples/elastic_inference.py                       # VECA-small, 224 256 512 px, budgets 64 32 16 8
    python examples/elastic_inference.py --resolutions 1024 --budgets 64 16 --json outputs/elastic.json
"""

import argparse
import functools
import json
import time
from pathlib import Path

import torch
from PIL import Image

from corevision_hf.cli import HelpFormatter
from corevision_hf import VECA_PRESETS, VecaConfig, VecaModel, dense_vit_flops, veca_flops
from corevision_hf.images import open_image, to_pixel_values
from corevision_hf.measure import median_latency_ms

try:
    from tqdm.auto import tqdm
except ImportError:  # tqdm is optional: no progress bar without it
    tqdm = None


PHOTO_DIR = Path(__file__).resolve().parent.parent / "assets" / "photos"
# A few-second model for tests and smoke runs: 2 layers of width 64, a bank of 16 cores.
TINY_CONFIG = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, num_cores=16)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--preset", default="small", choices=sorted(VECA_PRESETS), help="VECA size (default: small)")
    parser.add_argument("--tiny", action="store_true", help="use a tiny config instead of --preset (for tests)")
    parser.add_argument("--resolutions", type=int, nargs="+", default=[224, 256, 512], help="square sizes, px")
    parser.add_argument("--budgets", type=int, nargs="+", default=[64, 32, 16, 8], help="active cores per call")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per row, after one warm-up call")
    parser.add_argument("--photos", type=Path, default=PHOTO_DIR, help="folder of .jpg/.png photos")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random initialisation")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the rows as JSON")
    return parser.parse_args(argv)


def load_photos(folder: Path) -> list[Image.Image]:
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    if not paths:
        raise SystemExit(f"No photos found in {folder}.")
    return [open_image(p) for p in paths]


def mean_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1).mean().item()


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    started = time.perf_counter()

    # 1. The model: a reference size, randomly initialised with a fixed seed.
    if args.tiny:
        config, name = VecaConfig(**TINY_CONFIG), "tiny"
    else:
        config, name = VecaConfig.from_preset(args.preset), args.preset
    torch.manual_seed(args.seed)
    model = VecaModel(config).to(args.device).eval()
    full_bank = config.num_cores
    patch = config.patch_size
    bad = [b for b in args.budgets if not 1 <= b <= full_bank]
    if bad:
        raise SystemExit(f"Budgets {bad} lie outside 1..{full_bank} (the size of this model's core bank).")
    bad = [r for r in args.resolutions if r <= 0 or r % patch]
    if bad:
        raise SystemExit(f"Resolutions {bad} are not positive multiples of the patch size {patch}.")

    photos = load_photos(args.photos)
    print(
        f"VECA-{name}: hidden {config.hidden_size}, {config.num_hidden_layers} layers, patch {patch}, "
        f"bank of {full_bank} cores, {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters."
    )
    print(
        f"NOTE: no trained VECA checkpoint exists yet; this model is RANDOMLY INITIALISED (seed {args.seed}).\n"
        "      GFLOPs and latency are real; the cosine columns show how much a smaller budget changes the\n"
        f"      untrained network's output vs the full bank of {full_bank}, not accuracy."
    )
    print(
        f"{len(photos)} photos from {args.photos}; latency: median of {args.repeats} calls on one photo, "
        f"device {args.device}, {torch.get_num_threads()} CPU threads.\n"
    )

    # 2. Every (resolution, budget): cost, latency, and agreement with the full bank at that resolution.
    rows = []
    steps = [(r, b) for r in args.resolutions for b in args.budgets]
    progress = tqdm(total=len(steps), desc="VECA", leave=False) if tqdm is not None else None
    with torch.inference_mode():
        for resolution in args.resolutions:
            pixel_values = torch.stack([to_pixel_values(photo, resolution) for photo in photos]).to(args.device)
            num_patches = (resolution // patch) ** 2
            dense = dense_vit_flops(
                resolution,
                hidden_size=config.hidden_size,
                num_hidden_layers=config.num_hidden_layers,
                intermediate_size=config.intermediate_size,
                patch_size=patch,
                num_prefix_tokens=5,
                gated_mlp=True,
                num_channels=config.num_channels,
            )
            reference = model(pixel_values, num_cores=full_bank)
            for budget in args.budgets:
                if progress is not None:
                    progress.set_postfix_str(f"{resolution}px, {budget} cores")
                output = reference if budget == full_bank else model(pixel_values, num_cores=budget)
                assert output.last_hidden_state.shape[1] == budget + num_patches
                flops = veca_flops(config, resolution, resolution, num_cores=budget)
                rows.append(
                    dict(
                        resolution=resolution,
                        patches=num_patches,
                        budget=budget,
                        gflops=flops / 1e9,
                        dense_vit_gflops=dense / 1e9,
                        flop_ratio_vs_dense=flops / dense,
                        latency_ms=median_latency_ms(functools.partial(model, pixel_values[:1], num_cores=budget),
                                                     args.device, args.repeats, warmup=1),
                        pooler_cosine=mean_cosine(output.pooler_output, reference.pooler_output),
                        patch_cosine=mean_cosine(output.patch_tokens, reference.patch_tokens),
                    )
                )
                if progress is not None:
                    progress.update()
    if progress is not None:
        progress.close()

    # 3. The table.
    header = (
        f"{'res':>5} {'patches':>7} {'cores':>5} {'GFLOPs':>7} {'dense':>7} {'vs dense':>8} "
        f"{'ms/img':>8} {'cos pool':>8} {'cos patch':>9}"
    )
    print(header)
    print("-" * len(header))
    for i, row in enumerate(rows):
        if i and row["resolution"] != rows[i - 1]["resolution"]:
            print()
        print(
            f"{row['resolution']:>5} {row['patches']:>7} {row['budget']:>5} {row['gflops']:>7.2f} "
            f"{row['dense_vit_gflops']:>7.2f} {row['flop_ratio_vs_dense']:>7.2f}x "
            f"{row['latency_ms']:>8.1f} {row['pooler_cosine']:>8.4f} {row['patch_cosine']:>9.4f}"
        )
    print(
        "\ndense = a dense ViT of the same width, depth and SwiGLU MLP with 5 prefix tokens; 'vs dense' < 1 means "
        "VECA is cheaper.\ncos pool / cos patch = mean cosine similarity to the full bank at the same resolution."
    )
    elapsed = time.perf_counter() - started
    print(f"Total time {elapsed:.1f} s.")

    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        summary = dict(
            model=name,
            config={k: getattr(config, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                   "intermediate_size", "patch_size", "num_cores")},
            random_init=True,
            seed=args.seed,
            device=args.device,
            num_photos=len(photos),
            repeats=args.repeats,
            rows=rows,
        )
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"Wrote {len(rows)} rows to {args.json}.")
    return rows


if __name__ == "__main__":
    main()
