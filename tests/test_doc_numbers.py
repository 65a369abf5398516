"""Every measured number the docs quote is its committed JSON's, rounded as the docs show it (issue #60).

Each check in CHECKS is (doc file, text, values): `text` is the doc's wording with one `{}` per number, and each value
names a committed JSON, the key path to the number in it, and the digits the doc shows (`V(json, *path, digits=)`). The test reads the JSON, rounds half
away from zero (on the JSON's own decimal text) and asserts the doc holds the text with those numbers, whitespace and
line breaks aside. A rerun that changes a JSON fails here until the doc quotes the new numbers.

A key path is a sequence of dict keys and list indices; a dict in it picks, from a list, the one item whose fields
match it (`{"model": "DINOv3-B", "resolution": 1024}`). Numbers that are not stored but follow from stored ones (a
ratio of two latencies) are `Derived`, computed from the JSON's values. On the task pages (README's task paragraph,
docs/tasks.md, docs/elastic-from-pretrained.md) every measured number is a check's value or is named in ELSEWHERE with
where it comes from (`test_every_measured_number_of_the_task_pages_is_checked`); tests/test_tasks_doc.py checks that
docs/tasks.md's opening table is the benchmark's own rendering and each goal's verdict.
"""

import json
import re
import sys
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from functools import cache
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results/"
FINETUNE = "experiments/finetune_rotation/results/"


@cache
def load(json_file: str):
    # floats as Decimal: the JSON's own decimal text is what gets rounded, not its nearest binary float
    return json.loads((ROOT / json_file).read_text(), parse_float=Decimal)


@cache
def page(doc: str) -> str:
    return re.sub(r"\s+", " ", (ROOT / doc).read_text())


def lookup(json_file: str, path: tuple):
    node = load(json_file)
    for key in path:
        if isinstance(key, dict):
            matches = [item for item in node if all(item.get(field) == want for field, want in key.items())]
            assert len(matches) == 1, f"{json_file}: {key} matches {len(matches)} items"
            node = matches[0]
        else:
            node = node[key]
    return node


def rounded(value, digits: int, sign: bool = False, percent: bool = False) -> str:
    """`value` rounded half away from zero to `digits` decimals (negative: tens, hundreds), as the docs write it."""
    value = Decimal(value) * (100 if percent else 1)
    text = str(value.quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))
    if digits < 0:
        text = str(int(Decimal(text)))
    return f"+{text}" if sign and not text.startswith("-") else text


@dataclass(frozen=True)
class Value:
    json_file: str
    path: tuple
    digits: int
    sign: bool = False
    percent: bool = False

    def text(self) -> str:
        return rounded(lookup(self.json_file, self.path), self.digits, self.sign, self.percent)

    def __str__(self):
        return f"{self.json_file}:{'/'.join(map(str, self.path))}"


@dataclass(frozen=True)
class Derived:
    what: str
    compute: Callable[[], Decimal]
    digits: int
    sign: bool = False
    percent: bool = False

    def text(self) -> str:
        value = self.compute()
        if isinstance(value, str):   # a verdict the JSON stores as text
            return value
        return rounded(value, self.digits, self.sign, self.percent)

    def __str__(self):
        return self.what


def V(json_file, *path, digits=3, sign=False, percent=False):
    return Value(json_file, path, digits, sign, percent)


def interval(json_file, *path, digits=3, sign=False):
    """mean [low, high] of a statistic."""
    return [V(json_file, *path, key, digits=digits, sign=sign) for key in ("mean", "low", "high")]


def plus_minus(json_file, *path, digits=3):
    """+mean ± half_width of a difference."""
    return [V(json_file, *path, "mean", digits=digits, sign=True), V(json_file, *path, "half_width", digits=digits)]


def ratio(json_file, numerator: tuple, denominator: tuple, digits: int):
    return Derived(f"{json_file}: {numerator} / {denominator}",
                   lambda: lookup(json_file, numerator) / lookup(json_file, denominator), digits)


# ---------------------------------------------------------------------------------------------------- speed
VECA = RESULTS + "veca_cpu.json"
LW = RESULTS + "lookwhere_cpu.json"
MEM = RESULTS + "memory_cpu.json"


def veca_row(model, resolution, key="latency_s", digits=3, **kw):
    return V(VECA, "rows", {"model": model, "resolution": resolution}, key, digits=digits, **kw)


def lw_row(model, resolution, key="latency_s", digits=3, **kw):
    return V(LW, "rows", {"model": model, "resolution": resolution}, key, digits=digits, **kw)


def lw_latency(model, resolution):
    return ("rows", {"model": model, "resolution": resolution}, "latency_s")


def veca_latency(model, resolution):
    return ("rows", {"model": model, "resolution": resolution}, "latency_s")


DINOV2, DINOV2_OPT = "DINOv2-B/14 full image", "DINOv2-B/14, optimize_for_cpu (reference)"
LWB, LWB_OPT = "LookWhere-B k_ratio=0.1", "LookWhere-B k_ratio=0.1, optimize_for_cpu"
VECA64, VECA64_OPT, VECA16_OPT = "VECA-B C=64", "VECA-B C=64, optimize_for_cpu", "VECA-B C=16, optimize_for_cpu"


def mem(model, path, key, digits=0, **kw):
    return V(MEM, "rows", {"model": model, "path": path}, key, digits=digits, **kw)


def mem_kept_by_opt_in(model, digits=-1):
    def compute():
        return (lookup(MEM, ("rows", {"model": model, "path": "optimize_for_cpu"}, "after_forward_mib"))
                - lookup(MEM, ("rows", {"model": model, "path": "default"}, "after_forward_mib")))

    return Derived(f"{MEM}: {model} after_forward_mib, opt-in minus default", compute, digits)


def gflops_needed_over(target_ratio, teacher_row, student_row, reference, json_file, resolution):
    """How much faster per second the student must compute for `target_ratio` against the teacher: its FLOPs over the
    teacher's time / target, over `reference` (a row's achieved GFLOP/s, or the matmul rate)."""

    def compute():
        teacher = lookup(json_file, ("rows", {"model": teacher_row, "resolution": resolution}, "latency_s"))
        gflops = lookup(json_file, ("rows", {"model": student_row, "resolution": resolution}, "gflops"))
        return gflops / (teacher / target_ratio) / reference()

    return compute


SPEED_TABLE_README = [
    ("README.md", "| VECA-B/16 at 64 cores vs DINOv3-B/16 | default | 1024 px | {} s | {} s | {}x |",
     [veca_row("DINOv3-B", 1024, digits=2), veca_row(VECA64, 1024, digits=2),
      veca_row(VECA64, 1024, "dinov3_over_this", 2)]),
    ("README.md", "| | default | 2048 px | {} s | {} s | {}x |",
     [veca_row("DINOv3-B", 2048, digits=1), veca_row(VECA64, 2048, digits=1),
      veca_row(VECA64, 2048, "dinov3_over_this", 2)]),
    ("README.md", "| LookWhere-B/14 at k_ratio 0.1 vs DINOv2-B/14 | default | 518 px | {} s | {} s | {}x |",
     [lw_row(DINOV2, 518, digits=2), lw_row(LWB, 518), lw_row(LWB, 518, "speedup_vs_dinov2", 1)]),
    ("README.md", "| | default | 1036 px | {} s | {} s | {}x |",
     [lw_row(DINOV2, 1036, digits=1), lw_row(LWB, 1036), lw_row(LWB, 1036, "speedup_vs_dinov2", 1)]),
    ("README.md", "| | opt-in | 518 px | {} s | {} s | {}x |",
     [lw_row(DINOV2_OPT, 518, digits=2), lw_row(LWB_OPT, 518),
      ratio(LW, lw_latency(DINOV2_OPT, 518), lw_latency(LWB_OPT, 518), 1)]),
    ("README.md", "| | opt-in | 1036 px | {} s | {} s | {}x |",
     [lw_row(DINOV2_OPT, 1036, digits=1), lw_row(LWB_OPT, 1036),
      ratio(LW, lw_latency(DINOV2_OPT, 1036), lw_latency(LWB_OPT, 1036), 1)]),
    ("README.md", "(log-log slope {} between 1024 and 2048 px, against DINOv3's {})",
     [V(VECA, "slopes", VECA64, digits=2), V(VECA, "slopes", "DINOv3-B", digits=2)]),
]

SPEED_PAGE = [
    ("docs/speed.md", "| 1024 px | 4096 | {} s | {} s | {}x |",
     [veca_row("DINOv3-B", 1024), veca_row(VECA64, 1024), veca_row(VECA64, 1024, "dinov3_over_this", 2)]),
    ("docs/speed.md", "| 2048 px | 16384 | {} s | {} s | {}x |",
     [veca_row("DINOv3-B", 2048), veca_row(VECA64, 2048), veca_row(VECA64, 2048, "dinov3_over_this", 2)]),
    ("docs/speed.md", "| 1024 px | {} s | {} s | {}x / {}x |",
     [veca_row(VECA64_OPT, 1024), veca_row(VECA16_OPT, 1024), veca_row(VECA64_OPT, 1024, "dinov3_over_this", 2),
      veca_row(VECA16_OPT, 1024, "dinov3_over_this", 2)]),
    ("docs/speed.md", "| 2048 px | {} s | {} s | {}x / {}x |",
     [veca_row(VECA64_OPT, 2048), veca_row(VECA16_OPT, 2048), veca_row(VECA64_OPT, 2048, "dinov3_over_this", 2),
      veca_row(VECA16_OPT, 2048, "dinov3_over_this", 2)]),
    ("docs/speed.md", "log-log slope {} (default) and {} (opt-in) between 1024 and 2048 px, against {} for DINOv3",
     [V(VECA, "slopes", VECA64, digits=2), V(VECA, "slopes", VECA64_OPT, digits=2),
      V(VECA, "slopes", "DINOv3-B", digits=2)]),
    ("docs/speed.md", "the analytic FLOP ratios are {}x at 1024 px ({} against {} GFLOP) and {}x at 2048 px",
     [ratio(VECA, ("rows", {"model": "DINOv3-B", "resolution": 1024}, "gflops"),
            ("rows", {"model": VECA64, "resolution": 1024}, "gflops"), 2),
      veca_row(VECA64, 1024, "gflops", 0), veca_row("DINOv3-B", 1024, "gflops", 0),
      ratio(VECA, ("rows", {"model": "DINOv3-B", "resolution": 2048}, "gflops"),
            ("rows", {"model": VECA64, "resolution": 2048}, "gflops"), 2)]),
    ("docs/speed.md", "the default VECA-B runs at {}% / {}% of a 4096³ `torch.mm` in the same run ({} GFLOP/s), "
                      "DINOv3-B at {}% / {}%, the opt-in VECA-B at {} / {} GFLOP/s, {}% / {}%",
     [veca_row(VECA64, 1024, "fraction_of_matmul_peak", 0, percent=True),
      veca_row(VECA64, 2048, "fraction_of_matmul_peak", 0, percent=True),
      V(VECA, "matmul_gflops_per_s", digits=0),
      veca_row("DINOv3-B", 1024, "fraction_of_matmul_peak", 0, percent=True),
      veca_row("DINOv3-B", 2048, "fraction_of_matmul_peak", 0, percent=True),
      veca_row(VECA64_OPT, 1024, "achieved_gflops_per_s", 0), veca_row(VECA64_OPT, 2048, "achieved_gflops_per_s", 0),
      veca_row(VECA64_OPT, 1024, "fraction_of_matmul_peak", 0, percent=True),
      veca_row(VECA64_OPT, 2048, "fraction_of_matmul_peak", 0, percent=True)]),
    ("docs/speed.md", "So 2.5x at 1024 px would need VECA to compute {}% more per second than DINOv3 does, about {}% "
                      "of the matmul rate",
     [Derived("veca_cpu.json: VECA-B C=64 GFLOP / (DINOv3-B's latency / 2.5) over DINOv3-B's GFLOP/s, minus 1",
              lambda: gflops_needed_over(Decimal("2.5"), "DINOv3-B", VECA64,
                                         lambda: lookup(VECA, ("rows", {"model": "DINOv3-B", "resolution": 1024},
                                                               "achieved_gflops_per_s")), VECA, 1024)() - 1,
              0, percent=True),
      Derived("veca_cpu.json: the same over the matmul rate",
              lambda: gflops_needed_over(Decimal("2.5"), "DINOv3-B", VECA64,
                                         lambda: lookup(VECA, ("matmul_gflops_per_s",)), VECA, 1024)(),
              -1, percent=True)]),
    ("docs/speed.md", "(C=16 is {}% faster than C=64)",
     [Derived("veca_cpu.json: 1 - opt-in C=16 / C=64 latency at 1024 px",
              lambda: 1 - lookup(VECA, veca_latency(VECA16_OPT, 1024)) / lookup(VECA, veca_latency(VECA64_OPT, 1024)),
              0, percent=True)]),
    ("docs/speed.md", "| 518 px | 1369 ({}) | default | {} s | {} s | {}x |",
     [lw_row(LWB, 518, "k", 0), lw_row(DINOV2, 518), lw_row(LWB, 518), lw_row(LWB, 518, "speedup_vs_dinov2", 1)]),
    ("docs/speed.md", "| 518 px | 1369 ({}) | opt-in | {} s | {} s | {}x |",
     [lw_row(LWB_OPT, 518, "k", 0), lw_row(DINOV2_OPT, 518), lw_row(LWB_OPT, 518),
      ratio(LW, lw_latency(DINOV2_OPT, 518), lw_latency(LWB_OPT, 518), 1)]),
    ("docs/speed.md", "| 1036 px | 5476 ({}) | default | {} s | {} s | {}x |",
     [lw_row(LWB, 1036, "k", 0), lw_row(DINOV2, 1036), lw_row(LWB, 1036),
      lw_row(LWB, 1036, "speedup_vs_dinov2", 1)]),
    ("docs/speed.md", "| 1036 px | 5476 ({}) | opt-in | {} s | {} s | {}x |",
     [lw_row(LWB_OPT, 1036, "k", 0), lw_row(DINOV2_OPT, 1036), lw_row(LWB_OPT, 1036),
      ratio(LW, lw_latency(DINOV2_OPT, 1036), lw_latency(LWB_OPT, 1036), 1)]),
    ("docs/speed.md", "(`fill_dense=False`): {} s at 518 px, {} s at 1036 px",
     [lw_row(LWB_OPT + ", no fill", 518), lw_row(LWB_OPT + ", no fill", 1036)]),
    ("docs/speed.md", "the opt-in LookWhere-B is {}x / {}x",
     [lw_row(LWB_OPT, 518, "speedup_vs_dinov2", 1), lw_row(LWB_OPT, 1036, "speedup_vs_dinov2", 1)]),
    ("docs/speed.md", "The analytic FLOP ratio at 518 px is {}x ({} against {} GFLOP;",
     [ratio(LW, ("rows", {"model": DINOV2, "resolution": 518}, "gflops"),
            ("rows", {"model": LWB, "resolution": 518}, "gflops"), 1),
      lw_row(DINOV2, 518, "gflops", 0), lw_row(LWB, 518, "gflops", 0)]),
    ("docs/speed.md", "at 1036 px {}x ({} against {})",
     [ratio(LW, ("rows", {"model": DINOV2, "resolution": 1036}, "gflops"),
            ("rows", {"model": LWB, "resolution": 1036}, "gflops"), 1),
      lw_row(DINOV2, 1036, "gflops", 0), lw_row(LWB, 1036, "gflops", 0)]),
    ("docs/speed.md", "({} GFLOP/s at 518 px, with 141 tokens against 1379; the stock DINOv2-B: {})",
     [ratio(LW, ("rows", {"model": LWB_OPT, "resolution": 518}, "gflops"), lw_latency(LWB_OPT, 518), 0),
      ratio(LW, ("rows", {"model": DINOV2, "resolution": 518}, "gflops"), lw_latency(DINOV2, 518), 0)]),
    ("docs/speed.md", "so 12x at 518 px would need it to compute {}% more per second than the stock DINOv2-B does",
     [Derived("lookwhere_cpu.json: opt-in LookWhere-B GFLOP / (DINOv2-B's latency / 12) over DINOv2-B's GFLOP/s - 1",
              lambda: gflops_needed_over(12, DINOV2, LWB_OPT,
                                         lambda: lookup(LW, ("rows", {"model": DINOV2, "resolution": 518}, "gflops"))
                                         / lookup(LW, lw_latency(DINOV2, 518)), LW, 518)() - 1, 0, percent=True)]),
    ("docs/speed.md", "({} s -> {} s)", [lw_row(LWB, 518), lw_row(LWB_OPT, 518)]),
    ("docs/speed.md", "resident memory after importing torch, transformers and corevision_hf ({} MiB)",
     [mem("VECA-B", "default", "baseline_mib")]),
    *[("docs/speed.md", f"| {label}, default | {{}} MiB | {{}} MiB (+{{}}, {{}}x{tail}) | {{}} MiB | {{}} MiB |",
       [mem(model, "default", "parameters_mib"), mem(model, "default", "after_load_mib"),
        mem(model, "default", "load_over_baseline_mib"),
        mem(model, "default", "load_over_baseline_per_parameter_byte", 2),
        mem(model, "default", "peak_mib"), mem(model, "default", "after_forward_mib")])
      for label, model, tail in [("VECA-B (C=16)", "VECA-B", " the parameters"), ("DINOv3-B", "DINOv3-B", ""),
                                 ("LookWhere-B (k_ratio 0.1)", "LookWhere-B", ""), ("DINOv2-B", "DINOv2-B", "")]],
    *[("docs/speed.md", f"| {label}, opt-in | {{}} MiB | {{}} MiB (+{{}}) | {{}} MiB | {{}} MiB |",
       [mem(model, "optimize_for_cpu", "parameters_mib"), mem(model, "optimize_for_cpu", "after_load_mib"),
        mem(model, "optimize_for_cpu", "load_over_baseline_mib"),
        mem(model, "optimize_for_cpu", "peak_mib"), mem(model, "optimize_for_cpu", "after_forward_mib")])
      for label, model in [("VECA-B (C=16)", "VECA-B"), ("DINOv3-B", "DINOv3-B"),
                           ("LookWhere-B (k_ratio 0.1)", "LookWhere-B"), ("DINOv2-B", "DINOv2-B")]],
    ("docs/speed.md", "after the forward, about {} MiB more than the default for VECA-B, {} MiB for LookWhere-B (its "
                      "selector and extractor), {} MiB for DINOv3-B and {} MiB for DINOv2-B",
     [mem_kept_by_opt_in("VECA-B"), mem_kept_by_opt_in("LookWhere-B"), mem_kept_by_opt_in("DINOv3-B"),
      mem_kept_by_opt_in("DINOv2-B")]),
]
SPEED_PAGE = [check for check in SPEED_PAGE if check[2]]   # (a bare text with no number is no check)

