"""Child processes of fastlane for tests and benchmarks: daemons and workers on 127.0.0.1.

A test that needs the real thing (a ``fastlane serve`` and a ``fastlane worker``, each its own
process, to be killed and restarted) starts them with :class:`Daemon` and :class:`WorkerProcess`.
Each process writes its output to a log file, and ``stop()`` always ends it: SIGTERM, then
SIGKILL after a bounded wait. ``kill()`` is a crash (SIGKILL), not a shutdown.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import fastlane

# Where this process's fastlane comes from, which children must import too: the checkout (or
# site-packages) holding the package, and the directory children run in. In a checkout that is
# the repository, so ROOT is it too.
FASTLANE_ROOT = Path(fastlane.__file__).resolve().parent.parent
ROOT = FASTLANE_ROOT
STOP_TIMEOUT = 15.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (another process may take it since:
    callers that bind it themselves retry)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def child_environment(*extra_paths: Path, **variables: str) -> dict[str, str]:
    """This environment, with this fastlane (and ``extra_paths`` before it) importable and output
    unbuffered; ``variables`` set on top."""
    env = dict(os.environ)
    paths = [str(path) for path in dict.fromkeys((*extra_paths, FASTLANE_ROOT))]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(variables)
    return env


class Process:
    """A child process whose output goes to a log file."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.log_path = log_path
        self.env = env or child_environment()
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=FASTLANE_ROOT)

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.popen and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(STOP_TIMEOUT)

    def stop(self) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if not self.popen or self.popen.poll() is not None:
            return self.popen.returncode if self.popen else None
        self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(STOP_TIMEOUT)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Daemon(Process):
    """``fastlane serve`` on a free loopback port, with metrics on another."""

    def __init__(self, db_url: str, log_path: Path, *, node_id: str = "node-1", shards: int = 8,
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
                 client_options: Mapping[str, Any] | None = None) -> None:
        """``client_options``: how the harness's own client calls reach it (token, TLS)."""
        self.client_options = dict(client_options or {})
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.metrics_address = f"127.0.0.1:{free_port()}"
        super().__init__(
            [sys.executable, "-m", "fastlane", "serve", "--db", db_url, "--listen", self.address,
             "--node-id", node_id, "--shards", str(shards), "--metrics", self.metrics_address, *extra_args],
            log_path, env,
        )

    async def wait_ready(self, timeout: float = 30.0) -> None:
        from fastlane.client import Client

        async with Client(self.address, **self.client_options) as client:
            try:
                await client.wait_ready(timeout)
            except Exception as error:
                raise RuntimeError(f"daemon not ready: {error}\n{self.log_tail()}") from error

    def metric_sum(self, family: str, **labels: str) -> float:
        """The sum of the node's samples of ``family`` that have these labels (and any others),
        e.g. ``metric_sum("fastlane_runs_total", outcome="succeeded")`` over every job type and tenant."""
        return summed(self.metrics(), family, **labels)

    def metrics(self) -> dict[str, float]:
        """The node's Prometheus samples by name with labels, e.g.
        'fastlane_runs_total{outcome="succeeded",job_type="e2e",tenant="default"}'."""
        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=5) as response:
            text = response.read().decode()
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples


class WorkerProcess(Process):
    """``fastlane worker TARGET --server ADDRESS``."""

    def __init__(self, target: str, addresses: Sequence[str], log_path: Path, *,
                 concurrency: int | None = None, env: dict[str, str] | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        argv = [sys.executable, "-m", "fastlane", "worker", target, *extra_args]
        for address in addresses:
            argv += ["--server", address]
        if concurrency is not None:
            argv += ["--concurrency", str(concurrency)]
        super().__init__(argv, log_path, env)


_SAMPLE = re.compile(r'^(?P<family>[^{]+)(?:\{(?P<labels>.*)\})?$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def summed(samples: Mapping[str, float], family: str, **labels: str) -> float:
    """The sum of the ``samples`` (as :meth:`Daemon.metrics` reads them) of ``family`` whose
    labels include ``labels``."""
    total = 0.0
    for key, value in samples.items():
        match = _SAMPLE.match(key)
        if match is None or match["family"] != family:
            continue
        have = dict(_LABEL.findall(match["labels"] or ""))
        if all(have.get(name) == wanted for name, wanted in labels.items()):
            total += value
    return total
