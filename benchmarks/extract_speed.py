"""Feature extraction throughput: the same `python -m corevision_hf.extract` job with VECA-B and LookWhere-B against
transformers' DINOv3-B and DINOv2-B, at about 1024 px, in one run.

All four are random-init (speed does not depend on the weights) and saved to a temporary folder; the job is the
shipped photos (assets/photos/), resized to 1024 px (patch 16) or 1022 px (patch 14, the nearest multiple), batch 1,
pooled features only, one shard per image. Throughput is images / s of the extraction loop (decode, resize, forward,
writing the shard) over all images but the first, whose time (the one-time warm-up: prepacked weights, kernels) is
reported apart; the model load and the final merge are not counted. The jobs run one after the other in one process,
--rounds times, alternating; the median round is reported.
The machine may have been shared with other jobs: the ratios, measured in the same run, carry over, not the seconds.

    python -m benchmarks.extract_speed     # a few minutes on 2 idle cores (2-3x busy)
"""

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import DINOv3ViTModel, Dinov2Config, Dinov2Model

from benchmarks.common import OUTPUTS, PHOTOS, dinov3_base_config
from corevision_hf.cli import HelpFormatter
from corevision_hf import LookWhereConfig, LookWhereModel, VecaConfig, VecaModel, extract


def models() -> dict:
    """name -> (model, extraction budget flags, resolution)."""
    torch.manual_seed(0)
    return {
        "VECA-B/16, 16 cores": (VecaModel(VecaConfig.from_preset("base")), ["--num-cores", "16"], 1024),
        "LookWhere-B/14, k_ratio 0.1": (LookWhereModel(LookWhereConfig.from_preset("base")), ["--k-ratio", "0.1"], 1022),
        "DINOv3-B/16": (DINOv3ViTModel(dinov3_base_config()), [], 1024),
        "DINOv2-B/14": (Dinov2Model(Dinov2Config(
            hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_ratio=4, patch_size=14)), [], 1022),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--output", default=str(OUTPUTS / "extract_cpu.json"))
    args = parser.parse_args()

    loop_seconds = []
    original = extract.run_shard

    def timed_shard(*shard_args, **kwargs):  # the loop only: the model load and the merge are not the throughput
        start = time.perf_counter()
        original(*shard_args, **kwargs)
        loop_seconds.append(time.perf_counter() - start)

    extract.run_shard = timed_shard
    num_images = len(list(PHOTOS.glob("*.jpg")))
    rows = {}
    with tempfile.TemporaryDirectory(prefix="extract-speed-") as folder:
        jobs = {}
        for name, (model, budget, resolution) in models().items():
            path = Path(folder) / name.split(",")[0].replace("/", "-")
            model.save_pretrained(path)
            jobs[name] = (str(path), budget, resolution)
        times = {name: [] for name in jobs}
        first = {name: [] for name in jobs}
        for round_index in range(args.rounds):
            for name, (path, budget, resolution) in jobs.items():
                output = Path(folder) / "features"
                shutil.rmtree(output, ignore_errors=True)
                loop_seconds.clear()
                extract.main([path, "--data", str(PHOTOS), *budget, "--resolution", str(resolution),
                              "--batch-size", "1", "--shard-size", "1", "--output", str(output)])
                first[name].append(loop_seconds[0])
                times[name].append(sum(loop_seconds[1:]))
                print(f"round {round_index + 1}: {name} at {resolution} px: "
                      f"{(num_images - 1) / times[name][-1]:.3f} images/s (first image {loop_seconds[0]:.2f} s)",
                      flush=True)
        for name, (_, _, resolution) in jobs.items():
            seconds = statistics.median(times[name])
            rows[name] = {"resolution": resolution, "images_timed": num_images - 1, "seconds": seconds,
                          "images_per_second": (num_images - 1) / seconds,
                          "first_image_seconds": statistics.median(first[name]),
                          "images_per_second_per_round": [(num_images - 1) / t for t in times[name]]}
    for name, row in rows.items():
        for reference in ("DINOv3-B/16", "DINOv2-B/14"):
            row[f"speedup_vs_{reference}"] = row["images_per_second"] / rows[reference]["images_per_second"]

    print(f"\n{'model':<30} {'px':>5} {'images/s':>9} {'first (s)':>10} {'vs DINOv3-B':>12} {'vs DINOv2-B':>12}")
    for name, row in rows.items():
        print(f"{name:<30} {row['resolution']:>5} {row['images_per_second']:>9.3f} {row['first_image_seconds']:>10.2f} "
              f"{row['speedup_vs_DINOv3-B/16']:>11.2f}x {row['speedup_vs_DINOv2-B/14']:>11.2f}x")
    environment = {"threads": torch.get_num_threads(), "torch": torch.__version__, "rounds": args.rounds,
                   "note": "random-init models, fp32, batch 1, CPU; the machine may have been shared with other jobs"}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"environment": environment, "rows": rows}, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
