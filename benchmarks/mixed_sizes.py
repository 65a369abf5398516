"""The cost of a padded batch of photos of different shapes against running them one by one.

The shipped photos (assets/photos/: landscape, portrait and square) go through the image processor at one shorter
side; one by one, each runs alone at its own size; as a padded batch, they run together at the largest height and
width with the pixel mask. Both ways are timed alternated in one process; each reports its median and interquartile
range (IQR) over the runs, and the share of the batch that is padding. Each photo's features in the batch (pooled
output and patch tokens on its own grid) are compared with its features alone: the largest difference, absolute and
over the largest magnitude of the features (float32 rounding, which grows with them; the README's bound is the
relative one, tests/test_mixed_sizes.py). Models: VECA-S/16 (16 cores) and LookWhere-S/14 (k_ratio 0.1), random-init (speed does not depend on
the weights), width 384, fp32, on the CPU.

    python -m benchmarks.mixed_sizes                     # about 2 minutes on 2 idle cores (2-3x busy)
    python -m benchmarks.mixed_sizes --shortest-edge 448 --runs 5
"""

import argparse
import json
from pathlib import Path

import torch
from PIL import Image

from benchmarks.common import OUTPUTS, PHOTOS
from corevision_hf.cli import HelpFormatter
from corevision_hf import LookWhereConfig, LookWhereImageProcessor, LookWhereModel, VecaConfig, VecaImageProcessor
from corevision_hf import VecaModel
from corevision_hf.measure import alternated_latency, latency_warnings


def models() -> dict:
    """name -> (model, its processor class, forward budget)."""
    torch.manual_seed(0)
    return {
        "VECA-S/16, 16 cores": (VecaModel(VecaConfig.from_preset("small", patch_size=16)).eval(), VecaImageProcessor,
                                {"num_cores": 16}),
        "LookWhere-S/14, k_ratio 0.1": (LookWhereModel(LookWhereConfig.from_preset("small")).eval(),
                                        LookWhereImageProcessor, {"k_ratio": 0.1}),
    }


@torch.no_grad()
def feature_difference(model, alone: list, batch, budget: dict) -> tuple[float, float]:
    """(the largest |batched - alone| over the photos' pooled outputs and patch tokens on their own grids, the
    largest |feature| alone)."""
    batched = model(batch.pixel_values, pixel_mask=batch.pixel_mask, **budget)
    patch = model.config.patch_size
    grid = (batch.pixel_values.shape[2] // patch, batch.pixel_values.shape[3] // patch)
    difference = magnitude = 0.0
    for index, pixel_values in enumerate(alone):
        own = model(pixel_values, **budget)
        rows, columns = pixel_values.shape[2] // patch, pixel_values.shape[3] // patch
        tokens = batched.patch_tokens[index].unflatten(0, grid)[:rows, :columns].flatten(0, 1)
        difference = max(difference, (tokens - own.patch_tokens[0]).abs().max().item(),
                         (batched.pooler_output[index] - own.pooler_output[0]).abs().max().item())
        magnitude = max(magnitude, own.patch_tokens.abs().max().item(), own.pooler_output.abs().max().item())
    return difference, magnitude


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--shortest-edge", type=int, default=320, help="the processor's size (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each way (default: %(default)s)")
    parser.add_argument("--output", default=str(OUTPUTS / "mixed_sizes_cpu.json"),
                        help="the JSON written (default: %(default)s)")
    args = parser.parse_args(argv)

    photos = [Image.open(path).convert("RGB") for path in sorted(PHOTOS.glob("*.jpg"))]
    rows = []
    for name, (model, processor_class, budget) in models().items():
        processor = processor_class(size={"shortest_edge": args.shortest_edge}, patch_size=model.config.patch_size)
        alone = [processor(photo).pixel_values for photo in photos]
        batch = processor(photos)
        padding = 1 - batch.pixel_mask.float().mean().item()
        print(f"{name}: {len(photos)} photos, sizes {sorted({tuple(p.shape[-2:]) for p in alone})}, "
              f"padded to {tuple(batch.pixel_values.shape[-2:])} ({padding:.0%} padding), {args.runs} runs each",
              flush=True)
        difference, magnitude = feature_difference(model, alone, batch, budget)
        print(f"    largest difference from a photo alone: {difference:.2e} ({difference / magnitude:.2e} of the "
              f"features' largest magnitude, {magnitude:.3g})", flush=True)
        latencies = alternated_latency({
            "one by one": lambda: [model(pixels, **budget) for pixels in alone],
            "padded batch": lambda: model(batch.pixel_values, pixel_mask=batch.pixel_mask, **budget),
        }, "cpu", args.runs)
        for way, latency in latencies.items():
            print(f"    {way}: {latency['latency_ms'] / 1e3:.2f} s (IQR {latency['latency_iqr_ms'] / 1e3:.2f} s)")
        rows.append({"model": name, "images": len(photos), "shortest_edge": args.shortest_edge,
                     "padded_size": list(batch.pixel_values.shape[-2:]), "padding_fraction": padding,
                     "max_abs_difference": difference, "relative_difference": difference / magnitude,
                     "one_by_one": latencies["one by one"], "padded_batch": latencies["padded batch"],
                     "padded_over_one_by_one": latencies["padded batch"]["latency_ms"]
                     / latencies["one by one"]["latency_ms"]})
        print(f"    padded batch / one by one: {rows[-1]['padded_over_one_by_one']:.2f}", flush=True)
    warnings = latency_warnings({(row["model"] + ", " + way, args.shortest_edge): row[key] for row in rows
                                 for way, key in (("one by one", "one_by_one"), ("padded batch", "padded_batch"))})
    for line in warnings:
        print(f"warning: {line}: the machine was busy; rerun on an idle one before quoting these numbers")
    result = {"device": "cpu", "threads": torch.get_num_threads(), "rows": rows, "latency_warnings": warnings}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
