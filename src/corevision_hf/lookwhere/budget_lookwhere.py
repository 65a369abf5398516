"""A LookWhere forward's budget (`num_kept`, `kept_in_images`; per image from the selector map, `kept_for_mass`), what it
costs, and the largest k that fits a target in analytic GFLOPs (`max_gflops`).

Hub-copied: imported by modeling_lookwhere.py; imports torch, transformers and the configuration. A forward's inputs
are checked here (`check_inputs`, a marked copy of VECA's), as VECA's are in its budget file.
`corevision_hf.lookwhere_flops` and `corevision_hf.dense_vit_flops` are this file's functions, so cost tables and the
budget a target picks use one formula. Choosing a fixed budget is arithmetic on the image size, and k_mass's counts
are computed on the device from the selector map: nothing here reads a tensor's values or anything of the machine (a
latency target is `corevision_hf.budget_for_latency`'s).
"""

import bisect
import math
import numbers
from collections.abc import Callable

import torch
from transformers.utils.generic import TransformersKwargs

from .configuration_lookwhere import LookWhereConfig


def dense_vit_flops(
    height: int,
    width: int | None = None,
    *,
    hidden_size: int,
    num_hidden_layers: int,
    intermediate_size: int,
    patch_size: int,
    num_prefix_tokens: int = 1,
    gated_mlp: bool = False,
    num_channels: int = 3,
) -> int:
    """FLOPs of a dense ViT forward (DINOv2 / DINOv3 style, every token attends to every token; a multiply-add counts
    2). Per layer, with L = N + prefix tokens: projections 8 L d^2, attention 4 d L^2, MLP 4 L d h (6 L d h gated)."""
    d = hidden_size
    num_patches = patch_count(height, width, patch_size)
    tokens = num_patches + num_prefix_tokens
    mlp = (6 if gated_mlp else 4) * tokens * d * intermediate_size
    per_layer = 8 * tokens * d * d + 4 * d * tokens * tokens + mlp
    return num_hidden_layers * per_layer + 2 * num_patches * d * num_channels * patch_size**2


def lookwhere_flops(
    config, height: int, width: int | None = None, k: int | None = None, k_ratio: float | None = None
) -> int:
    """FLOPs of one `LookWhereModel` forward: the selector (a `selector_depth`-block ViT on the low-resolution copy,
    plus its map head) and the extractor (a full-depth ViT on 1 + registers + k tokens), their MLPs plain (4 L d h) or
    SwiGLU (`use_swiglu_ffn`: fc1 to 2h, 6 L d h). The dense fill is not counted (a few MFLOPs)."""
    num_patches = patch_count(height, width, config.patch_size)
    if k is None:
        k = kept_for_ratio(config.k_ratio if k_ratio is None else k_ratio, num_patches)
    vit = dict(
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        patch_size=config.patch_size,
        num_prefix_tokens=1 + config.num_register_tokens,
        num_channels=config.num_channels,
        gated_mlp=config.use_swiglu_ffn,
    )
    selector = dense_vit_flops(config.selector_image_size, num_hidden_layers=config.selector_depth, **vit)
    selector_patches = (config.selector_image_size // config.patch_size) ** 2
    d, r, m = config.hidden_size, config.map_head_ratio, config.map_upsampling
    map_head = 2 * selector_patches * (d * r * d + r * d * m * m)
    # The extractor embeds only its k patches: a dense ViT over k "patches" costs exactly that.
    tokens = k + 1 + config.num_register_tokens
    d, h = config.hidden_size, config.intermediate_size
    per_layer = 8 * tokens * d * d + 4 * d * tokens * tokens + (6 if config.use_swiglu_ffn else 4) * tokens * d * h
    extractor = config.num_hidden_layers * per_layer + 2 * k * d * config.num_channels * config.patch_size**2
    return selector + map_head + extractor


def num_kept(config, grid: tuple[int, int], k=None, k_ratio=None, max_gflops=None) -> int:
    """k, the patches a forward keeps per image on a (Hp, Wp) grid, for its `k` or `k_ratio`, or the largest k whose
    GFLOPs fit its `max_gflops`; default: `config.default_k` if set, else `config.default_max_gflops` if set, else
    `config.k_ratio`."""
    height, width = (side * config.patch_size for side in grid)
    num_patches = grid[0] * grid[1]
    check_one_budget(k=k, k_ratio=k_ratio, max_gflops=max_gflops)
    name = "k"
    if k is None and k_ratio is None and max_gflops is None:
        if config.default_k is not None:
            k, name = config.default_k, "config.default_k"
        max_gflops = config.default_max_gflops
    if k is None and max_gflops is not None:
        return kept_for_target(config, height, width, max_gflops)
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, numbers.Integral):
            raise ValueError(f"{name} must be an int in 1..{num_patches}, got {k!r}.")
        if not 1 <= k <= num_patches:
            raise ValueError(
                f"{name}={k} is out of range: a {height}x{width} image has {num_patches} patches, so choose "
                f"1..{num_patches} (or give k_ratio, a fraction of the grid)."
            )
        return int(k)
    if k_ratio is None:
        k_ratio = config.k_ratio
    if isinstance(k_ratio, bool) or not isinstance(k_ratio, numbers.Real) or not 0 < k_ratio <= 1:
        raise ValueError(f"k_ratio must be a number in (0, 1], got {k_ratio!r}.")
    return kept_for_ratio(k_ratio, num_patches)