# -------------------------------------------------------------------------------------------------- quality
Q = RESULTS + "distill_quality.json"
TRAINING = "training"


def learning(entry, digits=3):
    return plus_minus(Q, "learning", entry, digits=digits)


def student(resolution, name, setting):
    return ("results", str(resolution), "students", {"student": name, "setting": setting})


def cells(json_file, base: tuple, metrics=("cls", "patch", "cls_centred", "patch_centred", "patch_r2")):
    return [value for metric in metrics for value in interval(json_file, *base, metric)]


CELLS5 = "| {} [{}, {}] | {} [{}, {}] | {} [{}, {}] | {} [{}, {}] | {} [{}, {}] |"
CELLS3 = "| {} [{}, {}] | {} [{}, {}] | {} [{}, {}] |"

QUALITY_README = [
    ("README.md", "VECA-S converted from the teacher {} ± {}, over its bar of twice the half-width; LookWhere-S at "
                  "k_ratio 0.1 {} ± {} ({} ± {} at 448 px) and VECA-Ti {} ± {}, short of theirs at the training size",
     [*learning("veca_teacher_centred_patch", 2), *learning("lookwhere_centred_patch_k01", 2),
      *learning("lookwhere_centred_patch_k01@448", 2), *learning("veca_centred_patch", 2)]),
    ("README.md", "the committed run took {} minutes on an idle machine",
     [Derived("distill_quality.json: total_time_s / 60", lambda: lookup(Q, ("total_time_s",)) / 60, 0)]),
    ("README.md", "a constant predictor already scores {} on patches",
     [V(Q, "results", "112", "baselines", "constant", "patch", "mean", digits=2)]),
    ("README.md", "no better than random patches on photos ({} ± {})", learning("lookwhere_selector_minus_random", 2)),
]

LEARNING_ROWS = ["veca_centred_patch", "veca_teacher_centred_patch", "veca_teacher_trained_minus_untrained",
                 "lookwhere_centred_patch_k01", "lookwhere_selector_minus_random",
                 "lookwhere_k1_trained_minus_untrained"]


QUALITY_PAGE = [
    ("docs/quality.md", "Centred patch cosine with the teacher is {} ± {} on 21 held-out photos at the training size, "
                        "where the mean token scores 0: over its bar (more than twice the half-width), and at 224 px "
                        "too ({} ± {}). The conversion moved it {} ± {} above its start",
     [*learning("veca_teacher_centred_patch", 2), *learning("veca_teacher_centred_patch@224", 2),
      *learning("veca_teacher_trained_minus_untrained", 2)]),
    ("docs/quality.md", "it keeps the teacher's retrieval (top-1 {} against {})",
     [V(Q, "teacher_free", "rows", {"model": model, "setting": setting}, "top1", "mean", digits=3)
      for model, setting in [("VECA from teacher", "cores=32"), ("teacher", "all")]]),
    ("docs/quality.md", "**LookWhere-S from the teacher, at k_ratio 0.1.** {} ± {} at the training size, short of its "
                        "bar (its two seeds differ: {} degrees of freedom); {} ± {} at 224 px and {} ± {} at 448 px",
     [*learning("lookwhere_centred_patch_k01", 2), V(Q, "learning", "lookwhere_centred_patch_k01", "df", digits=1),
      *learning("lookwhere_centred_patch_k01@224", 2), *learning("lookwhere_centred_patch_k01@448", 2)]),
    ("docs/quality.md", "Training does not damage it: {} ± {} over its start",
     learning("lookwhere_k1_trained_minus_untrained", 2)),
    ("docs/quality.md", "**VECA-Ti.** {} ± {}: above 0, but short of its bar", learning("veca_centred_patch", 2)),
    ("docs/quality.md", "at any resolution ({} ± {} at the training size)", learning("lookwhere_selector_minus_random",
                                                                                       2)),
    ("docs/quality.md", "VECA elastic's is missed by a small margin ({} against a bar of {})",
     [V(Q, "learning", "veca_centred_patch", "mean", digits=3),
      Derived("distill_quality.json: learning/veca_centred_patch: 2 x half_width",
              lambda: 2 * lookup(Q, ("learning", "veca_centred_patch", "half_width")), 3)]),
    ("docs/quality.md", "LookWhere-S at k_ratio 0.1 has the widest interval: its two seeds differ ({} degrees of "
                        "freedom)", [V(Q, "learning", "lookwhere_centred_patch_k01", "df", digits=1)]),
    ("docs/quality.md", "raw patch cosine {}, below the constant's {}, yet {} [{}, {}] centred",
     [V(Q, "results", "112", "baselines", "init", "VECA from teacher/cores=32", "patch", "mean", digits=2),
      V(Q, "results", "112", "baselines", "constant", "patch", "mean", digits=2),
      *interval(Q, "results", "112", "baselines", "init", "VECA from teacher/cores=32", "patch_centred", digits=2,
                sign=True)]),
    ("docs/quality.md", "(validation picked steps {} and {}), it is at {} ± {}: over its bar at every size",
     [*[V(Q, TRAINING, f"VECA from teacher/seed{seed}", "best_step", digits=0) for seed in (0, 1)],
      *learning("veca_teacher_centred_patch", 2)]),
    ("docs/quality.md", "with VECA-Ti from scratch ({} ± {}), whose interval overlaps its own",
     learning("veca_centred_patch", 2)),
    ("docs/quality.md", "| constant (the mean token) | 0 | {} [{}, {}] | {} [{}, {}] | 0 | 0 | 0 |",
     cells(Q, ("results", "112", "baselines", "constant"), ("cls", "patch"))),
    *[("docs/quality.md", f"| teacher at {size} px | {{}} " + CELLS5,
       [V(Q, "results", "112", "baselines", "teacher_equal_flops", str(size), "gflops", digits=2),
        *cells(Q, ("results", "112", "baselines", "teacher_equal_flops", str(size)))]) for size in (42, 56)],
    *[("docs/quality.md", f"| {label} | {{}} " + CELLS5,
       [V(Q, "results", "112", "baselines", "init", key, "gflops", digits=2),
        *cells(Q, ("results", "112", "baselines", "init", key))])
      for label, key in [("VECA from teacher, untrained (C = 32)", "VECA from teacher/cores=32"),
                         ("VECA, untrained (C = 32)", "VECA/cores=32"),
                         ("LookWhere-S from teacher, untrained, k_ratio 1", "LookWhere-S from teacher/k_ratio=1")]],
    *[("docs/quality.md", f"| {label} | {{}} " + CELLS5,
       [V(Q, *student(112, name, setting), "gflops", digits=2), *cells(Q, student(112, name, setting))])
      for label, name, setting in [
          ("VECA elastic, C = 1", "VECA elastic", "cores=1"), ("VECA elastic, C = 32", "VECA elastic", "cores=32"),
          ("VECA fixed-4, C = 4", "VECA fixed-4", "cores=4"), ("VECA fixed-32, C = 32", "VECA fixed-32", "cores=32"),
          ("VECA from teacher, C = 1", "VECA from teacher", "cores=1"),
          ("VECA from teacher, C = 32", "VECA from teacher", "cores=32"), ("dense ViT", "dense ViT", "all"),
          ("LookWhere-S random init, k_ratio 1", "LookWhere-S random init", "k_ratio=1"),
          ("LookWhere-S from teacher, k_ratio 0.1", "LookWhere-S from teacher", "k_ratio=0.1"),
          ("LookWhere-S from teacher, k_ratio 1", "LookWhere-S from teacher", "k_ratio=1")]],
    ("docs/quality.md", "Untrained at k_ratio 1, it runs the teacher's weights on every patch, yet scores {} raw and "
                        "{} centred",
     [V(Q, "results", "112", "baselines", "init", "LookWhere-S from teacher/k_ratio=1", "patch", "mean", digits=2),
      V(Q, "results", "112", "baselines", "init", "LookWhere-S from teacher/k_ratio=1", "patch_centred", "mean",
        digits=2)]),
    ("docs/quality.md", "Training lifts it to {} centred",
     [V(Q, *student(112, "LookWhere-S from teacher", "k_ratio=1"), "patch_centred", "mean", digits=2)]),
    ("docs/quality.md", "at best {} [{}, {}] for the random-init students (VECA fixed-4 at 4 cores), {} for VECA from "
                        "the teacher and {} for LookWhere-S from the teacher at k_ratio 1",
     [*interval(Q, *student(112, "VECA fixed-4", "cores=4"), "patch_r2", digits=2),
      V(Q, *student(112, "VECA from teacher", "cores=32"), "patch_r2", "mean", digits=2),
      V(Q, *student(112, "LookWhere-S from teacher", "k_ratio=1"), "patch_r2", "mean", digits=2)]),
    ("docs/quality.md", "(VECA fixed-4 at 2 cores: {} [{}, {}])",
     interval(Q, *student(112, "VECA fixed-4", "cores=2"), "cls_centred", digits=2)),
]


def selection(resolution, *path, digits=3, sign=False):
    return V(Q, "selection", SELECTION(resolution), *path, digits=digits, sign=sign)


def SELECTION(resolution):
    return {"resolution": resolution, "metric": "patch_centred", "model": "LookWhere-S from teacher"}


for resolution, label in [(112, "112 px (6 of 64)"), (224, "224 px (25 of 256)"), (448, "448 px (102 of 1024)")]:
    QUALITY_PAGE.append((
        "docs/quality.md", f"| {label} | " + " | ".join(["{} [{}, {}]"] * 4) + " | {} ± {} |",
        [selection(resolution, choice, key) for choice in ("selector", "random", "centre", "oracle")
         for key in ("mean", "low", "high")]
        + [selection(resolution, "selector_minus", "random", "mean", sign=True),
           selection(resolution, "selector_minus", "random", "half_width")]))
QUALITY_PAGE += [
    ("docs/quality.md", "At 448 px it leads the oracle by {} ± {} and the centre by {} ± {}",
     [Derived("distill_quality.json: selection 448 patch_centred: selector_minus/oracle/mean",
              lambda: lookup(Q, ("selection", SELECTION(448), "selector_minus",
                                 "oracle", "mean")), 3, sign=True),
      selection(448, "selector_minus", "oracle", "half_width"),
      Derived("distill_quality.json: selection 448 patch_centred: selector_minus/centre/mean",
              lambda: lookup(Q, ("selection", SELECTION(448), "selector_minus",
                                 "centre", "mean")), 3, sign=True),
      selection(448, "selector_minus", "centre", "half_width")]),
    ("docs/quality.md", "| teacher at 140 px, upsampled | {} " + CELLS3,
     [V(Q, "results", "448", "baselines", "teacher_equal_flops", "140", "gflops", digits=2),
      *cells(Q, ("results", "448", "baselines", "teacher_equal_flops", "140"), ("cls", "patch", "patch_centred"))]),
    ("docs/quality.md", "| LookWhere-S from teacher, k_ratio 0.1 | {} " + CELLS3,
     [V(Q, *student(448, "LookWhere-S from teacher", "k_ratio=0.1"), "gflops", digits=2),
      *cells(Q, student(448, "LookWhere-S from teacher", "k_ratio=0.1"), ("cls", "patch", "patch_centred"))]),
    ("docs/quality.md", "| LookWhere-S from teacher, untrained, k_ratio 0.1 | {} " + CELLS3,
     [V(Q, "results", "448", "baselines", "init", "LookWhere-S from teacher/k_ratio=0.1", "gflops", digits=2),
      *cells(Q, ("results", "448", "baselines", "init", "LookWhere-S from teacher/k_ratio=0.1"),
             ("cls", "patch", "patch_centred"))]),
    ("docs/quality.md", "| VECA elastic, C = 32 | {} " + CELLS3,
     [V(Q, *student(448, "VECA elastic", "cores=32"), "gflops", digits=2),
      *cells(Q, student(448, "VECA elastic", "cores=32"), ("cls", "patch", "patch_centred"))]),
    ("docs/quality.md", "| VECA from teacher, C = 32 | {} " + CELLS3,
     [V(Q, *student(448, "VECA from teacher", "cores=32"), "gflops", digits=1),
      *cells(Q, student(448, "VECA from teacher", "cores=32"), ("cls", "patch", "patch_centred"))]),
    ("docs/quality.md", "LookWhere-S reaches a ratio of {} [{}, {}] on CLS",
     interval(Q, *student(448, "LookWhere-S from teacher", "k_ratio=0.1"), "ratios", "teacher_equal_flops", "cls")),
    ("docs/quality.md", "and {} [{}, {}] on patches (missed)",
     interval(Q, *student(448, "LookWhere-S from teacher", "k_ratio=0.1"), "ratios", "teacher_equal_flops",
              "patch")),
    ("docs/quality.md", "Its centred patch cosine is {} ± {} behind the teacher's",
     plus_minus(Q, *student(448, "LookWhere-S from teacher", "k_ratio=0.1"), "differences", "teacher_equal_flops",
                "patch_centred")),
    ("docs/quality.md", "Training moved it {} ± {} above its untrained start",
     plus_minus(Q, *student(448, "LookWhere-S from teacher", "k_ratio=0.1"), "differences", "init",
                "patch_centred")),
]

