"""fastlane: a precise, durable, sharded job scheduler.

The public API: the async :class:`Client`, the :class:`Worker` with its :class:`RunContext`, the
schedule and policy values, and the errors a handler raises to steer retries.
"""

from fastlane.client import Client
from fastlane.domain.models import (
    Delivery,
    JobSpec,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    RunState,
    Schedule,
)
from fastlane.errors import FastlaneError, PermanentError, RetryableError
from fastlane.worker import RunContext, Worker

__all__ = [
    "Client",
    "Delivery",
    "FastlaneError",
    "JobSpec",
    "MisfireKind",
    "MisfirePolicy",
    "OverlapPolicy",
    "PermanentError",
    "RetryPolicy",
    "RetryableError",
    "RunContext",
    "RunState",
    "Schedule",
    "Worker",
]
