"""Latency per budget on this machine, so that `model(pixel_values, max_ms=...)` can pick a budget:

    corevision_hf.calibrate_latency(model, sizes=[224, 448])   # once per machine; stored in config.json

Forward reads the table from `config.latency_table` (see `budget_veca.latency_at`): at a calibrated size, or linear in
pixel count between two, never outside, and only in the setup it was measured in (device, machine, threads, dtype,
batch size: `budget_veca.measurement_setup`).
"""

import json
import numbers
import os
import stat
import tempfile
import warnings

import torch

from .images import check_pixels_fit
from .measure import median_latency_ms
from .outputs import is_ours, read_manifest, record
from .veca.budget_veca import measurement_setup


# LookWhere's budgets for max_ms: fractions of the grid, so that one table serves every image size.
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
        warnings.warn(f"calibrate_latency: {shown}. The machine was probably busy, so max_ms would pick from noise: "
                      "calibrate again on an idle machine (this table is stored as measured).", stacklevel=2)
    table = {**measurement_setup(pixel_values), "budget": argument, "sizes": rows}
    config.latency_table = table
    if path and os.path.isfile(path):
        ours = is_ours(folder, "config.json", read_manifest(folder))
        write_config_field(path, "latency_table", table)
        if ours:  # a converted folder: its manifest lists the new config.json, so --force may still replace it
            record(folder, ["config.json"], keep=True)
    return table


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
