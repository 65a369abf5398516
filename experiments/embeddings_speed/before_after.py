"""Speed of the hub models before and after issue #66's embeddings (the embeddings own their weights; the rotary
embedding places the patches; the key masks are built in the models' forwards), in one process: the modeling files of
commit BEFORE are imported as a package of their own beside today's, both models get the same weights (today's names
renamed back by LEGACY_KEYS), and their forwards are timed in alternated rounds on the same inputs, so that the
machine's drift falls on both sides alike.

    python -m experiments.embeddings_speed.before_after [--before b1792a2] [--rounds 5] [--runs 5]

Prints, per model and size, each round's after / before latency ratio and their median; writes
experiments/embeddings_speed/results/before_after.json."""

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from corevision_hf import LookWhereConfig, LookWhereModel, VecaConfig, VecaModel

ROOT = Path(__file__).resolve().parents[2]
FILES = {"veca": ("configuration_veca", "modeling_veca", "budget_veca", "pipeline_veca"),
         "lookwhere": ("configuration_lookwhere", "modeling_lookwhere", "budget_lookwhere", "pipeline_lookwhere")}


def old_package(commit: str, family: str, folder: Path):
    """The modeling module of `family` at `commit`, imported as the package `before_<family>`."""
    package = folder / f"before_{family}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in FILES[family]:
        source = subprocess.run(["git", "show", f"{commit}:src/corevision_hf/{family}/{name}.py"], cwd=ROOT,
                                capture_output=True, text=True)
        if source.returncode == 0:
            (package / f"{name}.py").write_text(source.stdout)
    sys.path.insert(0, str(folder))
    return importlib.import_module(f"before_{family}.modeling_{family}")


def old_name(key: str) -> str:
    """Today's parameter name -> the name before #66 (the inverse of LEGACY_KEYS' #66 lines)."""
    if key == "embeddings.position_embeddings":
        return "position_embeddings.weight"
    for owner in ("selector.", "extractor.", ""):
        if key.startswith(owner + "embeddings."):
            return owner + key[len(owner + "embeddings."):]
    return key


def pair(family: str, module, attn: str, control: bool = False):
    """(before, after) models of the base preset with the same weights, in eval mode; with `control`, "after" is a
    second model of the before code (an A/A run: the harness's own spread)."""
    torch.manual_seed(0)
    if family == "veca":
        after = VecaModel(VecaConfig.from_preset("base", attn_implementation=attn)).eval()
        before = module.VecaModel(module.VecaConfig.from_preset("base", attn_implementation=attn)).eval()
    else:
        after = LookWhereModel(LookWhereConfig.from_preset("base", attn_implementation=attn)).eval()
        before = module.LookWhereModel(module.LookWhereConfig.from_preset("base", attn_implementation=attn)).eval()
    before.load_state_dict({old_name(key): value for key, value in after.state_dict().items()})
    if control:
        after = type(before)(before.config).eval()
        after.load_state_dict(before.state_dict())
    return before, after


def timed(forward) -> float:
    start = time.perf_counter()
    forward()
    return time.perf_counter() - start


@torch.inference_mode()
def rounds(before, after, pixel_values, kwargs: dict, num_rounds: int, runs: int) -> dict:
    """Per round, the median of `runs` forwards of each model (after a warm-up), the order alternated per round."""
    torch.testing.assert_close(after(pixel_values, **kwargs).last_hidden_state,
                               before(pixel_values, **kwargs).last_hidden_state, atol=0, rtol=0)
    medians = {"before": [], "after": []}
    for index in range(num_rounds):
        order = [("before", before), ("after", after)][:: 1 if index % 2 == 0 else -1]
        for name, model in order:
            model(pixel_values, **kwargs)  # warm-up
            medians[name].append(statistics.median(timed(lambda: model(pixel_values, **kwargs)) for _ in range(runs)))
    ratios = [a / b for a, b in zip(medians["after"], medians["before"])]
    return {"before_ms": [1e3 * t for t in medians["before"]], "after_ms": [1e3 * t for t in medians["after"]],
            "ratio_after_over_before": ratios, "median_ratio": statistics.median(ratios)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="b1792a2", help="the commit before the change")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--control", action="store_true", help="an A/A run: the before code on both sides")
    parser.add_argument("--families", nargs="+", default=list(FILES), choices=list(FILES))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cases = [("veca", 512, {"num_cores": 64}), ("veca", 1024, {"num_cores": 16}),
             ("lookwhere", 518, {"k_ratio": 0.1}), ("lookwhere", 1036, {"k_ratio": 0.1})]
    results = []
    with tempfile.TemporaryDirectory() as folder:
        modules = {family: old_package(args.before, family, Path(folder)) for family in FILES}
        for family, size, kwargs in (case for case in cases if case[0] in args.families):
            before, after = pair(family, modules[family], "sdpa", args.control)
            pixel_values = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
            row = {"model": f"{family}-base", "size": size, **kwargs,
                   **rounds(before, after, pixel_values, kwargs, args.rounds, args.runs)}
            print(f"{row['model']:15s} {size:5d} {kwargs}  after/before per round: "
                  + " ".join(f"{r:.3f}" for r in row["ratio_after_over_before"]) + f"  median {row['median_ratio']:.3f}"
                  + f"  (before {statistics.median(row['before_ms']):.0f} ms)", flush=True)
            results.append(row)
    out = Path(__file__).parent / "results" / ("control.json" if args.control else "before_after.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"control": args.control, "before": args.before, "after": subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
        "threads": args.threads, "rounds": args.rounds, "runs": args.runs, "rows": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
