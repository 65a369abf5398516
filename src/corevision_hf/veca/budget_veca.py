"""A VECA forward's budget (`active_cores`), what it costs, and the largest core budget that fits a target: analytic
GFLOPs (`max_gflops`) or the latency measured on this machine (`max_ms`, from the table
`corevision_hf.calibrate_latency` stores in the config).

Hub-copied: imported by modeling_veca.py; standard library and torch. `corevision_hf.veca_flops` is this file's
function, so cost tables and the budget a target picks use one formula. Choosing a budget is arithmetic on the image
size: it reads no tensor's values (a latency table is checked against the input's device, dtype and batch size).
"""

import bisect
import math
import numbers
import platform

import torch


def veca_flops(config, height: int, width: int | None = None, num_cores: int | None = None) -> int:
    """FLOPs of one `VecaModel` forward (a multiply-add counts 2) on one image of `height` x `width` (square if width
    is None) with `num_cores` active cores (default: the whole bank). Per layer, with L = N + C tokens: projections
    8 L d^2, attention 4 d (C^2 + 2 N C), SwiGLU MLP 6 L d h. Norms, RoPE and softmax are not counted (a few
    percent)."""
    d, h = config.hidden_size, config.intermediate_size
    num_patches = patch_count(height, width, config.patch_size)
    cores = config.num_cores if num_cores is None else num_cores
    tokens = num_patches + cores
    per_layer = 8 * tokens * d * d + 4 * d * (cores * cores + 2 * num_patches * cores) + 6 * tokens * d * h
    coordinate_heads = (config.num_hidden_layers - 1) * 2 * cores * d * 2
    patch_embedding = 2 * num_patches * d * config.num_channels * config.patch_size**2
    output_projection = 2 * tokens * d * (config.output_projection_size or 0)
    return config.num_hidden_layers * per_layer + coordinate_heads + patch_embedding + output_projection


def active_cores(config, pixel_values, num_cores=None, max_gflops=None, max_ms=None) -> int:
    """The number of active cores for a forward on `pixel_values`: its `num_cores`, else the largest of
    `config.training_budgets` that fits its target (`max_gflops` or `max_ms`) at this image size, else the config's
    default (`default_num_cores` or `default_max_gflops`), else the whole bank."""
    check_one_budget(num_cores=num_cores, max_gflops=max_gflops, max_ms=max_ms)
    if num_cores is None and max_gflops is None and max_ms is None:
        num_cores, max_gflops = config.default_num_cores, config.default_max_gflops
    if max_gflops is not None or max_ms is not None:
        height, width = pixel_values.shape[-2:]
        return cores_for_target(config, height, width, pixel_values, max_gflops, max_ms)
    if num_cores is None:
        return config.num_cores
    if isinstance(num_cores, bool) or not isinstance(num_cores, numbers.Integral):
        raise ValueError(f"num_cores must be an int in 1..{config.num_cores}, got {num_cores!r}.")
    if not 1 <= num_cores <= config.num_cores:
        raise ValueError(
            f"num_cores={num_cores} is out of range: this model's core bank holds {config.num_cores} cores, "
            f"so choose 1..{config.num_cores} (None uses all of them)."
        )
    return int(num_cores)


def cores_for_target(config, height: int, width: int, pixel_values, max_gflops=None, max_ms=None) -> int:
    """The largest of `config.training_budgets` (the core counts nested dropout trained) whose analytic GFLOPs at
    `height` x `width` are at most `max_gflops`, or whose calibrated latency there is at most `max_ms`."""
    check_target(max_gflops=max_gflops, max_ms=max_ms)
    size = f"{height}x{width} px"
    if max_ms is None:
        budgets = sorted(config.training_budgets)
        return largest_fitting_budget(
            budgets, lambda c: veca_flops(config, height, width, num_cores=c) / 1e9, max_gflops, "max_gflops",
            "num_cores", "GFLOPs", size,
        )
    latency = latency_at(config.latency_table, height, width, measurement_setup(pixel_values))
    return largest_fitting_budget(sorted(latency), latency.get, max_ms, "max_ms", "num_cores", "ms", size)


