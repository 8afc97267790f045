"""The codec endpoint: Temporal's remote codec protocol (POST /encode, POST /decode with a
Payloads message as protobuf JSON), on loopback, answering only the user who owns the key.

The Temporal UI decrypts what it shows by calling this endpoint from the browser
(`--ui-codec-endpoint`), and so can the `temporal` CLI (`--codec-endpoint`). Binding to
127.0.0.1 keeps other machines out but not other users of this one, and the UI tells anyone who
asks where its codec endpoint is. So each connection is checked before a byte of it is read:

- **the peer's uid.** A loopback TCP connection's other end is a socket in this host's table
  (`/proc/net/tcp`), which names the uid that owns it; a connection from any uid but this
  process's is closed unanswered. The owner's browser, CLI, or the sshd forwarding their tunnel
  run as the owner; another user's curl does not. Where the table cannot be read (not Linux),
  the check cannot be made and every local process is served: said once at start.
- **the Host header** must name this endpoint (127.0.0.1 or localhost and its port): a web page
  that rebinds its own name to 127.0.0.1 sends its own name and is refused.
- **the Origin header**, when a browser sends one, must be the UI's own; CORS answers grant
  exactly those origins, so no other page the owner visits can read a decrypted payload.

`python -m conductor_engine.runtime.codec_server --key FILE --port N --ui-port M` runs it;
the embedded stack starts it beside the dev server (runtime/embedded.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload, Payloads

from conductor_engine.engine.storage.codec import CodecError, EncryptionCodec, read_key

HOST = "127.0.0.1"
MAX_BODY = 64 << 20
"""The largest request read: a UI page decodes a history's payloads in batches, each payload
under Temporal's 2 MB limit."""
READ_TIMEOUT_S = 30.0
_TCP_TABLES = {socket.AF_INET: "/proc/net/tcp", socket.AF_INET6: "/proc/net/tcp6"}


def _proc_address(text: str, family: int) -> tuple[str, int]:
    """An `ADDR:PORT` of /proc/net/tcp: the address as the kernel's native-endian words of a
    network-order address, the port in big-endian hex."""
    addr, port = text.split(":")
    raw = b"".join(struct.pack("=I", int(addr[i:i + 8], 16)) for i in range(0, len(addr), 8))
    return socket.inet_ntop(family, raw), int(port, 16)


def peer_uid(conn: socket.socket) -> int | None:
    """The uid owning the other end of a loopback TCP connection (from /proc/net/tcp), or None
    when the table cannot be read or lists no such socket (the peer already left)."""
    family = conn.family
    table = _TCP_TABLES.get(family)
    if table is None:
        return None
    peer, here = conn.getpeername()[:2], conn.getsockname()[:2]
    try:
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                # the peer's socket: its local end is our peer, its remote end is us
                if (_proc_address(fields[1], family) == peer
                        and _proc_address(fields[2], family) == here):
                    return int(fields[7])
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return None


def listener_uid(port: int) -> int | None:
    """The uid owning the socket listening on `port` (any local address), from the kernel's
    socket tables; None when none is listed or the tables cannot be read."""
    for family, table in _TCP_TABLES.items():
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A" and _proc_address(fields[1], family)[1] == port:
                        return int(fields[7])
        except (OSError, ValueError, IndexError, StopIteration):
            continue
    return None


def peer_check_works() -> bool:
    return os.path.exists(_TCP_TABLES[socket.AF_INET])


class CodecServer(ThreadingHTTPServer):
    """Serves the codec to connections from `owner` (a uid) only; see the module docstring."""

    daemon_threads = True

    def __init__(self, codec: EncryptionCodec, port: int, ui_origins: Sequence[str],
                 owner: int | None = None, host: str = HOST) -> None:
        self.codec = codec
        self.owner = os.geteuid() if owner is None else owner
        self.origins = frozenset(ui_origins)
        self.check_peers = peer_check_works()
        self.refused = 0
        self._last_refusal_log = 0.0
        super().__init__((host, port), _Handler)
        self.hosts = frozenset({f"127.0.0.1:{self.server_port}", f"localhost:{self.server_port}"})

    def verify_request(self, request: Any, client_address: Any) -> bool:
        if not self.check_peers:
            return True
        uid = peer_uid(request)
        if uid == self.owner:
            return True
        self.refused += 1
        now = time.monotonic()
        if now - self._last_refusal_log > 60:  # at most a line a minute, however many knock
            self._last_refusal_log = now
            print(f"codec endpoint: refused a connection from uid {uid} (only uid {self.owner} "
                  f"is served; {self.refused} refused so far)", file=sys.stderr, flush=True)
        return False


