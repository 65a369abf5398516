"""The two CPU paths of each model in one process: the default (what the hub files run) and the opt-in
`optimize_for_cpu` (prepacked oneDNN linear layers, VECA's MLP over 1024-token chunks, LookWhere's position table
resized by matrix products). VECA-B at 16 cores on 1024 px and LookWhere-B at k_ratio 0.1 on 1036 px, random-init
(speed does not depend on the weights), batch 1, float32, every thread; the median of --runs calls after one warm-up.

    python benchmarks/cpu_paths.py                        # about 3 minutes on 2 idle cores (2-3x busy)
    PYTHONPATH=OTHER_TREE/src python benchmarks/cpu_paths.py   # another checkout's code: run both, alternating

Prints one JSON line: the package file it measured and the seconds per forward of each model and path.
"""

import argparse
import json
import statistics
import time

import torch

import corevision_hf
from corevision_hf import LookWhereConfig, LookWhereModel, VecaConfig, VecaModel, optimize_for_cpu
from corevision_hf.cli import HelpFormatter

MODELS = (
    ("veca-b", lambda: VecaModel(VecaConfig.from_preset("base")), 1024, {"num_cores": 16}),
    ("lookwhere-b", lambda: LookWhereModel(LookWhereConfig.from_preset("base")), 1036, {"k_ratio": 0.1}),
)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="timed calls per model and path")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}.")
    torch.manual_seed(0)
    result = {"package": corevision_hf.__file__, "threads": torch.get_num_threads()}
    for name, build, size, budget in MODELS:
        model = build().eval()
        pixel_values = torch.randn(1, 3, size, size)
        for path in ("default", "opt-in"):
            if path == "opt-in":
                optimize_for_cpu(model)
            with torch.inference_mode():
                model(pixel_values, **budget)  # warm-up
                times = []
                for _ in range(args.runs):
                    start = time.perf_counter()
                    model(pixel_values, **budget)
                    times.append(time.perf_counter() - start)
            result[f"{name} {path} s"] = round(statistics.median(times), 3)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
