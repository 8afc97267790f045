"""The HTTP side of the server, apart from any script: the stdlib server and its handler, which
path goes to which API family's codec, the API key however a family sends it, sending a reply,
and noticing a client that hung up."""

from __future__ import annotations

import json
import re
import select
import socket
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.agent_server import anthropic, google, openai
from tests.agent_server.codec import Api, Codec


class HttpServer(ThreadingHTTPServer):
    """Serves every POST with `handle_post` (the AgentServer's), a thread per connection."""

    daemon_threads = True
    handle_post: Callable[[Handler], None]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDKs' connection pools expect
    disable_nagle_algorithm = True  # reply at once: no ~40 ms Nagle/delayed-ACK stall
    server: HttpServer

    def do_POST(self) -> None:
        self.server.handle_post(self)

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the tests' output is for the tests."""


CODECS: dict[Api, Codec] = {
    "openai": openai.CHAT,
    "responses": openai.RESPONSES,
    "anthropic": anthropic.MESSAGES,
    "gemini": google.GENERATE_CONTENT,
}
_GEMINI_PATH = re.compile(r"^/v1(?:beta|alpha)?/models/(?P<model>[^/:]+):generateContent$")


def route(path: str) -> tuple[Api, str] | None:
    """(API family, model from the path or "") for a request path, None if not served."""
    if path == "/v1/chat/completions":
        return "openai", ""
    if path == "/v1/responses":
        return "responses", ""
    if path == "/v1/messages":
        return "anthropic", ""
    match = _GEMINI_PATH.match(path)
    if match:
        return "gemini", match["model"]
    return None


def api_key(headers: Mapping[str, str], query: str) -> str | None:
    """The key as any family sends it: a bearer token, x-api-key, x-goog-api-key or ?key=.
    `headers` are keyed in lower case."""
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:]
    found = headers.get("x-api-key") or headers.get("x-goog-api-key")
    if found:
        return found
    match = re.search(r"(?:^|&)key=([^&]+)", query)
    return match[1] if match else None


def send(h: BaseHTTPRequestHandler, status: int, payload: bytes | dict[str, Any],
         headers: Mapping[str, str]) -> bool:
    """One JSON reply (`payload` as is when bytes), with any extra headers; False when the
    client had hung up and the reply could not be written."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    try:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()
    except (BrokenPipeError, ConnectionResetError):
        # The client gave up (its timeout passed while this reply was delayed).
        h.close_connection = True
        return False
    return True


def hung_up(conn: socket.socket) -> bool:
    """Whether the client closed its end: readable with nothing to read (clients here send
    nothing more on a connection while they await its reply)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True
