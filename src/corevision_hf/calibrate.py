"""Latency per budget on this machine, and the largest budget that fits a latency target:

    corevision_hf.calibrate_latency(model, sizes=[224, 448])   # once per machine; stored in config.json
    outputs = model(pixel_values, **corevision_hf.budget_for_latency(model, pixel_values, max_ms=50))

The hub files read nothing of the machine: the table is plain data in config.json (`latency_table`), written, checked
and read here only. `budget_for_latency` reads it at a calibrated size, or linear in pixel count between two, never
outside, and only in the setup it was measured in (device, machine, threads, dtype, batch size: `measurement_setup`).
"""

import json
import numbers
import os
import platform
import stat
import tempfile
import warnings

import torch

from .images import check_pixels_fit
from .measure import median_latency_ms
from .outputs import is_ours, read_manifest, record
from .veca.budget_veca import check_target, largest_fitting_budget


# LookWhere's budgets for a latency target: fractions of the grid, so that one table serves every image size.
LOOKWHERE_K_RATIOS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
BUDGET_ARGUMENT = {"veca": "num_cores", "lookwhere": "k_ratio"}


def calibrate_latency(
    model: torch.nn.Module,
    sizes: list,
    budgets: list | None = None,
    runs: int = 5,
    batch_size: int = 1,
    save_to: str | os.PathLike | None = None,
) -> dict:
    """Times `model` on random images of each size (ints for squares, or (height, width)) at each budget: one
    warm-up, then the median of `runs` forwards, in milliseconds, on the model's device and dtype, in inference mode.
    `budgets` are VECA core counts (default `config.training_budgets`) or LookWhere k_ratios (default
    `LOOKWHERE_K_RATIOS`). The table goes to `model.config.latency_table`, and into the `config.json` of `save_to`, or
    of the local folder the model was loaded from, so that `from_pretrained` of that folder finds it (a read-only
    config.json is refused before any timing; a folder this package converted keeps its manifest true). Returns it."""
    config = model.config
    if config.model_type not in BUDGET_ARGUMENT:
        raise ValueError(f"calibrate_latency takes a VECA or LookWhere model, got a {config.model_type!r} model.")
    argument = BUDGET_ARGUMENT[config.model_type]
    if budgets is None:
        budgets = config.training_budgets if config.model_type == "veca" else LOOKWHERE_K_RATIOS
    if not budgets or not whole(runs) or not whole(batch_size):
        raise ValueError("calibrate_latency needs at least one budget, runs >= 1 and batch_size >= 1.")
    parameter = next(model.parameters())
    shapes = image_shapes(sizes, config.patch_size)
    for height, width in shapes:
        check_pixels_fit(height, width, batch_size, f"sizes {height}x{width}", parameter.device)
    folder = save_to if save_to is not None else config._name_or_path
    if save_to is not None and not os.path.isfile(os.path.join(save_to, "config.json")):
        raise ValueError(f"save_to={str(save_to)!r} holds no config.json: save the model there first "
                         "(model.save_pretrained(save_to)).")
    path = os.path.join(folder, "config.json") if folder else None
    if path and os.path.isfile(path) and not (os.stat(path).st_mode & stat.S_IWUSR and os.access(path, os.W_OK)):
        raise ValueError(f"{path} is read-only, so the table could not be stored there: make it writable, or pass "
                         "save_to= a folder of your own (model.save_pretrained(folder) first).")
    was_training = model.training
    model.eval()
    rows = []
    with torch.inference_mode():
        for height, width in shapes:
            pixel_values = torch.randn(batch_size, config.num_channels, height, width, device=parameter.device,
                                       dtype=parameter.dtype)
            device = parameter.device.type
            times = [
                [budget, median_latency_ms(lambda: model(pixel_values, **{argument: budget}), device, runs, warmup=1)]
                for budget in sorted(budgets)
            ]
            rows.append({"height": height, "width": width, "ms": times})
    model.train(was_training)
    if problems := not_monotone(rows, argument):  # as evaluate_budgets' latency warnings: a busy machine, usually
        shown = "; ".join(problems[:3]) + (f" and {len(problems) - 3} more" if len(problems) > 3 else "")
        warnings.warn(f"calibrate_latency: {shown}. The machine was probably busy, so budget_for_latency would pick "
                      "from noise: calibrate again on an idle machine (this table is stored as measured).",
                      stacklevel=2)
    table = {**measurement_setup(parameter.device, parameter.dtype, batch_size), "budget": argument, "sizes": rows}
    config.latency_table = table  # a plain field: config.json keeps it, the hub files never read it
    if path and os.path.isfile(path):
        ours = is_ours(folder, "config.json", read_manifest(folder))
        write_config_field(path, "latency_table", table)
        if ours:  # a converted folder: its manifest lists the new config.json, so --force may still replace it
            record(folder, ["config.json"], keep=True)
    return table


