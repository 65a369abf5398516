"""A VECA forward's inputs checked and its budget chosen (`cores_to_keep`), what a budget costs, and the largest core
budget that fits a target in analytic GFLOPs (`max_gflops`).

Hub-copied: imported by modeling_veca.py; imports torch, transformers and the configuration. `corevision_hf.veca_flops`
is this file's function, so cost tables and the budget a target picks use one formula. Choosing a budget is arithmetic
on the image size: it reads no tensor's values and nothing of the machine (a latency target is
`corevision_hf.budget_for_latency`'s).
"""

import bisect
import math
import numbers

import torch
from transformers.utils.generic import TransformersKwargs

from .configuration_veca import VecaConfig


def cores_to_keep(
    config: VecaConfig,
    pixel_values: torch.Tensor,
    pixel_mask: torch.Tensor | None,
    num_cores: int | None,
    max_gflops: float | None,
    kwargs: dict,
) -> int:
    """A forward's inputs checked (`check_inputs`), then its number of active cores (`active_cores`): the prefix of
    the core bank to keep."""
    check_inputs(config, pixel_values, pixel_mask, kwargs, ("num_cores", "max_gflops", "pixel_mask"))
    return active_cores(config, pixel_values.shape[2], pixel_values.shape[3], num_cores, max_gflops)


def veca_flops(config, height: int, width: int | None = None, num_cores: int | None = None) -> int:
    """FLOPs of one `VecaModel` forward (a multiply-add counts 2) on one image of `height` x `width` (square if width
    is None) with `num_cores` active cores (default: the whole bank). Per layer, with L = N + C tokens: projections
    8 L d^2, attention 4 d (C^2 + 2 N C), MLP 6 L d h (SwiGLU: fc1 to 2h) or 4 L d h (`mlp_type="plain"`). Norms,
    RoPE, activations, softmax and absolute positions are not counted (a few percent)."""
    d, h = config.hidden_size, config.intermediate_size
    num_patches = patch_count(height, width, config.patch_size)
    cores = config.num_cores if num_cores is None else num_cores
    tokens = num_patches + cores
    mlp = (6 if config.mlp_type == "swiglu" else 4) * tokens * d * h
    per_layer = 8 * tokens * d * d + 4 * d * (cores * cores + 2 * num_patches * cores) + mlp
    coordinate_heads = (config.num_hidden_layers - 1) * 2 * cores * d * 2
    patch_embedding = 2 * num_patches * d * config.num_channels * config.patch_size**2
    output_projection = 2 * tokens * d * (config.output_projection_size or 0)
    return config.num_hidden_layers * per_layer + coordinate_heads + patch_embedding + output_projection


def active_cores(config, height: int, width: int, num_cores=None, max_gflops=None) -> int:
    """The number of active cores for a forward on `height` x `width` images: its `num_cores`, else the largest of
    `config.training_budgets` whose GFLOPs fit its `max_gflops` at this size, else the config's default
    (`default_num_cores` or `default_max_gflops`), else the whole bank."""
    check_one_budget(num_cores=num_cores, max_gflops=max_gflops)
    if num_cores is None and max_gflops is None:
        num_cores, max_gflops = config.default_num_cores, config.default_max_gflops
    if max_gflops is not None:
        return cores_for_target(config, height, width, max_gflops)
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


# Forward's own arguments travel by name; these are transformers' standard ones (output capture, attention backends).
STANDARD_FORWARD_KWARGS = frozenset(TransformersKwargs.__annotations__) | {"return_dict"}


def check_inputs(
    config: VecaConfig,
    pixel_values: torch.Tensor,
    pixel_mask: torch.Tensor | None,
    kwargs: dict,
    own: tuple[str, ...],
) -> None:
    """What forward needs to fail clearly, from shapes and names only (no host synchronisation): a batch of
    normalised float images with the config's channels and sides in whole patches, a pixel_mask to match, no
    misspelt keyword (`num_core=8` must not silently run the default budget), attention maps only where they are
    formed. The budget is checked where it is chosen (budget file); NaN pixels are the image processor's to refuse."""
    check_keywords(config, kwargs, own)
    check_pixel_values(config, pixel_values, pixel_mask)
    check_pixel_mask(config, pixel_values, pixel_mask)


