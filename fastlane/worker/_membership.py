"""The worker's set of node streams, following the cluster's membership.

:class:`ClusterStreams` keeps one :class:`~fastlane.worker._stream.NodeStream` to every live node:
it asks the seeds or any known node (``AdminService.GetCluster``) which nodes are live, adds streams
to those that join, and retires those to nodes that leave, handing their work to a stream that stays
when their node is gone. :func:`drain_streams` stops them all at the end. The public face is
:mod:`fastlane.worker`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress

import grpc

from fastlane._proto import admin_pb2, admin_pb2_grpc
from fastlane.domain.models import AttemptOutcome
from fastlane.worker._clock import ClockEstimate
from fastlane.worker._runs import Verdict
from fastlane.worker._stream import NodeStream, OpenChannel, plain_channel

log = logging.getLogger("fastlane.worker")

_DISCOVERY_TIMEOUT = 2.0  # per GetCluster call; a node that takes longer is skipped this round
_UNSPECIFIED_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})  # a listen address, not one to dial
_SHUTDOWN = Verdict(AttemptOutcome.FAILED, "WorkerShutdown", "the worker stopped before the handler finished")
_ABANDON_GRACE = 2.0  # after the drain timeout, for the cancelled runs' results to be acknowledged
_CLOSE_GRACE = 5.0  # for a node to end a stream the worker half-closed

_AdminStubs = dict[str, tuple[grpc.aio.Channel, admin_pb2_grpc.AdminServiceStub]]


class ClusterStreams:
    """The streams of one worker: one per node it takes work from, and those leaving.

    Args:
        seeds: The addresses the worker was given; asked first, and dialled when nothing else works.
        open_stream: Makes the (not yet serving) stream to one address.
    """

    def __init__(self, seeds: Sequence[str], open_stream: Callable[[str], NodeStream],
                 open_channel: OpenChannel = plain_channel) -> None:
        self._seeds = list(seeds)
        self._open_stream = open_stream
        self._open_channel = open_channel
        self._streams: dict[str, NodeStream] = {}  # by address: the streams taking work
        self._serving: dict[NodeStream, asyncio.Task[None]] = {}  # every stream's serve() task
        self._retiring: dict[NodeStream, asyncio.Task[None]] = {}  # leaving streams: retire_stream()
        self.crashed: list[asyncio.Task[None]] = []
        self.crash = asyncio.Event()
        self._discovery_failing: bool | None = None  # for one log line per change, not per check
        self._unusable_addresses: set[str] = set()

    @property
    def connected(self) -> bool:
        """Whether at least one node has welcomed the worker on its current stream."""
        return any(stream.connected for stream in self._serving)

    @property
    def addresses(self) -> tuple[str, ...]:
        """The addresses of the nodes the worker takes work from now (leaving streams excluded)."""
        return tuple(self._streams)

    def credits_free(self, concurrency: int) -> int:
        """Runs the streams taking work could be sent now: each connected one's credits less its runs in flight."""
        return sum(max(0, concurrency - stream.in_flight) for stream in self._streams.values() if stream.connected)

    def clock_estimates(self) -> dict[str, ClockEstimate]:
        """Each node's clock relative to the worker's, for the streams taking work that have one."""
        return {address: estimate for address, stream in self._streams.items()
                if (estimate := stream.clock_estimate) is not None}

    def add(self, address: str) -> None:
        stream = self._open_stream(address)
        serving = asyncio.create_task(stream.serve(), name=f"worker-stream:{address}")
        # serve() returns only once the stream was closed on purpose; ending otherwise is a crash.
        serving.add_done_callback(lambda task: self._task_ended(task, expected=stream.closing))
        self._streams[address] = stream
        self._serving[stream] = serving

    async def drain(self, timeout: float) -> None:
        """Stop every stream gracefully; see :func:`drain_streams`."""
        await drain_streams(list(self._streams.values()), list(self._serving.values()), timeout, dict(self._retiring))

    async def tear_down(self, following: asyncio.Task[None] | None) -> None:
        """Cancel every handler, stream and task left, without reporting."""
        handlers = [task for stream in self._serving for task in stream.abort()]
        tasks = [*self._serving.values(), *self._retiring.values(), *([following] if following else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *handlers, return_exceptions=True)

    def _task_ended(self, task: asyncio.Task[None], *, expected: bool) -> None:
        if task.cancelled() or (expected and task.exception() is None):
            return
        self.crashed.append(task)
        self.crash.set()

    def _retire(self, address: str) -> None:
        stream = self._streams.pop(address)
        retiring = asyncio.create_task(
            retire_stream(stream, self._serving[stream], functools.partial(self._successor, stream)),
            name=f"worker-retire:{address}",
        )
        self._retiring[stream] = retiring
        retiring.add_done_callback(functools.partial(self._retired, stream))

    def _retired(self, stream: NodeStream, task: asyncio.Task[None]) -> None:
        self._retiring.pop(stream, None)
        if not task.cancelled() and task.exception() is None:
            self._serving.pop(stream, None)
            log.info("stream to %s closed", stream.address)
        self._task_ended(task, expected=True)

    def _successor(self, leaving: NodeStream) -> NodeStream | None:
        """The stream that takes over the work of a leaving one whose node is gone: a connected
        one if there is any."""
        candidates = [s for s in self._streams.values() if s is not leaving and not s.closing]
        return next((s for s in candidates if s.connected), candidates[0] if candidates else None)

    # -- cluster membership ----------------------------------------------------------------

    async def follow(self, interval: float, stop_requested: asyncio.Event) -> None:
        """Check the cluster's membership every ``interval`` seconds until ``stop_requested``."""
        stubs: _AdminStubs = {}
        try:
            while True:
                nodes = await self._ask_cluster(stubs)
                if nodes is None:
                    self._fall_back_to_seeds()
                else:
                    self._follow(nodes)
                with suppress(TimeoutError):
                    async with asyncio.timeout(interval):
                        await stop_requested.wait()
                        return
        finally:
            await asyncio.gather(*(channel.close() for channel, _ in stubs.values()), return_exceptions=True)

    async def _ask_cluster(self, stubs: _AdminStubs) -> list[admin_pb2.NodeStatus] | None:
        """The cluster's nodes, from the first seed or known node that answers; None if none does."""
        candidates = list(dict.fromkeys([*self._seeds, *self._streams]))
        for address in stubs.keys() - set(candidates):
            await stubs.pop(address)[0].close()
        failures: list[str] = []
        for address in candidates:
            if address not in stubs:
                channel = self._open_channel(address)
                stubs[address] = (channel, admin_pb2_grpc.AdminServiceStub(channel))
            try:
                status = await stubs[address][1].GetCluster(admin_pb2.GetClusterRequest(), timeout=_DISCOVERY_TIMEOUT)
            except grpc.aio.AioRpcError as error:
                failures.append(f"{address}: {error.code().name}")
                continue
            except Exception as error:  # one odd answer must not end the worker; the next check retries
                failures.append(f"{address}: {type(error).__name__}: {error}")
                continue
            if self._discovery_failing:
                log.info("cluster membership known again (from %s)", address)
            self._discovery_failing = False
            return list(status.nodes)
        if not self._discovery_failing:
            # Once per outage: an older daemon without GetCluster answers UNIMPLEMENTED every time.
            log.info("no node reports the cluster's membership (%s): keeping the streams to %s",
                     "; ".join(failures), ", ".join(self._streams))
        self._discovery_failing = True
        return None

    def _follow(self, nodes: Sequence[admin_pb2.NodeStatus]) -> None:
        live: dict[str, str] = {}  # address: node id
        for node in nodes:
            if node.live and self._usable(node):
                live.setdefault(node.address, node.node_id)
        if not live:
            self._fall_back_to_seeds()  # a cluster still starting: its nodes have not heartbeaten
            return
        # Add before removing, so a leaving stream whose node is gone has a stream to hand over to.
        for address, node_id in live.items():
            if address not in self._streams:
                log.info("node %s at %s is live: adding a stream to it", node_id, address)
                self.add(address)
        # A stream that works, or may yet (to a seed spelled otherwise than the node advertises
        # itself, say), stays until one to a listed node works: listed addresses the worker cannot
        # reach must not leave it with no work at all.
        anchored = any(self._streams[address].connected for address in live)
        for address in [address for address in self._streams if address not in live]:
            stream = self._streams[address]
            if not anchored and not stream.down:
                continue
            log.info("%s is not a live cluster member: removing its stream (%d runs in flight finish first)",
                     address, stream.in_flight)
            self._retire(address)

    def _usable(self, node: admin_pb2.NodeStatus) -> bool:
        if not node.address:
            return False  # not known yet
        host = node.address.rpartition(":")[0]
        if host not in _UNSPECIFIED_HOSTS:
            return True
        if node.address not in self._unusable_addresses:
            self._unusable_addresses.add(node.address)
            log.warning("node %s advertises %r, which a worker cannot dial: start it with --advertise HOST:PORT",
                        node.node_id, node.address)
        return False

    def _fall_back_to_seeds(self) -> None:
        """Without a usable answer, keep every stream; add the seeds back if no stream is up."""
        if any(stream.connected for stream in self._streams.values()):
            return
        for address in self._seeds:
            if address not in self._streams:
                log.info("no live node is known and no stream is up: adding a stream to seed %s", address)
                self.add(address)


async def retire_stream(
    stream: NodeStream, serving: asyncio.Task[None], successor: Callable[[], NodeStream | None]
) -> None:
    """Stop one stream gracefully while the worker goes on: no new credits, finish, report, close.

    While its node answers, the stream's handlers finish and their results are acknowledged there;
    once it does not, the stream hands what it holds to ``successor()`` (see :meth:`NodeStream.drain`).
    """
    stream.begin_drain()
    await stream.drain(successor)
    _, late = await asyncio.wait([serving], timeout=_CLOSE_GRACE)
    for task in late:  # the node never ended the stream (or the address never answered)
        task.cancel()
    await asyncio.gather(serving, return_exceptions=True)


async def drain_streams(
    streams: Sequence[NodeStream],
    serving: Sequence[asyncio.Task[None]],
    timeout: float,
    retiring: Mapping[NodeStream, asyncio.Task[None]] | None = None,
) -> None:
    """Stop every stream gracefully: no new credits, finish, report, half-close, await the node.

    Handlers still running after ``timeout`` seconds are cancelled and reported as retryable
    ``WorkerShutdown`` failures (``cancelled`` would end the run for good); so are runs still held
    for their start instant then, whose handlers never start.

    Args:
        streams: The streams to drain here.
        serving: The :meth:`NodeStream.serve` tasks of every stream, leaving ones included.
        timeout: Seconds for the handlers to finish.
        retiring: Streams already leaving, with their :func:`retire_stream` tasks, which go on
            (a leaving stream may still hand its work to one of ``streams``).
    """
    retiring = retiring or {}
    everything = [*streams, *retiring]
    for stream in everything:
        stream.begin_drain()
    drains = [
        *retiring.values(),
        *(asyncio.create_task(s.drain(), name=f"worker-drain:{s.address}") for s in streams),
    ]
    try:
        late = (await asyncio.wait(drains, timeout=timeout))[1] if drains else set()
        if late:
            running = sum(stream.in_flight for stream in everything)
            log.warning("drain timeout (%g s) passed with %d runs in flight: cancelling them", timeout, running)
            for stream in everything:
                stream.abandon(_SHUTDOWN)
            await asyncio.wait(late, timeout=_ABANDON_GRACE)
            for stream in everything:
                stream.half_close()
        if serving:
            await asyncio.wait(serving, timeout=_CLOSE_GRACE)
    finally:
        for task in drains:
            task.cancel()
        await asyncio.gather(*drains, return_exceptions=True)
