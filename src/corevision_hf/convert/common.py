"""What every converter of the authors' checkpoints shares: safe loading, output-folder checks, saving."""

import os
import pickle

import torch
from transformers import initialization as init

WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # added by DDP / torch.compile


def load_tensor_checkpoint(path: str, layout_hint: str):
    """`torch.load(path, weights_only=True)`: tensors and plain containers only, never code."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Reference checkpoint {path!r} does not exist (or is not a file).")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError, EOFError) as error:
        # Unpickling arbitrary objects runs whatever code the file names, so weights_only refusals are final.
        raise ValueError(
            f"{path!r} is not a plain tensor checkpoint and will not be unpickled (that could run code from the "
            f"file). Re-save only the weights in a trusted environment, {layout_hint}. "
            f"torch.load said: {str(error).strip().splitlines()[0]}"
        ) from error


def strip_wrapper_prefixes(state_dict: dict) -> dict:
    stripped = {}
    for key, value in state_dict.items():
        while key.startswith(WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        stripped[key] = value
    return stripped


def check_out_dir(out_dir: str, force: bool) -> None:
    """A user's folder is never written into unasked: it must be new or empty, unless `force`."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"{out_dir!r} exists and is not a folder.")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not force:
        raise ValueError(f"{out_dir!r} exists and is not empty; pass --force to write into it anyway.")


def save_converted(model_class, config, state_dict: dict, out_dir: str):
    """Builds `model_class(config)` without random init (every weight is overwritten), loads `state_dict` strictly
    and writes the hub folder (weights, config, code files, preprocessor config)."""
    with init.no_init_weights():
        model = model_class(config)
    model.load_state_dict(state_dict, strict=True)
    model.save_pretrained(out_dir)
    return model


def expected_state_dict(model_class, config) -> dict:
    """Names and shapes of `model_class(config)`'s weights, built on the meta device (no memory, no init)."""
    with torch.device("meta"), init.no_init_weights():
        return model_class(config).state_dict()
