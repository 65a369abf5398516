"""Opt-in NaN / infinity checks around a model's forward, for tensors that do not come through the image processor.

The image processor refuses non-finite and wrongly scaled images where the data enters. A tensor passed straight to
`model(pixel_values)` is not checked by the model: reading its values would make the device wait for the host in
every call. `check_forward_finite(model)` adds that check, and one of the outputs, as forward hooks:

    model = check_forward_finite(AutoModel.from_pretrained(...))
    model(pixel_values)   # a ValueError for NaN / inf pixels, or for NaN / inf outputs (a float16 overflow, say)

`extract` and `visualize` run their models with it; `compare` and `evaluate_budgets`, which time their forwards,
check the outputs they keep with `check_output_finite` instead, outside the timed calls.
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


def check_output_finite(value, what: str) -> None:
    """A ValueError when `value`, a model output (`what` names it), is a floating-point tensor holding NaN or
    infinity; anything else passes."""
    if torch.is_tensor(value) and value.is_floating_point() and not value.isfinite().all():
        cause = ("float16 overflowed: run in float32 or bfloat16" if value.dtype == torch.float16 else
                 "the pixel values lie far outside an image's range, or the weights are corrupt")
        raise ValueError(f"{what} holds NaN or infinite values from finite pixels: {cause}.")


__all__ = ["check_forward_finite", "check_output_finite"]
