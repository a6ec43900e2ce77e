"""Prometheus metrics of one node, in a registry of its own (several nodes can share a process in tests).

What ``/metrics`` shows of tenants and job types: their names in clear on a node without ``--auth``
(or with ``--metrics-names``); otherwise each ``tenant`` and ``job_type`` label value is a
:class:`Pseudonyms` stand-in (``t-`` or ``j-`` and 10 hex digits of an HMAC-SHA256), so a scrape,
which carries no token, tells no one which tenants and job types the node serves. A pseudonym is
the same on every scrape, so rates, alerts and ``sum by (tenant)`` work as before; it is keyed by
a secret of the node's settings, so one cannot test guessed names against it without that secret.
The registry itself keeps the names: the node's own readers (the console) see them.
"""

from __future__ import annotations

import hashlib
import hmac
import platform
import secrets as random_source
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from fastlane.errors import ConfigurationError
from fastlane.runtime.version import installed_version

# Labels whose values name a tenant's things, and the prefix of their pseudonyms.
NAMED_LABELS = {"tenant": "t-", "job_type": "j-"}
# Series labelled by job type and tenant are bounded: the first MAX_LABELLED_QUEUES (job type,
# tenant) pairs a node counts keep their names, every later pair is counted under OTHER in both
# labels. No name can be OTHER (names begin with a letter or a digit), and it is no pseudonym.
MAX_LABELLED_QUEUES = 1_000
OTHER = "_other"
PSEUDONYM_HEX_DIGITS = 10  # 40 bits: collisions unlikely below a million names

# Trigger lag is the product's promise: fine buckets from 20 microseconds (a p50 of 75 us or a p99
# of 0.2 ms is read off bucket bounds, not interpolated across one) up to two minutes.
_LAG_BUCKETS = (0.00002, 0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01,
                0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# Workers' clock estimates: from a fraction of a millisecond (a good LAN) up to the bounds a probe may carry.
_WORKER_CLOCK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 10.0, 60.0)


class ReadWhenScraped:
    """A gauge family whose samples ``read`` returns (label values to value) when scraped: no cost
    on the fire path. The dispatcher sets ``read``."""

    def __init__(self, name: str, documentation: str, labels: list[str]) -> None:
        self._name, self._documentation, self._labels = name, documentation, labels
        self.read: Callable[[], Mapping[Any, float]] = dict  # keys: tuples of label values

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self._name, self._documentation, labels=self._labels)
        for values, value in self.read().items():
            family.add_metric(list(values), value)
        yield family


class QueueLabels:
    """The (job type, tenant) label values of a series counted per queue: the pair itself for the
    first :data:`MAX_LABELLED_QUEUES` pairs seen, ``(OTHER, OTHER)`` for any later one, so a
    tenant that makes job types by the thousand cannot make a node's metrics grow without end."""

    def __init__(self, most: int = MAX_LABELLED_QUEUES) -> None:
        self._named: set[tuple[str, str]] = set()
        self._most = most

    def of(self, queue: tuple[str, str]) -> tuple[str, str]:
        if queue in self._named:
            return queue
        if len(self._named) < self._most:
            self._named.add(queue)
            return queue
        return (OTHER, OTHER)


class Pseudonyms:
    """Stable, non-reversible stand-ins for the values of :data:`NAMED_LABELS`.

    Args:
        secret: What keys them: the same secret gives the same pseudonyms (on every node given
            it, and after a restart); without it a guessed name cannot be checked against one.
    """

    def __init__(self, secret: bytes) -> None:
        self._key = hashlib.sha256(b"fastlane metrics pseudonyms\0" + secret).digest()

    def of(self, label: str, value: str) -> str:
        """The pseudonym of ``value`` of ``label`` (``tenant`` or ``job_type``); empty stays empty
        (a worker serving every tenant), and so does :data:`OTHER`."""
        if not value or value == OTHER:
            return value
        digest = hmac.new(self._key, f"{label}\0{value}".encode(), hashlib.sha256).hexdigest()
        return NAMED_LABELS[label] + digest[:PSEUDONYM_HEX_DIGITS]

    def labels(self, labels: dict[str, str]) -> dict[str, str]:
        return {name: self.of(name, value) if name in NAMED_LABELS else value for name, value in labels.items()}


