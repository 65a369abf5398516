"""quality.png of the quality benchmark (benchmarks.distill_quality), drawn from its JSON result alone: per resolution,
raw and centred patch cosine against GFLOPs (every student and budget, the teacher run at smaller sizes, the constant,
initialisations hollow), then the same against VECA's cores; bars are 95% intervals."""

from pathlib import Path

from corevision_hf.visualize import save_figures_atomically
from evaluation.quality_students import ELASTIC_BUDGETS, STUDENTS

PLOT_METRICS = ("patch", "patch_centred")
STYLES = {"VECA elastic": ("tab:blue", "o"), "VECA fixed-4": ("tab:cyan", "v"), "VECA fixed-32": ("tab:purple", "^"),
          "VECA from teacher": ("tab:brown", "X"), "dense ViT": ("tab:green", "D"),
          "LookWhere-S random init": ("tab:red", "s"), "LookWhere-S from teacher": ("tab:orange", "P")}
PLOT_NAMES = {"patch": "mean patch cosine", "patch_centred": "centred patch cosine"}
PLOT_LIMITS = {"patch": (0, 1), "patch_centred": (-0.2, 1)}


def plot_student(axis, block: dict, name: str, metric: str) -> None:
    """Student `name`'s points against GFLOPs (its untrained start hollow), with its k_ratio or end-budget labels."""
    colour, marker = STYLES[name]
    points = [s for s in block["students"] if s["student"] == name]
    if name in ("VECA fixed-4", "VECA fixed-32"):  # here at their trained budget; every C on the right
        points = [p for p in points if p["setting"] == f"cores={name.split('-')[-1]}"]
    axis.errorbar([p["gflops"] for p in points], [p[metric]["mean"] for p in points],
                  yerr=[[p[metric]["mean"] - p[metric]["low"] for p in points],
                        [p[metric]["high"] - p[metric]["mean"] for p in points]],
                  color=colour, marker=marker, capsize=2, label=name, linestyle="-" if len(points) > 1 else "")
    inits = [block["baselines"]["init"][f"{STUDENTS[name][1]}/{p['setting']}"] for p in points]
    axis.scatter([p["gflops"] for p in points], [i[metric]["mean"] for i in inits], facecolors="none",
                 edgecolors=colour, marker=marker, s=30)
    if name.startswith("LookWhere"):  # k_ratio labels: above one LookWhere, below the other
        offset = 7 if name.endswith("teacher") else -12
        for p in points:
            axis.annotate(p["setting"].split("=")[1], (p["gflops"], p[metric]["mean"]), fontsize=7,
                          color=colour, textcoords="offset points", xytext=(6, offset), ha="left")
    if name == "VECA elastic":  # its budgets sit close together in GFLOPs: the two ends labelled
        for p in (points[0], points[-1]):
            axis.annotate(f"C={p['setting'].split('=')[1]}", (p["gflops"], p[metric]["mean"]),
                          fontsize=7, color=colour, textcoords="offset points", xytext=(-4, -12),
                          ha="right")


