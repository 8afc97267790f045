"""A run's data is its owner's alone on the embedded stack: another local user (uid 65534) who
asks the real Temporal dev server for a run's history with the `temporal` CLI finds ciphertext
where the task, its reference, the agents' answers and failure messages were, and the codec
endpoint refuses them; the owner's `conductor history`, `conductor resume` and a decode through
the codec endpoint (as the UI makes it) show plaintext. Histories written before encryption
still read."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads
from temporalio.client import Client
from temporalio.common import RawValue

from conductor_engine.engine.contracts.names import BATCH_WORKFLOW
from conductor_engine.engine.contracts.records import AgentReply
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.codec import load_or_create_key
from conductor_engine.runtime.client import ConductorClient, RunFailed
from conductor_engine.runtime.connection import connect_temporal
from conductor_engine.runtime.embedded import (
    EmbeddedError,
    EmbeddedTemporal,
    temporal_binary,
)
from conductor_engine.runtime.history import step_trail
from tests.agent_server import Reply
from tests.cli import run_conductor
from tests.conftest import free_port, make_pool, running_worker
from tests.plans import plan_json

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
MARK = uuid.uuid4().hex[:10]
QUESTION = f"Which is larger, 2^10 or 10^3? question-{MARK}"
REFERENCE = f"reference-{MARK}"
SUBTASK = f"Compute 10^3 subtask-{MARK}"
OUTPUT = f"2^10 = 1024 output-{MARK}"
REFUSAL = f"refused failure-{MARK}"
SECRETS = (QUESTION, REFERENCE, SUBTASK, OUTPUT, REFUSAL)
CHAIN = plan_json(("gpt", "Compute 2^10.", []), ("claude", SUBTASK, [0]),
                  ("gemini", "Give the final answer.", "all"))

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="running the temporal CLI as uid 65534 needs root (setpriv)")


@dataclass
class Stack:
    settings: Settings
    server: EmbeddedTemporal
    client: Client

    @property
    def env(self) -> dict[str, str]:
        """A `conductor` command's environment for this embedded stack (no Temporal address:
        the embedded default, so encryption is on as a user gets it)."""
        s = self.settings
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TEMPORAL_", "CONDUCTOR_"))}
        return {**env, "CONDUCTOR_DATA_DIR": str(s.data_dir),
                "CONDUCTOR_EMBEDDED_PORT": str(s.embedded_port),
                "CONDUCTOR_EMBEDDED_UI_PORT": str(s.embedded_ui_port),
                "CONDUCTOR_EMBEDDED_CODEC_PORT": str(s.embedded_codec_port),
                "CONDUCTOR_DATABASE_URL": s.database_url or ""}


@pytest.fixture(scope="module")
async def stack(postgres_url: str, agent_server) -> AsyncIterator[Stack]:
    """The embedded stack as `conductor run` starts it: dev server, codec endpoint, a key
    created in the private data directory; and one worker for the module's runs."""
    data = Path(tempfile.mkdtemp(prefix="conductor-private-"))
    settings = Settings(data_dir=data, embedded_port=free_port(), embedded_ui_port=free_port(),
                        embedded_codec_port=free_port(), database_url=postgres_url,
                        task_queue=f"t-{uuid.uuid4().hex[:8]}")
    assert settings.embedded and settings.encrypts_payloads
    server = EmbeddedTemporal.from_settings(settings)
    server.start(detached=False)
    try:
        client = await connect_temporal(settings, start_embedded=False)
        async with running_worker(client, settings, make_pool(agent_server)):
            yield Stack(settings, server, client)
    finally:
        server.stop()


def nobody_command(*argv: str) -> tuple[list[str], dict[str, str], Path]:
    """The command line and environment that run `argv` as uid 65534 with no capabilities, in
    a mount namespace where the program and this interpreter are reachable by that uid
    (tests/security/unprivileged.py's `expose`), with a home of its own; and the scratch
    directory that holds the home and `expose`'s staging, for the caller to remove."""
    scratch = Path(tempfile.mkdtemp(prefix="conductor-nobody-"))
    scratch.chmod(0o755)
    home = scratch / "home"
    home.mkdir()
    home.chmod(0o777)
    reach = [Path(argv[0]).parent, Path(os.path.realpath(sys.base_prefix)), Path(sys.prefix)]
    script = ("import os, sys; from pathlib import Path; "
              "from tests.security.unprivileged import expose; "
              f"expose([Path(p) for p in {[str(p) for p in reach]!r}], "
              f"under=Path({str(scratch)!r})); "
              f"os.execv('/usr/bin/setpriv', ['setpriv', '--reuid={NOBODY}', "
              f"'--regid={NOBODY}', '--clear-groups', '--inh-caps=-all', "
              "'--bounding-set=-all', '--', *sys.argv[1:]])")
    return (["unshare", "--mount", "--propagation", "private", sys.executable, "-c", script,
             *argv], {"PATH": "/usr/bin:/bin", "HOME": str(home)}, scratch)


