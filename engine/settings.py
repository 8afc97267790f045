"""Settings: a TOML file (`conductor.toml`, or the path in CONDUCTOR_CONFIG) under
`CONDUCTOR_*` environment variables, under command-line flags.

With no `temporal_address` the engine starts its embedded Temporal dev server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from conductor_engine.engine.contracts.names import TASK_QUEUE, TRAINER_TASK_QUEUE


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CONDUCTOR_", extra="ignore")

    temporal_address: str | None = Field(
        default=None, description="host:port of a Temporal frontend; unset = embedded dev server"
    )
    temporal_namespace: str = "default"
    temporal_tls: bool = False
    temporal_tls_cert: Path | None = None
    temporal_tls_key: Path | None = None
    temporal_api_key_env: str = Field(
        default="TEMPORAL_API_KEY", description="NAME of the env var with a Temporal Cloud API key"
    )
    task_queue: str = TASK_QUEUE
    trainer_task_queue: str = Field(
        default=TRAINER_TASK_QUEUE, description="where `conductor trainer` takes GRPO updates from"
    )
    data_dir: Path = Path(".conductor")
    pool_file: Path | None = None
    embedded_port: int = 7233
    embedded_ui_port: int = 8233
    ui_url: str | None = Field(default=None, description="Temporal UI base URL for links")
    log_format: str = Field(default="auto", description="auto, json or console")
    log_level: str = "warning"
    worker_shutdown_grace: float = Field(
        default=30.0, ge=0,
        description="seconds a stopping worker lets its running agent calls finish (a deploy "
        "then pays for no call twice); what is still running after that is retried elsewhere",
    )

    # --- the code verifier's sandbox (README: Security) -----------------------------------------
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
    s3_prefix: str = "conductor/"
    s3_endpoint_url: str | None = Field(default=None, description="e.g. MinIO's URL")
    s3_region: str | None = None
    trace_blob_threshold: int = Field(
        default=64 * 1024, ge=0, description="trace texts above this many bytes go to blobs"
    )
    payload_threshold: int = Field(
        default=256 * 1024, ge=0,
        description="Temporal payloads above this many bytes go to external storage",
    )
    # --- serving trained policy versions ------------------------------------------------------
    lora_dir: Path | None = Field(
        default=None,
        description="where policy versions are written for vLLM to load (runtime LoRA); a "
        "directory the vLLM server reads at the same path; default data_dir/policies",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = Path(os.environ.get("CONDUCTOR_CONFIG", "conductor.toml"))
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file))

    @property
    def blobs_path(self) -> Path:
        return self.blob_dir or self.data_dir / "blobs"

    @property
    def lora_root(self) -> Path:
        return self.lora_dir or self.data_dir / "policies"

    @property
    def embedded(self) -> bool:
        return self.temporal_address is None

    @property
    def address(self) -> str:
        return self.temporal_address or f"127.0.0.1:{self.embedded_port}"

    def ui_base(self) -> str:
        if self.ui_url:
            return self.ui_url.rstrip("/")
        if self.embedded:
            return f"http://localhost:{self.embedded_ui_port}"
        return "http://localhost:8080"

    def workflow_url(self, workflow_id: str, run_id: str | None = None) -> str:
        from urllib.parse import quote

        wid = quote(workflow_id, safe="")
        url = f"{self.ui_base()}/namespaces/{self.temporal_namespace}/workflows/{wid}"
        return f"{url}/{run_id}/history" if run_id else url
