"""Temporal's own client config (a temporal.toml profile, TEMPORAL_* variables, as the
`temporal` CLI reads them) under our settings: what `Client.connect` is given."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.service import TLSConfig

from conductor_engine.engine.settings import Settings, SettingsError
from conductor_engine.runtime.connection import ConnectError, connect_options
from tests.tls_certs import Certs, make_certs


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No CONDUCTOR_* or TEMPORAL_* variable of the machine, no conductor.toml of the working
    directory, and no temporal.toml of the user's (HOME and XDG_CONFIG_HOME point here)."""
    for name in list(os.environ):
        if name.upper().startswith(("CONDUCTOR_", "TEMPORAL_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "pki")


def _profile_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, certs: Certs) -> Path:
    path = tmp_path / "temporal.toml"
    path.write_text(f"""
[profile.default]
address = "localhost:7233"

[profile.prod]
address = "temporal.internal:7233"
namespace = "conductor-prod"

[profile.prod.tls]
server_name = "{certs.server_name}"
server_ca_cert_path = "{certs.ca}"
client_cert_path = "{certs.client_cert}"
client_key_path = "{certs.client_key}"

[profile.prod.grpc_meta]
x-team = "research"
""")
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(path))
    return path


def test_no_temporal_config_means_the_embedded_server(tmp_path: Path) -> None:
    s = Settings()
    assert s.embedded and s.address == "127.0.0.1:7233"
    opts = connect_options(s)
    assert opts["tls"] is False and opts["api_key"] is None and opts["namespace"] == "default"


def test_a_profile_and_temporal_variables_give_the_connect_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, certs: Certs) -> None:
    _profile_file(tmp_path, monkeypatch, certs)
    monkeypatch.setenv("TEMPORAL_PROFILE", "prod")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "from-env")  # a TEMPORAL_* variable beats the file
    s = Settings()
    assert not s.embedded
    opts = connect_options(s)
    assert opts["target_host"] == "temporal.internal:7233"
    assert opts["namespace"] == "from-env" == s.temporal_namespace
    assert opts["rpc_metadata"] == {"x-team": "research"}
    tls = opts["tls"]
    assert isinstance(tls, TLSConfig)
    assert tls.domain == certs.server_name
    assert tls.server_root_ca_cert == certs.ca.read_bytes()
    assert tls.client_cert == certs.client_cert.read_bytes()
    assert tls.client_private_key == certs.client_key.read_bytes()


def test_the_default_profile_and_temporal_address(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, certs: Certs) -> None:
    _profile_file(tmp_path, monkeypatch, certs)
    assert Settings().address == "localhost:7233"
    monkeypatch.setenv("TEMPORAL_ADDRESS", "other:7233")
    assert Settings().address == "other:7233"
    # the profile can be picked by our setting as well as by TEMPORAL_PROFILE
    monkeypatch.delenv("TEMPORAL_ADDRESS")
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_PROFILE", "prod")
    assert Settings().temporal_namespace == "conductor-prod"


def test_conductor_settings_override_the_profile_piece_by_piece(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, certs: Certs) -> None:
    _profile_file(tmp_path, monkeypatch, certs)
    monkeypatch.setenv("TEMPORAL_PROFILE", "prod")
    other = make_certs(tmp_path / "other-pki", "frontend.other.test")
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_ADDRESS", "frontend.other.test:7233")
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_NAMESPACE", "mine")
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_TLS_SERVER_CA", str(other.ca))
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_TLS_SERVER_NAME", other.server_name)
    opts = connect_options(Settings())
    assert (opts["target_host"], opts["namespace"]) == ("frontend.other.test:7233", "mine")
    tls = opts["tls"]
    assert isinstance(tls, TLSConfig)
    assert (tls.domain, tls.server_root_ca_cert) == (other.server_name, other.ca.read_bytes())
    assert tls.client_cert == certs.client_cert.read_bytes()  # the profile's, not overridden
    # and TLS can be forced off over a profile that turns it on
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_TLS", "false")
    assert connect_options(Settings())["tls"] is False


