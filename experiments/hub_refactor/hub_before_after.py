"""The hub files' speed before and after a change, in one run.

VECA-B against DINOv3-B at 1024 px and LookWhere-B against DINOv2-B at 1036 px (batch 1, fp32, sdpa). Each of our
models is built twice: from the hub files of a git revision (`--before`) and from the working tree. The "before"
model is saved and loaded by today's code, so both share every weight, and the check that their outputs agree comes
with the timings. The runs alternate on one input (corevision_hf.measure.alternate), so load drifts hit every model
alike.

    python -m experiments.hub_refactor.hub_before_after     # from the repository root: about 5 min on 2 idle cores
    python -m experiments.hub_refactor.hub_before_after --before HEAD~3 --runs 3

Writes OUT.json (default outputs/hub_refactor/hub_before_after.json): median latency per model and the ratios
dense / ours for each version.
"""

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import DINOv3ViTConfig, DINOv3ViTModel, Dinov2WithRegistersConfig, Dinov2WithRegistersModel

from corevision_hf import LookWhereModel, VecaModel
from corevision_hf.atomic import write_text_atomically
from corevision_hf.cli import HelpFormatter
from corevision_hf.measure import alternated_latency, threads_to_use

ROOT = Path(__file__).resolve().parents[2]
# The last commit before issue #45's restructure of the hub files (fused qkv, no encoder submodule).
BEFORE = "12145b7"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--before", default=BEFORE, help="git revision whose hub files are 'before'")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per model (alternated)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--veca-size", type=int, default=1024, help="VECA-B and DINOv3-B input side in px")
    parser.add_argument("--lookwhere-size", type=int, default=1036, help="LookWhere-B and DINOv2-B input side in px")
    parser.add_argument("--num-cores", type=int, default=64, help="VECA's budget")
    parser.add_argument("--k-ratio", type=float, default=0.1, help="LookWhere's budget")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: OMP_NUM_THREADS if set, else every core)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "hub_refactor" / "hub_before_after.json")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be at least 1 and --warmup at least 0.")
    return args


def hub_package(revision: str, folder: str, into: Path):
    """The hub files of src/corevision_hf/FOLDER at `revision`, imported as a package of their own, `before_FOLDER`
    (they import each other with single dots only, as on the hub)."""
    package = into / f"before_{folder}"
    package.mkdir()
    listing = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", revision,
                              f"src/corevision_hf/{folder}/"], check=True, capture_output=True, text=True).stdout
    for path in listing.split():
        if path.endswith(".py") and not path.endswith("__init__.py"):
            source = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{path}"], check=True,
                                    capture_output=True, text=True).stdout
            (package / Path(path).name).write_text(source)
    (package / "__init__.py").write_text("")
    # registered under its name, as transformers registers a hub repo's code, so that its single-dot imports resolve
    spec = importlib.util.spec_from_file_location(package.name, package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    sys.modules[package.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[package.name])
    return importlib.import_module(f"{package.name}.modeling_{folder}"), \
        importlib.import_module(f"{package.name}.configuration_{folder}")


def before_and_after(old_modeling, old_configuration, model_name: str, config_name: str, preset: str,
                     new_class, scratch: Path):
    """(before, after): the revision's model with seed-0 weights, and today's model loaded from its save."""
    torch.manual_seed(0)
    config = getattr(old_configuration, config_name).from_preset(preset, attn_implementation="sdpa")
    before = getattr(old_modeling, model_name)(config).eval()
    before.save_pretrained(scratch / model_name)
    after = new_class.from_pretrained(str(scratch / model_name), attn_implementation="sdpa").float().eval()
    return before, after


def dense_dinov3() -> torch.nn.Module:
    torch.manual_seed(0)
    return DINOv3ViTModel(DINOv3ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                          intermediate_size=3072, patch_size=16, num_register_tokens=4,
                                          attn_implementation="sdpa")).eval()


def dense_dinov2() -> torch.nn.Module:
    torch.manual_seed(0)
    return Dinov2WithRegistersModel(Dinov2WithRegistersConfig(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_ratio=4, patch_size=14, image_size=518,
        num_register_tokens=4, attn_implementation="sdpa")).eval()


def compare(name: str, dense, before, after, pixel_values, budget: dict, args) -> dict:
    """The three models' alternated latencies and the before/after output difference."""
    with torch.inference_mode():
        difference = (before(pixel_values, **budget).last_hidden_state
                      - after(pixel_values, **budget).last_hidden_state).abs().max().item()
        fns = {"dense": lambda: dense(pixel_values), "before": lambda: before(pixel_values, **budget),
               "after": lambda: after(pixel_values, **budget)}
        latency = alternated_latency(fns, "cpu", args.runs, args.warmup)
    ms = {key: value["latency_ms"] for key, value in latency.items()}
    row = {"model": name, "size": pixel_values.shape[-1], "budget": budget, "latency": latency,
           "max_abs_output_difference": difference, "dense_over_before": ms["dense"] / ms["before"],
           "dense_over_after": ms["dense"] / ms["after"], "after_over_before": ms["after"] / ms["before"]}
    print(f"  {name} at {row['size']} px {budget}: dense {ms['dense']:.0f} ms, before {ms['before']:.0f} ms "
          f"(x {row['dense_over_before']:.2f}), after {ms['after']:.0f} ms (x {row['dense_over_after']:.2f}); "
          f"after / before {row['after_over_before']:.3f}; outputs differ by at most {difference:.2e}", flush=True)
    return row


def main(argv=None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(threads_to_use(args.threads))
    revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before], capture_output=True,
                              text=True)
    if revision.returncode:
        raise SystemExit(f"error: --before {args.before} is not a git revision of {ROOT}: give a commit, tag or "
                         "branch of this repository.")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        old_veca = hub_package(args.before, "veca", scratch)
        old_lookwhere = hub_package(args.before, "lookwhere", scratch)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; before = {revision.stdout.strip()}, "
              "after = the working tree", flush=True)
        before, after = before_and_after(*old_veca, "VecaModel", "VecaConfig", "base", VecaModel, scratch)
        pixels = torch.randn(1, 3, args.veca_size, args.veca_size, generator=torch.Generator().manual_seed(0))
        rows.append(compare("VECA-B vs DINOv3-B", dense_dinov3(), before, after, pixels,
                            {"num_cores": args.num_cores}, args))
        del before, after
        before, after = before_and_after(*old_lookwhere, "LookWhereModel", "LookWhereConfig", "base",
                                         LookWhereModel, scratch)
        pixels = torch.randn(1, 3, args.lookwhere_size, args.lookwhere_size,
                             generator=torch.Generator().manual_seed(0))
        rows.append(compare("LookWhere-B vs DINOv2-B", dense_dinov2(), before, after, pixels,
                            {"k_ratio": args.k_ratio}, args))
    report = {"before": revision.stdout.strip(), "after": "working tree", "threads": torch.get_num_threads(),
              "torch": torch.__version__, "runs": args.runs, "rows": rows,
              "load_average_at_end": os.getloadavg(), "total_time_s": time.perf_counter() - started}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(args.out, json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out} ({report['total_time_s'] / 60:.1f} min)")
    return report


if __name__ == "__main__":
    main()