# k = floor(k_ratio * N), computed in float64 with a relative tolerance, so that a decimal ratio keeps what it says:
# the product 0.29 * 100 is 28.999999999999996, an ulp short of 29. The tolerance is above half a float32 ulp of a
# ratio in (0, 1] (3e-8), so a ratio that went through float32 (0.28999999...) keeps its decimal's k too. export.py's
# graph and web/budget.js compute the same float64 expression, in the same order, and so get the same k.
RATIO_TOLERANCE = 1e-7


def kept_for_ratio(k_ratio: float, num_patches: int) -> int:
    """k for `k_ratio` of `num_patches`: floor(k_ratio * N + 1e-7 * N) clamped to [1, N], i.e. floor(k_ratio * N)
    exact for decimal ratios, in float64 or float32 (0.29 of 100 patches keeps 29, 0.57 keeps 57)."""
    return min(num_patches, max(1, math.floor(k_ratio * num_patches + RATIO_TOLERANCE * num_patches)))


def kept_in_images(config, image_grids: torch.Tensor, k: int, k_ratio, budget_given: bool) -> torch.Tensor:
    """(B,) patches each image of a padded batch keeps, as it would alone: `k_ratio` of its own grid when the call's
    budget is a ratio (given, or `config.k_ratio` by default), else `k` (the padded grid's), at most all of its
    patches. Computed on the device from `image_grids` (B, 2)."""
    patches = image_grids.prod(dim=1)
    if k_ratio is None and not budget_given and config.default_k is None and config.default_max_gflops is None:
        k_ratio = config.k_ratio
    if k_ratio is None:
        return patches.clamp(max=k)
    kept = (patches.double() * k_ratio + RATIO_TOLERANCE * patches.double()).floor().long()  # as kept_for_ratio
    return torch.minimum(kept.clamp(min=1), patches)


def mass_for_call(config, batch_size: int, k=None, k_ratio=None, max_gflops=None, k_mass=None):
    """The `k_mass` a forward keeps patches by (None: a fixed k), checked: the call's, else `config.default_k_mass`
    when the call gives no budget. A number in (0, 1], or a floating-point tensor of shape () or (batch_size,) (one
    mass per image), whose values are checked where forward reads the kept counts; `k` / `k_ratio` may come with it
    (a cap), `max_gflops` may not. Only with eager or sdpa attention."""
    if k_mass is None:
        if k is not None or k_ratio is not None or max_gflops is not None:
            return None
        k_mass = config.default_k_mass
        if k_mass is None:
            return None
    attention = config._attn_implementation
    if attention not in ("eager", "sdpa"):  # flash reads a float mask as 0/1 padding; flex's CPU kernel fails on it
        raise ValueError(
            f"k_mass needs eager or sdpa attention, not {attention!r} (each image's unused slots are masked out of "
            'attention): load the model with attn_implementation="sdpa", or give a fixed k or k_ratio instead.'
        )
    if max_gflops is not None:
        raise ValueError(
            f"k_mass={k_mass!r} and max_gflops={max_gflops!r} each choose the budget: give one (k_mass may come with k "
            "or k_ratio, which cap each image's count)."
        )
    if isinstance(k_mass, torch.Tensor):
        if not k_mass.is_floating_point() or k_mass.shape not in ((), (batch_size,)):
            raise ValueError(
                f"k_mass as a tensor must be floating point of shape () or ({batch_size},) (one mass per image), got "
                f"{tuple(k_mass.shape)} {k_mass.dtype}; or pass a number in (0, 1]."
            )
        return k_mass
    if isinstance(k_mass, bool) or not isinstance(k_mass, numbers.Real) or not 0 < k_mass <= 1:
        raise ValueError(
            f"k_mass must be a number in (0, 1] (the share of the selector's softmax mass each image keeps; 1 keeps "
            f"every patch), got {k_mass!r}."
        )
    return float(k_mass)