def test_tls_from_conductor_settings_alone(monkeypatch: pytest.MonkeyPatch, certs: Certs) -> None:
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_ADDRESS", "t:7233")
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_TLS_SERVER_CA", str(certs.ca))
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_TLS_CERT", str(certs.client_cert))
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_TLS_KEY", str(certs.client_key))
    tls = connect_options(Settings())["tls"]
    assert isinstance(tls, TLSConfig) and tls.server_root_ca_cert == certs.ca.read_bytes()
    assert tls.domain is None and tls.client_private_key == certs.client_key.read_bytes()


def test_an_api_key_turns_tls_on_and_our_variable_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "temporal.toml"
    path.write_text('[profile.default]\naddress = "ns.acct.tmprl.cloud:7233"\n'
                    'namespace = "ns.acct"\napi_key = "from-file"\n')
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(path))
    opts = connect_options(Settings())
    assert opts["api_key"] == "from-file" and opts["tls"] is True
    monkeypatch.setenv("TEMPORAL_API_KEY", "from-env")
    assert connect_options(Settings())["api_key"] == "from-env"
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_API_KEY_ENV", "MY_CLOUD_KEY")
    monkeypatch.setenv("MY_CLOUD_KEY", "mine")
    assert connect_options(Settings())["api_key"] == "mine"
    assert Settings().ui_base() == "https://cloud.temporal.io"


@pytest.mark.parametrize(("env", "message"), [
    ({"TEMPORAL_CONFIG_FILE": "{tmp}/nope.toml"},
     "environment variable TEMPORAL_CONFIG_FILE names '{tmp}/nope.toml', which does not exist"),
    ({"TEMPORAL_CONFIG_FILE": "{tmp}/typo.toml"}, "unknown field `adress`"),
    ({"TEMPORAL_CONFIG_FILE": "{tmp}/good.toml", "TEMPORAL_PROFILE": "nope"},
     "Profile 'nope' not found"),
])
def test_bad_temporal_config_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    (tmp_path / "typo.toml").write_text('[profile.default]\nadress = "x:1"\n')
    (tmp_path / "good.toml").write_text('[profile.default]\naddress = "x:1"\n')
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(tmp=tmp_path))
    with pytest.raises(SettingsError) as e:
        Settings()
    assert "\n" not in str(e.value) and message.format(tmp=tmp_path) in str(e.value)


def test_half_an_mtls_pair_or_a_missing_file_is_one_line(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, certs: Certs) -> None:
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_ADDRESS", "t:7233")
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_TLS_CERT", str(certs.client_cert))
    with pytest.raises(ConnectError, match="needs both a client certificate and its key"):
        connect_options(Settings())
    monkeypatch.delenv("CONDUCTOR_TEMPORAL_TLS_CERT")
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_TLS_SERVER_CA", str(tmp_path / "gone.pem"))
    with pytest.raises(ConnectError) as e:
        connect_options(Settings())
    assert "\n" not in str(e.value) and f"{tmp_path / 'gone.pem'}: No such file" in str(e.value)


@pytest.mark.parametrize(("values", "ui"), [
    ({}, "http://localhost:8233"),  # the embedded server's UI
    ({"embedded_ui_port": 9999}, "http://localhost:9999"),
    ({"temporal_address": "127.0.0.1:7233"}, "http://localhost:8233"),  # compose, from the host
    ({"temporal_address": "temporal.internal:7233"}, "http://temporal.internal:8233"),
    ({"temporal_address": "ns.acct.tmprl.cloud:7233"}, "https://cloud.temporal.io"),
    ({"temporal_address": "x:7233", "ui_url": "https://ui.example/"}, "https://ui.example"),
])
def test_ui_links_never_point_at_a_guessed_8080(values: dict[str, object], ui: str) -> None:
    s = Settings(**values)  # type: ignore[arg-type]
    assert s.ui_base() == ui
    assert s.workflow_url("conduct-a b", "r1") == (
        f"{ui}/namespaces/default/workflows/conduct-a%20b/r1/history")