TEACHER_FREE_ROWS = [("teacher (ceiling)", "teacher", "all"), ("raw pixels (floor)", "raw pixels", "-"),
                     ("VECA elastic, C = 32", "VECA elastic", "cores=32"), ("dense ViT", "dense ViT", "all"),
                     ("VECA from teacher, untrained, C = 32", "VECA from teacher (untrained)", "cores=32"),
                     ("VECA from teacher, C = 32", "VECA from teacher", "cores=32"),
                     ("LookWhere-S from teacher, untrained, k_ratio 1", "LookWhere-S from teacher (untrained)",
                      "k_ratio=1"),
                     ("LookWhere-S from teacher, k_ratio 1", "LookWhere-S from teacher", "k_ratio=1"),
                     ("LookWhere-S from teacher, k_ratio 0.1", "LookWhere-S from teacher", "k_ratio=0.1")]
QUALITY_PAGE += [
    ("docs/quality.md", f"| {label} " + CELLS3,
     cells(Q, ("teacher_free", "rows", {"model": model, "setting": setting}), ("top1", "map", "correspondence")))
    for label, model, setting in TEACHER_FREE_ROWS]
QUALITY_PAGE += [
    ("docs/quality.md", "is below 0.96 in {} of the {} cells (3 sizes, CLS and patch, 6 budgets), the worst "
                        "{} [{}, {}] (patch, 112 px, C = 4)",
     [Derived(f"{Q}: elasticity cells below 0.96", lambda: Decimal(sum(
         row["ratio"]["mean"] < Decimal("0.96") for row in load(Q)["elasticity"] if isinstance(row["cores"], int))), 0),
      Derived(f"{Q}: elasticity cells", lambda: Decimal(sum(
          isinstance(row["cores"], int) for row in load(Q)["elasticity"])), 0),
      *interval(Q, "elasticity", {"resolution": 112, "metric": "patch", "cores": 4}, "ratio")]),
    ("docs/quality.md", "fixed-32 at 32 cores no better than fixed-4 at 4 ({} [{}, {}], patch, 112 px)",
     interval(Q, "elasticity", {"resolution": 112, "metric": "patch", "cores": "fixed-32@32 / fixed-4@4"}, "ratio")),
    ("docs/quality.md", "LookWhere-S random init at k_ratio 0.1 on patches at 224 px ({} [{}, {}])",
     interval(Q, "comparisons", {"resolution": 224, "metric": "patch", "student": "LookWhere-S random init",
                                 "setting": "k_ratio=0.1"}, "ratio")),
    ("docs/quality.md", "on CLS at 224 px ({} [{}, {}]) and on patches at 448 px ({} [{}, {}])",
     [*interval(Q, "comparisons", {"resolution": 224, "metric": "cls", "student": "LookWhere-S from teacher",
                                   "setting": "k_ratio=0.1"}, "ratio"),
      *interval(Q, "comparisons", {"resolution": 448, "metric": "patch", "student": "LookWhere-S from teacher",
                                   "setting": "k_ratio=0.1"}, "ratio")]),
    ("docs/quality.md", "raw patch at 448 px ({} ± {})",
     plus_minus(Q, *student(448, "LookWhere-S from teacher", "k_ratio=0.1"), "differences", "constant", "patch")),
    ("docs/quality.md", "CLS missed at 112 px ({}) and met at 224 and 448 px ({}, {}). Patch is missed at every size "
                        "({}, {}, {})",
     [V(Q, *student(resolution, "LookWhere-S from teacher", "k_ratio=0.1"), "ratios", "teacher_equal_flops", metric,
        "mean") for metric in ("cls", "patch") for resolution in (112, 224, 448)]),
    ("docs/quality.md", "centred patch: met for LookWhere-S at 224 and 448 px, missed at 112 px; for VECA met at "
                        "224 px only ({} ± {}, {} ± {}, {} ± {})",
     [*learning("veca_centred_patch"), *learning("veca_centred_patch@224"), *learning("veca_centred_patch@448")]),
    ("docs/quality.md", "run on an idle 2-core CPU in {} minutes (`total_time_s`)",
     [Derived("distill_quality.json: total_time_s / 60", lambda: lookup(Q, ("total_time_s",)) / 60, 0)]),
    ("docs/quality.md", "the committed run took {} minutes (benchmark {}, the JSON's `total_time_s`; cards 1)",
     [Derived("distill_quality.json: total_time_s / 60 (+ 1 minute of cards)",
              lambda: lookup(Q, ("total_time_s",)) / 60 + 1, 0),
      Derived("distill_quality.json: total_time_s / 60", lambda: lookup(Q, ("total_time_s",)) / 60, 1)]),
    ("docs/quality.md", "validation score {}, {} and {} at 1e-5, 3e-5 and 1e-4",
     [V(RESULTS + "lr_sweep_veca_teacher.json", "rows", {"student": "VECA from teacher", "lr": Decimal(lr)}, "score",
        digits=3) for lr in ("1e-05", "3e-05", "0.0001")]),
]


def training_times(students, seeds, digits=0, low=True):
    """The least (or most) train_time_s of `students` over `seeds` (one seed, or a tuple of them)."""
    pick, seeds = (min if low else max), (seeds if isinstance(seeds, tuple) else (seeds,))
    return Derived(f"{Q}: {'min' if low else 'max'} train_time_s of {students}, seeds {seeds}",
                   lambda: pick(load(Q)[TRAINING][f"{name}/seed{seed}"]["train_time_s"] for name in students
                                for seed in seeds), digits)


ALL = (0, 1)  # both seeds


TI_SIZED = ["VECA elastic", "VECA fixed-4", "VECA fixed-32", "dense ViT"]
LOOKWHERE_S = ["LookWhere-S random init", "LookWhere-S from teacher"]
QUALITY_PAGE += [
    ("docs/quality.md", "far behind the teacher at 154 px (centred patch {})",
     [V(Q, "results", "448", "baselines", "teacher_equal_flops", "154", "patch_centred", "mean")]),
    ("docs/quality.md", "it costs {} GFLOPs against VECA-Ti's {}",
     [V(Q, *student(112, "VECA from teacher", "cores=32"), "gflops", digits=1),
      V(Q, *student(112, "VECA elastic", "cores=32"), "gflops", digits=2)]),
    ("docs/quality.md", "VECA-Ti (6.30 GFLOPs, centred patch {})",
     [V(Q, *student(448, "VECA elastic", "cores=32"), "patch_centred", "mean")]),
    ("docs/quality.md", "VECA-S converted from the teacher costs {} GFLOPs at 448 px, where its attention, linear in "
                        "the patches, still costs as much as the teacher's own at {} px; at {} it is far behind that "
                        "teacher ({})",
     [V(Q, *student(448, "VECA from teacher", "cores=32"), "gflops", digits=1),
      V(Q, *student(448, "VECA from teacher", "cores=32"), "teacher_equal_flops_resolution", digits=0),
      V(Q, *student(448, "VECA from teacher", "cores=32"), "patch_centred", "mean"),
      V(Q, "results", "448", "baselines", "teacher_equal_flops", "392", "patch_centred", "mean")]),
    ("docs/quality.md", "its CLS finds the same photo's other views {} of the time (the teacher: {}) and its patches "
                        "the corresponding cell {} of the time (the teacher's: {}). After the conversion: {} and {}.",
     [V(Q, "teacher_free", "rows", {"model": model, "setting": setting}, metric, "mean", digits=3)
      for model, setting, metric in [("VECA from teacher (untrained)", "cores=32", "top1"), ("teacher", "all", "top1"),
                                     ("VECA from teacher (untrained)", "cores=32", "correspondence"),
                                     ("teacher", "all", "correspondence"), ("VECA from teacher", "cores=32", "top1"),
                                     ("VECA from teacher", "cores=32", "correspondence")]]),
    ("docs/quality.md", "(the teacher at 112 px is itself: {} ± {} centred patch)",
     plus_minus(Q, *student(112, "VECA from teacher", "cores=32"), "differences", "teacher_equal_flops",
                "patch_centred", digits=2)),
    ("docs/quality.md", "LookWhere-S from the teacher reaches {}-{}, VECA from the teacher {}",
     [*[V(Q, *student(112, "LookWhere-S from teacher", setting), "cls_centred", "mean", digits=2)
        for setting in ("k_ratio=0.1", "k_ratio=1")],
      V(Q, *student(112, "VECA from teacher", "cores=32"), "cls_centred", "mean", digits=2)]),
    ("docs/quality.md", "VECA elastic at 32 cores is {} ± {} above it on patches",
     plus_minus(Q, *student(112, "VECA elastic", "cores=32"), "differences", "constant", "patch")),
    ("docs/quality.md", "indistinguishable from random ({} ± {} at 224 px)",
     [V(Q, "selection", {**SELECTION(224), "model": "LookWhere-S from teacher (untrained)"}, "selector_minus",
        "random", key, sign=key == "mean") for key in ("mean", "half_width")]),
    ("docs/quality.md", "Picked steps ranged from {} to {}",
     [Derived(f"{Q}: {name} of training/*/best_step",
              lambda pick=pick: pick(entry["best_step"] for entry in load(Q)[TRAINING].values()), 0)
      for name, pick in (("min", min), ("max", max))]),
    ("docs/quality.md", "training took {}-{} s for the ViT-Ti-sized students, {}-{} s for the LookWhere-S ones and "
                        "{}-{} s for VECA from the teacher, its stage 1 included ({}-{} s), over both seeds",
     [training_times(TI_SIZED, s, low=low) for s, low in ((ALL, True), (ALL, False))]
     + [training_times(LOOKWHERE_S, s, low=low) for s, low in ((ALL, True), (ALL, False))]
     + [training_times(("VECA from teacher",), s, low=low) for s, low in ((ALL, True), (ALL, False))]
     + [Derived(f"{Q}: {name} of VECA from teacher's stage 1 time_s", lambda pick=pick: pick(
         load(Q)[TRAINING][f"VECA from teacher/seed{seed}"]["conversion"]["stage1"]["time_s"] for seed in (0, 1)), 0)
        for name, pick in (("min", min), ("max", max))]),
]
# docs/quality.md's per-block table of VECA from the teacher's conversion: means over blocks, seed 0 (seed 1)
CONVERSION_POINTS = [("start (the seeded copy)", "start"), ("after stage 1 (150 steps)", "stage1"),
                     ("the step validation picked", "chosen")]


def block_mean(seed, point, column):
    return Derived(f"{Q}: mean over blocks of training/VECA from teacher/seed{seed}/conversion/{point}/{column}",
                   lambda: sum(lookup(Q, (TRAINING, f"VECA from teacher/seed{seed}", "conversion", point,
                                          "transfer_error", column))) / 12, 3)


# VECA from the teacher's bank in the quality run: the largest budget of its per-block table
QUALITY_BANK = Derived(f"{Q}: the largest C of VECA from teacher's per-block table", lambda: Decimal(max(
    int(key.rsplit("_c", 1)[1]) for key in lookup(Q, (TRAINING, "VECA from teacher/seed0", "conversion", "start",
                                                      "transfer_error")) if "_c" in key)), 0)


def centred_cosine(seed, point):
    return V(Q, TRAINING, f"VECA from teacher/seed{seed}", "conversion", point, "final_cosines",
             "centred_patch_cosine")


QUALITY_PAGE += [
    ("docs/quality.md", f"| {label} | {{}} ({{}}) | {{}} ({{}}) | {{}} | {{}} | {{}} ({{}}) |",
     [block_mean(0, point, "student_c32"), block_mean(1, point, "student_c32"), block_mean(0, point, "student_c8"),
      block_mean(1, point, "student_c8"), block_mean(0, point, "uniform"), block_mean(0, point, "pooled_bound_c32"),
      centred_cosine(0, point), centred_cosine(1, point)])
    for label, point in CONVERSION_POINTS[:2]] + [
    ("docs/quality.md", f"| {CONVERSION_POINTS[2][0]} | {{}} ({{}}) | {{}} ({{}}) | {{}} ({{}}) | {{}} ({{}}) | "
                        "{} ({}) |",
     [block_mean(seed, "chosen", column) for column in ("student_c32", "student_c8", "uniform", "pooled_bound_c32")
      for seed in (0, 1)] + [centred_cosine(0, "chosen"), centred_cosine(1, "chosen")])]
QUALITY_PAGE = [check for check in QUALITY_PAGE if check[2]]

# ---------------------------------------------------------------------------------------------- adaptive
A = RESULTS + "adaptive_budget.json"
MEASURES = ["cls_cosine", "patch_cosine", "cls_centred_cosine", "patch_centred_cosine", "patch_r2"]


def adaptive_row(index):
    point = ("points", index)
    values = [V(A, *point, "k_ratio", digits=len(str(load(A)["points"][index]["k_ratio"]).split(".")[1])),
              V(A, *point, "k_fixed", digits=0), V(A, *point, "gflops_fixed", digits=2),
              V(A, *point, "k_mass", digits=3),
              *[V(A, *point, "gflops_adaptive_heldout", key, digits=2) for key in ("mean", "std", "min", "max")]]
    for measure in MEASURES:
        values += [V(A, *point, "measures", measure, "adaptive_minus_fixed", key, digits=4, sign=True)
                   for key in ("mean", "low", "high")]
        values.append(Derived(f"{A}: points[{index}]/measures/{measure}/verdict",
                              lambda measure=measure: lookup(A, (*point, "measures", measure, "verdict")), 0))
    return values


def adaptive_k_range(index):
    return [Derived(f"{A}: points[{index}]/k_adaptive_heldout min",
                    lambda: min(load(A)["points"][index]["k_adaptive_heldout"]), 0),
            Derived(f"{A}: points[{index}]/k_adaptive_heldout max",
                    lambda: max(load(A)["points"][index]["k_adaptive_heldout"]), 0),
            V(A, "points", index, "k_fixed", digits=0)]


ADAPTIVE = [
    ("docs/adaptive_budget.md", "| {} ({}) | {} | {} | {} ({}; {} to {}) | " + " | ".join(["{} [{}, {}] {}"] * 5)
     + " |", adaptive_row(index)) for index in range(3)
] + [
    ("docs/adaptive_budget.md", "{}-{} patches where the fixed budget keeps {}, {}-{} against {}, {}-{} against {}",
     [*adaptive_k_range(0), *adaptive_k_range(1), *adaptive_k_range(2)]),
    ("docs/adaptive_budget.md", "({} against {} GFLOPs, {} against {}, {} against {})",
     [value for index in range(3) for value in (V(A, "points", index, "gflops_adaptive_heldout", "mean", digits=2),
                                                V(A, "points", index, "gflops_fixed", digits=2))]),
    ("docs/quality.md", "{}-{} of the 256 patches where the fixed budget keeps {}", adaptive_k_range(0)),
    ("docs/quality.md", "adaptive − fixed centred patch cosine is {} ± {}, {} ± {} and {} ± {}",
     [value for index in range(3)
      for value in plus_minus(A, "points", index, "measures", "patch_centred_cosine", "adaptive_minus_fixed")]),
]

ADAPTIVE += [
    ("docs/quality.md", "adaptive − fixed raw patch cosine is {} ± {}, {} ± {} and {} ± {}",
     [value for index in range(3)
      for value in plus_minus(A, "points", index, "measures", "patch_cosine", "adaptive_minus_fixed")]),
    ("docs/adaptive_budget.md", "no interval is wider than ±{}",
     [Derived(f"{A}: the largest adaptive_minus_fixed half_width", lambda: max(
         point["measures"][measure]["adaptive_minus_fixed"]["half_width"]
         for point in load(A)["points"] for measure in MEASURES), 2)]),
    ("docs/adaptive_budget.md", "its mean cost lands within {}% of the fixed one",
     [Derived(f"{A}: the largest |gflops_adaptive_heldout mean / gflops_fixed - 1|", lambda: max(
         abs(point["gflops_adaptive_heldout"]["mean"] / point["gflops_fixed"] - 1) for point in load(A)["points"]),
         0, percent=True)]),
]

