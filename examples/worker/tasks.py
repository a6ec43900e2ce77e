"""The handlers of an example worker image (examples/worker/Dockerfile): replace them with yours.

``fastlane worker tasks:worker`` runs the ``worker`` below; each handler takes the job types it
names. A handler's return value (JSON) is kept as the run's output.
"""

from __future__ import annotations

from fastlane import RunContext, Worker

worker = Worker(concurrency=16)


@worker.handler("reports.build")
async def build_report(ctx: RunContext) -> dict[str, object]:
    """A run of a ``reports.build`` job: its payload says which report."""
    request = ctx.json() or {}
    return {"report": request.get("name", "daily"), "for": ctx.scheduled_for.isoformat()}
