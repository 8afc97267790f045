"""Hostile HTTP clients of `conductor serve`, on loopback, each bounded in bytes and time, and the
keyed client whose answers they must not hold up: shared by tests/integration/test_serve_guard.py
and tests/benchmarks/bench_serve_attacks.py."""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Awaitable
from typing import Any

SERVER_FILES = 1024
"""The open-file limit a served attack runs the server under (a common default): 1,100
half-sent requests are more connections than it may hold."""


def limit_server_files() -> None:
    """For `preexec_fn`: the server process may open SERVER_FILES files."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (SERVER_FILES, SERVER_FILES))


def raise_own_files(wanted: int) -> bool:
    """Raise this process's open-file soft limit to `wanted`; False when the hard one is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return True
    if hard != resource.RLIM_INFINITY and hard < wanted:
        return False
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return True


async def get_models(port: int, key: str) -> tuple[int, float]:
    """A keyed GET /v1/models on a fresh connection: its status and how long it took."""
    start = time.monotonic()
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    try:
        writer.write(f"GET /v1/models HTTP/1.1\r\nHost: serve\r\nAuthorization: Bearer {key}\r\n"
                     "Connection: close\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1]), time.monotonic() - start


async def answers_while(attack: Awaitable[Any], port: int, key: str
                        ) -> tuple[Any, list[float]]:
    """Keyed requests, one after another, for as long as `attack` runs (at least three): what
    the attack returned and how long each answer took (every one must be a 200)."""
    running = asyncio.ensure_future(attack)
    took: list[float] = []
    while not running.done() or len(took) < 3:
        status, seconds = await get_models(port, key)
        assert status == 200, status
        took.append(seconds)
        await asyncio.sleep(0.05)
    return await running, took


async def endless_header(port: int, most: int = 64 << 20) -> tuple[int, bytes]:
    """One header that never ends, 64 KiB at a time, up to `most` bytes: how much was sent
    before the server stopped it, and what it answered (b"" for a closed connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: serve\r\nX-Pad: ")
    try:
        while sent < most:
            writer.write(b"a" * 65536)
            await asyncio.wait_for(writer.drain(), 10)
            sent += 65536
    except (ConnectionError, TimeoutError):
        pass
    try:
        answer = await asyncio.wait_for(reader.read(1024), 10)
    except ConnectionError:
        answer = b""
    writer.close()
    return sent, answer


async def half_sent_requests(port: int, count: int = 1100, hold_s: float = 1.5) -> int:
    """`count` connections, 100 at a time, each sending half a request head (no key) and then
    nothing; held `hold_s` once all are open, then closed. How many were opened."""
    writers: list[asyncio.StreamWriter] = []

    async def one() -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: serve\r\nX-Slow: ")
        writers.append(writer)

    try:
        for start in range(0, count, 100):
            await asyncio.gather(*(one() for _ in range(min(100, count - start))))
        await asyncio.sleep(hold_s)
        return len(writers)
    finally:
        for writer in writers:
            writer.close()


def tiny_objects_bodies() -> tuple[bytes, bytes]:
    """Two chat bodies of just under 8 MiB: 270,000 one-letter messages, and one message of
    300,000 one-letter content parts."""
    messages = b'{"model":"conductor","messages":[' + b'{"role":"user","content":"a"},' * 270_000
    parts = (b'{"model":"conductor","messages":[{"role":"user","content":['
             + b'{"type":"text","text":"a"},' * 300_000)
    return messages[:-1] + b"]}", parts[:-1] + b"]}]}"


async def post_chat(port: int, key: str, body: bytes) -> bytes:
    """A keyed POST /v1/chat/completions of `body`, sent at once: the whole answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: serve\r\nAuthorization: Bearer "
                 f"{key}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                 "Connection: close\r\n\r\n".encode() + body)
    answer = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    return answer


async def tiny_chunks(port: int, key: str | None = None, most: int = 1_400_000
                      ) -> tuple[int, bytes]:
    """A chunked request body of up to `most` one-byte chunks (8 MiB of framing), keyed or
    not, sent as fast as the server takes them: how many went out before the server stopped
    taking them, and what it answered (b"" for a connection closed or reset)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: serve\r\n{auth}Content-Type: "
                 "application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
    sent = 0
    try:
        while sent < most:
            writer.write(b"1\r\n \r\n" * 10_000)
            await asyncio.wait_for(writer.drain(), 10)
            sent += 10_000
    except (ConnectionError, TimeoutError):
        pass
    try:
        answer = await asyncio.wait_for(reader.read(1024), 10)
    except ConnectionError:
        answer = b""
    writer.close()
    return sent, answer