def patch_count(height: int, width: int | None, patch_size: int) -> int:
    """Patches of a `height` x `width` image (square if width is None)."""
    width = height if width is None else width
    return (height // patch_size) * (width // patch_size)


def largest_fitting_budget(budgets, cost, target, target_name: str, budget_name: str, unit: str, size: str):
    """The largest of `budgets` (ascending, with `cost(budget)` never decreasing along them) whose cost is at most
    `target` (checked by `check_target`); a ValueError naming the cheapest budget and its cost when none fits."""
    fitting = bisect.bisect_right(budgets, target, key=cost)
    if fitting == 0:
        cheapest = budgets[0]
        raise ValueError(
            f"{target_name}={target:g} is below the cheapest budget at {size}: {budget_name}={cheapest:g} costs "
            f"{cost(cheapest):.4g} {unit}. Raise {target_name} to at least that, or use smaller images."
        )
    return budgets[fitting - 1]


def latency_at(table: dict | None, height: int, width: int, setup: dict) -> dict:
    """{budget: ms} at `height` x `width` from a latency table (`config.latency_table`): the measurement at that
    size, else linear in pixel count between the two calibrated sizes around it. Sizes outside the calibrated range,
    and a call whose `setup` (`measurement_setup`: device, machine, threads, dtype, batch size) differs from the
    table's, are refused: their latency was not measured."""
    if not table:
        raise ValueError(
            "max_ms needs this model's latency measured on this machine: run "
            "corevision_hf.calibrate_latency(model, sizes=[...]) once (it stores the table in the config and in "
            "config.json beside the weights), or give max_gflops, which needs no measurement."
        )
    differ = [f"{name} {table.get(name)!r}, this call {value!r}"
              for name, value in setup.items() if table.get(name) != value]
    if differ:
        raise ValueError(
            f"The latency table was measured in another setup ({'; '.join(differ)}), so its times do not hold for this "
            "call: run corevision_hf.calibrate_latency(model, sizes=[...], batch_size=...) in this one."
        )
    rows = sorted(table["sizes"], key=lambda row: row["height"] * row["width"])
    pixels = height * width
    below = [row for row in rows if row["height"] * row["width"] <= pixels]
    above = [row for row in rows if row["height"] * row["width"] >= pixels]
    if not below or not above:
        calibrated = ", ".join(f"{row['height']}x{row['width']}" for row in rows)
        raise ValueError(
            f"max_ms at {height}x{width} px: the latency table covers {calibrated} px only, and latency outside that "
            f"range is not extrapolated. Run corevision_hf.calibrate_latency(model, sizes=[({height}, {width}), ...])."
        )
    low, high = below[-1], above[0]
    exact = [row for row in rows if (row["height"], row["width"]) == (height, width)]
    if exact:
        low = high = exact[0]
    low_pixels, high_pixels = low["height"] * low["width"], high["height"] * high["width"]
    weight = 0.0 if high_pixels == low_pixels else (pixels - low_pixels) / (high_pixels - low_pixels)
    low_ms, high_ms = dict(map(tuple, low["ms"])), dict(map(tuple, high["ms"]))
    if not set(low_ms) & set(high_ms):
        raise ValueError(
            f"max_ms at {height}x{width} px: the calibrated sizes around it share no budget. Run "
            "corevision_hf.calibrate_latency(model, sizes=[...]) again with the same budgets for every size."
        )
    latency, slowest = {}, 0.0
    for budget in sorted(set(low_ms) & set(high_ms)):
        # A larger budget never runs faster: a median that did is timing noise, raised to the one before.
        slowest = max(slowest, (1 - weight) * low_ms[budget] + weight * high_ms[budget])
        latency[budget] = slowest
    return latency


def measurement_setup(pixel_values: torch.Tensor) -> dict:
    """What a latency depends on besides the model and the image size, for a call on `pixel_values` (its device,
    dtype and batch size; never its values): {"device", "machine", "threads", "dtype", "batch_size"}. The machine
    is the GPU's name, or the CPU's model; threads count on a CPU only (None elsewhere)."""
    device = pixel_values.device
    return {
        "device": device.type,
        "machine": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "dtype": str(pixel_values.dtype).removeprefix("torch."),
        "batch_size": pixel_values.shape[0],
    }


def cpu_name() -> str:
    """This machine's CPU model as Linux names it in /proc/cpuinfo (its first lines), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "Hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def check_one_budget(**arguments) -> None:
    """Refuses a call that chooses its budget twice: a budget (num_cores, k, k_ratio) and a target (max_gflops,
    max_ms), or both targets."""
    given = [name for name, value in arguments.items() if value is not None]
    if len(given) > 1:  # the message is formatted only here: forward calls this on every call, compiled too
        described = " and ".join(f"{name}={arguments[name]!r}" for name in given)
        raise ValueError(
            f"{described} each choose the budget: give one (a budget, or a target that picks the largest budget that "
            "fits it)."
        )


def check_target(**targets) -> None:
    """Refuses a target that is not a finite number > 0."""
    for name, target in targets.items():
        if target is not None and (isinstance(target, bool) or not isinstance(target, numbers.Real)
                                   or not 0 < target < math.inf):
            raise ValueError(f"{name} must be a finite number > 0 (per image and forward), got {target!r}.")