# --------------------------------------------------------------------------------------------- fine-tuning
G = FINETUNE + "finetune_rotation_gcompris.json"


def gcompris_row(seed):
    pair = ("pairs", f"final_seed{seed}")
    return [V(G, *pair, "fine_tuned", "heldout_accuracy"),
            V(G, *pair, "hindsight_probes", "0.01", "fine_tuned_minus_probe_heldout", "difference", sign=True),
            *[V(G, *pair, "hindsight_probes", "0.01", "fine_tuned_minus_probe_heldout", "interval_95", side,
                sign=True) for side in (0, 1)],
            V(G, *pair, "hindsight_probes", "1", "fine_tuned_minus_probe_heldout", "difference", sign=True),
            *[V(G, *pair, "hindsight_probes", "1", "fine_tuned_minus_probe_heldout", "interval_95", side, sign=True)
              for side in (0, 1)]]


def one_class(seed, side):
    def count():
        groups = load(G)["pairs"][f"final_seed{seed}"]["per_group"].values()
        return sum(group[side]["one_class"] for group in groups)

    return count


def accuracy_range(json_file, pairs, side, digits=2, low=True):
    pick = min if low else max
    return Derived(f"{json_file}: {'min' if low else 'max'} of {side} heldout_accuracy over {pairs}",
                   lambda: pick(load(json_file)["pairs"][pair][side]["heldout_accuracy"] for pair in pairs), digits)


SEEDS = [f"final_seed{seed}" for seed in range(4)]
VAL_FINAL = FINETUNE + "finetune_rotation_val_data_final.json"
VAL_PAIRS = ["final_seed0_hypothesis", "final_seed1_hypothesis", "final_seed2", "final_seed3"]
TRAINER = FINETUNE + "trainer_snippet_rotation.json"
TRAINER_G = FINETUNE + "trainer_snippet_gcompris.json"

FINE_TUNING = [
    ("docs/fine-tuning.md", "| `final/` - probe (penalty 0.01; held-out {}) | - probe, penalty 1 (held-out {}) |",
     [V(G, "pairs", "final_seed0", "hindsight_probes", "0.01", "heldout_accuracy"),
      V(G, "pairs", "final_seed0", "hindsight_probes", "1", "heldout_accuracy")]),
    *[("docs/fine-tuning.md", f"| {seed} | {{}} | {{}} [{{}}, {{}}] | {{}} [{{}}, {{}}] |", gcompris_row(seed))
      for seed in range(4)],
    ("docs/fine-tuning.md", "The probe gives one class both ways up for {} of the 121 photos, the fine-tuned models "
                            "for {}-{}",
     [Derived(f"{G}: per_group probe one_class, seed 0", one_class(0, "probe"), 0),
      Derived(f"{G}: fewest per_group fine_tuned one_class over seeds",
              lambda: min(one_class(seed, "fine_tuned")() for seed in range(4)), 0),
      Derived(f"{G}: most per_group fine_tuned one_class over seeds",
              lambda: max(one_class(seed, "fine_tuned")() for seed in range(4)), 0)]),
    ("docs/fine-tuning.md", "*below* the probe here, {} [{}, {}]",
     [V(FINETUNE + "finetune_rotation_gcompris_best.json", "pairs", "best_seed3", "fine_tuned_minus_probe_heldout",
        *key, sign=True) for key in (("difference",), ("interval_95", 0), ("interval_95", 1))]),
    ("docs/fine-tuning.md", "the same runs lead by {}-{}",
     [Derived(f"{VAL_FINAL}: min difference", lambda: min(
         load(VAL_FINAL)["pairs"][pair]["fine_tuned_minus_probe_heldout"]["difference"] for pair in VAL_PAIRS), 3),
      Derived(f"{VAL_FINAL}: max difference", lambda: max(
          load(VAL_FINAL)["pairs"][pair]["fine_tuned_minus_probe_heldout"]["difference"] for pair in VAL_PAIRS), 3)]),
    ("docs/fine-tuning.md", "easier than the 21 ({}-{} against {}-{})",
     [V(G, "pairs", "final_seed0", "probe", "heldout_accuracy", digits=2),
      accuracy_range(G, SEEDS, "fine_tuned", low=False),
      Derived(f"{VAL_FINAL}: the probe's heldout_accuracy",
              lambda: load(VAL_FINAL)["pairs"]["final_seed2"]["probe"]["heldout_accuracy"], 2),
      accuracy_range(VAL_FINAL, VAL_PAIRS, "fine_tuned", low=False)]),
    ("docs/fine-tuning.md", "fine-tuning is {} [{}, {}] over its own head on the 21 held-out photos",
     [V(TRAINER, "finetuned_minus_head", *key, sign=True)
      for key in (("difference",), ("interval_95", 0), ("interval_95", 1))]),
    ("docs/fine-tuning.md", "**{} [{}, {}]**: it learns",
     [V(TRAINER_G, "finetuned_minus_head", *key, sign=True)
      for key in (("difference",), ("interval_95", 0), ("interval_95", 1))]),
]

FT_TASKS = RESULTS + "finetune_tasks.json"


def finetune_task_row(task, size):
    entry = ("entries", {"task": task, "image_size": size})
    kept = Derived(f"{FT_TASKS}: {task} {size} kept", lambda: lookup(FT_TASKS, (*entry, "kept")), 0)
    return [V(FT_TASKS, *entry, "probe"), V(FT_TASKS, *entry, "recipe"), kept,
            *interval(FT_TASKS, *entry, "difference", sign=True),
            *interval(FT_TASKS, *entry, "final_minus_probe", sign=True)]


def verdict(json_file, key, text):
    return Derived(f"{json_file}: {key}", lambda: text[load(json_file)[key]], 0)


FINE_TUNING += [
    *[("docs/fine-tuning.md", f"| {task} | {size} px | {{}} | {{}} ({{}}) | {{}} [{{}}, {{}}] | {{}} [{{}}, {{}}] |",
       finetune_task_row(task, size)) for task in ("semantic", "orientation", "colour") for size in (112, 224)],
    ("docs/fine-tuning.md", "kept fine-tuning where validation saw it clearly ahead: the rule is {}.**",
     [verdict(FT_TASKS, "met", {True: "met", False: "missed"})]),
    ("docs/fine-tuning.md", "split by photo ({} held out, {} for validation, {} to train)",
     [Derived(f"{FT_TASKS}: setup split {part}", lambda part=part: len(load(FT_TASKS)["setup"]["split"][part]), 0)
      for part in ("heldout", "val", "train")]),
    ("docs/fine-tuning.md",
     "the last epoch's lead on the held-out photos, {} [{}, {}] at 112 px and {} [{}, {}] at 224 px",
     [*interval(FT_TASKS, "entries", {"task": "orientation", "image_size": 112}, "final_minus_probe", sign=True),
      *interval(FT_TASKS, "entries", {"task": "orientation", "image_size": 224}, "final_minus_probe", sign=True)]),
    ("docs/fine-tuning.md", "The last epoch fell {} [{}, {}] at 112 px",
     interval(FT_TASKS, "entries", {"task": "colour", "image_size": 112}, "final_minus_probe", sign=True)),
    ("docs/fine-tuning.md", "validation ({} photos) saw no candidate clearly ahead",
     [V(FT_TASKS, "entries", {"task": "orientation", "image_size": 112}, "choice", "groups", digits=0)]),
]

# ------------------------------------------------------------------------------------------------- tasks
S = RESULTS + "sparse_recognition.json"
SV = RESULTS + "sparse_recognition_veca.json"
TRANSFER = ("transfer_error", "stages")
PILOT = RESULTS + "task_pilot.json"
W = RESULTS + "where_check/where_check.json"


def goal(name):
    return ("goals", {"goal": name}, "value")


def margin(name, json_file=S, digits=2, sign=True):
    return V(json_file, "goals", {"goal": name}, "margin", digits=digits, sign=sign)


def minutes(json_file, *path, digits=0):
    return Derived(f"{json_file}:{'/'.join(map(str, path))} / 60", lambda: lookup(json_file, path) / 60, digits)


def words(what, compute):
    """A number the docs write as words or with thousands commas (a reader's name, 1,000), from `compute`."""
    return Derived(what, lambda: str(compute()), 0)


def thousands(json_file, *path):
    """A count the docs write with thousands commas (1,000)."""
    return words(f"{json_file}:{'/'.join(map(str, path))}", lambda: f"{lookup(json_file, path):,}")


def met(name, json_file=S):
    """A goal's verdict as the docs write it: met or missed."""
    return words(f"{json_file}: goal {name}'s verdict", lambda: "met" if lookup(
        json_file, ("goals", {"goal": name}, "met")) else "missed")


PROBE = ("variants", "single", "probe")
SELECTOR = "LookWhere-S k_ratio 0.1 selector"


def accuracy(line, reader=None, json_file=S, digits=2):
    """mean [low, high] of a probe line, by `reader` (None: the one validation picked)."""
    readers = ("readers", reader) if reader else ()
    return interval(json_file, *PROBE, line, *readers, "accuracy", digits=digits)


def mean_accuracy(line, reader=None, json_file=S, digits=2):
    readers = ("readers", reader) if reader else ()
    return V(json_file, *PROBE, line, *readers, "accuracy", "mean", digits=digits)


def coverage(variant, line, digits=2):
    return interval(S, "variants", variant, "label_cell_coverage", line, digits=digits)


def digit_at(size_path):
    """The digit's side in pixels once the canvas is shrunk to the size at `size_path` of the JSON."""
    return Derived(f"{S}: task/digit_size x {'/'.join(size_path)} / task/canvas_size", lambda: lookup(
        S, ("task", "digit_size")) * lookup(S, size_path) / lookup(S, ("task", "canvas_size")), 0)


def reader_of(line):
    return words(f"{S}: {line}'s reader", lambda: lookup(S, (*PROBE, line, "reader")))


FINE_TUNED = ("variants", "single", "fine_tuned", SELECTOR)
FINE_TUNED_DENSE = ("variants", "single", "fine_tuned", "teacher dense")
COMPARISONS = ("variants", "single", "comparisons")
LOOKWHERE_TABLE = [("its selector", "selector", True), ("random cells", "random", False),
                   ("the teacher's cls map (oracle)", "oracle_cls", False),
                   ("the digits' own cells (ceiling)", "digits", False)]

def flat_steps():
    """The steps of stage 2 since the curve's fourth point (stage 2 at 150), over which the docs call it flat."""
    return Derived(f"{SV}: stage 2's steps since its best point", lambda: lookup(SV, (
        "learning_curve", "VECA from teacher", -1, "stage_steps")) - lookup(SV, (
            "learning_curve", "VECA from teacher", 3, "stage_steps")), 0)


def below_full_range():
    """The lowest and highest final line of VECA from the teacher below the whole bank (C = 4-32)."""
    return [Derived(f"{SV}: the {pick.__name__} of VECA from teacher at C = 4-32",
                    lambda pick=pick: pick(final_accuracies("VECA from teacher")[:-1]), 2) for pick in (min, max)]


def epochs_run(line, json_file=S) -> int:
    """The epochs a fine-tuned line ran (its validation list starts at epoch 0, the probe's head)."""
    return len(lookup(json_file, (*line, "val_accuracy"))) - 1


def last_epoch(line, json_file=S):
    return Derived(f"{json_file}: {line[-1]}'s last epoch", lambda: epochs_run(line, json_file), 0)


def fine_tuning_minutes(line, per_epoch=False, json_file=S):
    """A fine-tuned line's training time in minutes (resumed runs included), or per epoch it ran."""
    return Derived(f"{json_file}: {line[-1]}'s train_time_s / 60" + (" / its epochs" if per_epoch else ""),
                   lambda: lookup(json_file, (*line, "train_time_s")) / 60
                   / (epochs_run(line, json_file) if per_epoch else 1), 0)


def fine_tuning_course(line):
    """A fine-tuned line's validation accuracy at its start and best epoch, that epoch, and the epoch it stopped at."""
    return [V(S, *line, "val_accuracy", 0, digits=2),
            Derived(f"{S}: {line[-1]}'s best val_accuracy", lambda: max(lookup(S, (*line, "val_accuracy"))), 2),
            V(S, *line, "epoch", digits=0), last_epoch(line)]


TASKS_README = [
    ("README.md", "so that the dense teacher reads it ({} on {} test canvases) and the teacher shrunk to LookWhere's "
                  "cost does not ({})",
     [mean_accuracy("teacher dense"), thousands(S, "task", "test"), mean_accuracy("teacher at equal FLOPs")]),
    ("README.md", "keeps {}x as many of the digit's cells as random patches at k_ratio 0.1 ({} of what the "
                  "teacher's full-resolution map keeps) and scores {} at {}x fewer GFLOPs and {}x less latency than "
                  "the dense teacher ({} against {} ms)",
     [V(S, *goal("coverage_selector_over_random"), "ratio", digits=1),
      V(S, *goal("selector_coverage_vs_teacher_map"), "ratio", digits=2),
      mean_accuracy(SELECTOR, "attentive"),
      ratio(S, ("gflops", "dense"), ("gflops", "0.1"), 1),
      ratio(S, ("latency_ms", "teacher dense", "latency_ms"), ("latency_ms", SELECTOR, "latency_ms"), 1),
      V(S, "latency_ms", SELECTOR, "latency_ms", digits=0),
      V(S, "latency_ms", "teacher dense", "latency_ms", digits=0)]),
    ("README.md", "{} [{}, {}] against the teacher at equal FLOPs, {} [{}, {}] against the dense teacher, which misses "
                  "the goal of {}",
     [*interval(S, *goal("lookwhere_vs_equal_flops_teacher"), digits=2, sign=True),
      *interval(S, *goal("lookwhere_vs_dense_teacher"), digits=2, sign=True), margin("lookwhere_vs_dense_teacher")]),
    ("README.md", "Both fine-tuned with labels by the same protocol, LookWhere scores {} and the dense teacher {}: {} "
                  "[{}, {}], within the margin, so that goal is {}.",
     [V(S, *FINE_TUNED, "accuracy", "mean", digits=2), V(S, *FINE_TUNED_DENSE, "accuracy", "mean", digits=2),
      *interval(S, *goal("lookwhere_vs_dense_teacher_fine_tuned"), digits=3, sign=True),
      met("lookwhere_vs_dense_teacher_fine_tuned")]),
]

