"""Per-tenant quotas: how much of a shared cluster one tenant may take.

Three limits, each ``None`` for unlimited: jobs in existence, job creations per second (on each
node), and runs waiting for a worker (due, not yet taken). A node has defaults (``fastlane serve
--quota-…``); an admin may override any of them per tenant (``fastlane quotas set``), and an
override left unset falls back to the node's default.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from fastlane.errors import InvalidArgument

MAX_QUOTA_COUNT = 1_000_000_000  # a limit above this is no limit: leave it unset
MAX_QUOTA_RATE = 1_000_000.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantQuota:
    """Limits of one tenant; a field left None is unlimited (or, in an override, the default).

    Attributes:
        max_jobs: Jobs the tenant may have at once (created and not deleted).
        job_creations_per_second: Job creations per second, per node (a token bucket holding
            one second's worth, at least one).
        max_waiting_runs: Runs due and not yet taken by a worker; beyond it the API refuses to
            add runs (trigger, retry, jobs to run now). Scheduled occurrences still fire: a
            schedule is never silently dropped by a quota.
    """

    max_jobs: int | None = None
    job_creations_per_second: float | None = None
    max_waiting_runs: int | None = None

    def over(self, defaults: TenantQuota) -> TenantQuota:
        """This override on top of ``defaults``: each unset field takes the default's value."""
        return replace(defaults, **{f.name: getattr(self, f.name) for f in fields(self)
                                    if getattr(self, f.name) is not None})

    def validated(self) -> TenantQuota:
        """Self, or InvalidArgument naming the first field out of range."""
        for name in ("max_jobs", "max_waiting_runs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_QUOTA_COUNT:
                raise InvalidArgument(name, f"{value} must be between 0 and {MAX_QUOTA_COUNT:,}")
        rate = self.job_creations_per_second
        if rate is not None and not 0 <= rate <= MAX_QUOTA_RATE:  # NaN fails both comparisons
            raise InvalidArgument("job_creations_per_second", f"{rate} must be between 0 and {MAX_QUOTA_RATE:,.0f}")
        return self
