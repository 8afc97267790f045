"""The `conductor` command as a person uses it: the embedded stack end to end, and one-line
errors for the mistakes people make."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from conductor_engine.engine.contracts.names import pool_task_queue
from conductor_engine.engine.settings import Settings
from tests.agent_server import Reply
from tests.cli import CONDUCTOR, embedded_env, one_line_error, run_conductor
from tests.conftest import free_port, make_pool, write_pool
from tests.plans import plan_json


def test_run_starts_the_embedded_stack_and_prints_answer_steps_and_ui_link(
    agent_server, reachable_tmp: Path
) -> None:
    tmp_path = reachable_tmp  # the embedded PostgreSQL lives in its data dir
    agent_server.script("conductor", [Reply.ok(plan_json(
        ("gpt", "Compute 2^10 and 10^3.", []), ("claude", "Say which is larger.", "all")))])
    agent_server.script("gpt", [Reply.ok("1024 and 1000")])
    agent_server.script("claude", [Reply.ok(
        "2^10 = 1024 is larger than 10^3 = 1000.\n\nAnswer: 1024")])
    pool = write_pool(make_pool(agent_server), tmp_path / "pool.toml")
    env = embedded_env(tmp_path / "data", pool)
    ui_port = env["CONDUCTOR_EMBEDDED_UI_PORT"]
    try:
        proc = run_conductor("run", "Which is larger, 2^10 or 10^3?", "--id", "cli-1",
                         "--reference", "1024", env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "reward: 1 (" in proc.stdout
        assert "2^10 = 1024 is larger" in proc.stdout
        assert "Compute 2^10 and 10^3." in proc.stdout and "claude" in proc.stdout
        assert f"http://localhost:{ui_port}/namespaces/default/workflows/conduct-cli-1" in (
            proc.stdout)
        assert (tmp_path / "data" / "temporal.db").is_file()
        # the server was left running so the link works: the UI answers
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/", timeout=10) as r:
            assert r.status == 200
        # and the run can be read back by id
        res = run_conductor("result", "conduct-cli-1", "--json", env=env)
        assert json.loads(res.stdout)["answer"].startswith("2^10 = 1024")
        st = run_conductor("status", "conduct-cli-1", env=env)
        assert "completed" in st.stdout
        # the trace is in the embedded PostgreSQL, readable with `conductor traces`
        shown = run_conductor("traces", "show", "conduct-cli-1", env=env)
        assert shown.returncode == 0, shown.stderr
        assert "reward: 1 (" in shown.stdout and "Say which is larger." in shown.stdout
        listed = run_conductor("traces", "list", "--min-reward", "1", "--json", env=env)
        [row] = [json.loads(line) for line in listed.stdout.splitlines()]
        assert row["workflow_id"] == "conduct-cli-1" and row["reward"] == 1.0
        missing = run_conductor("traces", "show", "conduct-nope", env=env)
        assert "no trace of 'conduct-nope'" in one_line_error(missing)
    finally:
        down = run_conductor("down", env=env)
    assert down.stdout.strip() == "stopped Temporal and PostgreSQL"


HOSTILE = "[/code] [bold]b [@SPLIT] [link=file:///etc/passwd]x[/link] :cat:"


def test_user_and_model_text_prints_verbatim_in_every_view(
    agent_server, reachable_tmp: Path
) -> None:
    """Text that looks like Rich markup (or an emoji code), in a task's id, question, tags and
    dataset and in every reply, prints as written in `run`, `status`, `traces show|list` and
    `history`, never crashing a command or vanishing; a file with a bad line submits nothing."""
    tmp_path = reachable_tmp  # the embedded PostgreSQL lives in its data dir
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", f"sub {HOSTILE}", [])))])
    agent_server.script("gpt", [Reply.ok(f"answer {HOSTILE}")])
    pool = write_pool(make_pool(agent_server), tmp_path / "pool.toml")
    env = {**embedded_env(tmp_path / "data", pool), "COLUMNS": "400"}  # no cell wraps
    tasks = tmp_path / "hostile.jsonl"
    task = {"id": "[bold]t", "question": f"q {HOSTILE}", "tags": [HOSTILE], "dataset": HOSTILE}
    tasks.write_text(json.dumps(task) + "\n" + '{"question": "q", "id": "bad\\u0000"}\n')
    refused = run_conductor("batch", str(tasks), env=env)
    assert refused.returncode == 1 and "nothing was submitted" in refused.stderr
    assert f"{tasks}:2: field id: holds a NUL" in refused.stderr
    assert not (tmp_path / "data").exists(), "refused before anything started"
    wid = "conduct-[bold]t"
    try:
        proc = run_conductor("run", f"q {HOSTILE}", "--id", "[bold]t", env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"answer {HOSTILE}" in proc.stdout and f"sub {HOSTILE}" in proc.stdout
        views = {"status": run_conductor("status", wid, env=env),
                 "traces show": run_conductor("traces", "show", wid, env=env),
                 "traces list": run_conductor("traces", "list", env=env),
                 "history": run_conductor("history", wid, env=env)}
        for view, shown in views.items():
            assert shown.returncode == 0, (view, shown.stderr)
            assert wid in shown.stdout, view
        for view in ("traces show", "history"):
            for text in (f"q {HOSTILE}", f"sub {HOSTILE}", f"answer {HOSTILE}"):
                assert text in views[view].stdout, (view, text)
        assert f"sub {HOSTILE}" in views["status"].stdout
        assert f"q {HOSTILE}"[:59] in views["traces list"].stdout
    finally:
        run_conductor("down", env=env)


def test_a_malformed_pool_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "pool.toml"
    bad.write_text('[conductor]\nid = "c"\nprovider = "nope"\nmodel = "m"\n')
    line = one_line_error(run_conductor("pool", "show", "--pool", str(bad)))
    assert "pool file" in line and "conductor.provider" in line
    bad.write_text("this is = = not toml")
    assert "invalid TOML" in one_line_error(run_conductor("pool", "show", "--pool", str(bad)))


def test_a_key_in_a_pool_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "pool.toml"
    bad.write_text('[conductor]\nid = "c"\nprovider = "openai"\nmodel = "m"\n'
                   'api_key_env = "sk-live-123"\n[[agents]]\nid="a"\nprovider="local"\nmodel="m"\n')
    assert "NAME of an environment variable" in one_line_error(
        run_conductor("pool", "show", "--pool", str(bad)))


def test_an_unreachable_temporal_is_a_one_line_error() -> None:
    env = {"CONDUCTOR_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"}
    line = one_line_error(run_conductor("submit", "hello", env=env, timeout=60))
    assert "cannot reach Temporal at 127.0.0.1" in line


def test_plan_check_prints_the_plan_or_the_reason(tmp_path: Path) -> None:
    good = 'model_id = [0, 1]\nsubtasks = ["a", "b"]\naccess_list = [[], "all"]'
    proc = run_conductor("plan", "check", "--pool-size", "2", stdin=good)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["steps"][1] == {"agent": "1", "subtask": "b", "access": "all"}
    bad = 'model_id = ["gpt-4"]\nsubtasks = ["a"]\naccess_list = [[]]'
    line = one_line_error(run_conductor("plan", "check", "-", stdin=bad))
    assert "unknown agent 'gpt-4'" in line


def test_pool_show_lists_agents_and_which_are_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    proc = subprocess.run([*CONDUCTOR, "pool", "show"], capture_output=True,
                          text=True, env={**env, "COLUMNS": "250"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "gpt-5" in proc.stdout and "no (key not set)" in proc.stdout
    assert "OPENAI_API_KEY" in proc.stdout


def test_settings_come_from_a_file_under_environment_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "conductor.toml"
    cfg.write_text('task_queue = "from-file"\ntemporal_namespace = "ns-file"\n')
    monkeypatch.setenv("CONDUCTOR_CONFIG", str(cfg))
    monkeypatch.setenv("CONDUCTOR_TEMPORAL_NAMESPACE", "ns-env")
    s = Settings()
    assert s.task_queue == "from-file" and s.temporal_namespace == "ns-env"


def test_a_bad_setting_is_one_line_naming_its_variable_and_exit_status_2(tmp_path: Path) -> None:
    proc = run_conductor("down", env={"CONDUCTOR_EMBEDDED_PORT": "abc",
                                      "CONDUCTOR_DATA_DIR": str(tmp_path)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: environment variable CONDUCTOR_EMBEDDED_PORT: Input should be a valid integer, "
        "unable to parse string as an integer (got 'abc')"]


def test_up_serves_runs_and_ctrl_c_stops_server_and_worker(agent_server, reachable_tmp: Path
                                                           ) -> None:
    tmp_path = reachable_tmp  # the embedded PostgreSQL lives in its data dir
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Answer.", [])))])
    agent_server.script("gpt", [Reply.ok("served by up")])
    pool = write_pool(make_pool(agent_server), tmp_path / "pool.toml")
    queue = pool_task_queue("conductor", make_pool(agent_server).model_dump(mode="json"))
    env = {**os.environ, **embedded_env(tmp_path / "data", pool)}
    up = subprocess.Popen([*CONDUCTOR, "up"], env=env, text=True,
                          stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        assert up.stderr is not None
        for line in up.stderr:  # wait until the worker polls
            if "worker polling" in line:
                assert queue in line, "the queue of the pool it serves"
                break
        proc = run_conductor("run", "q", "--no-worker", "--json", env=env)
        assert json.loads(proc.stdout)["answer"] == "served by up", proc.stderr
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=30) == 0, up.stderr.read()
    finally:
        up.kill()
    from conductor_engine.runtime.embedded import port_open

    assert not port_open(int(env["CONDUCTOR_EMBEDDED_PORT"])), (
        "Ctrl-C must stop the embedded server too")


def test_tasks_check_counts_good_lines_and_names_bad_ones(tmp_path: Path, repo_root: Path) -> None:
    shipped = run_conductor("tasks", "check", str(repo_root / "examples" / "tasks.jsonl"))
    assert shipped.returncode == 0 and "5 task(s) ok" in shipped.stderr, shipped.stderr
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"id": "a", "question": "2+2?", "answer": "4"}\n{"question":\n'
                   '{"id": "b", "answer": "5"}\n')
    proc = run_conductor("tasks", "check", str(bad), "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["id"] == "a"
    assert "1 task(s) ok" in proc.stderr
    assert f"{bad}:2: invalid JSON" in proc.stderr and f"{bad}:3: field question" in proc.stderr
    missing = run_conductor("tasks", "check", str(tmp_path / "nope.jsonl"))
    assert "nope.jsonl" in one_line_error(missing)
