"""The demo (`examples/elastic_inference.py`) runs end to end on the shipped photos with a tiny VECA."""

import importlib.util
import json
import math
from pathlib import Path

from corevision_hf import VecaConfig, veca_flops


DEMO = Path(__file__).resolve().parent.parent / "examples" / "elastic_inference.py"


def load_demo():
    spec = importlib.util.spec_from_file_location("elastic_inference", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_tiny_writes_rows(tmp_path, capsys):
    demo = load_demo()
    out = tmp_path / "rows.json"
    rows = demo.main(["--tiny", "--resolutions", "64", "--budgets", "16", "8", "--repeats", "1", "--json", str(out)])

    printed = capsys.readouterr().out
    assert "RANDOMLY INITIALISED" in printed
    summary = json.loads(out.read_text())
    assert summary["random_init"] is True
    assert summary["num_photos"] >= 5  # the photos shipped in assets/photos
    assert summary["rows"] == rows
    assert [(r["resolution"], r["patches"], r["budget"]) for r in rows] == [(64, 16, 16), (64, 16, 8)]

    config = VecaConfig(**demo.TINY_CONFIG)  # the example's own --tiny model, not conftest's
    for row in rows:
        assert math.isclose(row["gflops"], veca_flops(config, 64, 64, row["budget"]) / 1e9)
        assert math.isclose(row["flop_ratio_vs_dense"], row["gflops"] / row["dense_vit_gflops"])
        assert row["latency_ms"] > 0
        assert -1.0 <= row["pooler_cosine"] <= 1.0 + 1e-6
        assert -1.0 <= row["patch_cosine"] <= 1.0 + 1e-6
    full, half = rows
    # The full bank is the reference, so it agrees with itself; fewer cores cost fewer FLOPs.
    assert math.isclose(full["pooler_cosine"], 1.0, abs_tol=1e-5)
    assert math.isclose(full["patch_cosine"], 1.0, abs_tol=1e-5)
    assert half["gflops"] < full["gflops"]


def test_every_quiet_install_of_make_demo_says_first_what_it_installs():
    """`make demo` on a fresh machine spends minutes in `pip install --quiet`: each rule that runs one prints a line
    saying what it installs before it starts."""
    rules = {}
    for line in (DEMO.parents[1] / "Makefile").read_text().splitlines():
        if line and not line.startswith(("\t", "#", " ")) and ":" in line:
            target = line.split(":")[0]
            rules[target] = []
        elif line.startswith("\t") and rules:
            rules[target].append(line.strip())
    quiet = {target: recipe for target, recipe in rules.items() if any("install --quiet" in line for line in recipe)}
    assert quiet  # the setup rules
    for target, recipe in quiet.items():
        first_install = next(i for i, line in enumerate(recipe) if "install --quiet" in line)
        assert any(line.startswith('@echo "setup: installing') for line in recipe[:first_install]), target