class _Handler(BaseHTTPRequestHandler):
    server: CodecServer
    timeout = READ_TIMEOUT_S
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass  # one line per UI request would grow the log without bound; errors are answered

    def _cors(self) -> dict[str, str]:
        origin = self.headers.get("Origin")
        if origin is None or origin not in self.server.origins:
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                "Access-Control-Allow-Methods": "POST, OPTIONS",
                "Access-Control-Allow-Headers": "content-type, x-namespace, authorization",
                "Access-Control-Allow-Credentials": "true", "Access-Control-Max-Age": "600"}

    def _send(self, status: HTTPStatus, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        for name, value in self._cors().items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _refusal(self) -> str | None:
        """Why this request is not served (wrong Host, a foreign Origin), or None."""
        if self.headers.get("Host") not in self.server.hosts:
            return "wrong Host: this endpoint answers only as 127.0.0.1 or localhost"
        origin = self.headers.get("Origin")
        if origin is not None and origin not in self.server.origins:
            return f"origin {origin} is not the Temporal UI this endpoint serves"
        return None

    def do_OPTIONS(self) -> None:  # noqa: N802 (http.server's naming)
        why = self._refusal()
        if why is not None or self.headers.get("Origin") is None:
            self._send(HTTPStatus.FORBIDDEN, (why or "no Origin").encode())
            return
        self._send(HTTPStatus.NO_CONTENT, b"")

    def do_POST(self) -> None:  # noqa: N802
        action: Callable[[Sequence[Payload]], list[Payload]] | None = {
            "encode": self.server.codec.encrypt, "decode": self.server.codec.decrypt,
        }.get(self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1])
        why = self._refusal()
        if why is not None:
            self._send(HTTPStatus.FORBIDDEN, why.encode())
            return
        if action is None:
            self._send(HTTPStatus.NOT_FOUND, b"POST /encode or /decode")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._send(HTTPStatus.LENGTH_REQUIRED, b"Content-Length required")
            return
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"over {MAX_BODY} bytes".encode())
            return
        try:
            payloads = json_format.Parse(self.rfile.read(length), Payloads(),
                                         ignore_unknown_fields=True)
            result = Payloads(payloads=action(payloads.payloads))
        except (json_format.ParseError, DecodeError, UnicodeDecodeError) as e:
            self._send(HTTPStatus.BAD_REQUEST, f"not a Payloads message in JSON: {e}".encode())
            return
        except CodecError as e:
            self._send(HTTPStatus.UNPROCESSABLE_ENTITY, str(e).encode())
            return
        self._send(HTTPStatus.OK, json_format.MessageToJson(result).encode(), "application/json")


def ui_origins(ui_port: int) -> list[str]:
    return [f"http://localhost:{ui_port}", f"http://127.0.0.1:{ui_port}"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--key", type=Path, required=True, help="the payload key file")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ui-port", type=int, required=True, help="the Temporal UI's port")
    args = parser.parse_args(argv)
    try:
        codec = EncryptionCodec(read_key(args.key))
        server = CodecServer(codec, args.port, ui_origins(args.ui_port))
    except (CodecError, OSError) as e:
        sys.exit(f"codec endpoint: {e}")
    if not server.check_peers:
        print("codec endpoint: this system has no /proc/net/tcp, so the uid of a caller cannot "
              "be checked: every local user can decrypt through this endpoint",
              file=sys.stderr, flush=True)
    for sig in (signal.SIGTERM, signal.SIGINT):  # `conductor up`'s Ctrl-C reaches it too
        signal.signal(sig, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
