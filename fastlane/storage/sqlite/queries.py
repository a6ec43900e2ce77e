"""The SQLite dialect's named statements (statements only: the store shapes their parameters).

Names match :mod:`fastlane.storage.postgres.queries` wherever a statement does the same job, so
the two dialects read side by side. Instants are integer microseconds since the Unix epoch, UTC;
a batch is one JSON array parameter expanded by ``json_each``.

Queries over runs not yet ended say ``finished_at IS NULL`` as well as their states: the
indexes of such runs are partial on it (schema version 13), and a planner uses a partial
index only for a query that implies its predicate.
"""

from __future__ import annotations

from fastlane.storage.sql import DUE_JOB_SCHEDULE

# The database clock, in integer microseconds. SQLite's own julianday('now') only has millisecond
# resolution; an embedded database shares its host's clock anyway, so the connection gets a SQL
# function reading that clock at full resolution (registered in ``connection``).
NOW = "fl_now_us()"

# -- lifecycle -------------------------------------------------------------------------------------

DB_NOW = f"SELECT {NOW}"
META_TABLE_EXISTS = "SELECT count(*) FROM sqlite_master WHERE name = 'fastlane_meta'"
SCHEMA_VERSION = "SELECT value FROM fastlane_meta WHERE key = 'schema_version'"
SET_SCHEMA_VERSION = (
    "INSERT INTO fastlane_meta VALUES ('schema_version', ?) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
INIT_SHARD_COUNT = "INSERT INTO fastlane_meta VALUES ('shard_count', ?) ON CONFLICT (key) DO NOTHING"
SHARD_COUNT = "SELECT value FROM fastlane_meta WHERE key = 'shard_count'"
CREATE_SHARDS = "INSERT OR IGNORE INTO shards (shard_id) VALUES (?)"  # executemany, one row per shard

# -- jobs ------------------------------------------------------------------------------------------

INSERT_JOB = """
    INSERT INTO jobs (job_id, tenant, name, job_type, shard_id, state, next_fire_at, priority,
                      payload, policies, created_at, updated_at)
    VALUES (?, ?, ?, ?, ?, 'active', ?, ?, ?, ?, ?, ?)
    ON CONFLICT (tenant, name) DO NOTHING
    RETURNING *
"""
JOB_BY_NAME = "SELECT * FROM jobs WHERE tenant = ? AND name = ?"
# Ids in [low, high): those starting with a prefix (common.id_prefix_range), through the primary key.
JOBS_BY_ID_RANGE = "SELECT * FROM jobs WHERE job_id >= ? AND job_id < ? AND tenant = ? ORDER BY job_id LIMIT ?"
# Names in [low, high), through the (tenant, name) unique index: SQLite compares text bytewise.
JOBS_BY_NAME_RANGE = "SELECT * FROM jobs WHERE tenant = ? AND name >= ? AND name < ? ORDER BY name LIMIT ?"
RUNS_BY_ID_RANGE = "SELECT * FROM runs WHERE run_id >= ? AND run_id < ? AND tenant = ? ORDER BY run_id LIMIT ?"
GET_JOB = "SELECT * FROM jobs WHERE job_id = ? AND tenant = ?"
# A job read to be changed: SQLite's writer lock (BEGIN IMMEDIATE) already keeps every other
# writer out, so the row needs no lock of its own.
LOCK_JOB = GET_JOB
LIST_JOBS = """
    SELECT * FROM jobs
    WHERE tenant = ? AND job_id > ? AND (? IS NULL OR state = ?) AND (? IS NULL OR job_type = ?)
    ORDER BY job_id LIMIT ?
"""
UPDATE_JOB = """
    UPDATE jobs SET job_type = ?, priority = ?, payload = ?, policies = ?, next_fire_at = ?, state = ?,
                    version = version + 1, updated_at = ?
    WHERE job_id = ? AND tenant = ?
    RETURNING *
"""
SET_JOB_ASIDE = f"UPDATE jobs SET state = ?, error = ?, version = version + 1, updated_at = {NOW} WHERE job_id = ?"
COUNT_JOBS = "SELECT count(*) AS n FROM jobs WHERE state = ?"
CHANGE_JOB_STATE = (
    f"UPDATE jobs SET state = ?, error = NULL, version = version + 1, updated_at = {NOW} WHERE job_id = ? RETURNING *"
)
DELETE_JOB = "DELETE FROM jobs WHERE job_id = ? AND tenant = ? RETURNING job_id"
CANCEL_RUNS_OF_DELETED_JOB = (
    f"UPDATE runs SET state = 'cancelled', finished_at = {NOW}, updated_at = {NOW}, "
    "last_error = 'job deleted' WHERE job_id = ? AND state IN ('scheduled', 'buffered') AND finished_at IS NULL"
)

# -- the fast lane ---------------------------------------------------------------------------------

LOAD_DUE_JOBS = f"""
    SELECT job_id, shard_id, next_fire_at,
           {DUE_JOB_SCHEDULE.format(kind="json_extract(policies, '$.schedule.kind')",
                                    schedule="json_extract(policies, '$.schedule')")},
           json_extract(policies, '$.misfire'), job_type, tenant, priority
    FROM jobs
    WHERE state = 'active' AND shard_id IN (SELECT value FROM json_each(?)) AND next_fire_at < ?
      AND (? IS NULL OR next_fire_at >= ?)
      AND (? IS NULL OR (next_fire_at, job_id) > (?, ?))
    ORDER BY next_fire_at, job_id LIMIT ?
"""

# The fences still held of a batch's shards, in one statement (PostgreSQL's unnest does the same):
# a batch under load spans every shard (64 in `fastlane bench fairness`), and a query per shard
# is a round trip to the writer's thread each, every one waiting for a turn of a busy event loop.
# With a query per shard, `fairness` on SQLite missed its target in 5 of 8 runs (the quiet
# tenant's runs written after their instant); with this one, it met it in 9 of 9.
# Checked inside the write lock, so they hold until commit.
FENCES = f"""
    SELECT s.shard_id FROM shards s
    JOIN (SELECT json_extract(value, '$[0]') AS shard_id, json_extract(value, '$[1]') AS owner,
                 json_extract(value, '$[2]') AS token FROM json_each(?)) AS f
      ON s.shard_id = f.shard_id AND s.owner = f.owner AND s.token = f.token
    WHERE s.lease_expires_at > {NOW}
"""

ADVANCE_JOBS = f"""
    UPDATE jobs
    SET next_fire_at = o.next_fire_at, updated_at = {NOW},
        state = CASE WHEN o.next_fire_at IS NULL THEN 'completed' ELSE jobs.state END
    FROM (SELECT json_extract(value, '$[0]') AS job_id, json_extract(value, '$[1]') AS expected,
                 json_extract(value, '$[2]') AS next_fire_at FROM json_each(?)) AS o
    WHERE jobs.job_id = o.job_id AND jobs.next_fire_at = o.expected
      AND jobs.state = 'active' AND jobs.shard_id IN (SELECT value FROM json_each(?))
    RETURNING jobs.job_id, json_extract(jobs.policies, '$.overlap') AS overlap
"""
JOBS_BY_IDS = "SELECT * FROM jobs WHERE job_id IN (SELECT value FROM json_each(?))"
ACTIVE_RUNS_OF_JOBS = (
    "SELECT job_id, run_id, state FROM runs WHERE job_id IN (SELECT value FROM json_each(?)) "
    "AND finished_at IS NULL AND state IN (SELECT value FROM json_each(?))"
)
CANCEL_FOR_OVERLAP = (
    f"UPDATE runs SET state = 'cancelled', finished_at = {NOW}, updated_at = {NOW}, last_error = ? "
    "WHERE run_id IN (SELECT value FROM json_each(?)) RETURNING *"
)
REQUEST_CANCEL_FOR_OVERLAP = (
    f"UPDATE runs SET cancel_requested = 1, last_error = ?, updated_at = {NOW} "
    "WHERE run_id IN (SELECT value FROM json_each(?)) RETURNING *"
)
# Now read once for the statement (``t``): its runs share one created_at, held once in memory
# (codec.build_runs).
INSERT_RUNS = f"""
    INSERT INTO runs (run_id, job_id, tenant, job_type, shard_id, scheduled_for, available_at, state,
                      payload, priority, manual, delivery, lease_ttl_ms, timeout_ms, retry,
                      created_at, updated_at, finished_at, last_error, concurrency_key, concurrency_limit)
    SELECT o.run_id, j.job_id, j.tenant, j.job_type, j.shard_id, o.scheduled_for, o.scheduled_for,
           o.state, j.payload, j.priority, 0, json_extract(j.policies, '$.delivery'),
           CAST(json_extract(j.policies, '$.lease_ttl') * 1000 AS INTEGER),
           CAST(json_extract(j.policies, '$.timeout') * 1000 AS INTEGER),
           json_extract(j.policies, '$.retry'), t.now, t.now,
           CASE WHEN o.state = 'skipped' THEN t.now END, o.last_error,
           json_extract(j.policies, '$.concurrency_key'), json_extract(j.policies, '$.concurrency_limit')
    FROM (SELECT json_extract(value, '$[0]') AS run_id, json_extract(value, '$[1]') AS job_id,
                 json_extract(value, '$[2]') AS scheduled_for, json_extract(value, '$[3]') AS state,
                 json_extract(value, '$[4]') AS last_error
          FROM json_each(?)) AS o
    JOIN jobs j ON j.job_id = o.job_id
    CROSS JOIN (SELECT {NOW} AS now) AS t
    WHERE true
    ON CONFLICT (job_id, scheduled_for, (CASE WHEN manual THEN run_id ELSE '' END)) DO NOTHING  -- runs_of_job
    RETURNING *
"""
PENDING_RUN_IDS = (
    "SELECT run_id FROM runs WHERE state = 'scheduled' AND shard_id IN (SELECT value FROM json_each(?)) "
    "AND finished_at IS NULL AND available_at < ? ORDER BY available_at"
)
PENDING_RUNS = "SELECT * FROM runs WHERE run_id IN (SELECT value FROM json_each(?)) AND state = 'scheduled'"
EXPIRED_RUNS = (
    f"SELECT * FROM runs WHERE shard_id = ? AND finished_at IS NULL AND state IN ('dispatched', 'running') "
    f"AND lease_expires_at < {NOW} ORDER BY lease_expires_at"
)
SHARDS_WITH_EXPIRED_LEASES = (
    f"SELECT DISTINCT shard_id FROM runs WHERE state IN ('dispatched', 'running') "
    f"AND shard_id IN (SELECT value FROM json_each(?)) AND finished_at IS NULL AND lease_expires_at < {NOW}"
)
# Microseconds until the earliest attempt lease of these shards runs out (negative: already out).
NEXT_LEASE_EXPIRY = (
    f"SELECT min(lease_expires_at) - {NOW} AS remaining FROM runs WHERE state IN ('dispatched', 'running') "
    f"AND shard_id IN (SELECT value FROM json_each(?)) AND finished_at IS NULL"
)

# -- runs ------------------------------------------------------------------------------------------

INSERT_MANUAL_RUN = f"""
    INSERT INTO runs (run_id, job_id, tenant, job_type, shard_id, scheduled_for, available_at, state,
                      payload, priority, manual, delivery, lease_ttl_ms, timeout_ms, retry,
                      created_at, updated_at, concurrency_key, concurrency_limit)
    SELECT ?, j.job_id, j.tenant, j.job_type, j.shard_id, {NOW}, {NOW}, 'scheduled', j.payload,
           j.priority, 1, json_extract(j.policies, '$.delivery'),
           CAST(json_extract(j.policies, '$.lease_ttl') * 1000 AS INTEGER),
           CAST(json_extract(j.policies, '$.timeout') * 1000 AS INTEGER),
           json_extract(j.policies, '$.retry'), {NOW}, {NOW},
           json_extract(j.policies, '$.concurrency_key'), json_extract(j.policies, '$.concurrency_limit')
    FROM jobs j WHERE j.job_id = ? AND j.tenant = ?
    RETURNING *
"""
GET_RUN = "SELECT * FROM runs WHERE run_id = ? AND tenant = ?"
LOCK_RUN = GET_RUN  # a run read to be changed: the writer lock covers it (see LOCK_JOB)
RUN_STATE = "SELECT state FROM runs WHERE run_id = ? AND tenant = ?"
REQUEST_CANCEL = f"UPDATE runs SET cancel_requested = 1, updated_at = {NOW} WHERE run_id = ? RETURNING *"
CANCEL_RUN = (
    f"UPDATE runs SET state = 'cancelled', finished_at = {NOW}, updated_at = {NOW}, last_error = ? "
    "WHERE run_id = ? RETURNING *"
)
RETRY_RUN = (
    f"UPDATE runs SET state = 'scheduled', available_at = {NOW}, finished_at = NULL, cancel_requested = 0, "
    f"updated_at = {NOW} WHERE run_id = ? RETURNING *"
)
DISPATCH_RUNS = f"""
    UPDATE runs
    SET state = 'dispatched', attempts = runs.attempts + 1, lease_token = d.lease_token,
        lease_expires_at = {NOW} + d.ttl_us, worker_id = d.worker_id, updated_at = {NOW},
        first_attempt_at = coalesce(runs.first_attempt_at, d.dispatched_at)
    FROM (SELECT json_extract(value, '$[0]') AS run_id, json_extract(value, '$[1]') AS lease_token,
                 json_extract(value, '$[2]') AS worker_id, json_extract(value, '$[3]') AS ttl_us,
                 json_extract(value, '$[4]') AS dispatched_at
          FROM json_each(?)) AS d
    WHERE runs.run_id = d.run_id AND runs.state = 'scheduled'
    RETURNING runs.run_id, runs.attempts, runs.lease_token, runs.worker_id
"""
# One statement for the whole batch: a row at a time would cross to SQLite's thread once per
# run, holding the single writer for seconds on a large batch.
INSERT_ATTEMPTS = """
    INSERT INTO attempts (run_id, attempt, lease_token, worker_id, node_id, outcome, dispatched_at)
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
           json_extract(value, '$[3]'), json_extract(value, '$[4]'), 'pending',
           json_extract(value, '$[5]')
    FROM json_each(?)
    RETURNING *
"""
# The lease tokens of these runs' current attempts. The store is the only writer, so tokens read
# inside a write transaction are still current at its updates.
CURRENT_ATTEMPTS = (
    "SELECT run_id, lease_token FROM runs WHERE run_id IN (SELECT value FROM json_each(?)) "
    "AND state IN ('dispatched', 'running')"
)
# Capped dispatches (Store.record_capped_dispatches); BEGIN IMMEDIATE already serialises writers.
SCHEDULED_AMONG = "SELECT run_id FROM runs WHERE run_id IN (SELECT value FROM json_each(?)) AND state = 'scheduled'"
COUNT_ACTIVE_BY_KEY = (
    "SELECT tenant, concurrency_key, count(*) AS active FROM runs "
    "WHERE concurrency_key IN (SELECT value FROM json_each(?)) "
    "AND concurrency_key IS NOT NULL AND finished_at IS NULL AND state IN ('dispatched', 'running') "
    "GROUP BY tenant, concurrency_key"
)
EXTEND_LEASES = f"""
    UPDATE runs SET lease_expires_at = {NOW} + lease_ttl_ms * 1000, progress = coalesce(?, progress),
                    checkpoint = coalesce(?, checkpoint),
                    state = CASE WHEN ? THEN 'running' ELSE state END, updated_at = {NOW}
    WHERE run_id = ? AND lease_token = ?
"""
MARK_ATTEMPTS_STARTED = (
    f"UPDATE attempts SET started_at = coalesce(started_at, {NOW}) WHERE run_id = ? AND lease_token = ?"
)
SUCCEED_RUNS = f"""
    UPDATE runs SET state = 'succeeded', finished_at = {NOW}, last_error = NULL, lease_token = NULL,
                    lease_expires_at = NULL, updated_at = {NOW}
    WHERE run_id IN (SELECT value FROM json_each(?))
    RETURNING *
"""
SUCCEED_ATTEMPTS = (
    f"UPDATE attempts SET outcome = 'succeeded', error_code = ?, error_message = ?, "
    f"started_at = coalesce(?, started_at), finished_at = coalesce(?, {NOW}) "
    "WHERE run_id = ? AND lease_token = ?"
)
RESULT_RUNS = "SELECT * FROM runs WHERE run_id IN (SELECT value FROM json_each(?))"
APPLY_RUN_RESULTS = (
    f"UPDATE runs SET state = ?, available_at = ?, finished_at = ?, last_error = ?, lease_token = NULL, "
    f"lease_expires_at = NULL, updated_at = {NOW} WHERE run_id = ?"
)
# ``?1`` is the outcome again: a stale result (superseded) never overwrites a decided attempt.
APPLY_ATTEMPT_RESULTS = (
    "UPDATE attempts SET outcome = ?, error_code = ?, error_message = ?, error_traceback = ?, "
    "started_at = coalesce(?, started_at), finished_at = ? WHERE run_id = ? AND lease_token = ? "
    "AND (outcome IN ('pending', 'lease_expired') OR ?1 <> 'superseded')"
)
# The oldest buffered run of each job that has no other active run left.
RELEASE_BUFFERED = f"""
    UPDATE runs SET state = 'scheduled', available_at = {NOW}, updated_at = {NOW}
    WHERE state = 'buffered' AND job_id IN (SELECT value FROM json_each(?)) AND finished_at IS NULL
      AND scheduled_for = (SELECT min(b.scheduled_for) FROM runs b
                           WHERE b.job_id = runs.job_id AND b.finished_at IS NULL AND b.state = 'buffered')
      AND NOT EXISTS (SELECT 1 FROM runs a WHERE a.job_id = runs.job_id AND a.finished_at IS NULL
                      AND a.state IN ('scheduled', 'dispatched', 'running'))
    RETURNING *
"""
# With when its first attempt started (its handler was entered), for the start lag `runs list` shows.
LIST_RUNS = """
    SELECT runs.*, (SELECT a.started_at FROM attempts a WHERE a.run_id = runs.run_id AND a.started_at IS NOT NULL
                    ORDER BY a.attempt LIMIT 1) AS first_started_at
    FROM runs
    WHERE tenant = ? AND (? IS NULL OR job_id = ?)
      AND (json_array_length(?) = 0 OR state IN (SELECT value FROM json_each(?)))
      AND (? IS NULL OR (scheduled_for, run_id) < (?, ?))
    ORDER BY scheduled_for DESC, run_id DESC LIMIT ?
"""
LIST_ATTEMPTS = "SELECT * FROM attempts WHERE run_id = ? ORDER BY attempt"
# Late reports (fastlane.storage.late_reports): which attempts of these runs have rows, the rows
# made from the reports, and what they change on their runs and on the runs' other attempts.
ATTEMPT_KEYS = "SELECT run_id, lease_token FROM attempts WHERE run_id IN (SELECT value FROM json_each(?))"
INSERT_LATE_ATTEMPT = """
    INSERT INTO attempts (run_id, attempt, lease_token, worker_id, node_id, outcome, dispatched_at, started_at,
                          finished_at, error_code, error_message, error_traceback, reported_late)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)
"""
COUNT_LATE_ATTEMPT = (
    f"UPDATE runs SET attempts = max(attempts, ?), first_attempt_at = coalesce(first_attempt_at, ?), "
    f"updated_at = {NOW} WHERE run_id = ?"
)
MARK_REDELIVERIES = (
    "UPDATE attempts SET redelivery = 1 WHERE run_id = ? AND attempt <> ? AND NOT reported_late "
    "AND (finished_at IS NULL OR finished_at >= ?)"
)

# -- shards ----------------------------------------------------------------------------------------

ACQUIRE_SHARDS = f"""
    UPDATE shards SET owner = ?, token = token + 1, lease_expires_at = {NOW} + ?
    WHERE shard_id IN (
        SELECT shard_id FROM shards
        WHERE (owner = '' OR lease_expires_at IS NULL OR lease_expires_at <= {NOW})
          AND (? IS NULL OR shard_id IN (SELECT value FROM json_each(?)))
        ORDER BY shard_id LIMIT ?
    )
    RETURNING *
"""
RENEW_SHARDS = f"""
    UPDATE shards SET lease_expires_at = {NOW} + ?
    WHERE owner = ? AND lease_expires_at > {NOW}
      AND (shard_id, token) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                FROM json_each(?))
    RETURNING *
"""
RELEASE_SHARDS = """
    UPDATE shards SET owner = '', lease_expires_at = NULL
    WHERE owner = ?
      AND (shard_id, token) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                FROM json_each(?))
"""
LIST_SHARDS = "SELECT * FROM shards ORDER BY shard_id"

# -- membership ------------------------------------------------------------------------------------

HEARTBEAT_NODE = f"""
    INSERT INTO nodes (node_id, address, started_at, heartbeat_at, clock_offset_ms, shards_owned,
                       workers, eligible, note)
    VALUES (?, ?, {NOW}, {NOW}, ?, ?, ?, ?, ?)
    ON CONFLICT (node_id) DO UPDATE
    SET address = excluded.address, heartbeat_at = excluded.heartbeat_at,
        clock_offset_ms = excluded.clock_offset_ms, shards_owned = excluded.shards_owned,
        workers = excluded.workers, eligible = excluded.eligible, note = excluded.note
"""
LIVE_NODES = f"SELECT * FROM nodes WHERE heartbeat_at > {NOW} - ? ORDER BY node_id"
REMOVE_NODE = "DELETE FROM nodes WHERE node_id = ?"
LIST_NODES = "SELECT * FROM nodes ORDER BY node_id"

# -- API tokens ------------------------------------------------------------------------------------

# created_at is the database clock's; a new token starts unrevoked and unused, whatever its record says.
INSERT_TOKEN = f"""
    INSERT INTO api_tokens (token_id, tenant, role, name, secret_hash, created_at, expires_at)
    VALUES (?, ?, ?, ?, ?, {NOW}, ?)
    ON CONFLICT (token_id) DO NOTHING
    RETURNING *
"""
GET_TOKEN = "SELECT * FROM api_tokens WHERE token_id = ?"
LIST_TOKENS = "SELECT * FROM api_tokens WHERE (? IS NULL OR tenant = ?) ORDER BY created_at, token_id"
# coalesce: revoking again keeps the first time. A token of another tenant is left alone and
# returns no row, exactly as an unknown one does.
REVOKE_TOKEN = f"""
    UPDATE api_tokens SET revoked_at = coalesce(revoked_at, {NOW})
    WHERE token_id = ? AND (? IS NULL OR tenant = ?)
    RETURNING *
"""
# Only rows whose time moves forward are written: a node reporting late never moves it back.
TOUCH_TOKENS = """
    UPDATE api_tokens SET last_used_at = u.used_at
    FROM (SELECT json_extract(value, '$[0]') AS token_id, json_extract(value, '$[1]') AS used_at
          FROM json_each(?)) AS u
    WHERE api_tokens.token_id = u.token_id
      AND (api_tokens.last_used_at IS NULL OR api_tokens.last_used_at < u.used_at)
"""

# -- the audit trail -------------------------------------------------------------------------------

# A batch in its order (json_each's key), so event ids follow it; at is the database clock's.
INSERT_AUDIT_EVENTS = f"""
    INSERT INTO audit_events (tenant, at, action, target_kind, target_id, job_id, token_id, actor, detail)
    SELECT json_extract(value, '$[0]'), {NOW}, json_extract(value, '$[1]'), json_extract(value, '$[2]'),
           json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'),
           json_extract(value, '$[6]'), json_extract(value, '$[7]')
    FROM json_each(?) ORDER BY key
"""
# A job's history: its own events and its runs' (they carry its id), newest first.
LIST_JOB_AUDIT = """
    SELECT * FROM audit_events WHERE tenant = ? AND job_id = ?
    ORDER BY at DESC, event_id DESC LIMIT ?
"""
LIST_RUN_AUDIT = """
    SELECT * FROM audit_events WHERE tenant = ? AND target_kind = 'run' AND target_id = ?
    ORDER BY at DESC, event_id DESC LIMIT ?
"""

# -- tenant quotas ---------------------------------------------------------------------------------

COUNT_TENANT_JOBS = "SELECT count(*) FROM jobs WHERE tenant = ?"  # jobs_by_tenant
# runs_unfinished_by_tenant: a tenant's runs not ended.
COUNT_WAITING_RUNS = (
    f"SELECT count(*) FROM runs WHERE tenant = ? AND finished_at IS NULL AND state = 'scheduled' "
    f"AND available_at <= {NOW}"
)
LIST_QUOTA_OVERRIDES = "SELECT tenant, max_jobs, job_creations_per_second, max_waiting_runs FROM tenant_quotas"
SET_QUOTA_OVERRIDE = f"""
    INSERT INTO tenant_quotas (tenant, max_jobs, job_creations_per_second, max_waiting_runs, updated_at)
    VALUES (?, ?, ?, ?, {NOW})
    ON CONFLICT (tenant) DO UPDATE SET max_jobs = excluded.max_jobs,
        job_creations_per_second = excluded.job_creations_per_second,
        max_waiting_runs = excluded.max_waiting_runs, updated_at = excluded.updated_at
"""
DELETE_QUOTA_OVERRIDE = "DELETE FROM tenant_quotas WHERE tenant = ?"
# A workflow step's output, kept for the steps after it (only results that carry one).
SET_OUTPUT = "UPDATE runs SET output = ? WHERE run_id = ? AND workflow_run_id IS NOT NULL"
