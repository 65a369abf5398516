"""Latency per budget on this machine, so that `model(pixel_values, max_ms=...)` can pick a budget:

    corevision_hf.calibrate_latency(model, sizes=[224, 448])   # once per machine; stored in config.json

Forward reads the table from `config.latency_table` (see `budget_veca.latency_at`): at a calibrated size, or linear in
pixel count between two, never outside.
"""

import json
import os
import platform
import tempfile

import torch

from .measure import median_latency_ms


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
    of the local folder the model was loaded from, so that `from_pretrained` of that folder finds it. Returns it."""
    config = model.config
    if config.model_type not in BUDGET_ARGUMENT:
        raise ValueError(f"calibrate_latency takes a VECA or LookWhere model, got a {config.model_type!r} model.")
    argument = BUDGET_ARGUMENT[config.model_type]
    if budgets is None:
        budgets = config.training_budgets if config.model_type == "veca" else LOOKWHERE_K_RATIOS
    if not sizes or not budgets or runs < 1 or batch_size < 1:
        raise ValueError("calibrate_latency needs at least one size and one budget, runs >= 1 and batch_size >= 1.")
    folder = save_to if save_to is not None else config._name_or_path
    if save_to is not None and not os.path.isfile(os.path.join(save_to, "config.json")):
        raise ValueError(f"save_to={str(save_to)!r} holds no config.json: save the model there first "
                         "(model.save_pretrained(save_to)).")
    parameter = next(model.parameters())
    was_training = model.training
    model.eval()
    rows = []
    with torch.inference_mode():
        for size in sizes:
            height, width = (size, size) if isinstance(size, int) else size
            pixel_values = torch.randn(batch_size, config.num_channels, height, width, device=parameter.device,
                                       dtype=parameter.dtype)
            device = parameter.device.type
            times = [
                [budget, median_latency_ms(lambda: model(pixel_values, **{argument: budget}), device, runs, warmup=1)]
                for budget in sorted(budgets)
            ]
            rows.append({"height": height, "width": width, "ms": times})
    model.train(was_training)
    table = {
        "device": parameter.device.type,
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "dtype": str(parameter.dtype).removeprefix("torch."),
        "batch_size": batch_size,
        "budget": argument,
        "sizes": rows,
    }
    config.latency_table = table
    if folder and os.path.isfile(os.path.join(folder, "config.json")):
        write_config_field(os.path.join(folder, "config.json"), "latency_table", table)
    return table


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
