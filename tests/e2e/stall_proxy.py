"""A TCP proxy for tests that can make the network hang: traffic stops, nothing is reset.

:class:`StallProxy` listens on 127.0.0.1 (a free port) and forwards every connection to one
upstream address (PostgreSQL). :meth:`StallProxy.stall` stops forwarding in both directions and
stops reading from either side, keeping every connection open: a peer's writes pile up in the
kernel buffers until its TCP window closes, and its reads wait, as behind a link that drops
packets. A connection opened during a stall is accepted but not connected upstream until
:meth:`StallProxy.resume`, which lets everything held flow again, in order. A refused or reset
connection is the other kind of fault; this proxy never makes one.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse

CHUNK = 65_536


class StallProxy:
    """Forwards 127.0.0.1:``port`` to ``upstream_host``:``upstream_port``; can stall and resume."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @classmethod
    def for_dsn(cls, dsn: str) -> StallProxy:
        """A proxy in front of the server a ``postgresql://`` DSN names."""
        parts = urllib.parse.urlsplit(dsn)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5432)

    def dsn(self, dsn: str) -> str:
        """``dsn`` with its host and port replaced by this proxy's."""
        parts = urllib.parse.urlsplit(dsn)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{self.port}" if userinfo else f"127.0.0.1:{self.port}"
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    async def start(self) -> StallProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stall(self) -> None:
        """Stop forwarding and reading, both ways, on every connection; keep them all open."""
        self._flowing.clear()
        for writer in self._writers:
            # Not even into our own buffers: the sender's data stays in its kernel, as on a dead link.
            with contextlib.suppress(Exception):
                writer.transport.pause_reading()

    def resume(self) -> None:
        """Forward again, starting with what was held."""
        self._flowing.set()
        for writer in self._writers:
            with contextlib.suppress(Exception):
                writer.transport.resume_reading()

    async def close(self) -> None:
        """Stop listening and end every connection (abort: this is teardown, not a fault)."""
        self._flowing.set()
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def __aenter__(self) -> StallProxy:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self._writers.add(client_writer)
        current = asyncio.current_task()
        if current is not None:
            self._track(current)
        try:
            await self._flowing.wait()  # a connection made during a stall hangs, unanswered
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(*self._upstream)
            except OSError:
                return
            self._writers.add(upstream_writer)
            if self.stalled:  # stalled again while connecting
                upstream_writer.transport.pause_reading()
                client_writer.transport.pause_reading()
            try:
                await asyncio.gather(
                    self._pump(client_reader, upstream_writer),
                    self._pump(upstream_reader, client_writer),
                )
            finally:
                upstream_writer.transport.abort()
                self._writers.discard(upstream_writer)
        finally:
            client_writer.transport.abort()
            self._writers.discard(client_writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer`` while flowing; on end of stream, end the other side too."""
        try:
            while True:
                await self._flowing.wait()  # stalled: stop reading, so the sender's window fills
                data = await reader.read(CHUNK)
                if not data:
                    break
                await self._flowing.wait()  # read just before the stall: hold it until resumed
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()  # the other pump sees its reader end