TASKS_PAGE = [
    # the opening table
    ("docs/tasks.md", "| teacher dense, {} px | {} | {} [{}, {}] | {} | {} |",
     [V(S, "task", "canvas_size", digits=0), reader_of("teacher dense"), *accuracy("teacher dense"),
      V(S, *PROBE, "teacher dense", "gflops", digits=1), V(S, "latency_ms", "teacher dense", "latency_ms", digits=0)]),
    ("docs/tasks.md", "| teacher at equal FLOPs, {} px | {} | {} [{}, {}] | {} | {} |",
     [V(S, "teacher_equal_flops_size", digits=0), reader_of("teacher at equal FLOPs"),
      *accuracy("teacher at equal FLOPs"), V(S, *PROBE, "teacher at equal FLOPs", "gflops", digits=1),
      V(S, "latency_ms", "teacher at equal FLOPs", "latency_ms", digits=0)]),
    ("docs/tasks.md", "| teacher dense, {} px | fine-tuned | {} [{}, {}] | {} |  |",
     [V(S, "task", "canvas_size", digits=0), *interval(S, *FINE_TUNED_DENSE, "accuracy", digits=2),
      V(S, *FINE_TUNED_DENSE, "gflops", digits=1)]),
    *[("docs/tasks.md", f"| LookWhere-S, k_ratio 0.1, {label} | attentive | {{}} [{{}}, {{}}] | {{}} |"
       + (" {} |" if latency else ""),
       [*accuracy(f"LookWhere-S k_ratio 0.1 {line}", "attentive"),
        V(S, *PROBE, f"LookWhere-S k_ratio 0.1 {line}", "gflops", digits=1)]
       + ([V(S, "latency_ms", SELECTOR, "latency_ms", digits=0)] if latency else []))
      for label, line, latency in LOOKWHERE_TABLE],
    ("docs/tasks.md", "| LookWhere-S, k_ratio 0.1, its selector | fine-tuned | {} [{}, {}] | {} |",
     [*interval(S, *FINE_TUNED, "accuracy", digits=2), V(S, *FINE_TUNED, "gflops", digits=1)]),
    ("docs/tasks.md", "| LookWhere-S, k_ratio 0.1, its untrained selector | attentive | {} [{}, {}] | {} |",
     [*accuracy("LookWhere-S untrained k_ratio 0.1 selector", "attentive"),
      V(S, *PROBE, "LookWhere-S untrained k_ratio 0.1 selector", "gflops", digits=1)]),
    *[("docs/tasks.md", f"| LookWhere-S, k_ratio {k}, its selector | attentive | {{}} [{{}}, {{}}] | {{}} | {{}} |",
       [*accuracy(f"LookWhere-S k_ratio {k} selector", "attentive"), V(S, "gflops", k, digits=1),
        V(S, "latency_ms", f"LookWhere-S k_ratio {k} selector", "latency_ms", digits=0)]) for k in ("0.05", "0.25")],
    ("docs/tasks.md", "| constant: always {} | | {} [{}, {}] | 0 | |",
     [V(S, "variants", "single", "constant", "predicts", digits=0),
      *interval(S, "variants", "single", "constant", "accuracy", digits=2)]),
    ("docs/tasks.md", "The committed run decides the claim on black canvases as issue #68 asks: {} test canvases a "
                      "variant", [thousands(S, "task", "test")]),
    ("docs/tasks.md", "Test accuracy on {} canvases with 95% bootstrap intervals; chance is {}.",
     [thousands(S, "task", "test"), V(S, "task", "chance", digits=2)]),
    ("docs/tasks.md", "ms per canvas: batch 1, {} threads, the median of {} alternated runs",
     [V(S, "environment", "threads", digits=0), V(S, "args", "latency_runs", digits=0)]),
    ("docs/tasks.md", "**LookWhere-S reads the digit at {}x fewer GFLOPs",
     [V(S, "goals", {"goal": "lookwhere_vs_dense_teacher"}, "gflops_ratio", digits=0)]),
    ("docs/tasks.md", "which also gives each interval's half-width, {}-{} on the accuracy differences",
     [Derived(f"{S}: the {pick.__name__} interval_half_width of the goals on accuracy differences", lambda pick=pick:
              pick(entry["interval_half_width"] for entry in lookup(S, ("goals",)) if "mean" in entry["value"]), 2)
      for pick in (min, max)]),
    # the goals
    ("docs/tasks.md", "the dense teacher minus the teacher at equal FLOPs, {} [{}, {}] (above {}): **{}**. On these "
                      "canvases resolution decides the label: at {} px a digit is {} px.",
     [*interval(S, *goal("resolution_matters"), digits=2, sign=True), margin("resolution_matters"),
      met("resolution_matters"), V(S, "teacher_equal_flops_size", digits=0), digit_at(("teacher_equal_flops_size",))]),
    ("docs/tasks.md", "at k_ratio 0.1 the selector keeps {} of the label digit's cells, {}x [{}, {}] random's {} (at "
                      "least {}x): **{}**.",
     [V(S, *PROBE, SELECTOR, "label_cell_coverage", "mean", digits=2),
      *[V(S, *goal("coverage_selector_over_random"), key, digits=1) for key in ("ratio", "low", "high")],
      V(S, *PROBE, "LookWhere-S k_ratio 0.1 random", "label_cell_coverage", "mean", digits=2),
      margin("coverage_selector_over_random", digits=0, sign=False), met("coverage_selector_over_random")]),
    ("docs/tasks.md", "the teacher's own full-resolution `cls` map keeps {} of them; the selector, which sees a {} px "
                      "copy where the digit is {} px, keeps {} [{}, {}] of that share (at least {}): **{}**.",
     [V(S, *PROBE, "LookWhere-S k_ratio 0.1 oracle_cls", "label_cell_coverage", "mean", digits=2),
      V(S, "student", "selector_size", digits=0), digit_at(("student", "selector_size")),
      *[V(S, *goal("selector_coverage_vs_teacher_map"), key, digits=2) for key in ("ratio", "low", "high")],
      margin("selector_coverage_vs_teacher_map", digits=1, sign=False), met("selector_coverage_vs_teacher_map")]),
    ("docs/tasks.md", "the selector's cells minus random cells, {} [{}, {}] with the attentive probe and {} [{}, {}] "
                      "fine-tuned (above {} in both): **{}**.",
     [*interval(S, "goals", {"goal": "accuracy_selector_minus_random"}, "protocols", "probe", digits=2, sign=True),
      *interval(S, "goals", {"goal": "accuracy_selector_minus_random"}, "protocols", "fine-tuned", digits=2,
                sign=True),
      margin("accuracy_selector_minus_random", digits=0, sign=False), met("accuracy_selector_minus_random")]),
    ("docs/tasks.md", "LookWhere-S at k_ratio 0.1 (attentive probe) minus the dense teacher, {} [{}, {}] at {}x fewer "
                      "GFLOPs (above {}): **{}**, by {} at the interval's lower end.",
     [*interval(S, *goal("lookwhere_vs_dense_teacher"), digits=2, sign=True),
      V(S, "goals", {"goal": "lookwhere_vs_dense_teacher"}, "gflops_ratio", digits=0),
      margin("lookwhere_vs_dense_teacher"), met("lookwhere_vs_dense_teacher"),
      Derived(f"{S}: lookwhere_vs_dense_teacher: margin - low", lambda: lookup(
          S, ("goals", {"goal": "lookwhere_vs_dense_teacher"}, "margin")) - lookup(
          S, (*goal("lookwhere_vs_dense_teacher"), "low")), 2)]),
    ("docs/tasks.md", "LookWhere-S minus the teacher at {} px, {} [{}, {}] (above {}): **{}**. Fine-tuned, both "
                      "learn: LookWhere {}, the teacher at {} px {}.",
     [V(S, "teacher_equal_flops_size", digits=0),
      *interval(S, *goal("lookwhere_vs_equal_flops_teacher"), digits=2, sign=True),
      margin("lookwhere_vs_equal_flops_teacher", digits=0, sign=False), met("lookwhere_vs_equal_flops_teacher"),
      V(S, *FINE_TUNED, "accuracy", "mean", digits=2), V(S, "teacher_equal_flops_size", digits=0),
      V(S, "variants", "single", "fine_tuned", "teacher at equal FLOPs", "accuracy", "mean", digits=2)]),
    ("docs/tasks.md", "the same protocol, {} [{}, {}] at {}x fewer GFLOPs (above {}): **{}**. Fine-tuning lifts both by "
                      "as much from their linear probes: the dense teacher {} [{}, {}] ({} to {}), LookWhere {} [{}, "
                      "{}] ({} to {}).",
     [*interval(S, *goal("lookwhere_vs_dense_teacher_fine_tuned"), digits=3, sign=True),
      V(S, "goals", {"goal": "lookwhere_vs_dense_teacher_fine_tuned"}, "gflops_ratio", digits=0),
      margin("lookwhere_vs_dense_teacher_fine_tuned"), met("lookwhere_vs_dense_teacher_fine_tuned"),
      *interval(S, *COMPARISONS, "fine-tuned teacher dense - its probe's start (linear)", digits=2, sign=True),
      mean_accuracy("teacher dense", "linear"), V(S, *FINE_TUNED_DENSE, "accuracy", "mean", digits=2),
      *interval(S, *COMPARISONS, "fine-tuned selector - its probe's start (linear)", digits=2, sign=True),
      mean_accuracy(SELECTOR, "linear"), V(S, *FINE_TUNED, "accuracy", "mean", digits=2)]),
    # after the goals
    ("docs/tasks.md", "the teacher map's ({}, {} and {} with the attentive probe), and at k_ratio 0.05 ({} GFLOPs, {}x "
                      "fewer) LookWhere still reads {}.",
     [mean_accuracy(SELECTOR, "attentive"), mean_accuracy("LookWhere-S k_ratio 0.1 digits", "attentive"),
      mean_accuracy("LookWhere-S k_ratio 0.1 oracle_cls", "attentive"), V(S, "gflops", "0.05", digits=1),
      ratio(S, ("gflops", "dense"), ("gflops", "0.05"), 0),
      mean_accuracy("LookWhere-S k_ratio 0.05 selector", "attentive")]),
    ("docs/tasks.md", "reads less than the linear one on these canvases: LookWhere {} against {}, the dense teacher {} "
                      "against {}",
     [mean_accuracy(SELECTOR, "attentive"), mean_accuracy(SELECTOR, "linear"),
      mean_accuracy("teacher dense", "attentive"), mean_accuracy("teacher dense", "linear")]),
    ("docs/tasks.md", "nothing but the selector's map head and blocks is trained, {} steps in {} seconds.",
     [V(S, "student", "selector_steps", digits=0), V(S, "student", "train_time_s", digits=0)]),
    ("docs/tasks.md", "at most {} epochs, stopped after {} without a better validation accuracy) took LookWhere's "
                      "validation accuracy from {} at the start to {} at epoch {}, and the run stopped at epoch {}; "
                      "the dense teacher's from {} to {} at epoch {}, stopped at epoch {}.",
     [V(S, "args", "finetune_epochs", digits=0), V(S, "args", "finetune_patience", digits=0),
      *fine_tuning_course(FINE_TUNED), *fine_tuning_course(FINE_TUNED_DENSE)]),
    ("docs/tasks.md", "Over half of it is the dense teacher's fine-tuning: {} minutes for its {} epochs, {} minutes an "
                      "epoch, against {} minutes for LookWhere's {}.",
     [fine_tuning_minutes(FINE_TUNED_DENSE), last_epoch(FINE_TUNED_DENSE),
      fine_tuning_minutes(FINE_TUNED_DENSE, per_epoch=True), fine_tuning_minutes(FINE_TUNED),
      last_epoch(FINE_TUNED)]),
    ("docs/tasks.md", "the benchmark {} of them, the teacher's passes cached", [minutes(S, "total_time_s")]),
    ("docs/tasks.md", "LookWhere's learning rate ended at {} of its peak, the dense teacher's at {}",
     [V(S, *FINE_TUNED, "schedule", "last_lr_over_peak", digits=2),
      V(S, *FINE_TUNED_DENSE, "schedule", "last_lr_over_peak", digits=2)]),
    # the pilot
    *[("docs/tasks.md", f"| {size} px | 0 | {{}} | {{}} | {{}} | {{}} | {{}} |",
       [Derived(f"{PILOT}: {size} px, {line} {reader}: the best val_accuracy", lambda size=size, line=line,
                reader=reader: max(lookup(PILOT, ("rows", {"digit_size": size, "strokes": 0}, line, "val_accuracy",
                                                  reader)).values()), 3)
        for line in ("dense", "equal_flops") for reader in ("linear", "attentive")]
       + [V(PILOT, "rows", {"digit_size": size, "strokes": 0}, "gap", digits=3, sign=True)]) for size in (28, 35, 42)],
    ("docs/tasks.md", "the teacher at equal FLOPs reads it at {}-{} where the dense teacher reads {}-{}",
     [Derived(f"{PILOT}: 28 px, {line}: the {name} reader's best val_accuracy", lambda line=line, pick=pick: pick(
         max(readings.values()) for readings in lookup(PILOT, ("rows", {"digit_size": 28, "strokes": 0}, line,
                                                               "val_accuracy")).values()), 2)
      for line in ("equal_flops", "dense") for name, pick in (("worse", min), ("better", max))]),
    ("docs/tasks.md", "The pilot took {} minutes", [minutes(PILOT, "total_time_s")]),
    ("docs/tasks.md", "the dense teacher's best validation accuracy at least {}, the teacher at equal FLOPs ({} px) at "
                      "least {} below it",
     [words(f"{PILOT}: choice/rule's floor", lambda: re.findall(r">= ([\d.]+)", lookup(PILOT, ("choice", "rule")))[0]),
      V(PILOT, "equal_flops_size", digits=0),
      words(f"{PILOT}: choice/rule's gap", lambda: re.findall(r">= ([\d.]+)", lookup(PILOT, ("choice", "rule")))[1])]),
    ("docs/tasks.md", "little optimistic), chance {}, one canvas {}:",
     [V(S, "task", "chance", digits=2), Derived(f"{PILOT}: 1 / validation", lambda: 1 / Decimal(lookup(
         PILOT, ("validation",))), 4)]),
    ("docs/tasks.md", "Intervals** are 95% bootstrap intervals over the {} test canvases, paired for differences. "
                      "Every line keeps its per-canvas correctness (`correct`) in the JSON, so any difference can be "
                      "re-paired. Chance is {}.", [thousands(S, "task", "test"), V(S, "task", "chance", digits=2)]),
    # where the selector looks
    *[("docs/tasks.md", f"| {label} | {{}} [{{}}, {{}}] | {{}} [{{}}, {{}}] |",
       [*coverage("single", line), *coverage("majority", line)]) for label, line in [
        ("trained selector (label-free, on the training canvases)", "LookWhere-S k_ratio 0.1 selector"),
        ("its untrained start (a random map head)", "LookWhere-S untrained k_ratio 0.1 selector"),
        ("random cells (3 draws)", "LookWhere-S k_ratio 0.1 random"),
        ("centre cells", "LookWhere-S k_ratio 0.1 centre"),
        ("oracle: the teacher's `cls` map", "LookWhere-S k_ratio 0.1 oracle_cls"),
        ("oracle: the teacher's `patches` map", "LookWhere-S k_ratio 0.1 oracle_patches"),
        ("the digits' own cells", "LookWhere-S k_ratio 0.1 digits")]],
    ("docs/tasks.md", "At k_ratio 0.25 the selector keeps {} [{}, {}] of them, where random keeps {} [{}, {}].",
     [*coverage("single", "LookWhere-S k_ratio 0.25 selector"),
      *coverage("single", "LookWhere-S k_ratio 0.25 random")]),
    ("docs/tasks.md", "({} against {}), because the map lights every digit",
     [V(S, "variants", "majority", "label_cell_coverage", f"LookWhere-S k_ratio 0.1 {line}", "mean", digits=2)
      for line in ("selector", "oracle_cls")]),
    # which map the selector should learn
    *[("docs/tasks.md", f"| {label} | {{}} [{{}}, {{}}] | {{}} [{{}}, {{}}] |",
       [*interval(W, "coverage", "majority", target, "top 10%", digits=2),
        *interval(W, "coverage", "single", target, "top 10%", digits=2)]) for label, target in [
        ("`patches` (every patch token as query; the old default)", "patches"),
        ("`authors` (the authors' token positions)", "authors"),
        ("`cls` (the CLS token as the only query)", "cls"), ("random cells", "random")]],
    ("docs/tasks.md", "without scribbles, it keeps {} of the digit's cells in its top 10%.",
     [V(S, *PROBE, "LookWhere-S k_ratio 0.1 oracle_cls", "label_cell_coverage", "mean", digits=2)]),
    # VECA on the task
    ("docs/tasks.md", "with an output projection to the teacher's width ({}M)",
     [Derived(f"{SV}: students/VECA-Ti from scratch/parameters / 1e6", lambda: Decimal(lookup(
         SV, ("students", "VECA-Ti from scratch", "parameters"))) / 1000000, 1)]),
    *[("docs/tasks.md", text, [margin(name, SV, digits, sign)]) for text, name, digits, sign in [
        ("accuracy at C = 8 over accuracy at C = 64, at least {} (the paper's claim)", "veca_retention_c8", 2, False),
        ("VECA from the teacher at C = 64 minus the dense teacher, above {} at fewer GFLOPs", "veca_vs_dense_teacher",
         2, True),
        ("VECA from the teacher minus VECA-Ti from scratch at C = 64, above {}.", "veca_from_teacher_vs_scratch", 0,
         False),
        ("VECA from the teacher at C = 64, the last point minus the first, above {}.", "learning_curve", 0, False)]],
    ("docs/tasks.md", "the students at every C, the student's model card ({} + 2 min, + {} to convert)",
     [minutes(SV, "total_time_s"), minutes(SV, "students", "VECA from teacher", "conversion_time_s")]),
    ("docs/tasks.md", "`benchmarks/results/sparse_recognition_veca.json` (`.log`): {} minutes on the idle 2-core CPU, "
                      "with the conversion reused from an earlier run of the same code, settings and images (its {} "
                      "minutes are not in the {}; a first run adds them).",
     [minutes(SV, "total_time_s"), minutes(SV, "students", "VECA from teacher", "conversion_time_s"),
      minutes(SV, "total_time_s")]),
    ("docs/tasks.md", "Test accuracy on {} canvases with 95% bootstrap intervals, chance {}; ms per canvas at batch 1 "
                      "on {} threads, {} alternated runs:",
     [V(SV, "task", "test", digits=0), V(SV, "task", "chance", digits=2), V(SV, "environment", "threads", digits=0),
      V(SV, "args", "latency_runs", digits=0)]),
    *[("docs/tasks.md", f"| {label} | {{}} [{{}}, {{}}] | {{}} | {{}} |",
       [*accuracy(line, json_file=SV), V(SV, *PROBE, line, "gflops", digits=1),
        V(SV, *PROBE, line, "ms_per_canvas", digits=0)]) for label, line in [
        ("teacher dense, 518 px", "teacher dense"), ("teacher at equal GFLOPs to C = 64", "teacher at equal FLOPs"),
        *[(f"VECA from teacher C = {c}", f"VECA from teacher C={c}") for c in (4, 8, 16, 32, 64)],
        *[(f"VECA-Ti from scratch C = {c}", f"VECA-Ti from scratch C={c}") for c in (8, 64)]]],
    *[("docs/tasks.md", f"| VECA from teacher C = {c}, fine-tuned elastically | {{}} [{{}}, {{}}] | {{}} | |",
       [*interval(SV, "variants", "single", "fine_tuned", f"VECA from teacher C={c}", "accuracy", digits=2),
        V(SV, "variants", "single", "fine_tuned", f"VECA from teacher C={c}", "gflops", digits=1)]) for c in (8, 64)],
    ("docs/tasks.md", "The learning curves, C = 8 / C = 64, on the first {} test canvases",
     [V(SV, "curve_test_canvases", digits=0)]),
    ("docs/tasks.md", "| VECA from the teacher | start | stage 1, {} steps | stage 2, {} | {} | {} | {} |",
     [V(SV, "learning_curve", "VECA from teacher", point, "stage_steps", digits=0) for point in range(1, 6)]),
    ("docs/tasks.md", "| accuracy | " + " | ".join(["{} / {}"] * 6) + " |",
     [V(SV, "learning_curve", "VECA from teacher", point, "accuracy", cores, "mean", digits=2)
      for point in range(6) for cores in ("8", "64")]),
    ("docs/tasks.md", "| VECA-Ti from scratch | {} steps | {} | {} | {} |",
     [words(f"{SV}: curve_steps[{i}], with thousands commas", lambda i=i: f"{lookup(SV, ('curve_steps', i)):,}")
      for i in range(4)]),
    ("docs/tasks.md", "| accuracy | " + " | ".join(["{} / {}"] * 4) + " |",
     [V(SV, "learning_curve", "VECA-Ti from scratch", point, "accuracy", cores, "mean", digits=2)
      for point in range(4) for cores in ("8", "64")]),
    ("docs/tasks.md", "The conversion's per-block table (`transfer_error`, on the first {} validation canvases",
     [V(SV, "args", "table_canvases", digits=0)]),
    *[("docs/tasks.md", f"| {label} | " + " | ".join(["{}"] * 13) + " |",
       [*[V(SV, *TRANSFER, stage, "per_block", key, block, digits=2) for block in range(12)],
        V(SV, *TRANSFER, stage, "mean", key, digits=2)]) for label, stage, key in [
        ("uniform attention (the mean of V)", "start", "uniform"),
        ("the teacher's tokens pooled into 64 regions", "start", "pooled_bound_c64"),
        ("the seeded copy, before any step", "start", "student_c64"),
        ("after stage 1", "stage1", "student_c64"), ("after stage 2 (the end)", "stage2", "student_c64")]],
    ("docs/tasks.md", "At C = 8 the mean is {} before any step, {} after stage 1 and {} at the end (the pooled bound: "
                      "{}).",
     [*[V(SV, *TRANSFER, stage, "mean", "student_c8", digits=2) for stage in ("start", "stage1", "stage2")],
      V(SV, *TRANSFER, "start", "mean", "pooled_bound_c8", digits=2)]),
    ("docs/tasks.md", "The final features' cosine with the teacher's (C = {}): patch tokens {}, {} and {}, centred "
                      "{}, {} and {}, CLS {}, {} and {}",
     [V(SV, "final_cosines", "cores", digits=0),
      *[V(SV, "final_cosines", "stages", stage, key, digits=2)
        for key in ("patch_cosine", "centred_patch_cosine", "cls_cosine") for stage in ("start", "stage1", "stage2")]]),
    ("docs/tasks.md", "`veca_from_teacher_vs_scratch`: {} [{}, {}]. **Met**",
     interval(SV, *goal("veca_from_teacher_vs_scratch"), digits=2, sign=True)),
    ("docs/tasks.md", "from scratch, after {} label-free steps, barely does.",
     [words(f"{SV}: curve_steps[-1], with thousands commas", lambda: f"{lookup(SV, ('curve_steps', -1)):,}")]),
    ("docs/tasks.md", "`learning_curve`: {} [{}, {}] from {} to {} steps. **Met**; it has not risen since {} steps of "
                      "stage 2 ({} [{}, {}] over the last two points).",
     [*interval(SV, *goal("learning_curve"), digits=2, sign=True),
      V(SV, "learning_curve", "VECA from teacher", 0, "steps", digits=0),
      V(SV, "learning_curve", "VECA from teacher", -1, "steps", digits=0),
      V(SV, "learning_curve", "VECA from teacher", 3, "stage_steps", digits=0),
      *[V(SV, "goals", {"goal": "learning_curve"}, "last_change", key, digits=2, sign=True)
        for key in ("value", "low", "high")]]),
    ("docs/tasks.md", "`veca_vs_dense_teacher`: {} [{}, {}]. **Missed**, by {} at the interval's lower end, at {} "
                      "GFLOPs against the teacher's {}.",
     [*interval(SV, *goal("veca_vs_dense_teacher"), digits=2, sign=True),
      V(SV, "goals", {"goal": "veca_vs_dense_teacher"}, "short_by", digits=2),
      V(SV, "goals", {"goal": "veca_vs_dense_teacher"}, "gflops", "VECA from teacher C=64", digits=1),
      V(SV, "goals", {"goal": "veca_vs_dense_teacher"}, "gflops", "teacher dense", digits=1)]),
    ("docs/tasks.md", "`veca_retention_c8`: {} [{}, {}]. **Missed**, by {} at the interval's lower end.",
     [*[V(SV, *goal("veca_retention_c8"), key, digits=2) for key in ("ratio", "low", "high")],
      V(SV, "goals", {"goal": "veca_retention_c8"}, "short_by", digits=2)]),
    ("docs/tasks.md", "the seeded copy already reads the digit above chance ({} at C = 64,",
     [V(SV, "learning_curve", "VECA from teacher", 0, "accuracy", "64", "mean", digits=2)]),
    ("docs/tasks.md", "stage 1 brings each block's attention error from {} to {} on average, and stage 2 brings the "
                      "final features to the teacher's (patch cosine {}). The conversion took {} minutes of this CPU "
                      "(stage 1 {}, stage 2 {}), within the goal of an hour.",
     [V(SV, *TRANSFER, "start", "mean", "student_c64", digits=2), V(SV, *TRANSFER, "stage1", "mean", "student_c64",
                                                                    digits=2),
      V(SV, "final_cosines", "stages", "stage2", "patch_cosine", digits=2),
      *[minutes(SV, "students", "VECA from teacher", key) for key in ("conversion_time_s", "stage1_time_s",
                                                                      "stage2_time_s")]]),
    ("docs/tasks.md", "It does not reach the teacher: {} against {} at C = 64, and the curve is flat over stage 2's "
                      "last {} steps. Block {} holds the conversion back at its end (error {} at C = {}, above uniform "
                      "attention's {} and the pooled bound's {} in the student's own weights). Stage 2 trades the "
                      "blocks' errors for the final features: the mean error rises from {} to {} while the patch "
                      "cosine goes from {} to {}.",
     [mean_accuracy("VECA from teacher C=64", json_file=SV), mean_accuracy("teacher dense", json_file=SV),
      flat_steps(),
      *[V(SV, "goals", {"goal": "veca_vs_dense_teacher"}, "held_back_by", key, digits=digits)
        for key, digits in (("block", 0), ("error", 2), ("cores", 0), ("uniform", 2), ("pooled_bound", 2))],
      V(SV, *TRANSFER, "stage1", "mean", "student_c64", digits=2), V(SV, *TRANSFER, "stage2", "mean", "student_c64",
                                                                     digits=2),
      *[V(SV, "final_cosines", "stages", stage, "patch_cosine", digits=2) for stage in ("stage1", "stage2")]]),
    ("docs/tasks.md", "after stage 1 every block's error at C = 64 is at most {}",
     [Derived(f"{SV}: the largest block error at C = 64 after stage 1", lambda: max(lookup(
         SV, (*TRANSFER, "stage1", "per_block", "student_c64"))), 2)]),
    ("docs/tasks.md", "the teacher's attention is close to uniform (uniform's error {}-{}) and the cores do worse than "
                      "the mean of V ({}-{}).",
     [Derived(f"{SV}: the {pick.__name__} {key} error after stage 1 in blocks 1, 2, 10, 11", lambda pick=pick, key=key:
              pick(lookup(SV, (*TRANSFER, "stage1", "per_block", key))[b] for b in (1, 2, 10, 11)), 2)
      for key in ("uniform", "student_c64") for pick in (min, max)]),
    ("docs/tasks.md", "C = 8 keeps {} of C = 64 here, not the paper's {}; the lines do not fall with the budget ({}-{} "
                      "at C = 4-32, their intervals overlapping). The curve's retention was {} at stage 2's {} steps "
                      "and {} at its end.",
     [V(SV, *goal("veca_retention_c8"), "ratio", digits=2), margin("veca_retention_c8", SV, 2, False),
      *below_full_range(),
      V(SV, "goals", {"goal": "veca_retention_c8"}, "curve", 2, "value", "value", digits=2),
      V(SV, "goals", {"goal": "veca_retention_c8"}, "curve", 2, "stage_steps", digits=0),
      V(SV, "goals", {"goal": "veca_retention_c8"}, "curve", -1, "value", "value", digits=2)]),
    ("docs/tasks.md", "Elastic fine-tuning with labels ({} epochs) brought validation to chance ({} with the probe's "
                      "head, then {} and {}), so validation kept epoch {}, the probe's head at C = 64.",
     [V(SV, "args", "finetune_epochs", digits=0),
      *[V(SV, "variants", "single", "fine_tuned", "VECA from teacher C=64", "val_accuracy", epoch, digits=2)
        for epoch in range(3)],
      V(SV, "variants", "single", "fine_tuned", "VECA from teacher C=64", "epoch", digits=0)]),
    ("docs/tasks.md", "({} at C = 8 against the probe's {})",
     [V(SV, "variants", "single", "fine_tuned", "VECA from teacher C=8", "accuracy", "mean", digits=2),
      mean_accuracy("VECA from teacher C=8", json_file=SV)]),
    ("docs/tasks.md", "VECA-Ti from scratch is above chance early on ({} at {} steps, C = 8)",
     [V(SV, "learning_curve", "VECA-Ti from scratch", 0, "accuracy", "8", "mean", digits=2),
      V(SV, "learning_curve", "VECA-Ti from scratch", 0, "steps", digits=0)]),
    ("docs/tasks.md", "The teacher at equal GFLOPs scores above the dense teacher here ({} against {}): a {} px digit "
                      "survives the shrink to {} px.",
     [mean_accuracy("teacher at equal FLOPs", json_file=SV), mean_accuracy("teacher dense", json_file=SV),
      V(SV, "task", "digit_size", digits=0), V(SV, "teacher_equal_flops_size", digits=0)]),
]


