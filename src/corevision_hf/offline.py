"""Fail fast without network: a hub id that cannot be reached is one line in seconds, not minutes.

huggingface_hub retries an unreachable hub five times with growing pauses (about 30 s) before transformers says it
could not connect, and its client waits forever for an endpoint that accepts connections but never answers. The
command lines call `check_hub_reachable` before loading a model by name: one request, with a connect and a read
timeout, and the same timeouts for every later request of huggingface_hub's client (`use_hub_timeouts`).
"""

import os

import httpx2
from huggingface_hub import constants, get_session, is_offline_mode, try_to_load_from_cache
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id


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
