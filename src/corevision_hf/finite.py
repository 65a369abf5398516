"""Opt-in checks of values around a model's forward (NaN / infinity, hand-built pixel masks), for tensors that do not
come through the image processor.

The image processor refuses non-finite and wrongly scaled images where the data enters. A tensor passed straight to
`model(pixel_values)` is not checked by the model: reading its values would make the device wait for the host in
every call. `check_forward_finite(model)` adds that check, and one of the outputs, as forward hooks:

    model = check_forward_finite(AutoModel.from_pretrained(...))
    model(pixel_values)   # a ValueError for NaN / inf pixels, or for NaN / inf outputs (a float16 overflow, say)

`extract` and `visualize` run their models with it; `compare` and `evaluate_budgets`, which time their forwards,
check the outputs they keep with `check_output_finite` instead, outside the timed calls.

`check_forward_mask(model)` does the same for a `pixel_mask` built by hand: the models read only where each image's
1s end in its first row and column, and any nonzero value as 1, so an all-0 mask (read as its top-left patch), 1s
that are not one rectangle at the top left, or a soft mask of 0.5s would pass without a word:

    model = check_forward_mask(AutoModel.from_pretrained(...))
    model(pixel_values, pixel_mask=pixel_mask)   # a ValueError naming the first problem of the mask
"""

import torch
from torch import nn


def check_forward_finite(model: nn.Module) -> nn.Module:
    """Registers forward hooks on `model` (any module whose forward takes the pixel values first or as
    `pixel_values`): a ValueError when the pixel values hold NaN or infinity, or when a floating-point output tensor
    does. Each check reads the values on the host, a synchronisation per call. Returns `model`."""
    name = type(model).__name__

    def check_input(module, args, kwargs):
        pixel_values = args[0] if args else kwargs.get("pixel_values")
        if torch.is_tensor(pixel_values) and pixel_values.is_floating_point() and not pixel_values.isfinite().all():
            raise ValueError(f"The pixel values passed to {name} hold NaN or infinite values; check how they were "
                             "computed (the image processor refuses such images).")

    def check_output(module, args, kwargs, output):
        if isinstance(output, dict):  # a ModelOutput
            fields = output.items()
        else:
            fields = enumerate(output if isinstance(output, tuple) else (output,))
        for field, value in fields:
            check_output_finite(value, f"{name}'s output {field}")

    model.register_forward_pre_hook(check_input, with_kwargs=True)
    model.register_forward_hook(check_output, with_kwargs=True)
    return model


def check_forward_mask(model: nn.Module) -> nn.Module:
    """Registers a forward pre-hook on `model` (a VECA or LookWhere model or head) that passes each `pixel_mask`
    keyword to `check_pixel_mask` with the model's patch size: a ValueError naming the first problem. Reads the mask on
    the host, a synchronisation per call. Returns `model`."""
    patch_size = model.config.patch_size

    def check_mask(module, args, kwargs):
        pixel_mask = kwargs.get("pixel_mask")
        if torch.is_tensor(pixel_mask) and pixel_mask.ndim == 3:  # other shapes: forward's own error
            check_pixel_mask(pixel_mask, patch_size)

    model.register_forward_pre_hook(check_mask, with_kwargs=True)
    return model


def check_pixel_mask(pixel_mask: torch.Tensor, patch_size: int) -> None:
    """A ValueError naming the first problem of a (B, H, W) `pixel_mask` that the models would misread: a value other
    than 0 and 1, an image without a pixel of 1s, 1s that are not one rectangle at the top left (the image; its padding
    lies below and to the right) or a rectangle that is not whole `patch_size` px patches."""
    fix = "pass the pixel_mask the image processor returned with these pixel values."
    if pixel_mask.dtype != torch.bool:
        odd = (pixel_mask != 0) & (pixel_mask != 1)
        if odd.any():
            raise ValueError(f"pixel_mask holds the value {pixel_mask[odd][0].item():g}; a mask is 1 on each image and "
                             f"0 on its padding: {fix}")
    inside = pixel_mask != 0
    rows, columns = inside[:, :, 0].sum(dim=1).tolist(), inside[:, 0, :].sum(dim=1).tolist()
    height, width = pixel_mask.shape[-2:]
    for index, image in enumerate(inside):
        if not image.any():
            raise ValueError(f"pixel_mask of image {index} is all 0 (no pixel of the image), which the models "
                             f"read as its top-left patch: {fix}")
        rectangle = ((torch.arange(height, device=image.device) < rows[index])[:, None]
                     & (torch.arange(width, device=image.device) < columns[index])[None, :])
        if not torch.equal(image, rectangle):
            raise ValueError(f"pixel_mask of image {index} is not one rectangle of 1s at the top left (the image) with "
                             f"0s below and to the right (its padding), the only layout the models read: {fix}")
        if rows[index] % patch_size or columns[index] % patch_size:
            raise ValueError(f"pixel_mask of image {index} covers {rows[index]}x{columns[index]} px, not whole "
                             f"{patch_size} px patches: {fix}")


def check_output_finite(value, what: str) -> None:
    """A ValueError when `value`, a model output (`what` names it), is a floating-point tensor holding NaN or
    infinity; anything else passes."""
    if torch.is_tensor(value) and value.is_floating_point() and not value.isfinite().all():
        cause = ("float16 overflowed: run in float32 or bfloat16" if value.dtype == torch.float16 else
                 "the pixel values lie far outside an image's range, or the weights are corrupt")
        raise ValueError(f"{what} holds NaN or infinite values from finite pixels: {cause}.")


__all__ = ["check_forward_finite", "check_forward_mask", "check_output_finite", "check_pixel_mask"]
