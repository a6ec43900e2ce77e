"""Every bound fastlane puts on input, in one place (applied by :mod:`fastlane.domain.validation`).

Instants are kept well inside what ``datetime`` can hold, so that adding any allowed duration,
window or lead to any allowed instant cannot overflow; durations and counts are bounded so that
backoff, retry budgets and misfire walks stay finite. The README's "Limits" table lists them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

# -- instants ----------------------------------------------------------------------------------

# Occurrences are computed up to LAST_INSTANT; a schedule whose next occurrence falls past it
# ends. datetime.max is year 9999: a thousand years of room above LAST_INSTANT leaves space for
# any window, lead, interval or retry delay allowed below.
FIRST_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
LAST_INSTANT = datetime(9000, 1, 1, tzinfo=UTC)

# -- durations ---------------------------------------------------------------------------------

MIN_INTERVAL = timedelta(milliseconds=100)
MAX_INTERVAL = timedelta(days=100 * 366)
MAX_JITTER = timedelta(hours=24)  # a schedule's jitter: runs start at most this long after their fire time
# Workers heartbeat every second: a lease of three seconds survives two lost heartbeats.
MIN_LEASE_TTL = timedelta(seconds=3)
# How long a shard lease lasts unrenewed (--shard-lease-ttl): the node's loops, its database
# sessions' limits and the cluster view's liveness all derive from it.
DEFAULT_SHARD_LEASE_TTL = timedelta(seconds=10)
MAX_LEASE_TTL = timedelta(hours=24)
MAX_TIMEOUT = timedelta(days=30)
MAX_MISFIRE_GRACE = timedelta(days=366)
MIN_BACKOFF = timedelta(milliseconds=1)
MAX_BACKOFF = timedelta(days=7)
MAX_RETRY_TIME = timedelta(days=366)
# How far before its instant a node may send a run to a worker that holds it (--send-ahead):
# well under the shortest lease, so a held run never outlives its lease before it starts.
MAX_SEND_AHEAD = timedelta(seconds=1)
# How long finished runs are kept (--history-retention). At least an hour: a run a worker reports
# late (after a network partition) should still be found, and its record read by whoever is paged.
MIN_HISTORY_RETENTION = timedelta(hours=1)
MAX_HISTORY_RETENTION = timedelta(days=100 * 366)
MAX_TOKEN_LIFETIME = timedelta(days=10 * 366)  # an API token's --expires; a longer one: leave it unset
# What a worker may report of its clock in a ClockProbe: beyond a day of offset the clock is
# broken, beyond a minute of uncertainty the estimate is useless (and never allows a send ahead).
MAX_WORKER_CLOCK_OFFSET = timedelta(days=1)
MAX_WORKER_CLOCK_UNCERTAINTY = timedelta(seconds=60)

# -- counts and sizes --------------------------------------------------------------------------

MAX_ATTEMPTS = 1_000
MAX_FIRE_ALL_CAP = 10_000
MIN_PRIORITY, MAX_PRIORITY = -1000, 1000
MAX_TENANT_WEIGHT = 100  # runs a tenant takes per turn of its job type's ready queue (--tenant-weight)
MAX_TENANT_IN_FLIGHT = 1_000_000  # a tenant's cap on attempts in flight per node (--tenant-max-in-flight)
MAX_BACKLOG = 10_000_000  # due runs of a job type and tenant waiting for busy workers before none are written (--max-backlog)
MAX_BACKLOG_SECONDS = 3_600.0  # the same as seconds of that queue's pace (--max-backlog-seconds)
MAX_CONCURRENCY_LIMIT = 10_000  # runs of one concurrency key active at once (spec.concurrency_limit)
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1_000
# Runs or jobs one call of a bulk action (ActOnRuns, ActOnJobs) acts on: each is its own
# transaction, so a call holds the database no longer than one item's verb at a time, and answers
# within seconds.
DEFAULT_BULK_LIMIT = 1_000
MAX_BULK_LIMIT = 10_000
MAX_PREVIEW = 1_000
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20
# The largest payload limit a daemon may be configured with; the gRPC message limit is above it.
PAYLOAD_CEILING_BYTES = 16 << 20
MAX_CHECKPOINT_BYTES = 1 << 20
MAX_NAME_LENGTH = 200
MAX_ID_LENGTH = 200
MAX_CRON_LENGTH = 200
MAX_TIMEZONE_LENGTH = 64
MAX_PAUSE_REASON = 200  # characters of the reason a pause is given: all of it fits an audit event's detail
MAX_ERROR_TEXT = 4_000  # error codes and messages reported by workers are cut to this
MAX_ERROR_TRACEBACK = 16_000  # a failed attempt's traceback is cut to its last this many characters
MAX_JOB_TYPES = 1_000  # job types one worker stream may declare

MAX_CREDITS = 100_000  # credits a worker stream may declare in its Hello, or grant in one message
MAX_PRIORITY_RESERVE = MAX_CREDITS  # credits of a worker stream kept for urgent runs (--priority-reserve)
