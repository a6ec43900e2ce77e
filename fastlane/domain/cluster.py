"""What a node tells of its cluster (``Client.cluster()``, ``fastlane cluster``): its nodes, their
shard leases, and the workers connected to the node that answered."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node, as its heartbeat row and (for the node that answered) its own state say."""

    node_id: str
    address: str
    shards_owned: int
    workers_connected: int
    clock_offset_ms: float  # its wall clock against the database's
    # Known only for the node that answered (None for the others, whose state is their heartbeat row's):
    heap_size: int | None  # runs in its in-memory window
    ready_runs: int | None  # runs due and waiting for a worker credit
    ready: bool | None  # it has taken its shards and serves
    eligible: bool  # False: it owns no shards, and ``note`` says why (its clock offset, say)
    note: str
    heartbeat_at: datetime | None
    live: bool  # heartbeat within the lease TTL


@dataclass(frozen=True, slots=True)
class ShardStatus:
    shard_id: int
    owner: str  # empty while no node owns it
    token: int  # the fencing token of the latest lease
    lease_expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """A worker stream connected to the node that answered (a worker connects to every node)."""

    worker_id: str
    tenant: str  # empty: it takes runs of every tenant
    job_types: tuple[str, ...]
    credits: int  # runs it will take now
    in_flight: int  # attempts it holds from the node that answered
    node_id: str  # the node that answered


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    database_time: datetime | None
    nodes: tuple[NodeStatus, ...]
    shards: tuple[ShardStatus, ...]
    workers: tuple[WorkerStatus, ...]