def as_nobody(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` run to completion as uid 65534 (`nobody_command`), output captured."""
    command, env, scratch = nobody_command(*argv)
    try:
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120, input=stdin)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# What another user's own client sends the codec endpoint: the UI's decode request, by hand.
_DECODE = """
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
try:
    c.request("POST", "/decode", sys.stdin.read(), {"Content-Type": "application/json"})
    print(c.getresponse().read().decode())
except (ConnectionError, http.client.HTTPException) as e:
    print("refused:", type(e).__name__)
"""


def readable(output: str) -> str:
    """All the text in a `temporal ... --output json` answer: every string as printed and, where
    it is base64 (how the CLI prints a payload's bytes), as decoded."""
    texts = [output]

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str):
            with contextlib.suppress(binascii.Error, ValueError):
                texts.append(base64.b64decode(value, validate=True).decode("latin-1"))

    with contextlib.suppress(ValueError):
        walk(json.loads(output))
    return "\n".join(texts)


def show(stack: Stack, wid: str, *extra: str) -> list[str]:
    return [temporal_binary(), "workflow", "show", "--workflow-id", wid, "--address",
            stack.settings.address, "--output", "json", *extra]


def _script(agent_server, claude: Reply) -> None:
    agent_server.script("conductor", [Reply.ok(CHAIN)])
    agent_server.script("gpt", [Reply.ok(OUTPUT)])
    agent_server.script("claude", [claude])
    agent_server.script("gemini", [Reply.ok("Answer: 1024")])


async def test_other_users_see_only_ciphertext_and_the_owner_audits_in_plaintext(
    agent_server, stack: Stack,
) -> None:
    settings = stack.settings
    conductor = ConductorClient(stack.client, settings)
    _script(agent_server, Reply.error(401, REFUSAL))
    with pytest.raises(RunFailed) as info:
        await conductor.run(Task(question=QUESTION, reference=REFERENCE))
    wid = info.value.workflow_id
    failed_run = (await step_trail(stack.client, wid)).run_id

    # the owner's `conductor history`: steps, answers and the failure in plaintext
    table = await asyncio.to_thread(run_conductor, "history", wid, env=stack.env)
    assert table.returncode == 0, table.stderr
    assert all(s in table.stdout for s in (QUESTION[:30], "subtask-", "output-",
                                           "failure-")), table.stdout
    # ...and `conductor resume`, which reads the history to reset it, then runs on
    agent_server.script("claude", [Reply.ok("1000")])
    proc = await asyncio.to_thread(run_conductor, "resume", wid, "--yes", env=stack.env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = await conductor.result(wid)
    assert res.status == "completed" and res.answer == "Answer: 1024"

    codec = ("--codec-endpoint", stack.server.codec_endpoint or "")
    codec_port = str(stack.settings.embedded_codec_port)
    history = await stack.client.get_workflow_handle(wid, run_id=failed_run).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    body = json_format.MessageToJson(started.input)  # the task, encrypted
    assert QUESTION.encode() not in started.input.SerializeToString()
    describe = [temporal_binary(), "workflow", "describe", "--workflow-id", wid, "--address",
                settings.address, "--output", "json"]
    failed, latest, described, through_codec, mine = await asyncio.gather(
        # another local user, with Temporal's own CLI, straight at the server...
        asyncio.to_thread(as_nobody, *show(stack, wid, "--run-id", failed_run)),
        asyncio.to_thread(as_nobody, *show(stack, wid)),
        asyncio.to_thread(as_nobody, *describe),
        # ...and through the codec endpoint, which does not answer them at all
        asyncio.to_thread(as_nobody, sys.executable, "-c", _DECODE, codec_port, stdin=body),
        # the owner: the same CLI through the codec endpoint shows everything
        asyncio.to_thread(subprocess.run, show(stack, wid, "--run-id", failed_run, *codec),
                          capture_output=True, text=True, timeout=120))
    for theirs in (failed, latest, described):
        assert theirs.returncode == 0, theirs.stderr  # the server answers them...
        seen = readable(theirs.stdout) + theirs.stderr
        assert not [s for s in (*SECRETS, "Answer: 1024") if s in seen], seen[:3000]
        assert "binary/encrypted" in seen  # ...with ciphertext
    assert through_codec.stdout.startswith("refused:"), through_codec.stdout + \
        through_codec.stderr
    assert not [s for s in SECRETS if s in through_codec.stdout + through_codec.stderr]
    assert mine.returncode == 0, mine.stderr
    assert all(s in readable(mine.stdout) for s in SECRETS), mine.stdout[:3000]


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _preflight(url: str, origin: str) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(url, method="OPTIONS", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-namespace"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


async def test_the_ui_decodes_through_the_codec_endpoint_for_its_own_origin_only(
    stack: Stack,
) -> None:
    """The dev server's UI is told the endpoint (its settings API, which its pages read), the
    browser's preflight and decode from the UI's origin are granted, another origin's and a
    rebound host name's are not."""
    ui = f"http://localhost:{stack.settings.embedded_ui_port}"
    with urllib.request.urlopen(f"{ui}/api/v1/settings", timeout=30) as r:
        assert json.load(r)["Codec"]["Endpoint"] == stack.server.codec_endpoint
    [encrypted] = await stack.client.data_converter.encode([f"secret {MARK}"])
    body = json_format.MessageToJson(Payloads(payloads=[encrypted])).encode()
    url = f"{stack.server.codec_endpoint}/decode"
    status, headers = await asyncio.to_thread(_preflight, url, ui)
    assert status == 204 and headers.get("Access-Control-Allow-Origin") == ui
    assert "x-namespace" in headers.get("Access-Control-Allow-Headers", "")
    status, headers = await asyncio.to_thread(_preflight, url, "http://evil.test")
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    status, headers, out = await asyncio.to_thread(
        _post, url, body, {"Content-Type": "application/json", "Origin": ui,
                           "X-Namespace": "default"})
    assert status == 200 and headers.get("Access-Control-Allow-Origin") == ui
    decoded = json_format.Parse(out, Payloads()).payloads[0]
    assert json.loads(decoded.data) == f"secret {MARK}"
    # another page in the owner's browser may not read it; a rebound host name is refused
    status, headers, out = await asyncio.to_thread(
        _post, url, body, {"Content-Type": "application/json", "Origin": "http://evil.test"})
    assert status == 403 and "Access-Control-Allow-Origin" not in headers and MARK.encode() \
        not in out
    status, _, out = await asyncio.to_thread(
        _post, url, body, {"Content-Type": "application/json",
                           "Host": f"evil.test:{stack.settings.embedded_codec_port}"})
    assert status == 403 and MARK.encode() not in out


async def test_histories_written_before_encryption_still_read(
    agent_server, stack: Stack,
) -> None:
    """A run started by a client that did not encrypt (an older engine): its plain payloads
    pass through the codec, so the owner's trail reads them."""
    settings = stack.settings
    plain = await connect_temporal(settings.model_copy(update={"payload_encryption": False}),
                                   start_embedded=False)
    _script(agent_server, Reply.ok("1000"))
    wid = await ConductorClient(plain, settings).submit(Task(question=QUESTION))
    res = await ConductorClient(stack.client, settings).result(wid)
    assert res.status == "completed"
    trail = await step_trail(stack.client, res.workflow_id)
    assert trail.task is not None and trail.task.question == QUESTION
    assert trail.steps[0].output == OUTPUT


async def test_the_owners_worker_is_no_decryption_oracle(agent_server, stack: Stack) -> None:
    """Another user replays an agent's encrypted answer into a workflow that cannot take it:
    the owner's worker decrypts it to validate it, and the validation error (which quotes the
    start of its input) reaches history encrypted, not as text."""
    settings = stack.settings
    [stolen] = await stack.client.data_converter.encode([AgentReply(output=f"{MARK} {OUTPUT}")])
    theirs = await Client.connect(settings.address)  # no codec, no key
    handle = await theirs.start_workflow(
        BATCH_WORKFLOW, RawValue(stolen), id=f"oracle-{uuid.uuid4().hex[:8]}",
        task_queue=ConductorClient(stack.client, settings).task_queue)
    for _ in range(300):  # until the worker has tried it (a failed workflow task)
        events = [e async for e in handle.fetch_history_events()]
        if any(e.HasField("workflow_task_failed_event_attributes")
               or e.HasField("workflow_execution_failed_event_attributes") for e in events):
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("the worker never tried the workflow")
    await handle.terminate()
    written = b"".join(e.SerializeToString() for e in events)
    assert MARK.encode() not in written


def test_a_codec_port_another_user_holds_is_refused(tmp_path: Path) -> None:
    """Another user who listens on the codec endpoint's port first would get the UI's
    plaintext (its /encode calls) and could feed the owner's audit made-up values: the stack
    refuses to start its UI against it."""
    port = free_port()
    command, env, scratch = nobody_command(sys.executable, "-c", (
        "import socket, sys, time; s = socket.create_server(('127.0.0.1', int(sys.argv[1]))); "
        "print('listening', flush=True); time.sleep(120)"), str(port))
    squatter = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline() == "listening\n"
        key = tmp_path / "payload.key"
        load_or_create_key(key)
        server = EmbeddedTemporal(tmp_path / "data", free_port(), free_port(), codec_key=key,
                                  codec_port=port)
        with pytest.raises(EmbeddedError, match=rf"port {port}, .* held by another user "
                                                 rf"\(uid {NOBODY}\)"):
            server.start(detached=False)
        assert not server.running(), "nothing started"
    finally:
        squatter.kill()
        squatter.wait()
        shutil.rmtree(scratch, ignore_errors=True)
