"""Daemon settings: one frozen value, validated once, shared by every component of a node.

A default that a component also applies by itself is that component's constant, named here
(the shard count beside the store, the lease TTL beside the shard ownership, the retention beside
the trimmer), so no default is written twice; ``fastlane serve``'s flags take theirs from here.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from fastlane.domain.limits import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_SHARD_LEASE_TTL,
    MAX_BACKLOG,
    MAX_BACKLOG_SECONDS,
    MAX_HISTORY_RETENTION,
    MAX_SEND_AHEAD,
    MAX_TENANT_IN_FLIGHT,
    MAX_TENANT_WEIGHT,
    MIN_HISTORY_RETENTION,
    PAYLOAD_CEILING_BYTES,
)
from fastlane.domain.quotas import TenantQuota
from fastlane.engine.dispatch.dispatcher import DEFAULT_MAX_READY_BYTES_PER_TYPE, DEFAULT_MAX_READY_PER_TYPE
from fastlane.engine.dispatch.reserve import PriorityReserve
from fastlane.engine.lane_settings import LANE_DEFAULTS, LaneSettings
from fastlane.engine.retention import DEFAULT_RETENTION
from fastlane.engine.shards import DEFAULT_MAX_CLOCK_OFFSET
from fastlane.errors import ConfigurationError
from fastlane.rpc.channel import DEFAULT_SERVER, is_loopback_host
from fastlane.storage import DEFAULT_SHARD_COUNT

DEFAULT_QUOTAS = TenantQuota(max_jobs=1_000_000, job_creations_per_second=1_000.0, max_waiting_runs=1_000_000)
DEFAULT_DB_URL = "sqlite:///fastlane.db"


def default_node_id() -> str:
    """$FASTLANE_NODE_ID (in Kubernetes, set to the pod's name), else host name and process id."""
    return os.environ.get("FASTLANE_NODE_ID") or f"{socket.gethostname()}-{os.getpid()}"



@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """How one node runs. Durations are timedeltas; the CLI converts from seconds."""

    # The database: sqlite:///path/to/file.db, or postgresql://user@host/db (every server of a
    # primary and its standbys may be named, with target_session_attrs=read-write).
    db_url: str = DEFAULT_DB_URL
    listen: str = DEFAULT_SERVER  # the HOST:PORT of the gRPC API
    # The HOST:PORT other nodes and workers reach this node at; None: the listen address.
    advertise: str | None = None
    node_id: str = field(default_factory=default_node_id)  # this node's name, unique in the cluster
    # The HOST:PORT of the Prometheus metrics, over plain HTTP without a token; None: not served.
    metrics_listen: str | None = None
    # Under --auth, /metrics shows tenants and job types as pseudonyms unless this is set.
    metrics_names: bool = False
    # Never answer a job's payload, a run's input, output or checkpoint (GetJob, ListJobs, GetRun,
    # the console), whatever the caller's role: for data no operator of the scheduler may read.
    hide_payloads: bool = False
    # The HOST:PORT of the gRPC health service alone, in plain gRPC without a token (for probes);
    # None: not served apart from the API.
    health_listen: str | None = None
    # The HOST:PORT of the web console (HTTP, or HTTPS with the API's TLS files); None: not served.
    console_listen: str | None = None
    # Every call but health checks needs an API token (fastlane tokens create).
    auth: bool = False
    # TLS for the API: the PEM certificate (chain) it serves, re-read when the file changes; None:
    # no TLS.
    tls_cert: Path | None = None
    tls_key: Path | None = None  # the PEM private key of tls_cert, re-read with it
    # The PEM CA that client certificates must be signed by (mutual TLS); None: none are asked for.
    tls_client_ca: Path | None = None
    # Allow the API and the console on a non-loopback address without tokens and TLS, and the
    # metrics without tokens (for development).
    insecure: bool = False
    # Quotas of every tenant without an override of its own (fastlane quotas set); generous, to
    # stop a runaway client rather than to ration normal use.
    quotas: TenantQuota = field(default_factory=lambda: DEFAULT_QUOTAS)
    shard_count: int = DEFAULT_SHARD_COUNT  # the shards jobs are split into; the same on every node of a cluster
    # How long a shard lease lasts without renewal: a crashed node's shards move after it.
    shard_lease_ttl: timedelta = DEFAULT_SHARD_LEASE_TTL
    # The fast lane's settings below (with max_backlog, max_backlog_seconds, send_ahead and
    # priority_reserve) are LaneSettings' fields: what each means is written there.

    window: timedelta = LANE_DEFAULTS.window
    lead: timedelta = LANE_DEFAULTS.lead
    scan_interval: timedelta = LANE_DEFAULTS.scan_interval
    full_scan_interval: timedelta = LANE_DEFAULTS.full_scan_interval
    max_batch: int = LANE_DEFAULTS.max_batch
    # The most this node's wall clock may differ from the database's: beyond it the node owns no
    # shards (within it, the node fires on its clock corrected to the database's).
    max_clock_offset: timedelta = DEFAULT_MAX_CLOCK_OFFSET
    # Released runs a node keeps in memory per job type while no worker takes them; beyond it they
    # wait in the database (where they already are) and are read back as workers take runs.
    max_ready_per_type: int = DEFAULT_MAX_READY_PER_TYPE
    # The most payload bytes of released runs a node keeps in memory per job type while no worker
    # takes them; beyond it runs wait in the database the same way.
    max_ready_bytes_per_type: int = DEFAULT_MAX_READY_BYTES_PER_TYPE
    max_backlog: int = LANE_DEFAULTS.max_backlog
    max_backlog_seconds: float = LANE_DEFAULTS.max_backlog_seconds
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES  # the largest job payload the API accepts
    send_ahead: timedelta = LANE_DEFAULTS.send_ahead
    # Runs a tenant takes per turn when runs of several tenants wait for the same workers; 1 for
    # every tenant not named. Give every node of a cluster the same weights.
    tenant_weights: dict[str, int] = field(default_factory=dict)
    # Attempts of a tenant's runs this node has at workers at once; no cap for a tenant not named.
    tenant_max_in_flight: dict[str, int] = field(default_factory=dict)
    priority_reserve: PriorityReserve | None = LANE_DEFAULTS.priority_reserve
    # Finished runs (and their attempts) older than this are deleted; None keeps them for ever.
    history_retention: timedelta | None = DEFAULT_RETENTION

    @property
    def lane(self) -> LaneSettings:
        """The fast lane's part of these settings."""
        return LaneSettings(window=self.window, lead=self.lead, scan_interval=self.scan_interval,
                            full_scan_interval=self.full_scan_interval, max_batch=self.max_batch,
                            max_backlog=self.max_backlog, max_backlog_seconds=self.max_backlog_seconds,
                            send_ahead=self.send_ahead, priority_reserve=self.priority_reserve)

    def __post_init__(self) -> None:
        self._check_listeners()
        self.quotas.validated()
        if self.shard_count < 1:
            raise ConfigurationError(f"shard count {self.shard_count} must be at least 1")
        if not 1 <= self.max_payload_bytes <= PAYLOAD_CEILING_BYTES:
            raise ConfigurationError(
                f"--max-payload-bytes {self.max_payload_bytes} is out of range (1..{PAYLOAD_CEILING_BYTES})"
            )
        if self.max_ready_bytes_per_type < 1:
            raise ConfigurationError(f"--max-ready-bytes-per-type {self.max_ready_bytes_per_type} must be at least 1")
        if self.max_ready_per_type < 1:
            raise ConfigurationError(f"--max-ready-per-type {self.max_ready_per_type} must be at least 1")
        if not 1 <= self.max_backlog <= MAX_BACKLOG:
            raise ConfigurationError(f"--max-backlog {self.max_backlog} is out of range (1..{MAX_BACKLOG})")
        if not 0 <= self.max_backlog_seconds <= MAX_BACKLOG_SECONDS:  # NaN fails too
            raise ConfigurationError(
                f"--max-backlog-seconds {self.max_backlog_seconds} is out of range (0..{MAX_BACKLOG_SECONDS:g})")
        if not timedelta(0) <= self.send_ahead <= MAX_SEND_AHEAD:
            raise ConfigurationError(
                f"--send-ahead {self.send_ahead.total_seconds() * 1000:g} ms is out of range "
                f"(0..{MAX_SEND_AHEAD.total_seconds() * 1000:g} ms)"
            )
        for tenant, weight in self.tenant_weights.items():
            if not 1 <= weight <= MAX_TENANT_WEIGHT:
                raise ConfigurationError(f"--tenant-weight {tenant}={weight} is out of range (1..{MAX_TENANT_WEIGHT})")
        for tenant, cap in self.tenant_max_in_flight.items():
            if not 1 <= cap <= MAX_TENANT_IN_FLIGHT:
                raise ConfigurationError(
                    f"--tenant-max-in-flight {tenant}={cap} is out of range (1..{MAX_TENANT_IN_FLIGHT})")
        if self.priority_reserve is not None:
            self.priority_reserve.validate()
        retention = self.history_retention
        if retention is not None and not MIN_HISTORY_RETENTION <= retention <= MAX_HISTORY_RETENTION:
            raise ConfigurationError(
                f"--history-retention {retention / timedelta(days=1):.3g} days is out of range "
                f"({MIN_HISTORY_RETENTION / timedelta(days=1):.3g}..{MAX_HISTORY_RETENTION.days} days, or 0 to keep all)"
            )
        if self.lead + self.send_ahead >= self.window:
            raise ConfigurationError("the materialisation lead (plus --send-ahead) must be shorter than the window")

    @property
    def advertised_address(self) -> str:
        return self.advertise or self.listen

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def _check_listeners(self) -> None:
        """Secure by default: the API and the console leave loopback only with tokens and TLS
        (tokens would cross the network in clear otherwise), metrics only with tokens on;
        ``--insecure`` overrides both, for development."""
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigurationError("--tls-cert and --tls-key go together: give both or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigurationError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        for flag, address in (("--listen", self.listen), ("--metrics", self.metrics_listen),
                              ("--health", self.health_listen), ("--console", self.console_listen)):
            if address is None:
                continue
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigurationError(f"{flag} {address!r}: expected HOST:PORT, e.g. 127.0.0.1:7070")
            # Health says SERVING or NOT_SERVING and nothing else: any address will do.
            if self.insecure or is_loopback_host(host) or flag == "--health":
                continue
            missing = [what for what, present in (("--auth", self.auth), ("--tls-cert/--tls-key", self.tls))
                       if present is False and (flag in ("--listen", "--console") or what == "--auth")]
            if missing:
                raise ConfigurationError(
                    f"{flag} {address!r} is not a loopback address: it needs {' and '.join(missing)} "
                    "(or pass --insecure to listen on it anyway, for development)"
                )
