"""The console's HTTP listener, in the node's own event loop: started with the API, stopped with it.

Under TLS it serves the API's certificate and key (``--tls-cert``/``--tls-key``), read again when
the files change, as the API does: each new connection's handshake looks at the files' stamps and
takes a fresh context if they moved. Client certificates are not asked for even when the API
requires them (``--tls-client-ca``): browsers sign in with an API token instead.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

from aiohttp import web

from fastlane.console.app import build_app
from fastlane.console.rendering import Console
from fastlane.errors import ConfigurationError

log = logging.getLogger("fastlane.console")


class _RotatingContext:
    """A server SSL context whose certificate follows its files."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self._files = (cert_file, key_file)
        self._stamps = self._read_stamps()
        self.context = self._load()
        self._current = self.context
        self.context.sni_callback = self._on_handshake

    def _read_stamps(self) -> tuple[tuple[int, int], ...]:
        return tuple((os.stat(path).st_mtime_ns, os.stat(path).st_size) for path in self._files)

    def _load(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(*self._files)
        except (OSError, ssl.SSLError) as error:
            raise ConfigurationError(f"--tls-cert/--tls-key cannot be used for the console: {error}") from error
        return context

    def _on_handshake(self, connection: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> None:
        try:
            stamps = self._read_stamps()
            if stamps != self._stamps:
                fresh = self._load()
                fresh.sni_callback = self._on_handshake
                self._current, self._stamps = fresh, stamps
                log.info("console certificate files changed: new connections use the new certificate")
        except (OSError, ConfigurationError) as error:
            log.warning("console certificate files changed but cannot be used (%s): keeping the current ones", error)
        if self._current is not self.context:
            connection.context = self._current


class ConsoleServer:
    """Serves ``console`` on ``listen`` (``HOST:PORT``; port 0 picks a free one, see :attr:`port`)."""

    def __init__(self, console: Console, listen: str, *, tls_files: tuple[Path, Path] | None = None) -> None:
        self._console = console
        self._listen = listen
        self._ssl = _RotatingContext(*tls_files).context if tls_files is not None else None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        host = self._listen.rpartition(":")[0]
        return f"{'https' if self._ssl else 'http'}://{host}:{self.port}/"

    async def start(self) -> None:
        runner = web.AppRunner(build_app(self._console), access_log=None, handle_signals=False)
        await runner.setup()
        host, _, port = self._listen.rpartition(":")
        site = web.TCPSite(runner, host.strip("[]"), int(port), ssl_context=self._ssl, reuse_port=False)
        try:
            await site.start()
        except OSError as error:
            await runner.cleanup()
            raise ConfigurationError(f"--console {self._listen}: cannot listen: {error.strerror or error}") from error
        self._runner = runner
        self.port = runner.addresses[0][1] if runner.addresses else int(port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
