"""Whether the Hugging Face Hub can be reached, answered in seconds.

huggingface_hub retries a failed request five times with backoff (about 23 s), even when the hub's name does not
resolve, before a user learns that a hub id cannot be loaded. One connection attempt answers that first.
"""

import functools
import os
import socket
from urllib.parse import urlparse

CONNECT_SECONDS = 5.0
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


@functools.cache
def hub_unreachable() -> str | None:
    """Why the hub cannot be reached (offline mode set, its name does not resolve, no connection); None when it can,
    or when a proxy stands between (the request itself then decides)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return None
    endpoint = urlparse(constants.ENDPOINT)
    host, port = endpoint.hostname, endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=CONNECT_SECONDS).close()
    except OSError as err:
        return f"{host}:{port} cannot be reached: {err.strerror or err}"
    return None
