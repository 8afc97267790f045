"""Who may call `conductor serve`: bearer keys from CONDUCTOR_API_KEYS, checked in constant
time, and the rule that a server with no keys listens on the loopback interface only.

The keys live in the environment only (never in a config or pool file, which are shared), and
no key is ever logged or echoed back in an error.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Mapping, Sequence

API_KEYS_ENV = "CONDUCTOR_API_KEYS"


def api_keys(env: Mapping[str, str] | None = None) -> list[str]:
    """The keys in CONDUCTOR_API_KEYS (comma-separated; blanks around them ignored)."""
    raw = (os.environ if env is None else env).get(API_KEYS_ENV, "")
    return [k.strip() for k in raw.split(",") if k.strip()]


def key_matches(given: str, keys: Sequence[str]) -> bool:
    """Whether `given` is one of `keys`, compared in constant time against every key (how long
    it takes says nothing about which key, or how much of one, matched)."""
    given_bytes = given.encode("utf-8", "surrogateescape")
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given_bytes, key.encode("utf-8", "surrogateescape"))
    return matched


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header; None for any other header."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def is_loopback(host: str) -> bool:
    """Whether binding `host` listens on this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_error(host: str, keys: Sequence[str]) -> str | None:
    """Why the server must not bind `host` (one line), or None when it may."""
    if keys or is_loopback(host):
        return None
    return (f"refusing to serve on {host} with no API keys: anyone who can reach it could run "
            f"(and spend on) the pool; set {API_KEYS_ENV}=KEY1,KEY2 (comma-separated), or bind "
            f"127.0.0.1")
