"""A node's start and stop plans: which services run, and the order it shuts down in, read here.

Start: the API listens (health NOT_SERVING) and the services of :func:`start_plan` start in its
order; once the node holds its share of the shards with their windows built it reports SERVING,
and the services of phase READY start. Stop: the steps of :func:`stop_plan`, in order — not
ready, stop firing, send nothing new, make the dispatches durable, hand the shards over, then
drain results while the workers' streams are still open.
"""

from __future__ import annotations

import logging

from fastlane.engine.retention import LOOP_NAME as TRIM_LOOP
from fastlane.server.assembly import Parts
from fastlane.server.services import Ending, Loop, Phase, Start, Step, Supervisor

log = logging.getLogger("fastlane.node")

DRAIN_TIMEOUT = 5.0  # seconds to make dispatches durable, and again to record the last results
SERVER_GRACE = 2.0  # seconds the API server lets calls under way finish


def start_plan(parts: Parts) -> list[Start]:
    """The node's services, in the order they start. Adding a background loop: one line here."""
    stopping = parts.stopping
    plan = [
        Start(Loop("shard-ownership", lambda: parts.ownership.run(parts.shards_ready))),
        Start(Loop("fast-lane", parts.lane.run)),
    ]
    if (authenticator := parts.authenticator) is not None:
        plan.append(Start(Loop("token-use", lambda: authenticator.run(stopping))))
    if (activity := parts.activity) is not None:
        plan.append(Start(Loop("console-activity", lambda: activity.run(stopping))))
    plan += [
        Start(Loop("loop-probe", parts.probe.run), Ending.FIRST),
        # Restarted while it has results to record, even while stopping: it returns once drained.
        Start(Loop("dispatch-journal", parts.dispatcher.run), Ending.DRAINED),
        Start(Loop("change-listener", lambda: parts.store.watch_changes(parts.follower.enqueue)), Ending.LAST),
        Start(Loop("change-follower", parts.follower.run), Ending.LAST),
        Start(Loop("workflows", parts.workflows.run), Ending.LAST),
    ]
    if parts.trimmer is not None:
        plan.append(Start(Loop(TRIM_LOOP, parts.trimmer.run)))  # returns once the node stops
    plan.append(Start(parts.health, Ending.FIRST, Phase.READY))
    return plan


def stop_plan(parts: Parts, services: Supervisor) -> list[Step]:
    """The node's shutdown, step by step."""
    dispatcher, settings = parts.dispatcher, parts.settings

    async def drain_journal() -> None:
        if not await services.drain(DRAIN_TIMEOUT):
            # The database is out of reach: the unrecorded results are lost here, and their
            # runs go to another attempt when their leases expire.
            log.warning("node %s could not record every result within %.0f s", settings.node_id, DRAIN_TIMEOUT)

    return [
        Step("stop reporting health and probing the loop", lambda: services.cancel(Ending.FIRST)),
        Step("not ready", lambda: parts.server.set_ready(False)),
        Step("stop firing", parts.lane.stop),
        Step("stop assigning runs to workers", dispatcher.stop_assigning),
        Step("make the dispatches durable", lambda: dispatcher.flush(DRAIN_TIMEOUT)),
        # Every dispatch is durable and nothing more fires here: successors may take the shards
        # now, while this node still records and acknowledges late results.
        Step("release the shards", parts.ownership.stop),
        Step("stop the API server", lambda: parts.server.stop(SERVER_GRACE)),
        Step("stop the dispatcher", dispatcher.stop),
        Step("record the last results", drain_journal),
        Step("stop following changes", lambda: services.cancel(Ending.LAST)),
    ]
