"""Settings: a TOML file (`conductor.toml`, or the path in CONDUCTOR_CONFIG) under
`CONDUCTOR_*` environment variables, under command-line flags. Temporal's own client config
(a temporal.toml profile and TEMPORAL_* variables, shared with the `temporal` CLI) lies under
all of them for the connection to Temporal.

With no Temporal address from any of them the engine starts its embedded Temporal dev server.

A bad setting fails where it is read, as one SettingsError line naming its source and field:
`environment variable CONDUCTOR_EMBEDDED_PORT: ...`, `conductor.toml:3: embedded_port: ...`.
The config file is strict: a key that is no setting is an error (with the likely intended key),
not silently ignored, and a CONDUCTOR_CONFIG naming no file is an error too (a missing
`conductor.toml` in the working directory is not: it is optional).
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings import SettingsError as _SourceError
from temporalio.envconfig import ClientConfigProfile

from conductor_engine.engine.contracts.names import TASK_QUEUE, TRAINER_TASK_QUEUE
from conductor_engine.engine.redaction import redact_text
from conductor_engine.engine.toml_errors import not_utf8, toml_error, toml_lines, utf8_text

ENV_PREFIX = "CONDUCTOR_"
DEFAULT_CONFIG = "conductor.toml"


class SettingsError(ValueError):
    """A setting that cannot be used, in one line naming its source (environment variable, or
    config file and line) and field. Entry points print it as `error: ...` and exit 2."""


def config_path() -> tuple[Path, bool]:
    """The config file, and whether it must exist (it must when CONDUCTOR_CONFIG names it)."""
    named = os.environ.get(f"{ENV_PREFIX}CONFIG")
    return (Path(named), True) if named else (Path(DEFAULT_CONFIG), False)


# CONDUCTOR_* variables that are read, but are no setting: each is read where it is used (and
# the tests' own), so a Settings load never refuses them. Every other CONDUCTOR_* variable names
# a setting or is a misspelling of one (tests/unit/engine/test_settings.py keeps this list
# complete).
OTHER_VARIABLES = frozenset({
    f"{ENV_PREFIX}CONFIG",  # the config file (config_path, above)
    f"{ENV_PREFIX}LOG",  # runtime/cli/app.py: a log level over log_level, for a command
    f"{ENV_PREFIX}LOCAL_WHEEL",  # engine/providers/local/weights.py
    f"{ENV_PREFIX}LOCAL_MAX_BATCH",  # engine/providers/local/batching.py
    f"{ENV_PREFIX}LOCAL_BATCH_SEEDED",  # engine/providers/local/batching.py
    f"{ENV_PREFIX}LOCAL_DEVICE",  # engine/providers/local/device.py
    f"{ENV_PREFIX}FAULT_TABLE",  # tests/faults/conftest.py
    f"{ENV_PREFIX}TEST_AGENT_KEY",  # tests: an agent's api_key_env
    f"{ENV_PREFIX}EXPOSED",  # tests/security/unprivileged.py
    f"{ENV_PREFIX}BIND",  # docker-compose.yml: the host address its ports are published on
    f"{ENV_PREFIX}API_KEYS",  # runtime/serve/access.py: environment only, never a file
})


def _did_you_mean(name: str, known: Iterable[str], prefix: str = "") -> str:
    """`did you mean 'X'?` for the closest known name (`prefix` put before it, left out of the
    comparison), else where the settings are listed."""
    close = difflib.get_close_matches(name.removeprefix(prefix),
                                      sorted(k.removeprefix(prefix) for k in known), n=1)
    return f"did you mean {prefix + close[0]!r}?" if close else \
        "see engine/settings.py for the settings there are"


def _check_environment(fields: Iterable[str]) -> None:
    """A SettingsError for a CONDUCTOR_* variable that is no setting (a misspelling, silently
    ignored otherwise): one line naming it and the closest variable there is, never its value.
    Names match without regard to case, as pydantic-settings reads them."""
    valid = {f"{ENV_PREFIX}{f.upper()}" for f in fields} | OTHER_VARIABLES
    unknown = sorted(n for n in os.environ if n.upper().startswith(ENV_PREFIX)
                     and n.upper() not in valid)
    if unknown:
        # the prefix, which every name shares, is left out: it would make any two look alike
        hint = _did_you_mean(unknown[0].upper(), valid, ENV_PREFIX)
        more = "".join(f"; also unknown: {n}" for n in unknown[1:])
        raise SettingsError(f"environment variable {unknown[0]}: unknown setting; {hint} (or "
                            f"unset it){more}")


def temporal_profile(name: str | None = None) -> ClientConfigProfile:
    """A profile of Temporal's client config, loaded by the SDK (temporalio.envconfig) with the
    TEMPORAL_* variables over it. Strict, as conductor.toml is: a misspelt key is an error, not
    a silent fall back to the embedded server; so is a TEMPORAL_CONFIG_FILE naming no file
    (which the SDK would ignore) and a profile that is not in the file."""
    named = os.environ.get("TEMPORAL_CONFIG_FILE")
    if named and not Path(named).is_file():
        raise SettingsError(f"environment variable TEMPORAL_CONFIG_FILE names {named!r}, which "
                            "does not exist: fix the path or unset the variable")
    try:
        return ClientConfigProfile.load(name, config_file_strict=True)
    except Exception as e:  # the SDK's ConfigError (from its Rust core) has no public class
        where = named or "temporal.toml"
        detail = " ".join(str(e).split())
        raise SettingsError(redact_text(
            f"Temporal client config ({where}, TEMPORAL_* variables): {detail}; fix it (the "
            "`temporal` CLI reads the same file and variables)")) from None


class _ConfigFile(PydanticBaseSettingsSource):
    """The TOML config file, read strictly: not UTF-8, not TOML, or a key that is no setting
    is a SettingsError naming the file, line and key."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        self.path, required = config_path()
        self.data: dict[str, Any] = {}
        self.lines: dict[str, int] = {}
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            if required:
                raise SettingsError(
                    f"environment variable {ENV_PREFIX}CONFIG names {str(self.path)!r}, which "
                    "does not exist: fix the path or unset the variable") from None
            return
        except OSError as e:
            raise SettingsError(f"config file {self.path}: cannot read it: {e.strerror}"
                                ) from None
        try:
            text = utf8_text(raw)
        except UnicodeDecodeError as e:
            raise SettingsError(f"config file {not_utf8(self.path, e)}") from None
        try:
            self.data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise SettingsError(f"config file {toml_error(self.path, e)}") from None
        self.lines = {str(path[0]): line for path, line in toml_lines(text).items()
                      if len(path) == 1}
        known = list(settings_cls.model_fields)
        unknown = [key for key in self.data if key not in known]
        if unknown:
            key = unknown[0]
            more = "".join(f"; also unknown: {k!r} ({self.where(k)})" for k in unknown[1:])
            raise SettingsError(f"{self.where(key)}: unknown setting {key!r}; "
                                f"{_did_you_mean(key, known)}{more}")

    def where(self, key: str) -> str:
        """`FILE:LINE` of a key (`FILE` where the line is not known)."""
        line = self.lines.get(key)
        return f"{self.path}:{line}" if line else str(self.path)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.data)


