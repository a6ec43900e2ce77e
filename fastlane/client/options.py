"""The options of :meth:`fastlane.client.Client.create`: the :class:`JobSpec` fields it passes on."""

from __future__ import annotations

from dataclasses import fields
from datetime import timedelta
from typing import Final, TypedDict

from fastlane.domain.models import Delivery, JobSpec, MisfirePolicy, OverlapPolicy, RetryPolicy

# Keyword arguments of Client.create that go straight into the JobSpec.
POLICY_FIELDS: Final = frozenset(f.name for f in fields(JobSpec)) - {
    "name",
    "job_type",
    "schedule",
    "tenant",
    "payload",
}


class JobOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`Client.create`: the :class:`JobSpec` fields it passes on.

    A type checker verifies ``JobSpec(**options)``, so a key here that the spec lacks, or of
    another type, is an error.
    """

    priority: int
    concurrency_key: str | None
    concurrency_limit: int | None
    retry: RetryPolicy
    misfire: MisfirePolicy
    overlap: OverlapPolicy
    delivery: Delivery
    timeout: timedelta | None
    lease_ttl: timedelta
