"""The SQLite dialect's SQL: the store's statements translated from PostgreSQL's, and those whose
SQL must differ written out (same names, same order of parameters).

Instants are integer microseconds since the Unix epoch, UTC; a list or a batch is one JSON array
parameter expanded by ``json_each``. Writes take ``BEGIN IMMEDIATE``, so the one writer already
holds every row a transaction reads: row locks are left out.
"""

from __future__ import annotations

import functools
import re

from fastlane.storage.store.statements import DUE_JOB_SCHEDULE, FINAL, WITH_A_WORKER, Statements, compiled

# The database clock, in integer microseconds. SQLite's own julianday('now') only has millisecond
# resolution; an embedded database shares its host's clock anyway, so the connection gets a SQL
# function reading that clock at full resolution (registered in ``connection``).
NOW = "fl_now_us()"

_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"= ANY\(\$(\d+)::\w+\[\]\)"), r"IN (SELECT value FROM json_each(?\1))"),
    (re.compile(r"cardinality\(\$(\d+)::\w+\[\]\)"), r"json_array_length(?\1)"),
    (re.compile(r"\$(\d+)(?:::\w+(?:\[\])?)?"), r"?\1"),
    (re.compile(r"\b(?:clock|statement)_timestamp\(\)"), NOW),
    (re.compile(r"\s*\*\s*interval '1 microsecond'"), ""),
    (re.compile(r"\s*\*\s*interval '1 millisecond'"), " * 1000"),
    (re.compile(r"\bgreatest\("), "max("),
    (re.compile(r"\s+FOR (?:UPDATE|SHARE|KEY SHARE|NO KEY UPDATE)(?: OF \w+)?(?: SKIP LOCKED| NOWAIT)?"), ""),
)


@functools.cache
def translate(sql: str) -> str:
    """PostgreSQL's SQL of a statement in SQLite's: numbered parameters without casts, lists as
    ``json_each``, the clock as :data:`NOW`, microsecond intervals as plain numbers, no row locks."""
    for pattern, replacement in _RULES:
        sql = pattern.sub(replacement, sql)
    return sql


def _batch(*columns: str) -> str:
    """The rows of a batch parameter (``?1``), as a table with these columns."""
    picked = ", ".join(f"json_extract(value, '$[{i}]') AS {name}" for i, name in enumerate(columns))
    return f"(SELECT {picked} FROM json_each(?1))"


