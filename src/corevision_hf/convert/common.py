"""What every converter of the authors' checkpoints shares: safe loading, output-folder checks, saving."""

import os
import shutil
import tempfile

import torch
from transformers import initialization as init

from corevision_hf.atomic import follow_umask
from corevision_hf.outputs import (
    MANIFEST,
    check_folder_output,
    files_under,
    is_ours,
    read_manifest,
    record,
    refuse_overlap,
)
from corevision_hf.saving import save_model_folder

WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # added by DDP / torch.compile


def load_tensor_checkpoint(path: str, layout_hint: str):
    """`torch.load(path, weights_only=True)`: tensors and plain containers only, never code. Every failure is a
    ValueError (FileNotFoundError for a missing file) that says what is wrong with the file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Reference checkpoint {path!r} does not exist (or is not a file).")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load raises many types (UnpicklingError, RuntimeError, KeyError, ...)
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if "weights only load failed" in str(error).lower():
            # Unpickling arbitrary objects runs whatever code the file names, so weights_only refusals are final.
            raise ValueError(
                f"{path!r} is not a plain tensor checkpoint and will not be unpickled (that could run code from the "
                f"file). Re-save only the weights in a trusted environment, {layout_hint}."
            ) from None
        raise ValueError(
            f"{path!r} cannot be read as a PyTorch checkpoint: it is truncated, corrupted or not a .pt file "
            f"(torch.load said: {first_line[:200]}). Download or copy it again."
        ) from None


def strip_wrapper_prefixes(state_dict: dict, prefixes: tuple[str, ...] = WRAPPER_PREFIXES) -> dict:
    stripped = {}
    for key, value in state_dict.items():
        while key.startswith(prefixes):
            key = key.split(".", 1)[1]
        stripped[key] = value
    return stripped


def check_out_dir(out_dir: str, force: bool, *inputs: str) -> None:
    """A user's folder is never written into unasked: it must be new or empty, unless `force` (which then replaces
    only files this package wrote: see `write_folder_atomically`), and it must not be, lie inside or hold one of
    `inputs`."""
    refuse_overlap(out_dir, *inputs)
    check_folder_output(out_dir, force, replaced=[])


def write_folder_atomically(out_dir: str, write) -> None:
    """Calls `write(folder)` on a temporary folder next to `out_dir` and moves the result into place only when it
    is complete, so a failure leaves nothing behind; the folder's manifest lists what was written. Into a non-empty
    `out_dir` (the caller's `--force`), files are moved one by one and only replace files of ours (a user's file of
    the same name stops the run before anything moves); ours that this write no longer makes are removed, the
    user's other files stay."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".converting-", dir=parent)
    follow_umask(staging)  # it becomes out_dir
    try:
        write(staging)
        names = files_under(staging)
        record(staging, names)
        if os.path.isdir(out_dir) and not os.listdir(out_dir):
            os.rmdir(out_dir)
        if not os.path.exists(out_dir):
            os.rename(staging, out_dir)
            return
        check_folder_output(out_dir, True, replaced=names)
        manifest = read_manifest(out_dir)
        for name in manifest:
            if name not in names and is_ours(out_dir, name, manifest):  # ours from before that this write lacks
                os.remove(os.path.join(out_dir, name))
        for name in [*names, MANIFEST]:
            os.makedirs(os.path.dirname(os.path.join(out_dir, name)), exist_ok=True)
            os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_finite(checkpoint: dict, source: str, prefix: str = "") -> None:
    """A ValueError naming the first tensor of `checkpoint` (a state dict, or nested dicts of them) that holds NaN
    or infinity: such weights make every output NaN, so `source` is refused rather than converted."""
    for name, value in checkpoint.items():
        if isinstance(value, dict):
            check_finite(value, source, f"{prefix}{name}.")
        elif torch.is_tensor(value) and (value.is_floating_point() or value.is_complex()):
            finite = torch.isfinite(value)
            if not finite.all():
                raise ValueError(f"{source!r} holds non-finite weights: {prefix}{name} has {(~finite).sum().item()} "
                                 f"NaN or infinite values of {value.numel()}. The checkpoint is corrupt (or was saved "
                                 "after training diverged); convert an earlier, finite one.")


def save_converted(model_class, config, state_dict: dict, out_dir: str):
    """Builds `model_class(config)` without random init (every weight is overwritten), loads `state_dict` strictly
    and writes the hub folder (weights, config, code files, preprocessor config), atomically. A weight stored as
    integers where the model's is floating point (a quantised or corrupt checkpoint) is a ValueError naming it:
    `load_state_dict` would cast it without a word."""
    with init.no_init_weights():
        model = model_class(config)
    expected = model.state_dict()
    for name, value in state_dict.items():
        if name in expected and expected[name].is_floating_point() and not value.is_floating_point():
            raise ValueError(f"The weight {name} is stored as {str(value.dtype).removeprefix('torch.')}, not as "
                             "floating point (a quantised or corrupt checkpoint): convert a floating-point one.")
    model.load_state_dict(state_dict, strict=True)
    write_folder_atomically(out_dir, lambda folder: save_model_folder(model, folder))
    return model


def expected_state_dict(model_class, config) -> dict:
    """Names and shapes of `model_class(config)`'s weights, built on the meta device (no memory, no init)."""
    with torch.device("meta"), init.no_init_weights():
        return model_class(config).state_dict()


def check_converted_keys(model_class, config, ours: dict, sources: dict, unused: list[str], kind: str) -> None:
    """A ValueError (`describe_key_mismatch`) unless the converted `ours` holds exactly `model_class(config)`'s
    weights, in their shapes; `sources` names each converted weight's source key, `unused` the source keys already
    left over (a converted weight beyond the model, e.g. a block past the depth found, joins them)."""
    expected = expected_state_dict(model_class, config)
    missing = sorted(set(expected) - set(ours))
    unused = list(unused) + [sources[name] for name in set(ours) - set(expected)]
    mismatched = [
        f"{sources[name]} {tuple(value.shape)} for {tuple(expected[name].shape)}"
        for name, value in ours.items()
        if name in expected and value.shape != expected[name].shape
    ]
    if unused or missing or mismatched:
        raise ValueError(describe_key_mismatch(kind, sorted(unused), missing, mismatched))


def describe_key_mismatch(kind: str, unexpected: list[str], missing: list[str], mismatched: list[str]) -> str:
    """One sentence naming what does not fit (the first few of each), for checkpoints that are not `kind`."""
    def few(names):
        names = sorted(names)
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    parts = []
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected tensors ({few(unexpected)})")
    if missing:
        parts.append(f"{len(missing)} missing tensors ({few(missing)})")
    if mismatched:
        parts.append(f"{len(mismatched)} tensors of the wrong shape ({few(mismatched)})")
    return f"This checkpoint is not a supported {kind}: " + "; ".join(parts) + "."
