"""``fastlane worker``: load the named :class:`~fastlane.worker.Worker` and run it until signalled.

Re-exported as :func:`fastlane.worker.run_worker_cli`.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from fastlane.auth.tls import ClientTls
from fastlane.errors import ConfigurationError
from fastlane.worker.sdk import Worker

log = logging.getLogger("fastlane.worker")


def run_worker_cli(
    target: str,
    servers: Sequence[str],
    concurrency: int | None,
    *,
    token: str | None = None,
    tls: ClientTls | None = None,
    realtime_priority: int | None = None,
    metrics: str | None = None,
) -> int:
    """Run the worker named by ``target`` until SIGTERM or SIGINT; return the exit code.

    The first signal stops gracefully (drain); a second one exits at once.

    Args:
        target: ``"package.module:attribute"``, a :class:`Worker` or a zero-argument callable
            returning one.
        servers: Node addresses replacing the worker's own, if any are given.
        concurrency: Replaces the worker's concurrency if given.
        token, tls: Replace the worker's API token and TLS settings if given.
        realtime_priority: Replaces the worker's real-time priority if given.
        metrics: Replaces the worker's metrics address if given.

    Returns:
        0 after a graceful stop, 1 after a forced exit, 2 if the target is unusable.
    """
    try:
        worker = _load_worker(target)
        worker.override(servers=servers, concurrency=concurrency, token=token, tls=tls,
                        realtime_priority=realtime_priority, metrics=metrics)
        if not worker.job_types:
            raise ConfigurationError(f"{target!r} has no handlers: register one with @worker.handler(job_type)")
    except ConfigurationError as exc:
        print(f"fastlane worker: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(_run_until_signalled(worker))


async def _run_until_signalled(worker: Worker) -> int:
    loop = asyncio.get_running_loop()
    running = asyncio.create_task(worker.run(), name="worker-run")
    stopping: list[asyncio.Task[None]] = []

    def on_signal(signum: signal.Signals) -> None:
        if not stopping:
            log.info("%s received: stopping gracefully (send it again to exit at once)", signum.name)
            stopping.append(loop.create_task(worker.stop(), name="worker-graceful-stop"))
        else:
            log.warning("%s received again: exiting at once", signum.name)
            running.cancel()

    signals = (signal.SIGTERM, signal.SIGINT)
    for signum in signals:
        with suppress(NotImplementedError):  # platforms without loop signal handlers
            loop.add_signal_handler(signum, on_signal, signum)
    try:
        await running
        return 0
    except asyncio.CancelledError:
        if running.cancelled() and len(stopping) == 1:
            return 1
        raise
    finally:
        for signum in signals:
            with suppress(NotImplementedError):
                loop.remove_signal_handler(signum)
        for task in stopping:
            task.cancel()


def _load_worker(target: str) -> Worker:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"worker target {target!r} must look like 'package.module:attribute'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would, so a worker module beside you imports
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as exc:  # whatever breaks the import, report it the same way
        raise ConfigurationError(f"cannot import {module_name!r} for {target!r}: {type(exc).__name__}: {exc}") from exc
    for name in attribute.split("."):
        try:
            found = getattr(found, name)
        except AttributeError:
            raise ConfigurationError(f"{module_name!r} has no attribute {attribute!r} (from {target!r})") from None
    if not isinstance(found, Worker) and callable(found):
        try:
            found = found()
        except Exception as exc:  # a failing factory is an unusable target too
            raise ConfigurationError(f"{target!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(found, Worker):
        kind = type(found).__name__
        raise ConfigurationError(f"{target!r} is a {kind}, not a fastlane Worker (or a function returning one)")
    return found