def kept_for_mass(selector_map: torch.Tensor, k_mass, cells: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) patches each image keeps for `k_mass`: the fewest of its best-scored cells whose softmax(selector_map)
    mass, over the image's own cells (`cells` (B, N), True on them; default all), reaches `k_mass` (a number, or a
    (B,) / () tensor), at least 1 and at most the image's cells. In float64 on the device: the ONNX graph computes the
    same. `selector_map` (B, N) logits."""
    logits = selector_map.double()
    if cells is not None:
        logits = logits.masked_fill(~cells, float("-inf"))
    ranked = logits.softmax(dim=-1).sort(dim=-1, descending=True).values
    mass = torch.as_tensor(k_mass, dtype=torch.float64, device=logits.device).reshape(-1, 1)
    # The cells ranked before the one whose running mass first reaches k_mass, plus that one.
    kept = (ranked.cumsum(dim=-1) < mass).sum(dim=-1) + 1
    available = torch.full_like(kept, selector_map.shape[1]) if cells is None else cells.sum(dim=-1)
    return torch.minimum(kept, available)


def patch_selection(
    config, batch_size: int, grid: tuple[int, int], image_grids: torch.Tensor | None = None, k=None, k_ratio=None,
    max_gflops=None, k_mass=None,
) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, bool]]:
    """A forward's budget (see `LookWhereModel.forward`), checked before anything runs, as the function that applies it
    to the selector map (B, Hp * Wp) on the (Hp, Wp) `grid`: -> (selected_indices (B, k) row-major, ascending, -1 in
    the slots an image does not use; num_kept (B,); whether some slots may be unused, i.e. need masking).
    `image_grids` (B, 2): each image's own grid in a padded batch (None: all the grid)."""
    k_mass = mass_for_call(config, batch_size, k, k_ratio, max_gflops, k_mass)
    capped = k is not None or k_ratio is not None
    budget_given = capped or max_gflops is not None or k_mass is not None
    slots = num_kept(config, grid, k, k_ratio, max_gflops) if k_mass is None or capped else None

    def select(selector_map: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
        if k_mass is None and image_grids is None:  # one k for the batch
            kept = torch.full((selector_map.shape[0],), slots, dtype=torch.long, device=selector_map.device)
            return selector_map.topk(slots, dim=-1).indices.sort(dim=-1).values, kept, False
        cells = None if image_grids is None else cells_in_images(image_grids, grid)
        if k_mass is None:  # each image's k of its own grid
            kept = kept_in_images(config, image_grids, slots, k_ratio, budget_given)
            return select_in_images(selector_map, slots, kept, cells), kept, True
        # each image's own count for its mass, capped by k / k_ratio (of its own grid) when given
        kept = kept_for_mass(selector_map, k_mass, cells)
        if slots is not None:
            kept = (kept.clamp(max=slots) if image_grids is None
                    else torch.minimum(kept, kept_in_images(config, image_grids, slots, k_ratio, True)))
        return select_in_images(selector_map, slots_for_mass(kept, slots, k_mass), kept, cells), kept, True

    return select


def slots_for_mass(kept: torch.Tensor, cap: int | None, k_mass) -> int:
    """The selection's slots for `k_mass` counts `kept` (B,): the cap when one was given, else the batch's largest
    count, read to the host here (with a tensor `k_mass`, whose range is checked in the same read). The one place a
    forward reads a value back."""
    is_tensor = isinstance(k_mass, torch.Tensor)
    if cap is not None and not is_tensor:
        return cap
    read = kept.max()[None]
    if is_tensor:
        read = torch.cat([read, ((k_mass > 0) & (k_mass <= 1)).all().long()[None].to(read.device)])
    values = read.tolist()
    if is_tensor and not values[1]:
        raise ValueError("k_mass must lie in (0, 1] for every image (the share of the selector's softmax mass kept; "
                         "1 keeps every patch): one of the given masses is outside it, or NaN.")
    return cap if cap is not None else values[0]


def select_in_images(
    selector_map: torch.Tensor, k: int, kept: torch.Tensor, cells: torch.Tensor | None
) -> torch.Tensor:
    """The top-`kept[b]` cells of each image of a padded batch by selector score, never a padding cell: (B, k)
    row-major indices, ascending, then -1 in the slots past an image's own count. `selector_map` (B, N), `k` the
    slots (at least every `kept`), `kept` (B,) and `cells` (B, N), True on each image's own cells (None: all)."""
    num_cells = selector_map.shape[1]
    if cells is not None:
        selector_map = selector_map.masked_fill(~cells, float("-inf"))
    ranked = selector_map.topk(k, dim=-1).indices  # best first
    used = torch.arange(k, device=kept.device) < kept[:, None]
    ordered = torch.where(used, ranked, ranked + num_cells).sort(dim=-1).values  # unused slots sort last
    return torch.where(ordered < num_cells, ordered, -1)


# Copied from corevision_hf.veca.modeling_veca.cells_in_images
def cells_in_images(image_grids: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(B, Hp * Wp) bool, row-major on the padded grid: whether each cell lies in its image's own (rows, columns)."""
    rows = torch.arange(grid[0], device=image_grids.device) < image_grids[:, :1]  # (B, Hp)
    columns = torch.arange(grid[1], device=image_grids.device) < image_grids[:, 1:]  # (B, Wp)
    return (rows[:, :, None] & columns[:, None, :]).flatten(1)



def kept_for_target(config, height: int, width: int, max_gflops: float) -> int:
    """The largest k in 1..Hp * Wp whose analytic GFLOPs at `height` x `width` are at most `max_gflops`."""
    check_target(max_gflops=max_gflops)
    num_patches = patch_count(height, width, config.patch_size)
    return largest_fitting_budget(
        range(1, num_patches + 1), lambda k: lookwhere_flops(config, height, width, k=k) / 1e9, max_gflops,
        "max_gflops", "k", "GFLOPs", f"{height}x{width} px",
    )


# Copied from corevision_hf.veca.budget_veca.patch_count
def patch_count(height: int, width: int | None, patch_size: int) -> int:
    """Patches of a `height` x `width` image (square if width is None)."""
    width = height if width is None else width
    return (height // patch_size) * (width // patch_size)


# Copied from corevision_hf.veca.budget_veca.largest_fitting_budget
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


# Copied from corevision_hf.veca.budget_veca.check_one_budget
def check_one_budget(**arguments) -> None:
    """Refuses a call that chooses its budget twice: a budget (num_cores, k, k_ratio) and a target (max_gflops)."""
    given = [name for name, value in arguments.items() if value is not None]
    if len(given) > 1:  # the message is formatted only here: forward calls this on every call, compiled too
        described = " and ".join(f"{name}={arguments[name]!r}" for name in given)
        raise ValueError(
            f"{described} each choose the budget: give one (a budget, or a target that picks the largest budget that "
            "fits it)."
        )


# Copied from corevision_hf.veca.budget_veca.check_target
def check_target(**targets) -> None:
    """Refuses a target that is not a finite number > 0."""
    for name, target in targets.items():
        if target is not None and (isinstance(target, bool) or not isinstance(target, numbers.Real)
                                   or not 0 < target < math.inf):
            raise ValueError(f"{name} must be a finite number > 0 (per image and forward), got {target!r}.")


# Forward's own arguments travel by name; these are transformers' standard ones (output capture, attention backends).
STANDARD_FORWARD_KWARGS = frozenset(TransformersKwargs.__annotations__) | {"return_dict"}


# Copied from corevision_hf.veca.budget_veca.check_inputs with Veca->LookWhere
def check_inputs(
    config: LookWhereConfig,
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


# Copied from corevision_hf.veca.budget_veca.check_keywords with Veca->LookWhere
def check_keywords(config: LookWhereConfig, kwargs: dict, own: tuple[str, ...]) -> None:
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


# Copied from corevision_hf.veca.budget_veca.check_pixel_values with Veca->LookWhere
def check_pixel_values(config: LookWhereConfig, pixel_values: torch.Tensor, pixel_mask: torch.Tensor | None) -> None:
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


# Copied from corevision_hf.veca.budget_veca.check_pixel_mask with Veca->LookWhere
def check_pixel_mask(config: LookWhereConfig, pixel_values: torch.Tensor, pixel_mask: torch.Tensor | None) -> None:
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
