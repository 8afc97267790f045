"""Connecting to Temporal: the options (Temporal's own client config under our settings) and
the connection itself, which a worker lets wait for a server that is still starting.

Layering, lowest first: the temporal.toml profile, the TEMPORAL_* variables (both read by the
SDK's temporalio.envconfig, as the `temporal` CLI reads them), then our settings (conductor.toml,
CONDUCTOR_*, flags). For TLS each piece (server CA, server name, client certificate and key)
comes from the highest layer that sets it, so a profile can hold the CA and the environment
the client key.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import structlog
from temporalio.client import Client
from temporalio.envconfig import ClientConfigTLS
from temporalio.service import TLSConfig

from conductor_engine.engine.settings import ENV_PREFIX, Settings
from conductor_engine.engine.storage.payloads import data_converter
from conductor_engine.runtime.embedded import EmbeddedTemporal
from conductor_engine.runtime.telemetry import metrics_runtime, tracing_interceptors

log = structlog.get_logger(__name__)

STARTING_SERVER_GRACE_S = 30.0
# What a frontend that is not up yet (or whose name does not resolve yet, as in a compose
# network before its container starts) looks like from the SDK's Rust core.
_NOT_UP = ("Connection refused", "ConnectionRefused", "dns error")


class ConnectError(RuntimeError):
    """Temporal cannot be reached; the message says where we looked and what to do."""


def _tls(settings: Settings, api_key: str | None) -> bool | TLSConfig:
    """TLS for the connection: off, or a TLSConfig whose pieces come from our settings over the
    profile's. Unset `temporal_tls` turns it on when the profile enables it, an API key is
    used (Temporal Cloud) or any temporal_tls_* setting names a piece."""
    profile = settings.temporal_client_profile
    base = profile.tls or ClientConfigTLS()
    merged = ClientConfigTLS(
        disabled=False,
        server_name=settings.temporal_tls_server_name or base.server_name,
        server_root_ca_cert=settings.temporal_tls_server_ca or base.server_root_ca_cert,
        client_cert=settings.temporal_tls_cert or base.client_cert,
        client_private_key=settings.temporal_tls_key or base.client_private_key)
    given = any(v is not None for v in (
        settings.temporal_tls_server_name, settings.temporal_tls_server_ca,
        settings.temporal_tls_cert, settings.temporal_tls_key))
    if settings.temporal_tls is not None:
        enabled = settings.temporal_tls
    elif base.disabled is not None:
        enabled = not base.disabled
    else:
        enabled = profile.tls is not None or api_key is not None or given
    if not enabled:
        return False
    if (merged.client_cert is None) != (merged.client_private_key is None):
        raise ConnectError("mTLS needs both a client certificate and its key: set "
                           f"{ENV_PREFIX}TEMPORAL_TLS_CERT and {ENV_PREFIX}TEMPORAL_TLS_KEY "
                           "(or the profile's client_cert_path and client_key_path)")
    try:
        tls = merged.to_connect_tls_config()
    except OSError as e:
        raise ConnectError(f"cannot read a Temporal TLS file {e.filename}: {e.strerror}; fix "
                           f"the path in {ENV_PREFIX}TEMPORAL_TLS_* or the Temporal profile"
                           ) from None
    empty = not isinstance(tls, TLSConfig) or tls == TLSConfig()
    return True if empty else tls  # True: TLS with the system's roots, the SDK's own default


def connect_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for `Client.connect`: address, namespace, API key, TLS, gRPC metadata
    (the profile's `grpc_meta`). The API key is the variable named by `temporal_api_key_env`,
    else the profile's."""
    profile = settings.temporal_client_profile
    api_key = os.environ.get(settings.temporal_api_key_env) or profile.api_key or None
    options: dict[str, Any] = {
        "target_host": settings.address, "namespace": settings.temporal_namespace,
        "api_key": api_key, "tls": _tls(settings, api_key)}
    if profile.grpc_meta:
        options["rpc_metadata"] = dict(profile.grpc_meta)
    return options


async def connect_temporal(
    settings: Settings, *, start_embedded: bool = True, wait_s: float = 0.0
) -> Client:
    """Connect to the configured Temporal, starting the embedded dev server if none is set.

    `wait_s`: how long a server that refuses connections (or whose name does not resolve yet)
    is waited for, each wait logged; workers pass `temporal_connect_timeout`, so one started
    beside a server that is still creating its schema joins it once it is up. Commands pass 0:
    a person waiting at a terminal is told at once."""
    if settings.embedded and start_embedded:
        EmbeddedTemporal.from_settings(settings).start(detached=True)
    options = connect_options(settings)
    started = time.monotonic()
    # a server that has just opened its port may still answer "not healthy yet" for a few
    # seconds (the dev server registers its search attributes then): wait that out too
    deadline = started + max(wait_s, STARTING_SERVER_GRACE_S)
    delay, attempt = 0.2, 0
    while True:
        try:
            return await Client.connect(
                **options, data_converter=data_converter(settings),
                # /metrics (metrics_bind) and OpenTelemetry spans: runtime/telemetry.py
                runtime=metrics_runtime(settings), interceptors=tracing_interceptors(settings))
        except RuntimeError as e:
            message = str(e)
            now = time.monotonic()
            not_up = any(marker in message for marker in _NOT_UP)
            if ("not healthy" in message and now < deadline) or (
                    not_up and now + delay < started + wait_s):
                attempt += 1
                if not_up:
                    log.warning("waiting for Temporal", address=settings.address,
                                attempt=attempt, waited_s=round(now - started, 1),
                                gives_up_in_s=round(started + wait_s - now, 1))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            waited = now - started if not_up and wait_s > 0 else None
            raise ConnectError(_unreachable(settings, message, waited)) from e


def _unreachable(settings: Settings, cause: str, waited: float | None) -> str:
    """The one line a failed connection gives: where, for how long it was waited for (None:
    it was not), what to do."""
    if settings.embedded:
        hint = "start it with `conductor up`"
    elif waited is not None:
        hint = (f"is the server up? Start it, or wait longer with {ENV_PREFIX}"
                f"TEMPORAL_CONNECT_TIMEOUT (now {settings.temporal_connect_timeout:g}s)")
    else:
        hint = ("check the address (CONDUCTOR_TEMPORAL_ADDRESS, TEMPORAL_ADDRESS or the "
                "temporal.toml profile), the namespace and the TLS settings")
    after = f" after waiting {waited:.0f}s" if waited is not None else ""
    return f"cannot reach Temporal at {settings.address}{after}: {hint} ({' '.join(cause.split())})"