class SQLiteStatements(Statements):
    META_TABLE_EXISTS = "SELECT count(*) FROM sqlite_master WHERE name = 'fastlane_meta'"
    CREATE_SHARDS = """
        WITH RECURSIVE n(i) AS (SELECT 0 WHERE ?1 > 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?1)
        INSERT OR IGNORE INTO shards (shard_id) SELECT i FROM n
    """
    # SQLite compares text bytewise: the (tenant, name) unique index serves the range.
    JOBS_BY_NAME_RANGE = "SELECT * FROM jobs WHERE tenant = ?1 AND name >= ?2 AND name < ?3 ORDER BY name LIMIT ?4"

    LOAD_DUE_JOBS = f"""
        SELECT job_id, shard_id, next_fire_at,
               {DUE_JOB_SCHEDULE.format(kind="json_extract(policies, '$.schedule.kind')",
                                        schedule="json_extract(policies, '$.schedule')")},
               json_extract(policies, '$.misfire'), job_type, tenant, priority
        FROM jobs
        WHERE state = 'active' AND shard_id IN (SELECT value FROM json_each(?1)) AND next_fire_at < ?2
          AND (?3 IS NULL OR next_fire_at >= ?3)
          AND (?5 IS NULL OR (next_fire_at, job_id) > (?5, ?6))
        ORDER BY next_fire_at, job_id LIMIT ?4
    """
    FENCE = f"""
        SELECT s.shard_id FROM shards s
        JOIN {_batch("shard_id", "owner", "token")} AS f
          ON s.shard_id = f.shard_id AND s.owner = f.owner AND s.token = f.token
        WHERE s.lease_expires_at > {NOW}
    """
    ADVANCE_JOBS = f"""
        UPDATE jobs
        SET next_fire_at = o.next_fire_at, updated_at = {NOW},
            state = CASE WHEN o.next_fire_at IS NULL THEN 'completed' ELSE jobs.state END
        FROM {_batch("job_id", "expected", "next_fire_at")} AS o
        WHERE jobs.job_id = o.job_id AND jobs.next_fire_at = o.expected
          AND jobs.state = 'active' AND jobs.shard_id IN (SELECT value FROM json_each(?2))
        RETURNING jobs.job_id, json_extract(jobs.policies, '$.overlap') AS overlap
    """
    # Now read once for the statement (``t``): its runs share one created_at, kept once in memory.
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
        FROM {_batch("run_id", "job_id", "scheduled_for", "state", "last_error")} AS o
        JOIN jobs j ON j.job_id = o.job_id
        CROSS JOIN (SELECT {NOW} AS now) AS t
        WHERE true
        ON CONFLICT (job_id, scheduled_for, (CASE WHEN manual THEN run_id ELSE '' END)) DO NOTHING  -- runs_of_job
        RETURNING *
    """
    NEXT_LEASE_EXPIRY = (
        f"SELECT min(lease_expires_at) - {NOW} FROM runs WHERE state IN ({WITH_A_WORKER}) "
        "AND shard_id IN (SELECT value FROM json_each(?1)) AND finished_at IS NULL"
    )
    INSERT_MANUAL_RUN = f"""
        INSERT INTO runs (run_id, job_id, tenant, job_type, shard_id, scheduled_for, available_at, state,
                          payload, priority, manual, delivery, lease_ttl_ms, timeout_ms, retry,
                          created_at, updated_at, concurrency_key, concurrency_limit)
        SELECT ?1, j.job_id, j.tenant, j.job_type, j.shard_id, {NOW}, {NOW}, 'scheduled', j.payload,
               j.priority, 1, json_extract(j.policies, '$.delivery'),
               CAST(json_extract(j.policies, '$.lease_ttl') * 1000 AS INTEGER),
               CAST(json_extract(j.policies, '$.timeout') * 1000 AS INTEGER),
               json_extract(j.policies, '$.retry'), {NOW}, {NOW},
               json_extract(j.policies, '$.concurrency_key'), json_extract(j.policies, '$.concurrency_limit')
        FROM jobs j WHERE j.job_id = ?2 AND j.tenant = ?3
        RETURNING *
    """
    COUNT_ACTIVE_BY_KEY = f"""
        SELECT r.tenant, r.concurrency_key, count(*) AS active FROM runs r
        JOIN {_batch("tenant", "key")} AS k ON r.tenant = k.tenant AND r.concurrency_key = k.key
        WHERE r.concurrency_key IS NOT NULL AND r.finished_at IS NULL AND r.state IN ({WITH_A_WORKER})
        GROUP BY r.tenant, r.concurrency_key
    """
    MARK_ATTEMPTS_STARTED = f"""
        UPDATE attempts SET started_at = coalesce(attempts.started_at, s.started_at, {NOW})
        FROM {_batch("run_id", "lease_token", "started_at")} AS s
        WHERE attempts.run_id = s.run_id AND attempts.lease_token = s.lease_token
    """
    APPLY_RUN_RESULTS = f"""
        UPDATE runs SET state = u.state, available_at = u.available_at, finished_at = u.finished_at,
                        last_error = u.last_error, lease_token = NULL, lease_expires_at = NULL, updated_at = {NOW}
        FROM {_batch("run_id", "state", "available_at", "finished_at", "last_error")} AS u
        WHERE runs.run_id = u.run_id
    """
    APPLY_ATTEMPT_RESULTS = f"""
        UPDATE attempts SET outcome = u.outcome, error_code = u.error_code, error_message = u.error_message,
                            error_traceback = u.error_traceback,
                            started_at = coalesce(u.started_at, attempts.started_at), finished_at = u.finished_at
        FROM {_batch("run_id", "lease_token", "outcome", "error_code", "error_message", "started_at",
                     "finished_at", "error_traceback")} AS u
        WHERE attempts.run_id = u.run_id AND attempts.lease_token = u.lease_token
          AND (attempts.outcome IN ('pending', 'lease_expired') OR u.outcome <> 'superseded')
    """
    ACQUIRE_SHARDS = f"""
        UPDATE shards SET owner = ?1, token = token + 1, lease_expires_at = {NOW} + ?2
        WHERE shard_id IN (
            SELECT shard_id FROM shards
            WHERE (owner = '' OR lease_expires_at IS NULL OR lease_expires_at <= {NOW})
              AND (?4 IS NULL OR shard_id IN (SELECT value FROM json_each(?4)))
            ORDER BY shard_id LIMIT ?3
        )
        RETURNING *
    """
    # Never run (the one writer holds no row locks to wait for): ACQUIRE_SHARDS takes expired ones.
    ACQUIRE_EXPIRED_SHARDS = ACQUIRE_SHARDS
    RENEW_SHARDS = f"""
        UPDATE shards SET lease_expires_at = {NOW} + ?3
        WHERE owner = ?2 AND lease_expires_at > {NOW}
          AND (shard_id, token) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                    FROM json_each(?1))
        RETURNING *
    """
    RELEASE_SHARDS = """
        UPDATE shards SET owner = '', lease_expires_at = NULL
        WHERE owner = ?2
          AND (shard_id, token) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                    FROM json_each(?1))
    """
    # One node uses the file: nobody to tell that it joined, so no answer to whether it did.
    HEARTBEAT_NODE = f"""
        INSERT INTO nodes (node_id, address, started_at, heartbeat_at, clock_offset_ms, shards_owned,
                           workers, eligible, note)
        VALUES (?1, ?2, {NOW}, {NOW}, ?3, ?4, ?5, ?6, ?7)
        ON CONFLICT (node_id) DO UPDATE
        SET address = excluded.address, heartbeat_at = excluded.heartbeat_at,
            clock_offset_ms = excluded.clock_offset_ms, shards_owned = excluded.shards_owned,
            workers = excluded.workers, eligible = excluded.eligible, note = excluded.note
        RETURNING NULL
    """
    TOUCH_TOKENS = f"""
        UPDATE api_tokens SET last_used_at = u.used_at
        FROM {_batch("token_id", "used_at")} AS u
        WHERE api_tokens.token_id = u.token_id
          AND (api_tokens.last_used_at IS NULL OR api_tokens.last_used_at < u.used_at)
    """
    # A batch in its order (json_each's key), so event ids follow it.
    INSERT_AUDIT_EVENTS = f"""
        INSERT INTO audit_events (tenant, at, action, target_kind, target_id, job_id, token_id, actor, detail)
        SELECT json_extract(value, '$[0]'), {NOW}, json_extract(value, '$[1]'), json_extract(value, '$[2]'),
               json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'),
               json_extract(value, '$[6]'), json_extract(value, '$[7]')
        FROM json_each(?1) ORDER BY key
    """


STATEMENTS = compiled(SQLiteStatements, translate)

# -- the procedures of SQLiteTx ----------------------------------------------------------------------

DISPATCH_RUNS = f"""
    UPDATE runs
    SET state = 'dispatched', attempts = runs.attempts + 1, lease_token = d.lease_token,
        lease_expires_at = {NOW} + d.ttl_us, worker_id = d.worker_id, updated_at = {NOW},
        first_attempt_at = coalesce(runs.first_attempt_at, d.dispatched_at)
    FROM {_batch("run_id", "lease_token", "worker_id", "ttl_us", "dispatched_at")} AS d
    WHERE runs.run_id = d.run_id AND runs.state = 'scheduled'
    RETURNING runs.run_id, runs.attempts, runs.lease_token, runs.worker_id
