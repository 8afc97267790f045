"""Settings and the files people write by hand (conductor.toml, pool files): a bad value is
one line naming its source (environment variable, or file and line) and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor_engine.engine.providers.pool import Pool, PoolError
from conductor_engine.engine.settings import (
    DEFAULT_CONFIG,
    ENV_PREFIX,
    OTHER_VARIABLES,
    Settings,
    SettingsError,
)
from tests.paths import ROOT


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No CONDUCTOR_* variable of the machine, and no conductor.toml of the working directory."""
    import os

    for name in list(os.environ):
        if name.upper().startswith("CONDUCTOR_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def _config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str | bytes) -> Path:
    path = tmp_path / "conductor.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    monkeypatch.setenv("CONDUCTOR_CONFIG", str(path))
    return path


def _one_line(excinfo: pytest.ExceptionInfo[SettingsError]) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_a_bad_environment_variable_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONDUCTOR_EMBEDDED_PORT", "abc")
    with pytest.raises(SettingsError) as e:
        Settings()
    assert _one_line(e).startswith("environment variable CONDUCTOR_EMBEDDED_PORT: ")
    assert "'abc'" in str(e.value)
    monkeypatch.setenv("CONDUCTOR_EMBEDDED_PORT", "70000")
    with pytest.raises(SettingsError, match="CONDUCTOR_EMBEDDED_PORT: .*less than or equal"):
        Settings()


def test_a_bad_value_in_the_config_file_names_file_line_and_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _config(tmp_path, monkeypatch, '# ports\n\nembedded_port = "x"\n')
    with pytest.raises(SettingsError) as e:
        Settings()
    assert _one_line(e).startswith(f"{path}:3: embedded_port: ")


def test_the_environment_wins_over_the_file_and_is_the_source_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _config(tmp_path, monkeypatch, 'embedded_port = 1234\ntask_queue = "from-file"\n')
    monkeypatch.setenv("CONDUCTOR_TASK_QUEUE", "from-env")
    s = Settings()
    assert (s.embedded_port, s.task_queue) == (1234, "from-env")


def test_malformed_toml_names_file_line_and_column(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _config(tmp_path, monkeypatch, 'task_queue = "q"\nthis is = = not toml\n')
    with pytest.raises(SettingsError) as e:
        Settings()
    assert _one_line(e).startswith(f"config file {path}:2:6: invalid TOML: ")


def test_a_config_file_that_is_not_utf8_names_the_byte(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _config(tmp_path, monkeypatch, b'task_queue = "\xff"\n')
    with pytest.raises(SettingsError, match="not UTF-8 .* at byte 14"):
        Settings()


def test_a_misspelled_key_is_an_error_naming_the_intended_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _config(tmp_path, monkeypatch, 'task_queue = "q"\ntemporal_adress = "h:1"\n')
    with pytest.raises(SettingsError) as e:
        Settings()
    assert _one_line(e) == (f"{path}:2: unknown setting 'temporal_adress'; did you mean "
                            "'temporal_address'?")
    _config(tmp_path, monkeypatch, "[zzz]\nq = 1\n")
    with pytest.raises(SettingsError, match=r":1: unknown setting .zzz.; see "):
        Settings()
    path = _config(tmp_path, monkeypatch, 'embeded_port = 1\nlog_levle = "x"\n')
    with pytest.raises(SettingsError) as e:  # every unknown key, in the one line
        Settings()
    assert _one_line(e) == (f"{path}:1: unknown setting 'embeded_port'; did you mean "
                            f"'embedded_port'?; also unknown: 'log_levle' ({path}:2)")


def test_a_config_file_named_by_the_variable_must_exist(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().task_queue  # no conductor.toml here, none named: defaults
    monkeypatch.setenv("CONDUCTOR_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(SettingsError) as e:
        Settings()
    assert _one_line(e).startswith("environment variable CONDUCTOR_CONFIG names ")
    assert "nope.toml" in str(e.value)


def test_a_misspelled_environment_variable_is_an_error_naming_the_intended_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_ADRESS", "h:1")
    with pytest.raises(SettingsError) as e:
        Settings()
    assert _one_line(e) == ("environment variable CONDUCTOR_TEMPORAL_ADRESS: unknown setting; "
                            "did you mean 'CONDUCTOR_TEMPORAL_ADDRESS'? (or unset it)")
    assert "h:1" not in str(e.value), "a value is never repeated: it may be a secret"
    monkeypatch.setenv("conductor_embeded_port", "1")  # read without regard to case
    with pytest.raises(SettingsError) as e:
        Settings(temporal_address="h:2")  # given in code, the variable is still wrong
    assert _one_line(e) == ("environment variable CONDUCTOR_TEMPORAL_ADRESS: unknown setting; "
                            "did you mean 'CONDUCTOR_TEMPORAL_ADDRESS'? (or unset it); also "
                            "unknown: conductor_embeded_port")
    monkeypatch.delenv("CONDUCTOR_TEMPORAL_ADRESS")
    monkeypatch.delenv("conductor_embeded_port")
    monkeypatch.setenv("CONDUCTOR_ZZZ", "1")
    with pytest.raises(SettingsError, match=r"^environment variable CONDUCTOR_ZZZ: unknown "
                                            r"setting; see engine/settings.py"):
        Settings()


def test_variables_that_are_no_setting_but_are_read_elsewhere_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTHER_VARIABLES - {"CONDUCTOR_CONFIG"}:
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("CONDUCTOR_TASK_QUEUE", "q")
    assert Settings().task_queue == "q"
    monkeypatch.setenv("CONDUCTOR_LOCAL_WHEELS", "x.whl")  # a misspelling of one is refused
    with pytest.raises(SettingsError, match="did you mean .CONDUCTOR_LOCAL_WHEEL.\\?"):
        Settings()


def test_every_conductor_variable_the_code_reads_is_a_setting_or_listed() -> None:
    """A CONDUCTOR_* variable named in the code (as a string) must be a setting or in
    OTHER_VARIABLES, or setting it would make every Settings load fail (this file's own
    misspellings aside)."""
    import re

    root = ROOT
    quoted = re.compile(rf"""["']({ENV_PREFIX}[A-Z0-9_]*[A-Z0-9])["']""")
    folders = ("engine", "activities", "workflows", "trainer", "runtime", "tests")
    named = {m.group(1) for folder in folders
             for path in (root / folder).rglob("*.py") if path != Path(__file__).resolve()
             for m in quoted.finditer(path.read_text(encoding="utf-8"))}
    settings = {f"{ENV_PREFIX}{f.upper()}" for f in Settings.model_fields}
    assert {"CONDUCTOR_LOCAL_WHEEL", "CONDUCTOR_DATA_DIR"} <= named, "the scan finds them"
    assert named - settings - OTHER_VARIABLES == set()


# --- pool files --------------------------------------------------------------------------


def test_a_pool_file_that_is_not_utf8_names_file_and_byte(tmp_path: Path) -> None:
    path = tmp_path / "pool.toml"
    path.write_bytes(b'[conductor]\nid = "c\xe9"\n')
    with pytest.raises(PoolError) as e:
        Pool.load(path)
    assert str(e.value).startswith(f"pool file {path}: not UTF-8 (invalid continuation byte) "
                                   "at byte 19")


def test_a_malformed_pool_file_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "pool.toml"
    path.write_text('[conductor]\nid = "c"\nprovider = \n')
    with pytest.raises(PoolError) as e:
        Pool.load(path)
    assert str(e.value).startswith(f"pool file {path}:3:12: invalid TOML: ")
    assert "\n" not in str(e.value)


_POOL = """\
[conductor]
id = "c"
provider = "local"
model = "smollm2-135m-instruct"
description = '''
timeout_s = -1 is in a multi-line string, not a key
'''

[[agents]]
id = "a"
provider = "sim"
model = "sim"

[[agents]]
id = "b"
provider = "sim"
model = "sim"
{b}
[agents.params]
{params}
"""


@pytest.mark.parametrize(("b", "params", "line", "field", "message"), [
    ("timeout_s = -1", "", 18, "agents.1.timeout_s", "Input should be greater than 0"),
    ('"structured_output" = "maybe"', "", 18, "agents.1.structured_output",
     "Input should be a valid boolean"),
    ("sim = { latency_s = -1 }", "", 18, "agents.1.sim.latency_s",
     "Input should be greater than or equal to 0"),
    ("sim.skills.math = 2", "", 18, "agents.1.sim.skills.math",
     "Input should be less than or equal to 1"),
    ("", "temperature = 1\nmax_tokens = 0", 21, "agents.1.params.max_tokens",
     "Input should be greater than 0"),
    ("", "max_token = 9", 20, "agents.1.params.max_token", "Extra inputs are not permitted"),
    ('web_search = "yes"', "", 18, "agents.1.web_search", ""),
])
def test_a_bad_value_in_a_pool_file_names_file_line_and_field(
        tmp_path: Path, b: str, params: str, line: int, field: str, message: str) -> None:
    path = tmp_path / "pool.toml"
    path.write_text(_POOL.format(b=b, params=params))
    with pytest.raises(PoolError) as e:
        Pool.load(path)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"pool file {path}:{line}: invalid at {field}: {message}")


def test_every_problem_of_a_pool_file_is_named_with_its_line_up_to_a_count(
        tmp_path: Path) -> None:
    path = tmp_path / "pool.toml"
    path.write_text(_POOL.format(b="timeout_s = -1\nprice_input_per_mtok = -2", params=""))
    with pytest.raises(PoolError) as e:
        Pool.load(path)
    assert str(e.value) == (
        f"pool file {path}:19: invalid at agents.1.price_input_per_mtok: Input should be greater "
        f"than or equal to 0; also {path}:18: invalid at agents.1.timeout_s: Input should be "
        "greater than 0")
    path.write_text(_POOL.format(b="timeout_s = -1\nprice_input_per_mtok = -2",
                                 params="max_tokens = 0\ntop_p = \"x\""))
    with pytest.raises(PoolError) as e:
        Pool.load(path)
    listed = str(e.value).split("; also ")  # the first MAX_LISTED (3), then the count
    assert [p.split(": ")[0].removeprefix("pool file ") for p in listed] == [
        f"{path}:22", f"{path}:21", f"{path}:19"]
    assert listed[-1].endswith(" (4 problems in all)")
    path.write_text('[conductor]\nid = "c"\nprovider = "local"\nmodel = "m"\n')
    with pytest.raises(PoolError, match=r"pool file [^:]*pool.toml: invalid at agents: Field "
                                        "required"):  # no line sets what is missing
        Pool.load(path)


def test_a_byte_order_mark_is_skipped_and_offsets_still_count_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _config(tmp_path, monkeypatch, b'\xef\xbb\xbftask_queue = "q"\n')
    assert Settings().task_queue == "q"
    _config(tmp_path, monkeypatch, b'\xef\xbb\xbftask_queue = "\xff"\n')
    with pytest.raises(SettingsError, match="at byte 17"):
        Settings()
    pool = tmp_path / "pool.toml"
    pool.write_bytes(b'\xef\xbb\xbf[conductor]\nid = "c"\nprovider = "local"\n'
                     b'model = "smollm2-135m-instruct"\n'
                     b'[[agents]]\nid = "a"\nprovider = "sim"\nmodel = "sim"\n')
    assert Pool.load(pool).conductor.id == "c"


@pytest.mark.parametrize(("env", "config", "expected"), [
    ({"CONDUCTOR_EMBEDDED_PORT": "abc"}, None,
     "error: environment variable CONDUCTOR_EMBEDDED_PORT: Input should be a valid integer, "
     "unable to parse string as an integer (got 'abc')"),
    ({}, 'temporal_adress = "h:1"\n',
     "error: {path}:1: unknown setting 'temporal_adress'; did you mean 'temporal_address'?"),
    ({}, "temporal_address = \n", "error: config file {path}:1:20: invalid TOML: Invalid value"),
    ({"CONDUCTOR_CONFIG": "{missing}"}, None,
     "error: environment variable CONDUCTOR_CONFIG names '{missing}', which does not exist: "
     "fix the path or unset the variable"),
])
def test_a_command_with_a_bad_setting_prints_one_line_and_exits_2(
        tmp_path: Path, env: dict[str, str], config: str | None, expected: str) -> None:
    from typer.testing import CliRunner

    from conductor_engine.runtime.cli import app

    path, missing = tmp_path / "conductor.toml", tmp_path / "nope.toml"
    if config is not None:
        path.write_text(config)
    env = {k: v.format(missing=missing) for k, v in env.items()}
    for command in (["traces", "list"], ["pool", "show"], ["worker"]):
        result = CliRunner().invoke(app, command, env={"COLUMNS": "400", **env})
        assert result.exit_code == 2, result.output
        assert result.stderr.splitlines() == [expected.format(path=DEFAULT_CONFIG,
                                                              missing=missing)]
