"""The PostgreSQL dialect's own SQL: the store's statements are written in PostgreSQL's SQL
already (:mod:`fastlane.storage.store.statements`); here are those of its procedures (``tx``), its
migrations and its change notifications.

Batches are set-based: one statement over ``unnest`` arrays per batch, never a statement per row.
Leases are judged by ``clock_timestamp()`` (the database clock at the moment of the statement,
not the start of the transaction).
"""

from __future__ import annotations

from fastlane.storage.store.statements import FINAL, WITH_A_WORKER, Statements, compiled

STATEMENTS = compiled(Statements, lambda sql: sql)

LOCK_MIGRATIONS = "SELECT pg_advisory_xact_lock($1)"
MIGRATION_LOCK = 7_236_001  # pg_advisory_xact_lock key: one migrator at a time across nodes
NOTIFY = "SELECT pg_notify($1, $2)"
PING = "SELECT 1"

# The runs dispatched and their attempts inserted in one statement.
DISPATCH_RUNS = """
    WITH started AS (
        UPDATE runs r
        SET state = 'dispatched', attempts = r.attempts + 1, lease_token = d.lease_token,
            lease_expires_at = clock_timestamp() + d.ttl_us * interval '1 microsecond',
            worker_id = d.worker_id, updated_at = clock_timestamp(),
            first_attempt_at = coalesce(r.first_attempt_at, d.dispatched_at)
        FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::timestamptz[])
             AS d(run_id, lease_token, worker_id, node_id, ttl_us, dispatched_at)
        WHERE r.run_id = d.run_id AND r.state = 'scheduled'
        RETURNING r.run_id, r.attempts, d.lease_token, d.worker_id, d.node_id, d.dispatched_at
    )
    INSERT INTO attempts (run_id, attempt, lease_token, worker_id, node_id, outcome, dispatched_at)
    SELECT run_id, attempts, lease_token, worker_id, node_id, 'pending', dispatched_at FROM started
    RETURNING *
"""
# Capped dispatches: a transaction-scoped lock per key, taken in sorted order (PostgreSQL
# evaluates the volatile lock function after the sort), then the count.
KEY_LOCK_SPACE = 7_236_002  # the first key of pg_advisory_xact_lock(int, int); the migrator uses 7_236_001
LOCK_CONCURRENCY_KEYS = (
    f"SELECT pg_advisory_xact_lock({KEY_LOCK_SPACE}, hashtext(k.tenant || chr(31) || k.key)) "
    "FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(tenant, key, position) ORDER BY k.position"
)
EXTEND_LEASES = f"""
    UPDATE runs r
    SET lease_expires_at = clock_timestamp() + r.lease_ttl_ms * interval '1 millisecond',
        progress = coalesce(h.progress, r.progress),
        checkpoint = coalesce(h.checkpoint, r.checkpoint),
        state = CASE WHEN h.started THEN 'running' ELSE r.state END,
        updated_at = clock_timestamp()
    FROM unnest($1::text[], $2::bigint[], $3::real[], $4::bytea[], $5::bool[])
         AS h(run_id, lease_token, progress, checkpoint, started)
    WHERE r.run_id = h.run_id AND r.lease_token = h.lease_token AND r.state IN ({WITH_A_WORKER})
    RETURNING r.run_id, r.lease_token
"""
# Successes of current attempts, set-wise: the runs end succeeded, then their attempts say so.
# A success whose attempt is no longer current matches nothing here and is decided in Python.
# (Two statements: joining the attempts to the first one's output inside one query lets the
# planner pick a nested loop over unindexed sets, quadratic in the batch.)
SUCCEED_RUNS = f"""
    UPDATE runs r SET state = 'succeeded', finished_at = clock_timestamp(), last_error = NULL,
                      lease_token = NULL, lease_expires_at = NULL, updated_at = clock_timestamp()
    FROM unnest($1::text[], $2::bigint[]) AS u(run_id, lease_token)
    WHERE r.run_id = u.run_id AND r.lease_token = u.lease_token AND r.state IN ({WITH_A_WORKER})
    RETURNING r.*, u.lease_token AS attempt_token
"""
# Found by primary key: the attempt number is the run's count of attempts, as the dispatch that
# made the attempt numbered it. By run id and token, only the run id is in the key: without
# statistics the planner cannot tell one attempt from a run's hundred, and on a new database (or
# until autovacuum analyses it) it scans every attempt for each batch of results.
SUCCEED_ATTEMPTS = """
    UPDATE attempts a SET outcome = 'succeeded', error_code = s.error_code, error_message = s.error_message,
                          started_at = coalesce(s.started_at, a.started_at),
                          finished_at = coalesce(s.finished_at, clock_timestamp())
    FROM unnest($1::text[], $2::integer[], $3::bigint[], $4::text[], $5::text[], $6::timestamptz[],
                $7::timestamptz[])
         AS s(run_id, attempt, lease_token, error_code, error_message, started_at, finished_at)
    WHERE a.run_id = s.run_id AND a.attempt = s.attempt AND a.lease_token = s.lease_token
    RETURNING a.run_id
"""
# The few the count does not number: a late report of an earlier attempt, recorded after this one
# went out, took the next number (INSERT_LATE_ATTEMPT).
SUCCEED_ATTEMPTS_BY_TOKEN = """
    UPDATE attempts a SET outcome = 'succeeded', error_code = s.error_code, error_message = s.error_message,
                          started_at = coalesce(s.started_at, a.started_at),
                          finished_at = coalesce(s.finished_at, clock_timestamp())
    FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::timestamptz[], $6::timestamptz[])
         AS s(run_id, lease_token, error_code, error_message, started_at, finished_at)
    WHERE a.run_id = s.run_id AND a.lease_token = s.lease_token
"""
# Why batches of deletes and not time partitions of run history (dropping a partition is cheaper
# still): a run is found by its id on every result, heartbeat and ``runs get``, and a partition key
# would have to join that key; and a partition old enough to drop may still hold a run that is not
# finished (retrying for days, or kept by a paused job), which must be kept. The deletes walk the
# ``runs_finished`` index from its old end, skip rows another trimmer holds, and take one small
# transaction per batch, so the fire path's writes never wait long behind them (see ``fastlane
# bench retention``). At the rates where deleting costs what writing did, partitions would pay,
# with runs that outlive their partition moved out before it is dropped.
TRIM_HISTORY = f"""
WITH doomed AS (
    SELECT run_id FROM runs
    WHERE finished_at < $1 AND shard_id = ANY($2::integer[]) AND state IN ({FINAL})
    ORDER BY finished_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), attempts_gone AS (
    DELETE FROM attempts a USING doomed d WHERE a.run_id = d.run_id
), runs_gone AS (
    DELETE FROM runs r USING doomed d WHERE r.run_id = d.run_id RETURNING 1
)
SELECT count(*) FROM runs_gone
"""
