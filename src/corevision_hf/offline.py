"""Fail fast without network: a hub id that cannot be reached is one line in about a second, not half a minute.

huggingface_hub retries an unreachable hub five times with growing pauses (about 30 s) before transformers says it
could not connect; the command lines call `check_hub_reachable` before loading a model by name.
"""

import os
import socket
from urllib.parse import urlparse
from urllib.request import getproxies, proxy_bypass

from huggingface_hub import constants, is_offline_mode, try_to_load_from_cache
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id


MODEL_ALTERNATIVE = "give a local model folder (e.g. outputs/demo/run/final from `make demo`)"


def check_hub_reachable(
    name_or_path: str, filename: str = "config.json", alternative: str = MODEL_ALTERNATIVE, timeout: float = 2.0
) -> None:
    """Returns at once for a local folder, in offline mode (HF_HUB_OFFLINE=1) or for a name that is no hub id (the
    loader's own error is fast then); otherwise opens one connection to the hub (HF_ENDPOINT, or the proxy when one
    is set) and, if that fails within `timeout` seconds, raises a ConnectionError saying how to work offline (and
    whether the hub cache holds `filename` of that repo, and the `alternative` to the hub)."""
    if os.path.isdir(name_or_path) or is_offline_mode():
        return
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        return
    endpoint = urlparse(constants.ENDPOINT)
    proxy = getproxies().get(endpoint.scheme)
    if proxy and not proxy_bypass(endpoint.hostname):  # behind a proxy, the proxy is what must answer
        endpoint = urlparse(proxy if "://" in proxy else f"http://{proxy}")
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout).close()
    except OSError:
        cached = isinstance(try_to_load_from_cache(name_or_path, filename), str)
        raise ConnectionError(
            f"{constants.ENDPOINT} cannot be reached to load {filename} of {name_or_path!r} (and there is no folder "
            f"of that name here). Offline, {alternative}, or set HF_HUB_OFFLINE=1 to use the hub cache, which "
            f"{'holds' if cached else 'does not hold'} it."
        ) from None