def budget_for_latency(model: torch.nn.Module, pixel_values_or_size, max_ms: float) -> dict:
    """The budget keyword for a forward that fits `max_ms` milliseconds on this machine: {"num_cores": c} for VECA,
    {"k_ratio": r} for LookWhere, the largest calibrated budget whose latency in `model.config.latency_table`
    (`calibrate_latency`) at this image size is at most `max_ms`. `pixel_values_or_size` is the call's
    (B, C, H, W) tensor, or a (height, width) pair for one image on the model's device in its dtype (a pipeline's
    image as its processor sizes it). Pass the result on: `model(pixel_values, **budget_for_latency(model,
    pixel_values, 50))`. A ValueError when the model has no table, the table was measured in another setup or does
    not cover this size, or no budget fits."""
    config = model.config
    if config.model_type not in BUDGET_ARGUMENT:
        raise ValueError(f"budget_for_latency takes a VECA or LookWhere model, got a {config.model_type!r} model.")
    check_target(max_ms=max_ms)
    if isinstance(pixel_values_or_size, torch.Tensor):
        pixel_values = pixel_values_or_size
        if pixel_values.ndim != 4:
            raise ValueError(f"budget_for_latency takes (batch, channels, height, width) pixel_values or a (height, "
                             f"width) pair, got a tensor of shape {tuple(pixel_values.shape)}.")
        height, width = pixel_values.shape[-2:]
        setup = measurement_setup(pixel_values.device, pixel_values.dtype, pixel_values.shape[0])
    else:
        [(height, width)] = image_shapes([pixel_values_or_size], config.patch_size)
        parameter = next(model.parameters())
        setup = measurement_setup(parameter.device, parameter.dtype, 1)
    argument = BUDGET_ARGUMENT[config.model_type]
    table = getattr(config, "latency_table", None)
    if table is None:
        raise ValueError(
            "budget_for_latency needs this model's latency measured on this machine: run "
            "corevision_hf.calibrate_latency(model, sizes=[...]) once (it stores the table in the config and in "
            "config.json beside the weights), or give max_gflops, which needs no measurement."
        )
    check_latency_table(table, argument, config.num_cores if argument == "num_cores" else 1)
    latency = latency_at(table, height, width, setup)
    budget = largest_fitting_budget(sorted(latency), latency.get, max_ms, "max_ms", argument, "ms",
                                    f"{height}x{width} px")
    return {argument: budget}


def latency_at(table: dict, height: int, width: int, setup: dict) -> dict:
    """{budget: ms} at `height` x `width` from a latency table: the measurement at that size, else linear in pixel
    count between the two calibrated sizes around it. Sizes outside the calibrated range, and a call whose `setup`
    (`measurement_setup`) differs from the table's, are refused: their latency was not measured."""
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


