"""Secrets never reach logs, trackers or saved configs: a config's secret-looking values masked."""

import re
from typing import Any

SECRET_MARKERS = ("api_key", "apikey", "secret", "password")
# "token" marks a secret as a whole word (token, hub_token, access_token), not in a count or a vocabulary entry
# (max_new_tokens, max_tokens_per_turn, yes_token, no_token: settings whose values a run's record needs).
SECRET_TOKEN = re.compile(r"(^|_)token$")
NOT_SECRET_TOKENS = ("yes_token", "no_token")
REDACTED = "***redacted***"
URL_CREDENTIALS = re.compile(r"(\w+://)[^/@\s]+:[^/@\s]*@")  # user:password@ of a URL


def redact(node: Any) -> Any:
    """A copy of a config container with secret-looking values masked (`*_env` keys name a variable: kept), and
    the credentials of any URL (scheme://user:password@host) too."""
    if isinstance(node, dict):
        return {
            key: REDACTED
            if value is not None and is_secret_key(key) and not isinstance(value, dict | list)
            else redact(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [redact(value) for value in node]
    if isinstance(node, str):
        return URL_CREDENTIALS.sub(rf"\1{REDACTED}@", node)
    return node


def is_secret_key(key: Any) -> bool:
    key = str(key).lower()
    if key.endswith("_env") or key in NOT_SECRET_TOKENS:
        return False
    return any(marker in key for marker in SECRET_MARKERS) or SECRET_TOKEN.search(key) is not None