"""
# One statement for the whole batch: a row at a time would cross to SQLite's thread once per
# run, holding the single writer for seconds on a large batch.
INSERT_ATTEMPTS = """
    INSERT INTO attempts (run_id, attempt, lease_token, worker_id, node_id, outcome, dispatched_at)
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
           json_extract(value, '$[3]'), json_extract(value, '$[4]'), 'pending', json_extract(value, '$[5]')
    FROM json_each(?1)
    RETURNING *
"""
# The lease tokens of these runs' current attempts. The store is the only writer, so tokens read
# inside a write transaction are still current at its updates.
CURRENT_ATTEMPTS = (
    "SELECT run_id, lease_token FROM runs WHERE run_id IN (SELECT value FROM json_each(?1)) "
    f"AND state IN ({WITH_A_WORKER})"
)
# A row at a time: a checkpoint is bytes, which a JSON batch cannot carry.
EXTEND_LEASES = f"""
    UPDATE runs SET lease_expires_at = {NOW} + lease_ttl_ms * 1000, progress = coalesce(?3, progress),
                    checkpoint = coalesce(?4, checkpoint),
                    state = CASE WHEN ?5 THEN 'running' ELSE state END, updated_at = {NOW}
    WHERE run_id = ?1 AND lease_token = ?2
"""
SUCCEED_RUNS = f"""
    UPDATE runs SET state = 'succeeded', finished_at = {NOW}, last_error = NULL, lease_token = NULL,
                    lease_expires_at = NULL, updated_at = {NOW}
    WHERE run_id IN (SELECT value FROM json_each(?1))
    RETURNING *
"""
SUCCEED_ATTEMPTS = f"""
    UPDATE attempts SET outcome = 'succeeded', error_code = ?3, error_message = ?4,
                        started_at = coalesce(?5, started_at), finished_at = coalesce(?6, {NOW})
    WHERE run_id = ?1 AND lease_token = ?2
"""
DOOMED_RUNS = f"""
    SELECT run_id FROM runs
    WHERE finished_at < ?1 AND shard_id IN (SELECT value FROM json_each(?2)) AND state IN ({FINAL})
    ORDER BY finished_at
    LIMIT ?3
"""
DELETE_ATTEMPTS = "DELETE FROM attempts WHERE run_id IN (SELECT value FROM json_each(?1))"
DELETE_RUNS = "DELETE FROM runs WHERE run_id IN (SELECT value FROM json_each(?1))"
