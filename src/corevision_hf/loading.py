"""What `from_pretrained` loads without a word: NaN or infinite weights (every output would be NaN), and weights
stored as integers where the model's are floating point (transformers casts them to float). The hub files hold the
model only, so the check lives here, and every command of the package loads with `load_checked`:

    model = load_checked(VecaModel, folder)   # from_pretrained, then check_loaded_weights
    check_loaded_weights(model, folder)       # after your own from_pretrained: a ValueError naming the first bad tensor

The checkpoint's dtypes are read from the headers of its safetensors files (what `save_pretrained` writes), not from
the loaded model, which holds the cast values; no tensor is read twice.
"""

import json
import os

import torch
from safetensors import safe_open
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, cached_file


def load_checked(model_class, name_or_path, **kwargs):
    """`model_class.from_pretrained(name_or_path, **kwargs)`, then `check_loaded_weights`: how every command of the
    package loads a checkpoint (a class such as `AutoModel` or `VecaModel`)."""
    model = model_class.from_pretrained(name_or_path, **kwargs)
    hub_kwargs = {key: kwargs[key] for key in ("subfolder", "revision", "cache_dir", "token") if key in kwargs}
    check_loaded_weights(model, name_or_path, **hub_kwargs)
    return model


def check_loaded_weights(model: torch.nn.Module, source, **hub_kwargs) -> None:
    """A ValueError naming the first weight of `model`, just loaded from `source` (a folder or hub id; `hub_kwargs`
    such as `subfolder` or `revision` as given to `from_pretrained`), that the checkpoint stores as integers where the
    model's is floating point, else the first floating-point parameter or buffer holding NaN or infinity."""
    floating = {name for name, tensor in [*model.named_parameters(), *model.named_buffers()]
                if tensor.is_floating_point()}
    prefix = getattr(model, "base_model_prefix", "") + "."
    for name, dtype in checkpoint_dtypes(source, **hub_kwargs):
        if not dtype.startswith(("F", "BF")) and {name, prefix + name, name.removeprefix(prefix)} & floating:
            raise ValueError(
                f"The weight {name} is stored as {dtype} in the checkpoint {str(source)!r}, not as floating point (a "
                "quantised or corrupt checkpoint), and would load cast to float: load a floating-point checkpoint."
            )
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and tensor.device.type != "meta" and not torch.isfinite(tensor).all():
            raise ValueError(
                f"{name} holds NaN or infinite values: the checkpoint {str(source)!r} is corrupt (or was saved after "
                "training diverged). Load an earlier checkpoint whose weights are finite."
            )


def checkpoint_dtypes(source, **hub_kwargs) -> list[tuple[str, str]]:
    """(name, safetensors dtype such as "F32" or "I32") of every tensor in the safetensors weights of `source`, one
    file or the shards its index names, from the files' headers; [] when it has none (a local or cached copy only:
    `from_pretrained` has just fetched them)."""
    options = {**hub_kwargs, "local_files_only": True, "_raise_exceptions_for_missing_entries": False}
    index = cached_file(str(source), SAFE_WEIGHTS_INDEX_NAME, **options)
    if index is not None:
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(os.path.dirname(index), name) for name in names]
    else:
        single = cached_file(str(source), SAFE_WEIGHTS_NAME, **options)
        files = [single] if single is not None else []
    found = []
    for path in files:
        with safe_open(path, "pt") as f:  # reads the header only: a slice's dtype needs none of its data
            found += [(name, f.get_slice(name).get_dtype()) for name in f.keys()]
    return found


__all__ = ["check_loaded_weights", "load_checked"]