def final_accuracies(student):
    return [lookup(SV, (*PROBE, f"{student} C={c}", "accuracy", "mean")) for c in load(SV)["cores"]]


def scratch_range(key, pick):
    return Derived(f"{SV}: the {pick.__name__} {key} of VECA-Ti from scratch's lines",
                   lambda: pick(lookup(SV, (*PROBE, f"VECA-Ti from scratch C={c}", key)) for c in load(SV)["cores"]), 0)


ELASTIC_PAGE = [
    ("docs/elastic-from-pretrained.md", "`veca_retention_c8` (C = 8 over C = 64, above {})",
     [margin("veca_retention_c8", SV, 2, False)]),
    ("docs/elastic-from-pretrained.md", "Converted at {} px on {} canvases and {} photos ({} steps of stage 1, {} of "
                                        "stage 2, {} minutes of this CPU), VECA from the teacher reads {} [{}, {}] at "
                                        "C = 64 against the dense teacher's {}, and {}-{} at C = 4..32; VECA-Ti from "
                                        "scratch reads {}, and the conversion beats it by {} [{}, {}].",
     [*[V(SV, "students", "VECA from teacher", key, digits=0) for key in ("train_size", "canvases", "photos",
                                                                          "stage1_steps", "stage2_steps")],
      minutes(SV, "students", "VECA from teacher", "conversion_time_s"),
      *accuracy("VECA from teacher C=64", json_file=SV), mean_accuracy("teacher dense", json_file=SV),
      *below_full_range(),
      mean_accuracy("VECA-Ti from scratch C=64", json_file=SV),
      *interval(SV, *goal("veca_from_teacher_vs_scratch"), digits=2, sign=True)]),
    ("docs/elastic-from-pretrained.md", "the seeded copy's attention branches miss the teacher's by {} on average "
                                        "at C = 64 (1 is the branch zeroed), stage 1 brings that to {}, and stage 2 "
                                        "trades it ({}) for final features close to the teacher's (patch cosine {}).",
     [*[V(SV, *TRANSFER, stage, "mean", "student_c64", digits=2) for stage in ("start", "stage1", "stage2")],
      V(SV, "final_cosines", "stages", "stage2", "patch_cosine", digits=2)]),
    ("docs/elastic-from-pretrained.md", "being within 5 points of the dense teacher (missed by {}) and keeping {} at "
                                        "C = 8 ({} [{}, {}], missed by {}) are not, and the curve has been flat since "
                                        "{} steps of stage 2. Block {} holds the conversion back at its end.",
     [V(SV, "goals", {"goal": "veca_vs_dense_teacher"}, "short_by", digits=2),
      margin("veca_retention_c8", SV, 2, False),
      *[V(SV, *goal("veca_retention_c8"), key, digits=2) for key in ("ratio", "low", "high")],
      V(SV, "goals", {"goal": "veca_retention_c8"}, "short_by", digits=2),
      V(SV, "learning_curve", "VECA from teacher", 3, "stage_steps", digits=0),
      V(SV, "goals", {"goal": "veca_vs_dense_teacher"}, "held_back_by", "block", digits=0)]),
    ("docs/elastic-from-pretrained.md", "Its seeded start is below the constant predictor on raw patch cosine ({} "
                                        "against the mean token's {}). Converted, it reaches a centred patch cosine "
                                        "of {} ± {} at 112 px and {} ± {} at 224 px, over its bar (twice the "
                                        "half-width) at both, {} ± {} above its start. VECA-Ti from scratch is at {} "
                                        "± {} with {}x fewer GFLOPs",
     [V(Q, "results", "112", "baselines", "init", "VECA from teacher/cores=32", "patch", "mean", digits=2),
      V(Q, "results", "112", "baselines", "constant", "patch", "mean", digits=2),
      *learning("veca_teacher_centred_patch", 2), *learning("veca_teacher_centred_patch@224", 2),
      *learning("veca_teacher_trained_minus_untrained", 2), *learning("veca_centred_patch", 2),
      ratio(Q, (*student(112, "VECA from teacher", "cores=32"), "gflops"),
            (*student(112, "VECA elastic", "cores=32"), "gflops"), 0)]),
    ("docs/elastic-from-pretrained.md", "its CLS finds a photo's other views {} of the time (the teacher: {}; the "
                                        "seeded start: {})",
     [V(Q, "teacher_free", "rows", {"model": model, "setting": setting}, "top1", "mean", digits=3)
      for model, setting in [("VECA from teacher", "cores=32"), ("teacher", "all"),
                             ("VECA from teacher (untrained)", "cores=32")]]),
    ("docs/elastic-from-pretrained.md", "the cores end above uniform attention's error (mean {} at C = {} against {}, "
                                        "seed 0): at {} px, with {} patches to {} cores and {} steps of stage 1",
     [block_mean(0, "chosen", "student_c32"), QUALITY_BANK, block_mean(0, "chosen", "uniform"),
      V(Q, "args", "image_size", digits=0),
      Derived(f"{Q}: (args.image_size / 14)^2", lambda: Decimal((lookup(Q, ("args", "image_size")) // 14) ** 2), 0),
      QUALITY_BANK, V(Q, "args", "stage1_steps", digits=0)]),
    ("docs/elastic-from-pretrained.md", "converts VECA-S with {} steps of stage 1 and {} of stage 2",
     [V(Q, "args", "stage1_steps", digits=0), V(Q, "args", "steps", digits=0)]),
    ("docs/elastic-from-pretrained.md", "`make quality` converts at {} px with {} steps of it",
     [V(Q, "args", "image_size", digits=0), V(Q, "args", "stage1_steps", digits=0)]),
    ("docs/elastic-from-pretrained.md", "(VECA-Ti: {}-{} GFLOPs and {}-{} ms per canvas at 518 px, against the "
                                        "converted copy's {}-{} GFLOPs)",
     [scratch_range("gflops", min), scratch_range("gflops", max), scratch_range("ms_per_canvas", min),
      scratch_range("ms_per_canvas", max),
      Derived(f"{SV}: the fewest GFLOPs of VECA from teacher", lambda: min(lookup(
          SV, (*PROBE, f"VECA from teacher C={c}", "gflops")) for c in load(SV)["cores"]), 0),
      Derived(f"{SV}: the most GFLOPs of VECA from teacher", lambda: max(lookup(
          SV, (*PROBE, f"VECA from teacher C={c}", "gflops")) for c in load(SV)["cores"]), 0)]),
    ("docs/elastic-from-pretrained.md", "the committed task run's conversion ends at {} steps on {} canvases and {} "
                                        "photos, its curve flat over the last {}.",
     [V(SV, "learning_curve", "VECA from teacher", -1, "steps", digits=0),
      V(SV, "students", "VECA from teacher", "canvases", digits=0),
      V(SV, "students", "VECA from teacher", "photos", digits=0),
      flat_steps()]),
]

# ------------------------------------------------------------------------------------------------ parity
P = RESULTS + "parity.json"


def scientific(json_file, *path):
    """1.5e-6: one decimal of the mantissa, rounded half away from zero."""
    def compute():
        value = lookup(json_file, path)
        exponent = value.adjusted()
        mantissa = Decimal(rounded(value.scaleb(-exponent), 1))
        if abs(mantissa) >= 10:
            mantissa, exponent = Decimal(rounded(mantissa / 10, 1)), exponent + 1
        return f"{mantissa}e{exponent}"

    return Derived(f"{json_file}:{'/'.join(map(str, path))} (scientific)", compute, 0)


TIE_SETTINGS = ["tie cells 37x37/k50", "tie cells 37x37/k136", "tie cells 37x37/k273", "tie cells 74x74/k547",
                "tie cells 74x74/k1095"]


def tie_cells(setting):
    return ("lookwhere/fill at full size", setting)


def tie_range(pick):
    return lambda: pick(tie_share_of(setting) for setting in TIE_SETTINGS)


def tie_share_of(setting):
    text = lookup(P, tie_cells(setting))
    return Decimal(re.findall(r"\(([\d.]+)%\)", text)[0])


def all_settings(which):
    def compute():
        text = lookup(P, ("lookwhere/fill at full size", "tie cells, all settings"))
        return Decimal(re.findall(r"\(([\d.]+)%\)", text)[which])

    return compute


PARITY = [
    *[("docs/parity.md", "| {} / {} / {} / {} |",
       [scientific(P, f"veca/{variant}", key) for key in ("cores", "patches", "pooled", "core_coordinates")])
      for variant in ("tiny", "tiny_variant")],
    *[("docs/parity.md", "| selector map / CLS / dense grid; kept sets | {} / {} / {}; all identical |",
       [scientific(P, f"lookwhere/{variant}", key) for key in ("selector_map", "cls", "dense")])
      for variant in ("dinov2", "franca")],
    ("docs/parity.md", "| {} / {}; {} % of cells ({}-{} % per setting) |",
     [scientific(P, "lookwhere/fill at full size", "dense where the 5 nearest are unique"),
      scientific(P, "lookwhere/fill at full size", "dense vs a stable sort"),
      Derived(f"{P}: tie cells, all settings (share)", all_settings(0), 0),
      Derived(f"{P}: the fewest tie cells of a setting", tie_range(min), 0),
      Derived(f"{P}: the most tie cells of a setting", tie_range(max), 0)]),
    ("docs/parity.md", "equidistant at {}-{} % of the cells of 518 px and 1036 px grids",
     [Derived(f"{P}: the fewest tie cells of a setting", tie_range(min), 0),
      Derived(f"{P}: the most tie cells of a setting", tie_range(max), 0)]),
    ("docs/parity.md", "It therefore fills {} % of the cells of those grids differently from its own result with a "
                       "stable sort, by up to {} on unit-variance tokens",
     [Derived(f"{P}: tie cells, all settings (differ)", all_settings(1), 0),
      V(P, "lookwhere/fill at full size", "dense at tie cells", digits=1)]),
    ("docs/limitations.md", "The two differ only at those cells ({} % of the cells of the 518 px and 1036 px grids "
                            "measured, `benchmarks/results/parity.json`",
     [Derived(f"{P}: tie cells, all settings (differ)", all_settings(1), 0)]),
]

# ------------------------------------------------------------------ throughput, ONNX, extraction, mixed sizes
T = RESULTS + "distill_throughput.json"
ONNX = RESULTS + "onnx_cpu.json"
X = RESULTS + "extract_cpu.json"
M = RESULTS + "mixed_sizes_cpu.json"


def throughput_row(label, model, processes):
    row = ("rows", {"model": model, "processes": processes})
    return ("docs/training.md", f"| {label} | {processes} | {{}} | {{}} | {{}}x | {{}} | {{}}% | {{}}% | {{}} MiB |",
            [V(T, *row, "s_per_step", digits=2), V(T, *row, "floor_s_per_step", digits=2),
             V(T, *row, "times_floor", digits=2), V(T, *row, "images_per_s", digits=2),
             V(T, *row, "teacher_share", digits=0, percent=True), V(T, *row, "data_share", digits=0, percent=True),
             V(T, *row, "peak_memory_mib_process0", digits=0)])


def onnx_row(label, model, resolution, digits):
    row = ("rows", {"model": model, "resolution": resolution})
    size = resolution.split("x")[0]
    return ("docs/onnx.md", f"| {label} | {size} px | {{}} s | {{}} s | {{}} s | {{}}x | {{}}x | {{}} |",
            [V(ONNX, *row, key, digits=digits) for key in ("pytorch_s", "onnxruntime_s", "elastic_s")]
            + [V(ONNX, *row, "pytorch_over_onnxruntime", digits=2), V(ONNX, *row, "elastic_over_fixed", digits=2),
               scientific(ONNX, *row, "max_abs_diff_at_small_size")])


def extract_row(label, model, vs_v3, vs_v2):
    row = ("rows", model)
    values = [V(X, *row, "resolution", digits=0), V(X, *row, "images_per_second", digits=3)]
    values += [V(X, *row, f"speedup_vs_{teacher}", digits=digits) for teacher, digits in (vs_v3, vs_v2) if digits]
    cells = " | ".join("{}x" if digits else "1" for _, digits in (vs_v3, vs_v2))
    return ("docs/features.md", f"| {label} | {{}} | {{}} | {cells} |", values)


MIXED = [("rows", {"model": "VECA-S/16, 16 cores"}), ("rows", {"model": "LookWhere-S/14, k_ratio 0.1"})]
OTHERS = [
    throughput_row("VECA-S/14, 224 px", "VECA-S 224 px", 1), throughput_row("VECA-S/14, 224 px", "VECA-S 224 px", 2),
    throughput_row("LookWhere-S, 518 px", "LookWhere-S 518 px", 1),
    throughput_row("LookWhere-S, 518 px", "LookWhere-S 518 px", 2),
    throughput_row("LookWhere-S, 518 px, `--teacher-cache 1`", "LookWhere-S 518 px, teacher cache", 1),
    *[("docs/training.md", "`authors` maps rank the digits last, below the black background (covering {} of them in "
                           "their top 10%, where random cells cover {})",
       [Derived(f"{W}: the larger of patches / authors, coverage/{variant}/*/top 10%/mean", lambda variant=variant: max(
           lookup(W, ("coverage", variant, target, "top 10%", "mean")) for target in ("patches", "authors")), 2),
        V(W, "coverage", variant, "random", "top 10%", "mean", digits=2)]) for variant in ("single", "majority")],
    ("docs/training.md", "measured first in the same run ({} GFLOP/s, a 4096 x 4096 `torch.mm`",
     [V(T, "matmul_gflops", digits=0)]),
    ("docs/training.md", "Every step runs within {}x of its floor",
     [Derived(f"{T}: the largest times_floor", lambda: max(row["times_floor"] for row in load(T)["rows"]), 1)]),
    ("docs/training.md", "a step takes {} s against {} s, {}x faster in the same run",
     [V(T, "rows", {"model": "LookWhere-S 518 px, teacher cache", "processes": 1}, "s_per_step", digits=2),
      V(T, "rows", {"model": "LookWhere-S 518 px", "processes": 1}, "s_per_step", digits=2),
      ratio(T, ("rows", {"model": "LookWhere-S 518 px", "processes": 1}, "s_per_step"),
            ("rows", {"model": "LookWhere-S 518 px, teacher cache", "processes": 1}, "s_per_step"), 1)]),
    ("docs/training.md", "`--help` answers in {} s",
     [Derived(f"{T}: the slower help_seconds", lambda: max(load(T)["help_seconds"].values()), 1)]),
    ("docs/training.md", "(LookWhere-S at k_ratio 0.1 {} ± {} and VECA-Ti {} ± {} centred patch cosine",
     [*learning("lookwhere_centred_patch_k01", 2), *learning("veca_centred_patch", 2)]),
    onnx_row("VECA-B, C=64", "veca {'num_cores': 64}", "512x512", 2),
    onnx_row("VECA-B, C=64", "veca {'num_cores': 64}", "1024x1024", 1),
    onnx_row("VECA-B, C=16", "veca {'num_cores': 16}", "512x512", 2),
    onnx_row("VECA-B, C=16", "veca {'num_cores': 16}", "1024x1024", 1),
    onnx_row("LookWhere-B, k_ratio 0.1", "lookwhere {'k_ratio': 0.1}", "518x518", 2),
    onnx_row("LookWhere-B, k_ratio 0.1", "lookwhere {'k_ratio': 0.1}", "1036x1036", 2),
    onnx_row("LookWhere-B, k_ratio 0.5", "lookwhere {'k_ratio': 0.5}", "518x518", 2),
    onnx_row("LookWhere-B, k_ratio 0.5", "lookwhere {'k_ratio': 0.5}", "1036x1036", 1),
    ("docs/onnx.md", "The elastic graph costs what the fixed graph of its budget costs: {}x to {}x in every row",
     [Derived(f"{ONNX}: {name} elastic_over_fixed", lambda pick=pick: pick(row["elastic_over_fixed"]
                                                                            for row in load(ONNX)["rows"]), 2)
      for name, pick in (("min", min), ("max", max))]),
    ("docs/onnx.md", "our PyTorch path is {}-{}% faster for VECA; for LookWhere the two are within {}% at 1036 px, "
                     "while the PyTorch path is slower at 518 px ({}x and {}x the fixed graph)",
     [Derived(f"{ONNX}: 1 - the {name} VECA pytorch_over_onnxruntime", lambda pick=pick: 1 - pick(
         row["pytorch_over_onnxruntime"] for row in load(ONNX)["rows"] if row["model"].startswith("veca")), 0,
         percent=True) for name, pick in (("largest", max), ("smallest", min))]
     + [Derived(f"{ONNX}: the largest |pytorch_over_onnxruntime - 1| of LookWhere at 1036 px", lambda: max(
         abs(row["pytorch_over_onnxruntime"] - 1) for row in load(ONNX)["rows"]
         if row["model"].startswith("lookwhere") and row["resolution"] == "1036x1036"), 0, percent=True)]
     + [V(ONNX, "rows", {"model": f"lookwhere {{'k_ratio': {k}}}", "resolution": "518x518"},
          "pytorch_over_onnxruntime", digits=2) for k in ("0.5", "0.1")]),
    extract_row("VECA-B/16, 16 cores", "VECA-B/16, 16 cores", ("DINOv3-B/16", 2), ("DINOv2-B/14", 2)),
    extract_row("LookWhere-B/14, k_ratio 0.1", "LookWhere-B/14, k_ratio 0.1", ("DINOv3-B/16", 1), ("DINOv2-B/14", 1)),
    extract_row("DINOv3-B/16", "DINOv3-B/16", ("DINOv3-B/16", 0), ("DINOv2-B/14", 2)),
    extract_row("DINOv2-B/14", "DINOv2-B/14", ("DINOv3-B/16", 2), ("DINOv2-B/14", 0)),
    ("docs/usage.md", "VECA-S/16 at 16 cores {} s as one padded batch against {} s one photo at a time ({}x: VECA's "
                      "cost follows the patches, padding included); LookWhere-S/14 at k_ratio 0.1 {} s against {} s "
                      "({}x:",
     [value for row in MIXED for value in (
         Derived(f"{M}: padded_batch latency_ms / 1000",
                 lambda row=row: lookup(M, (*row, "padded_batch", "latency_ms")) / 1000, 2),
         Derived(f"{M}: one_by_one latency_ms / 1000",
                 lambda row=row: lookup(M, (*row, "one_by_one", "latency_ms")) / 1000, 2),
         V(M, *row, "padded_over_one_by_one", digits=2))]),
    ("docs/usage.md", "about {}% of the padded batch is padding",
     [V(M, *MIXED[0], "padding_fraction", digits=0, percent=True)]),
    ("docs/usage.md", "{} for VECA ({} of the features' largest magnitude, 4.6) and {} for LookWhere ({})",
     [scientific(M, *MIXED[0], "max_abs_difference"), scientific(M, *MIXED[0], "relative_difference"),
      scientific(M, *MIXED[1], "max_abs_difference"), scientific(M, *MIXED[1], "relative_difference")]),
]

# ------------------------------------------------------------------------------------------- photo canvases
CALIBRATION = "experiments/task_calibration/"
PHOTO_PILOT = CALIBRATION + "task_pilot_photos_maximum.json"
PLATES, PLATES_1200, CELLS = (CALIBRATION + name for name in ("photo_plates.json", "photo_plates_1200.json",
                                                               "photo_cells.json"))
DIM, DIM_005, PHOTO_FINE_TUNED = (CALIBRATION + name for name in ("photo_dim.json", "photo_dim_005.json",
                                                                  "photo_finetune_28.json"))
PHOTO_FINE_TUNED_2000 = CALIBRATION + "photo_finetune_28_2000.json"
LARGE, LARGE_2000, TOKEN_READER = (CALIBRATION + name for name in ("photo_plates_large.json",
                                                                   "photo_plates_large_2000.json", "token_reader.json"))


def photo_fine_tuned(pick) -> Derived:
    """`pick` (min or max) of the dense teacher's validation accuracies, fine-tuned on photos."""
    return Derived(f"{PHOTO_FINE_TUNED}: the {pick.__name__} validation accuracy",
                   lambda: pick(lookup(PHOTO_FINE_TUNED, ("lines", "dense", "val_accuracy"))), 3)


PHOTO_CANVASES = [
    ("docs/tasks.md",
     "the black pilot's floor for the dense teacher, {}, and least gap to the teacher at equal FLOPs, {})",
     [Derived(f"{PHOTO_PILOT}: the rule's floor", lambda: Decimal(re.search(
         r">= ([\d.]+)", load(PHOTO_PILOT)["choice"]["rule"]).group(1)), 1),
      Derived(f"{PHOTO_PILOT}: the rule's gap", lambda: Decimal(re.findall(
          r">= ([\d.]+)", load(PHOTO_PILOT)["choice"]["rule"])[1]), 2)]),
    ("docs/tasks.md", "read {}, {} and {} px digits without scribbles",
     [V(PHOTO_PILOT, "rows", index, "digit_size", digits=0) for index in range(3)]),
    ("docs/tasks.md", "of either reader, was {}, {} and {} (chance",
     [V(PHOTO_PILOT, "rows", index, "dense", "best") for index in range(3)]),
    ("docs/tasks.md", "at 28 and 42 px: at most {}, and {} with three times the canvases",
     [Derived(f"{PLATES}: the best dense row", lambda: max(row["dense"]["best"] for row in load(PLATES)["rows"]), 3),
      V(PLATES_1200, "rows", 0, "dense", "best")]),
    ("docs/tasks.md", "reads {} on these photos against {} on black",
     [V(CELLS, "rows", {"canvases": "photo"}, "digit_cells"), V(CELLS, "rows", {"canvases": "black"}, "digit_cells")]),
    ("docs/tasks.md", "validation accuracy stayed between {} and {} over its {} epochs ({} minutes, stopped by patience)",
     [photo_fine_tuned(min), photo_fine_tuned(max), last_epoch(("lines", "dense"), PHOTO_FINE_TUNED),
      fine_tuning_minutes(("lines", "dense"), json_file=PHOTO_FINE_TUNED)]),
    ("docs/tasks.md", "the frozen dense teacher read {} at a quarter of the photo's brightness, {} at a tenth and {} at "
                      "a twentieth, against {} on black",
     [V(DIM, "rows", {"brightness": Decimal("0.25")}, "dense", "best"),
      V(DIM, "rows", {"brightness": Decimal("0.1")}, "dense", "best"),
      V(DIM_005, "rows", 0, "dense", "best"), V(PILOT, "rows", {"digit_size": 28}, "dense", "best")]),
    ("docs/tasks.md", "On {} canvases, its first epoch ({} steps, {} minutes) took it from {} to {}; the run was "
                      "stopped there.",
     [thousands(PHOTO_FINE_TUNED_2000, "train"), V(PHOTO_FINE_TUNED_2000, "lines", "dense", "steps", digits=0),
      fine_tuning_minutes(("lines", "dense"), json_file=PHOTO_FINE_TUNED_2000),
      V(PHOTO_FINE_TUNED_2000, "lines", "dense", "val_accuracy", 0),
      V(PHOTO_FINE_TUNED_2000, "lines", "dense", "val_accuracy", 1)]),
    ("docs/tasks.md", "{} px digits on their black plates, the largest these canvases take, read {} with the pilot's {} "
                      "canvases and {} with {}.",
     [V(LARGE, "rows", 0, "digit_size", digits=0), V(LARGE, "rows", 0, "dense", "best"), V(LARGE, "train", digits=0),
      V(LARGE_2000, "rows", 0, "dense", "best"), thousands(LARGE_2000, "train")]),
    ("docs/tasks.md", "It reads the black pilot's canvases at {} and the photo canvases at {}, so the readers are not "
                      "the cause. On the {} px plates with {} canvases it reads the dense teacher at {} and the teacher "
                      "at equal FLOPs at {}:",
     [V(TOKEN_READER, "rows", {"canvases": "black"}, "dense", "best"),
      V(TOKEN_READER, "rows", {"canvases": "photo"}, "dense", "best"),
      V(TOKEN_READER, "rows", -1, "digit_size", digits=0), thousands(TOKEN_READER, "rows", -1, "train"),
      V(TOKEN_READER, "rows", -1, "dense", "best"), V(TOKEN_READER, "rows", -1, "equal_flops", "best")]),
    ("docs/tasks.md", "the dense teacher took {} minutes an epoch for the pilot's {} on this CPU",
     [fine_tuning_minutes(("lines", "dense"), per_epoch=True, json_file=PHOTO_FINE_TUNED),
      Derived(f"{PHOTO_FINE_TUNED}: canvases fitted", lambda: load(PHOTO_FINE_TUNED)["train"]
              - load(PHOTO_FINE_TUNED)["validation"], 0)]),
    ("docs/tasks.md", "runs the pilot ({} minutes)",
     [Derived(f"{PHOTO_PILOT}: total_time_s in minutes", lambda: load(PHOTO_PILOT)["total_time_s"] / 60, 0)]),
]

CHECKS = (SPEED_TABLE_README + QUALITY_README + TASKS_README + SPEED_PAGE + QUALITY_PAGE + ADAPTIVE + FINE_TUNING
          + TASKS_PAGE + PHOTO_CANVASES + ELASTIC_PAGE + PARITY + OTHERS)


def expected(template: str, values) -> str:
    return re.sub(r"\s+", " ", template).format(*(value.text() for value in values))


def check_id(check):
    doc, template, _ = check
    return f"{doc}: {template[:60]}"


def test_rounding_is_half_away_from_zero_on_the_json_text():
    assert rounded(Decimal("0.205"), 2) == "0.21"          # the float 0.205 is 0.20499..., the JSON's text is not
    assert rounded(Decimal("-0.395"), 2) == "-0.40"
    assert rounded(Decimal("0.014999994929879903"), 2, sign=True) == "+0.01"
    assert rounded(Decimal("-0.00015900496925626482"), 3, sign=True) == "-0.000"
    assert rounded(Decimal("331.7109375"), -1) == "330"
    assert rounded(Decimal("0.8905431506227349"), 0, percent=True) == "89"


@pytest.mark.parametrize("entry", LEARNING_ROWS)
def test_the_learning_table_states_each_entry_as_the_json_does(entry):
    """docs/quality.md's learning table: each entry's row gives, at 112 / 224 / 448 px, the verdict and +mean ± the
    half-width of `learning` in the JSON."""
    lines = (ROOT / "docs" / "quality.md").read_text().splitlines()
    rows = [line for line in lines if line.startswith(f"| `{entry}`:")]
    assert len(rows) == 1, entry
    cells = []
    for suffix in ("", "@224", "@448"):
        stat = load(Q)["learning"][entry + suffix]
        verdict = "met" if stat["met"] else "missed"
        cells.append(f"{f'**{verdict}**' if not suffix else verdict}: "
                     f"{rounded(stat['mean'], 3, sign=True)} ± {rounded(stat['half_width'], 3)}")
    assert rows[0].endswith("| " + " | ".join(cells) + " |"), (rows[0], cells)


@pytest.mark.parametrize("check", CHECKS, ids=check_id)
def test_the_doc_quotes_its_json(check):
    doc, template, values = check
    assert template.count("{}") == len(values), "one value per {}"
    want = expected(template, values)
    assert want in page(doc), (
        f"{doc} should say {want!r}, from:\n" + "\n".join(f"  {value}: {value.text()}" for value in values))


# ------------------------------------------------------------------- no unchecked number in the task pages
# The passages whose every measured number (a decimal, a number with x or %, a time, a cost) must be a value of CHECKS:
# doc -> (the passage's first words, the words it ends before; None: the page's end).
SCANNED = {
    "README.md": [("`make tasks` tests LookWhere's claim", "For quality, use the authors' checkpoints")],
    "docs/tasks.md": [
        ("# Where to look, measured on a task", "## How the student was chosen"),  # the rest is the experiments'
        ("## Which map the selector should learn", "### The canvases: larger digits"),  # the first pilot's, below
        ("### Results", None),
    ],
    "docs/elastic-from-pretrained.md": [("## Measuring a copy on a task", None)],
}
# Numbers in those passages that no committed JSON of benchmarks/results holds: (doc, the words around them, whence).
ELSEWHERE = [
    ("docs/tasks.md", "about an hour and three quarters with the teacher's passes cached",
     "the sum of the committed run's parts: the where check 1 min, the teacher's lines 1.5, LookWhere's single lines 16 "
     "(the killed run's, idle), the fine-tuning 74 (its train_time_s 65 and the test passes), the majority lines 9, "
     "the card 0.5 (/work/logs of 2026-12-07, in #68's closing note)"),
    ("docs/tasks.md", "some 20 minutes more from a cold cache (the dense pass of 2,800 canvases)",
     "2 variants x 1,400 canvases at the dense teacher's 367 ms, plus the 168 px passes"),
    ("docs/tasks.md", "(77 minutes in all", "make tasks' whole time, 18:55-20:12 UTC on 2026-12-07"),
    ("docs/tasks.md", "(LookWhere's 9, the dense teacher's 7)", "the JSON's resumed_after_epoch of each fine-tuned line"),
    ("docs/tasks.md", "its first 32 minutes shared the CPU with the test suite",
     "the suite's log: 18:58-19:32 UTC, beside the run from 18:55"),
    ("docs/tasks.md", "take 46 minutes instead of 16", "benchmarks/results/sparse_recognition.log's progress times "
     "(210 to 2977 s), and the killed run's (88 to 1071 s)"),
    ("docs/tasks.md", "took 4.8 min idle from a cold cache", "make tasks QUICK=1's timing on the code of e029ee3 "
     "(288 s, 2026-12-07, black only, the cache empty)"),
    ("docs/tasks.md", "reads 0.29-0.33 on validation", "experiments/extractor_curve"),
    ("docs/tasks.md", "against the dense teacher's 0.49", "experiments/extractor_curve"),
    ("docs/tasks.md", "missed the 0.5 floor", "experiments/task_calibration/LOG.md"),
    ("docs/tasks.md", "(chance 0.10, one canvas 0.0125)",
     "ten balanced classes; one of the pilot's 80 validation canvases"),
    ("docs/tasks.md", "cannot meet a floor of 0.5 here", "the pilot's rule, checked above"),
    ("docs/tasks.md", "covers under 1% of the", "a bound: 2 x 2 of 37 x 37 patches"),
    ("docs/tasks.md", "(5.4 min idle", "make tasks-veca QUICK=1's timing, in commit 6335dbd"),
    ("docs/tasks.md", "+ 2 min,", "the card's time: 89 s, the end of benchmarks/results/sparse_recognition_veca.log"),
    ("docs/tasks.md", "read 0.09 in the run before", "the JSON of the run before (commit 41c82a5)"),
    ("docs/tasks.md", "LoRA read 0.28 against every weight's 0.38 at C = 64 on the 80 validation canvases, "
                      "-0.10 [-0.20, +0.00]", "experiments/veca_conversion/results/stage2_lora.json"),
    ("docs/tasks.md", "stage2_lora`, 21 minutes", "the same JSON's total_time_s"),
    ("docs/tasks.md", "GELU MLP at 1x its cost", "the copy's design (docs/elastic-from-pretrained.md)"),
]
MEASURED = re.compile(r"(?<![\w.])[+-]?(?:\d+\.\d+|\d+(?:\.\d+)?(?=x\b|%)|\d+(?:,\d{3})*(?= ?(?:ms|s|seconds|minutes|"
                      r"min|GFLOPs)\b))(?![\w.]*\d)")
SETTINGS = ("k_ratio ", "k_ratio=", "k_mass ", "top ")  # a budget or a map's share the run was given, not a result
LEVEL = "95%"  # the intervals' confidence level


def value_spans(doc: str) -> list[tuple[int, int]]:
    """Where in page(doc) a value of CHECKS stands: (start, end) of each `{}` of each check found there."""
    text, spans = page(doc), []
    for check_doc, template, values in CHECKS:
        if check_doc != doc:
            continue
        parts, want = re.sub(r"\s+", " ", template).split("{}"), expected(template, values)
        texts = [value.text() for value in values]
        start = text.find(want)
        while start >= 0:
            position = start
            for part, value in zip(parts, texts):
                spans.append((position + len(part), position + len(part) + len(value)))
                position += len(part) + len(value)
            start = text.find(want, start + 1)
    return spans


def elsewhere_spans(doc: str) -> list[tuple[int, int]]:
    text = page(doc)
    spans = []
    for where, words, _ in ELSEWHERE:
        if where == doc:
            assert words in text, f"{doc} no longer says {words!r}: drop it from ELSEWHERE"
            spans += [(m.start(), m.end()) for m in re.finditer(re.escape(words), text)]
    return spans


def unchecked_numbers(doc: str) -> list[str]:
    """Each measured number in SCANNED's passages of `doc` that is neither a value of CHECKS nor in ELSEWHERE."""
    text, found = page(doc), []
    covered = value_spans(doc) + elsewhere_spans(doc)
    for first, last in SCANNED[doc]:
        start = text.index(first)
        end = text.index(last, start) if last else len(text)
        for match in MEASURED.finditer(text, start, end):
            if text[:match.start()].endswith(SETTINGS) or text.startswith(LEVEL, match.start()):
                continue
            if not any(a <= match.start() and match.end() <= b for a, b in covered):
                found.append(f"{match.group()}: ...{text[max(0, match.start() - 60):match.end() + 20]}...")
    return found


@pytest.mark.parametrize("doc", sorted(SCANNED))
def test_every_measured_number_of_the_task_pages_is_checked(doc):
    """Every result that README's task paragraph, docs/tasks.md and docs/elastic-from-pretrained.md quote is a value of
    CHECKS (its JSON path in one table), or is named in ELSEWHERE with where it comes from."""
    assert unchecked_numbers(doc) == []


def test_an_unchecked_number_is_found(monkeypatch):
    before = unchecked_numbers("docs/tasks.md")
    text = page("docs/tasks.md") + " It scored 0.77 [0.70, 0.84] at 3.5x less cost in 12 minutes, k_ratio 0.2."
    monkeypatch.setattr(sys.modules[__name__], "page", lambda doc: text)
    found = unchecked_numbers("docs/tasks.md")[len(before):]
    assert [line.split(":")[0] for line in found] == ["0.77", "0.70", "0.84", "3.5", "12"]