def measurement_setup(device: torch.device, dtype: torch.dtype, batch_size: int) -> dict:
    """What a latency depends on besides the model and the image size: {"device", "machine", "threads", "dtype",
    "batch_size"}. The machine is the GPU's name, or the CPU's model; threads count on a CPU only (None elsewhere)."""
    device = torch.device(device)
    return {
        "device": device.type,
        "machine": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "dtype": str(dtype).removeprefix("torch."),
        "batch_size": int(batch_size),
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


def check_latency_table(table, budget: str, largest: int) -> None:
    """`table` is what `calibrate_latency` writes: the setup it was measured in (device, machine, threads, dtype, batch
    size), the budget it times (`budget`: "num_cores", each in 1..`largest`, or "k_ratio", each in (0, 1]) and, per
    image size, [budget, ms > 0] pairs; a ValueError names the first entry that is not."""

    def refuse(where: str, value, expected: str):
        raise ValueError(
            f"latency_table{where} is {value!r}, not {expected}. The table is what "
            "corevision_hf.calibrate_latency(model, sizes=[...]) writes: run it again rather than editing the table."
        )

    def positive(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")

    if not isinstance(table, dict):
        refuse("", table, "a dict")
    for name in ("device", "machine", "dtype"):
        if not isinstance(table.get(name), str) or not table[name]:
            refuse(f"[{name!r}]", table.get(name), "a name")
    if not whole(table.get("batch_size")):
        refuse("['batch_size']", table.get("batch_size"), "a whole number >= 1")
    if not (table.get("threads") is None if table["device"] != "cpu" else whole(table.get("threads"))):
        refuse("['threads']", table.get("threads"), "the CPU threads (None off the CPU)")
    if table.get("budget") != budget:
        refuse("['budget']", table.get("budget"), repr(budget))
    fits = (lambda b: whole(b) and b <= largest) if budget == "num_cores" else (lambda b: positive(b) and b <= 1)
    sizes = table.get("sizes")
    if not isinstance(sizes, list) or not sizes:
        refuse("['sizes']", sizes, "a non-empty list of sizes")
    for i, row in enumerate(sizes):
        if not isinstance(row, dict):
            refuse(f"['sizes'][{i}]", row, "a dict")
        for side in ("height", "width"):
            if not whole(row.get(side)):
                refuse(f"['sizes'][{i}][{side!r}]", row.get(side), "a whole number of pixels >= 1")
        times = row.get("ms")
        if not isinstance(times, list) or not times:
            refuse(f"['sizes'][{i}]['ms']", times, "a non-empty list of [budget, ms]")
        for j, pair in enumerate(times):
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and fits(pair[0]) and positive(pair[1])):
                refuse(f"['sizes'][{i}]['ms'][{j}]", pair, f"[{budget}, milliseconds > 0]")


def not_monotone(rows: list[dict], argument: str) -> list[str]:
    """One line for each larger budget that came out faster than the next smaller one at a size, and each larger
    size (in pixels) that came out faster than the next smaller one at a budget, of the table's `rows`."""
    found = []
    for row in rows:
        for (low, fast), (high, slow) in zip(row["ms"], row["ms"][1:]):
            if slow < fast:
                found.append(f"{argument}={high} came out faster than {argument}={low} at {row['height']}x"
                             f"{row['width']} px ({slow:.3g} ms < {fast:.3g} ms)")
    by_pixels = sorted(rows, key=lambda row: row["height"] * row["width"])
    for smaller, larger in zip(by_pixels, by_pixels[1:]):
        for (budget, small_ms), (_, large_ms) in zip(smaller["ms"], larger["ms"]):
            if large_ms < small_ms:
                found.append(f"{larger['height']}x{larger['width']} px came out faster than {smaller['height']}x"
                             f"{smaller['width']} px at {argument}={budget} ({large_ms:.3g} ms < {small_ms:.3g} ms)")
    return found


def whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def image_shapes(sizes, patch_size: int) -> list[tuple[int, int]]:
    """`sizes` (a list of ints for squares or (height, width) pairs) as (height, width) pairs, each side a positive
    multiple of the patch size; a ValueError naming the first that is not."""
    if not isinstance(sizes, (list, tuple)) or not sizes:
        raise ValueError(f"sizes must be a non-empty list of image sizes (ints or (height, width) pairs), got "
                         f"{sizes!r}.")
    shapes = []
    for size in sizes:
        shape = (size, size) if not isinstance(size, (list, tuple)) else tuple(size)
        if len(shape) != 2 or not all(whole(side) and side % patch_size == 0 for side in shape):
            raise ValueError(f"sizes: {size!r} is not a size in pixels: give an int or a (height, width) pair of "
                             f"positive multiples of the patch size {patch_size}.")
        shapes.append((int(shape[0]), int(shape[1])))
    return shapes


def write_config_field(path: str, name: str, value) -> None:
    """Sets one field of a config.json, the rest as it was, through a temporary file and a rename (never half
    written)."""
    with open(path) as f:
        fields = json.load(f)
    fields[name] = value
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".json.tmp")
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(fields, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(temporary, os.stat(path).st_mode & 0o777)  # mkstemp makes it private; keep the file's own mode
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
