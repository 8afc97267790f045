"""A TCP proxy a test can take down and bring back on the same port: a network partition
between the engine and one service (the blob store), with the service itself and its data
untouched. Down, connections are refused and every open one is cut."""

from __future__ import annotations

import asyncio
import contextlib


class Proxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def up(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port,
                                                  reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        """Refuse new connections and cut the open ones."""
        assert self._server is not None
        self._server.close()
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()
        await self._server.wait_closed()
        self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._open.update((writer, up_writer))
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._open.discard(w)
                w.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.write_eof()