def plot_against_gflops(axis, block: dict, metric: str, r: str) -> None:
    """One panel: `metric` against GFLOPs for every student and budget, the teacher at smaller sizes, the constant."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    base = block["baselines"]
    teacher_points = sorted((t["gflops"], t[metric]["mean"], t["resolution"])
                            for t in base["teacher_equal_flops"].values())
    axis.plot([p[0] for p in teacher_points], [p[1] for p in teacher_points], color="black", marker="*",
              label="the teacher itself, run at a smaller size (labels: px)")
    for x, y, size in teacher_points:
        axis.annotate(f"{size}", (x, y), fontsize=7, textcoords="offset points", xytext=(0, 5), ha="center")
    axis.axhline(base["constant"][metric]["mean"], color="0.4", linestyle="--",
                 label="constant: the mean teacher token of the training crops")
    for name in STYLES:
        plot_student(axis, block, name, metric)
    axis.scatter([], [], facecolors="none", edgecolors="0.3", label="hollow: the same student untrained")
    axis.set_xscale("log")
    axis.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    axis.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    axis.xaxis.set_minor_formatter(NullFormatter())
    axis.set_ylim(*PLOT_LIMITS[metric])
    axis.set_xlabel("GFLOPs per image (analytic)")
    axis.set_ylabel(f"{PLOT_NAMES[metric]} to the teacher's {r} px output")
    axis.set_title(f"{PLOT_NAMES[metric]}, {r} px (LookWhere labels: k_ratio)", fontsize=10)
    axis.grid(alpha=0.3)


def plot_against_cores(axis, block: dict, metric: str, r: str) -> None:
    """One panel: `metric` against the cores used, for each VECA (elastic, fixed-4, fixed-32, from the teacher)."""
    base = block["baselines"]
    for name in ("VECA elastic", "VECA fixed-4", "VECA fixed-32", "VECA from teacher"):
        colour, marker = STYLES[name]
        points = [s for s in block["students"] if s["student"] == name]
        cores = [int(p["setting"].split("=")[1]) for p in points]
        axis.errorbar(cores, [p[metric]["mean"] for p in points],
                      yerr=[[p[metric]["mean"] - p[metric]["low"] for p in points],
                            [p[metric]["high"] - p[metric]["mean"] for p in points]],
                      color=colour, marker=marker, capsize=2, label=name)
    for init, colour in (("VECA", "0.6"), ("VECA from teacher", STYLES["VECA from teacher"][0])):
        starts = [base["init"][f"{init}/cores={c}"][metric]["mean"] for c in ELASTIC_BUDGETS]
        axis.plot(ELASTIC_BUDGETS, starts, color=colour, linestyle=":", marker="o", markerfacecolor="none",
                  label=f"{'VECA random' if init == 'VECA' else init} untrained")
    axis.axhline(base["constant"][metric]["mean"], color="0.4", linestyle="--", label="constant")
    axis.set_xscale("log", base=2)
    axis.set_xticks(ELASTIC_BUDGETS, [str(c) for c in ELASTIC_BUDGETS])
    axis.set_ylim(*PLOT_LIMITS[metric])
    axis.set_xlabel("cores used at inference (C)")
    axis.set_ylabel(f"{PLOT_NAMES[metric]} to the teacher's {r} px output")
    axis.set_title(f"VECA elasticity: {PLOT_NAMES[metric]}, {r} px", fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="lower right")


def plot_quality(result: dict, path: Path) -> None:
    """quality.png, one row per resolution: raw and centred patch cosine against GFLOPs (every student and budget,
    the teacher run at smaller sizes as a curve, the constant as a line, initialisations as hollow markers), then the
    same two against VECA's cores (elastic, fixed-4, fixed-32). Bars: 95% intervals."""
    from matplotlib.figure import Figure

    resolutions = list(result["results"])
    figure = Figure(figsize=(22, 5.4 * len(resolutions) + 1.2), layout="constrained")
    axes = figure.subplots(len(resolutions), 4, squeeze=False)
    for row_axes, r in zip(axes, resolutions):
        block = result["results"][r]
        for axis, metric in zip(row_axes[:2], PLOT_METRICS):
            plot_against_gflops(axis, block, metric, r)
        for axis, metric in zip(row_axes[2:], PLOT_METRICS):
            plot_against_cores(axis, block, metric, r)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncol=5, fontsize=8)
    seeds = len(result["args"]["seeds"])
    figure.suptitle(f"Agreement with the teacher ({result['teacher']['name']}) on {len(result['held_out_photos'])} "
                    f"held-out photos: mean over photos and {seeds} seeds; bars: 95% intervals (photo, seed and "
                    "rerun-drift terms, t on their Welch-Satterthwaite df)", fontsize=11)
    save_figures_atomically({str(path): figure})