class PseudonymisedView:
    """A registry as ``/metrics`` shows it: every sample's tenant and job type a pseudonym."""

    def __init__(self, registry: CollectorRegistry, pseudonyms: Pseudonyms) -> None:
        self._registry, self._pseudonyms = registry, pseudonyms

    def collect(self) -> Iterable[Metric]:
        for family in self._registry.collect():
            if not any(name in sample.labels for sample in family.samples for name in NAMED_LABELS):
                yield family
                continue
            renamed = Metric(family.name, family.documentation, family.type, family.unit)
            renamed.samples = [sample._replace(labels=self._pseudonyms.labels(sample.labels))
                               for sample in family.samples]
            yield renamed


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        # Per job type and tenant: a tenant whose runs pile up while others' go out shows here.
        self.ready_by_tenant = ReadWhenScraped(
            "fastlane_ready_runs", "Released runs waiting for worker credits, by job type and tenant",
            ["job_type", "tenant"])
        self.oldest_ready = ReadWhenScraped(
            "fastlane_oldest_ready_age_seconds", "Seconds since the oldest run waiting for worker credits was due, "
            "by job type and tenant", ["job_type", "tenant"])
        self.in_flight_by_tenant = ReadWhenScraped(
            "fastlane_in_flight_runs", "Attempts this node sent and has no result of yet, by job type and tenant",
            ["job_type", "tenant"])
        self.held_by_cap = ReadWhenScraped(
            "fastlane_held_runs", "Released runs blocked by a cap: cap=tenant_in_flight (--tenant-max-in-flight) "
            "or concurrency_key (the job's concurrency_limit)", ["job_type", "tenant", "cap"])
        self.unserved = ReadWhenScraped(
            "fastlane_unserved_runs", "Released runs waiting for a worker while no worker connected to this node "
            "serves their job type and tenant: stuck until one connects", ["job_type", "tenant"])
        self.worker_streams = ReadWhenScraped(
            "fastlane_worker_streams", "Worker streams connected to this node that serve a job type, by job type",
            ["job_type"])
        for family in (self.ready_by_tenant, self.oldest_ready, self.in_flight_by_tenant, self.held_by_cap,
                       self.unserved, self.worker_streams):
            registry.register(family)
        self.trigger_lag = Histogram(
            "fastlane_trigger_lag_seconds", "Release time minus scheduled time of each run the node had in memory before "
            "its time (the precision SLO; catch-ups are in fastlane_catch_up_lag_seconds)",
            buckets=_LAG_BUCKETS, registry=registry,
        )
        self.catch_up_lag = Histogram(
            "fastlane_catch_up_lag_seconds",
            "Release time minus scheduled time of runs already late when the node first had them in memory (misfire "
            "catch-ups, past `at` instants, resumed jobs, runs recovered after a failover): kept out of trigger lag",
            buckets=_LAG_BUCKETS + (600.0, 3600.0, 86400.0), registry=registry,
        )
        self.dispatch_lag = Histogram(
            "fastlane_dispatch_lag_seconds", "Send time minus scheduled time of each attempt",
            buckets=_LAG_BUCKETS, registry=registry,
        )
        self.sent_ahead = Counter(
            "fastlane_runs_sent_ahead_total", "Runs sent to a worker before their instant, to be started by the "
            "worker on it (observed in trigger lag as 0 when sent)", registry=registry,
        )
        self.worker_clock_uncertainty = Histogram(
            "fastlane_worker_clock_uncertainty_seconds",
            "Uncertainty of workers' clock estimates (half their best recent probe round trip), as each probe "
            "reports it; a worker is sent runs ahead only while it is within --send-ahead",
            buckets=_WORKER_CLOCK_BUCKETS, registry=registry,
        )
        self.worker_clock_offset = Histogram(
            "fastlane_worker_clock_offset_seconds",
            "Absolute offset between workers' clocks and this node's, as each probe reports it",
            buckets=_WORKER_CLOCK_BUCKETS + (600.0, 3600.0, 86400.0), registry=registry,
        )
        self.runs = Counter("fastlane_runs_total", "Runs by final or intermediate outcome, job type and tenant (the first "
                            f"{MAX_LABELLED_QUEUES:,} pairs; later ones as {OTHER})", ["outcome", "job_type", "tenant"],
                            registry=registry)
        self.queue_labels = QueueLabels()
        self.heap_size = Gauge("fastlane_heap_size", "Jobs and runs kept in the in-memory window", registry=registry)
        self.ready_queue = Gauge("fastlane_ready_queue_depth", "Released runs waiting for worker credits",
                                 registry=registry)
        self.parked = Gauge("fastlane_runs_parked",
                            "Released runs left in the database because their job type's ready queue was full",
                            registry=registry)
        self.workers = Gauge("fastlane_workers_connected", "Worker streams connected to this node", registry=registry)
        self.database_writable = Gauge(
            "fastlane_database_writable",
            "1 while the database's last write committed; 0 while writes fail on a full disk, a read-only file "
            "or an I/O error (SQLite), so the node reports NOT_SERVING",
            registry=registry,
        )
        self.database_writable.set(1)
        self.shards_owned = Gauge("fastlane_shards_owned", "Shards this node holds a lease on", registry=registry)
        self.shard_count = Gauge("fastlane_shard_count",
                                 "Shards the jobs are split into (--shards: the same on every node of a cluster); "
                                 "the cluster's shards owned add up to it when every shard has a node",
                                 registry=registry)
        self.shards_lost = Counter("fastlane_shards_lost_total",
                                   "Shards this node stopped owning, by cause (rebalance, not_renewed, local_expiry, "
                                   "fence_rejected, rebuild_failed, server_changed)", ["cause"], registry=registry)
        self.database_server_changes = Counter(
            "fastlane_database_server_changes_total",
            "Times this node found its database to be another server history (a failover to a promoted "
            "standby): it dropped every shard and acquired them again",
            registry=registry,
        )
        self.fence_rejections = Counter("fastlane_fence_rejections_total",
                                        "Writes refused because this node's shard lease was stale", registry=registry)
        self.lease_expiries = Counter("fastlane_lease_expiries_total", "Attempts whose worker lease expired",
                                      registry=registry)
        self.clock_offset = Gauge("fastlane_clock_offset_seconds",
                                  "Database clock minus this node's wall clock, measured each lease cycle (the node "
                                  "fires on its wall clock corrected by it)", registry=registry)
        self.clock_steps = Counter("fastlane_clock_steps_total",
                                   "Steps of this node's wall clock against its monotonic clock (set by hand, a VM "
                                   "resumed), each taken back at once and the offset measured again", registry=registry)
        self.materialised = Counter("fastlane_runs_materialised_total", "Runs written ahead of their time",
                                    registry=registry)
        self.skipped = Counter("fastlane_occurrences_skipped_total",
                               "Occurrences recorded as skipped instead of run, by the policy that skipped them: "
                               "misfire (found later than the job's misfire grace) or overlap (the previous run "
                               "was still active)", ["policy"], registry=registry)
        for policy in ("misfire", "overlap"):  # at 0 from the start: increase() sees the first skips
            self.skipped.labels(policy=policy)
        self.history_trimmed = Counter("fastlane_history_trimmed_total",
                                       "Finished runs deleted (with their attempts) for being older than "
                                       "--history-retention", registry=registry)
        self.loop_failures = Counter("fastlane_loop_failures_total",
                                     "Unexpected exceptions that stopped a background loop (restarted with backoff)",
                                     ["loop"], registry=registry)
        self.jobs_errored = Gauge("fastlane_jobs_errored",
                                  "Jobs set aside in state errored because processing them raised (all tenants)",
                                  registry=registry)
        self.set_aside = Counter("fastlane_set_aside_total",
                                 "Jobs or records this node set aside because processing them raised, by kind",
                                 ["kind"], registry=registry)
        # Stalls of the event loop delay every timer due meanwhile: see fastlane.runtime.stalls.
        self.loop_lag = Histogram("fastlane_event_loop_lag_seconds",
                                  "How much later than asked the node's event loop woke (sampled every 5 ms)",
                                  buckets=_LAG_BUCKETS, registry=registry)
        self.loop_stalls = Counter("fastlane_event_loop_stalls_total",
                                   "Event-loop wake-ups 2 ms or more late, by cause: gc, cpu_wait (the loop thread "
                                   "waited for a CPU another process had), busy (it ran fastlane code: see "
                                   "fastlane_event_loop_stall_sites_total) or other", ["cause"], registry=registry)
        self.loop_stall_sites = Counter("fastlane_event_loop_stall_sites_total",
                                        "Busy event-loop stalls by the module:function the loop was in (the first 24 "
                                        "seen; later ones count as other), for diagnosis", ["site"], registry=registry)
        self.gc_pauses = Histogram("fastlane_gc_pause_seconds", "Cyclic garbage collections by generation",
                                   ["generation"], buckets=_LAG_BUCKETS, registry=registry)
        self.write_ahead_deferred = Gauge(
            "fastlane_write_ahead_held_jobs",
            "Due jobs not written because their (job type, tenant) has --max-backlog runs or more waiting for busy workers",
            registry=registry)
        self.write_lead = Gauge("fastlane_write_ahead_lead_seconds",
                                "How long before their instant runs are written now (grows with slow writes)",
                                registry=registry)
        # The process: its RSS, CPU seconds, open files and start time (process_*), read from /proc
        # when scraped; and which fastlane and Python answer (for a dashboard across an upgrade).
        ProcessCollector(registry=registry)
        Info("fastlane_build", "The fastlane and Python versions of this node", registry=registry).info(
            {"version": installed_version(), "python": platform.python_version()})

    def exposed(self, *, names_in_clear: bool = False, secret: bytes | None = None) -> CollectorRegistry:
        """The registry ``/metrics`` serves: this one with names in clear, else a
        :class:`PseudonymisedView` of it keyed by ``secret`` (None: a random key, so pseudonyms
        stable only while this process runs)."""
        if names_in_clear:
            return self.registry
        view = CollectorRegistry(auto_describe=True)  # names known, for ?name[]= scrapes
        view.register(PseudonymisedView(self.registry, Pseudonyms(secret or random_source.token_bytes(32))))
        return view

    def serve(self, listen: str, *, names_in_clear: bool = False, secret: bytes | None = None) -> None:
        """Expose /metrics over HTTP on ``HOST:PORT`` (a daemon thread): tenant names and job
        types as pseudonyms keyed by ``secret`` unless ``names_in_clear`` (see :meth:`exposed`).
        A node passes ``names_in_clear=not auth or metrics_names`` and its database URL as the
        secret (the nodes of a cluster share it, and it is kept from the process list)."""
        host, _, port = listen.rpartition(":")
        # No `_created` series beside each counter and histogram (the client library's default):
        # they double the series a scrape stores and answer no question an operator asks. Set for
        # the whole process, which is a node's own.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # the library leaves it unannotated
        registry = self.exposed(names_in_clear=names_in_clear, secret=secret)
        try:
            start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1", registry=registry)
        except OSError as error:
            raise ConfigurationError(f"--metrics {listen}: cannot listen: {error.strerror or error}") from error