def _source_of(field: str, given: dict[str, Any]) -> str:
    """Where a field's value came from, highest-priority source first (as pydantic-settings
    reads them): an argument, the environment, the config file."""
    if field in given:
        return f"{field} (given in code or by a flag)"
    env = f"{ENV_PREFIX}{field.upper()}"
    if any(name.upper() == env for name in os.environ):
        return f"environment variable {env}"
    try:
        source = _ConfigFile(Settings)
    except SettingsError:
        source = None
    if source is not None and field in source.data:
        return f"{source.where(field)}: {field}"
    return field


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    def __init__(self, **values: Any) -> None:
        """Build the settings; any bad value, or a CONDUCTOR_* variable that is no setting, is
        a one-line SettingsError naming its source."""
        _check_environment(type(self).model_fields)
        try:
            super().__init__(**values)
        except ValidationError as e:
            first = e.errors()[0]
            field = str(first["loc"][0]) if first["loc"] else ""
            more = f" ({e.error_count()} problems in all)" if e.error_count() > 1 else ""
            if first["type"] == "extra_forbidden":  # a misspelt keyword argument
                raise SettingsError(f"{field}: unknown setting; "
                                    f"{_did_you_mean(field, type(self).model_fields)}{more}"
                                    ) from None
            got = f" (got {first['input']!r})" if isinstance(first.get("input"), str | int
                                                              | float) else ""
            raise SettingsError(redact_text(  # a bad value may be (part of) a secret
                f"{_source_of(field, values)}: {first['msg']}{got}{more}")) from None
        except _SourceError as e:
            raise SettingsError(f"settings: {e}") from None
        self._apply_temporal_profile()

    _temporal: ClientConfigProfile = PrivateAttr(default_factory=ClientConfigProfile)

    def _apply_temporal_profile(self) -> None:
        """Temporal's own client config under ours: the profile (temporal.toml, or the file
        in TEMPORAL_CONFIG_FILE; TEMPORAL_PROFILE or temporal_profile picks it) with the
        TEMPORAL_* variables over it, as the `temporal` CLI reads them. The address and
        namespace fill the settings not given as CONDUCTOR_*, a flag, conductor.toml or in code;
        TLS and the API key are merged when connecting (runtime/connection.py)."""
        self._temporal = temporal_profile(self.temporal_profile)
        if "temporal_address" not in self.model_fields_set and self._temporal.address:
            self.temporal_address = self._temporal.address
        if "temporal_namespace" not in self.model_fields_set and self._temporal.namespace:
            self.temporal_namespace = self._temporal.namespace

    @property
    def temporal_client_profile(self) -> ClientConfigProfile:
        """The Temporal profile these settings were read with (TEMPORAL_* applied)."""
        return self._temporal

    # --- Temporal: these sit on top of Temporal's own client config (temporal.toml profile,
    # TEMPORAL_* variables; see _apply_temporal_profile), so each is unset by default ----------
    temporal_address: str | None = Field(
        default=None, description="host:port of a Temporal frontend; unset = the Temporal "
        "profile's address (TEMPORAL_ADDRESS, temporal.toml), else the embedded dev server"
    )
    temporal_namespace: str = Field(
        default="default", description="default: the Temporal profile's namespace, else default"
    )
    temporal_profile: str | None = Field(
        default=None, description="profile in Temporal's temporal.toml; default TEMPORAL_PROFILE, "
        "else the profile named default"
    )
    temporal_tls: bool | None = Field(
        default=None, description="force TLS on or off; unset = on when the profile, an API key "
        "or any temporal_tls_* setting asks for it"
    )
    temporal_tls_cert: Path | None = Field(default=None, description="client certificate (mTLS)")
    temporal_tls_key: Path | None = Field(default=None, description="client private key (mTLS)")
    temporal_tls_server_ca: Path | None = Field(
        default=None, description="CA certificate that signed the server's (a private CA)"
    )
    temporal_tls_server_name: str | None = Field(
        default=None, description="name to verify the server's certificate against (SNI)"
    )
    temporal_api_key_env: str = Field(
        default="TEMPORAL_API_KEY", description="NAME of the env var with a Temporal Cloud API key "
        "(else the profile's api_key)"
    )
    temporal_connect_timeout: float = Field(
        default=60.0, ge=0, description="seconds `conductor worker` and `trainer` wait for a "
        "Temporal that refuses connections (still starting) before they give up"
    )
    task_queue: str = Field(
        default=TASK_QUEUE, description="the stem of the task queues: a pool's runs and "
        "workers use STEM-FINGERPRINT, its own queue (engine/contracts/names.py)")
    trainer_task_queue: str = Field(
        default=TRAINER_TASK_QUEUE, description="where `conductor trainer` takes GRPO updates from"
    )
    data_dir: Path = Field(default=Path(".conductor"), description="the embedded stack's state, "
                           "the converted local model, blobs, batch reports")
    pool_file: Path | None = Field(default=None, description="the pool; unset: the shipped one")
    embedded_port: int = Field(default=7233, ge=1, le=65535, description="the dev server's port")
    embedded_ui_port: int = Field(default=8233, ge=1, le=65535, description="its UI's port")
    embedded_codec_port: int | None = Field(
        default=None, ge=1, le=65535,
        description="the loopback codec endpoint its UI decrypts payloads through (owner "
        "only); unset = the UI's port + 1 (8234)")
    # --- run data only its owner reads (docs/concepts/security.md) ---------------------------
    payload_encryption: bool | None = Field(
        default=None,
        description="encrypt every Temporal payload (inputs, results, failure messages, "
        "summaries) with AES-256-GCM before it reaches the server; unset = on for the embedded "
        "stack, on for a cluster when payload_key_file is set",
    )
    payload_key_file: Path | None = Field(
        default=None,
        description="the 32-byte payload key; unset = data_dir/payload.key, created 0600 by "
        "the embedded stack. On a cluster every worker and client reads the same file",
    )
    ui_url: str | None = Field(default=None, description="Temporal UI base URL for links")
    log_format: str = Field(default="auto", description="auto or console: human lines (a "
                            "terminal or a pipe); json: one JSON object a line")
    log_level: str = Field(default="warning", description="debug, info, warning or error")
    # --- observability (docs/how-to/metrics.md) ---------------------------------------------------
    metrics_bind: str | None = Field(
        default=None,
        description="host:port to serve Prometheus metrics on (/metrics): the Temporal SDK's "
        "and the engine's; unset = off",
    )
    otel_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP endpoint (e.g. http://localhost:4318) to send OpenTelemetry "
        "traces of workflows and activities to; OTEL_EXPORTER_OTLP_ENDPOINT works too; needs "
        "the otel extra",
    )
    plan_slots: int = Field(
        default=0, ge=0,
        description="plan attempts one worker runs at once; the plans beyond wait in Temporal, "
        "where only their step deadline counts (0: one generation batch for a local conductor, "
        "CONDUCTOR_LOCAL_MAX_BATCH; else no limit of its own)",
    )
    worker_shutdown_grace: float = Field(
        default=30.0, ge=0,
        description="seconds a stopping worker lets its running agent calls finish (a deploy "
        "then pays for no call twice); what is still running after that is retried elsewhere",
    )

    # --- the code verifier's sandbox (docs/concepts/security.md) -----------------------------
    code_sandbox: Literal["auto", "bwrap", "namespaces", "unconfined"] = Field(
        default="auto",
        description="how model-written code is isolated: auto = bubblewrap (non-root) or own "
        "namespaces; with none available the code verifier refuses. unconfined = limits only, "
        "an explicit opt-out for code you trust (never for training)",
    )
    code_sandbox_uid: int = Field(
        default=65534, ge=1, description="the uid candidates run as when the worker is root"
    )

    # --- traces -------------------------------------------------------------------------------
    database_url: str | None = Field(
        default=None, description="PostgreSQL for traces; unset = embedded PostgreSQL in data_dir"
    )
    # --- object storage for large payloads ----------------------------------------------------
    blob_dir: Path | None = Field(
        default=None, description="local blob store; default data_dir/blobs"
    )
    s3_bucket: str | None = Field(default=None, description="set to keep blobs in S3 instead")
    s3_prefix: str = Field(default="conductor/", description="every blob's key prefix")
    s3_endpoint_url: str | None = Field(default=None, description="e.g. MinIO's URL")
    s3_region: str | None = Field(default=None, description="the bucket's region (e.g. for MinIO)")
    trace_blob_threshold: int = Field(
        default=64 * 1024, ge=0, description="trace texts above this many bytes go to blobs"
    )
    payload_threshold: int = Field(
        default=256 * 1024, ge=0,
        description="Temporal payloads above this many bytes go to external storage",
    )
    # --- `conductor serve`'s bounds on clients (runtime/serve/guard.py) ----------------
    serve_max_connections: int = Field(
        default=1000, ge=1,
        description="connections `conductor serve` holds at once; past it a new one displaces "
        "the longest-waiting connection with no request in flight, or gets a 503 with "
        "Retry-After when all are busy (kept under the open-file limit)",
    )
    """A half-sent request costs its client nothing, so such connections are displaced rather
    than allowed to hold the slots; the cap bounds open files and memory for the rest."""
    serve_header_timeout: float = Field(
        default=10.0, gt=0,
        description="seconds a connection to `conductor serve` has to send a request's line and "
        "headers, from when it opens or its last answer ends; then it is closed",
    )
    """Without it a client that sends half a request, or a byte now and then, holds its
    connection (and an open file) forever."""
    serve_max_header_bytes: int = Field(
        default=16 * 1024, ge=1024,
        description="most bytes of a request's line and headers `conductor serve` reads; past "
        "it the answer is 431 and the connection closes",
    )
    """What one endless header can make the server buffer."""
    serve_max_headers: int = Field(
        default=100, ge=8,
        description="most header fields in a request to `conductor serve`; past it: 431",
    )
    serve_body_timeout: float = Field(
        default=60.0, gt=0,
        description="seconds a request body to `conductor serve` has to arrive whole; past "
        "it: 408",
    )
    """Bounds how long a keyed client sending its body slowly holds a connection."""
    # --- serving trained policy versions ------------------------------------------------------
    lora_dir: Path | None = Field(
        default=None,
        description="where policy versions are written for vLLM to load (runtime LoRA); a "
        "directory the vLLM server reads at the same path; default data_dir/policies",
    )

    @field_validator("metrics_bind")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        host, _, port = (value or "").rpartition(":")
        if value and not (host and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError("expected host:port, e.g. 127.0.0.1:9000 (0.0.0.0:9000 for every "
                             "interface)")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _ConfigFile(settings_cls))

    @property
    def blobs_path(self) -> Path:
        return self.blob_dir or self.data_dir / "blobs"

    @property
    def lora_root(self) -> Path:
        return self.lora_dir or self.data_dir / "policies"

    @property
    def payload_key_path(self) -> Path:
        return self.payload_key_file or self.data_dir / "payload.key"

    @property
    def encrypts_payloads(self) -> bool:
        """Whether payloads are encrypted: on by default for the embedded stack, whose server
        any local user can reach; on a cluster (mTLS guards the server) when a key is given."""
        if self.payload_encryption is not None:
            return self.payload_encryption
        return self.embedded or self.payload_key_file is not None

    @property
    def embedded(self) -> bool:
        return self.temporal_address is None

    @property
    def address(self) -> str:
        return self.temporal_address or f"127.0.0.1:{self.embedded_port}"

    def ui_base(self) -> str:
        """The Temporal UI the links we print point to: `ui_url` when set; the embedded
        server's UI; Temporal Cloud's UI for a `*.tmprl.cloud` address; else the UI on port
        8233 of the server's host, where docker-compose.yml publishes it beside :7233."""
        if self.ui_url:
            return self.ui_url.rstrip("/")
        if self.embedded:
            return f"http://localhost:{self.embedded_ui_port}"
        host = self.address.rsplit(":", 1)[0] if ":" in self.address else self.address
        if host.endswith(".tmprl.cloud"):
            return "https://cloud.temporal.io"
        if host in ("127.0.0.1", "0.0.0.0", "[::1]", "::1"):
            host = "localhost"
        return f"http://{host}:8233"

    def workflow_url(self, workflow_id: str, run_id: str | None = None) -> str:
        from urllib.parse import quote

        wid = quote(workflow_id, safe="")
        url = f"{self.ui_base()}/namespaces/{self.temporal_namespace}/workflows/{wid}"
        return f"{url}/{run_id}/history" if run_id else url