def check_keywords(config: VecaConfig, kwargs: dict, own: tuple[str, ...]) -> None:
    """No keyword but transformers' standard ones beside the model's `own`, and attention maps only where formed."""
    for name in kwargs:
        if name == "max_ms":  # a latency is this machine's measurement, which the model does not read
            raise ValueError(
                "forward() takes no max_ms: pick the budget that fits a latency outside the model, "
                "model(pixel_values, **corevision_hf.budget_for_latency(model, pixel_values, max_ms))."
            )
        if name not in STANDARD_FORWARD_KWARGS:
            raise ValueError(f"forward() got an unexpected argument {name!r}; this model's own arguments are "
                             f"{', '.join(own)}.")
    attention = config._attn_implementation
    if kwargs.get("output_attentions", config.output_attentions) and attention != "eager":
        raise ValueError(
            f"output_attentions=True needs attention maps, which {attention!r} attention does not compute: load the "
            'model with attn_implementation="eager" (or call model.set_attn_implementation("eager")).'
        )


def check_pixel_values(config: VecaConfig, pixel_values: torch.Tensor, pixel_mask: torch.Tensor | None) -> None:
    """A (batch, channels, height, width) float tensor with values (not meta), the config's channels, sides in whole
    patches."""
    if not isinstance(pixel_values, torch.Tensor) or pixel_values.ndim != 4 or not pixel_values.is_floating_point():
        is_tensor = isinstance(pixel_values, torch.Tensor)
        got = f"{tuple(pixel_values.shape)} {pixel_values.dtype}" if is_tensor else type(pixel_values).__name__
        raise ValueError(
            f"pixel_values must be a floating-point (batch, channels, height, width) tensor of normalised images, got "
            f"{got}: use the model's image processor (pixel_values[None] adds the batch dimension to one image)."
        )
    meta = [name for name, tensor in (("pixel_values", pixel_values), ("pixel_mask", pixel_mask))
            if isinstance(tensor, torch.Tensor) and tensor.is_meta]
    if meta:  # torch's own error names only the devices
        raise ValueError(f"{meta[0]} is on the meta device, which holds shapes but no values: pass a tensor with "
                         "values, on the model's device.")
    batch_size, channels, height, width = pixel_values.shape
    patch = config.patch_size
    if batch_size == 0:
        raise ValueError("pixel_values holds no images (batch size 0); pass at least one image.")
    if channels != config.num_channels:
        raise ValueError(
            f"pixel_values has {channels} channels but the model expects {config.num_channels}; "
            "convert images to RGB (PIL: image.convert('RGB'))."
        )
    if height % patch or width % patch or min(height, width) < patch:
        raise ValueError(
            f"Image size {height}x{width} is not a multiple of the patch size {patch} (one patch at least); resize or "
            f"crop it to {max(patch, height // patch * patch)}x{max(patch, width // patch * patch)}, or use the "
            "model's image processor, which snaps sizes to patch multiples."
        )


def check_pixel_mask(config: VecaConfig, pixel_values: torch.Tensor, pixel_mask: torch.Tensor | None) -> None:
    """A padded batch comes with its mask, of the batch's (batch, height, width), and an attention that takes it."""
    if pixel_mask is None:
        if getattr(pixel_values, "padded_by_processor", False):  # the image processor's mark: no value read
            raise ValueError(
                "pixel_values is a batch the image processor padded to one size (its images differ in size), and no "
                "pixel_mask was passed, so each image's features would include its padding: pass the mask too, "
                "model(**inputs) or model(inputs.pixel_values, pixel_mask=inputs.pixel_mask)."
            )
        return
    batch_size, _, height, width = pixel_values.shape
    if not isinstance(pixel_mask, torch.Tensor) or tuple(pixel_mask.shape) != (batch_size, height, width):
        shape = tuple(pixel_mask.shape) if isinstance(pixel_mask, torch.Tensor) else type(pixel_mask).__name__
        raise ValueError(
            f"pixel_mask has shape {shape} but pixel_values is {tuple(pixel_values.shape)}: pass the (batch, height, "
            f"width) = {(batch_size, height, width)} pixel_mask the image processor returned with these pixel_values."
        )
    attention = config._attn_implementation
    if attention not in ("eager", "sdpa"):  # flash takes no such mask; flex's CPU kernel fails on it
        raise ValueError(
            f"pixel_mask needs eager or sdpa attention, not {attention!r}: load the model with "
            'attn_implementation="sdpa", or run the images of each size as a batch of their own.'
        )


def cores_for_target(config, height: int, width: int, max_gflops: float) -> int:
    """The largest of `config.training_budgets` (the core counts nested dropout trained) whose analytic GFLOPs at
    `height` x `width` are at most `max_gflops`."""
    check_target(max_gflops=max_gflops)
    return largest_fitting_budget(
        sorted(config.training_budgets), lambda c: veca_flops(config, height, width, num_cores=c) / 1e9, max_gflops,
        "max_gflops", "num_cores", "GFLOPs", f"{height}x{width} px",
    )


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


def check_one_budget(**arguments) -> None:
    """Refuses a call that chooses its budget twice: a budget (num_cores, k, k_ratio) and a target (max_gflops)."""
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
