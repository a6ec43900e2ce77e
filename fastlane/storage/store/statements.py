"""Every statement of the store, written once in PostgreSQL's SQL.

A dialect says each in its own SQL: PostgreSQL as written; SQLite by a mechanical translation
(``$n`` parameters, ``= ANY($n)`` lists, the clock, row locks: see
:func:`fastlane.storage.sqlite.queries.translate`) except where its SQL must truly differ, which its
``queries`` module writes out in a subclass of :class:`Statements` under the same name. Parameters
take one order in every dialect: the order written here. A :class:`~fastlane.storage.store.database.Batch`
stands for as many parameters as it has columns on PostgreSQL (``unnest``) and for one on SQLite.

Lists of states are made from the named state sets, never typed as literals. Queries over runs
not yet ended say ``finished_at IS NULL`` as well as their states: the indexes of such runs are
partial on it (schema version 13), and a planner uses a partial index only for a query that
implies its predicate.
"""

from __future__ import annotations

from collections.abc import Callable

from fastlane.domain.lifecycle import FINAL as FINAL_SET
from fastlane.domain.lifecycle import OVERLAP_ACTIVE as OVERLAP_ACTIVE_SET
from fastlane.domain.lifecycle import WAITING as WAITING_SET
from fastlane.domain.lifecycle import WITH_A_WORKER as WITH_A_WORKER_SET
from fastlane.domain.lifecycle import sql_list
from fastlane.domain.models import RunState

# The named state sets of fastlane.domain.lifecycle, as SQL lists.
WITH_A_WORKER = sql_list(WITH_A_WORKER_SET)
OVERLAP_ACTIVE = sql_list(OVERLAP_ACTIVE_SET)
WAITING = sql_list(WAITING_SET)
FINAL = sql_list(FINAL_SET)
# The token a shard acquired on timeline t takes, at least (t - 1) << 32: see ACQUIRE_SHARDS.
TOKEN_FLOOR = ("GREATEST(token + 1, ((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1)"
               " << 32))")
# A job's runs that keep its oldest buffered run waiting.
AHEAD_OF_THE_BUFFER = sql_list(OVERLAP_ACTIVE_SET - {RunState.BUFFERED})
# The window's columns: the schedule only for recurring jobs (a one-shot has no next occurrence,
# and leaving its instant out lets every one-shot with the same misfire policy share one Timing).
DUE_JOB_SCHEDULE = "CASE WHEN {kind} IN ('now', 'at') THEN NULL ELSE {schedule} END"


class Statements:
    """The store's statements by name; a dialect's instance holds its SQL of each."""

    # -- lifecycle ---------------------------------------------------------------------------------

    DB_NOW = "SELECT clock_timestamp()"
    META_TABLE_EXISTS = "SELECT to_regclass('fastlane_meta') IS NOT NULL"
    SCHEMA_VERSION = "SELECT value FROM fastlane_meta WHERE key = 'schema_version'"
    SET_SCHEMA_VERSION = (
        "INSERT INTO fastlane_meta VALUES ('schema_version', $1) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
    )
    INIT_SHARD_COUNT = "INSERT INTO fastlane_meta VALUES ('shard_count', $1) ON CONFLICT (key) DO NOTHING"
    SHARD_COUNT = "SELECT value FROM fastlane_meta WHERE key = 'shard_count'"
    CREATE_SHARDS = "INSERT INTO shards (shard_id) SELECT generate_series(0, $1 - 1) ON CONFLICT DO NOTHING"

    # -- jobs --------------------------------------------------------------------------------------

    INSERT_JOB = """
        INSERT INTO jobs (job_id, tenant, name, job_type, shard_id, state, next_fire_at, priority,
                          payload, policies, created_at, updated_at)
        VALUES ($1, $2, $3, $4, $5, 'active', $6, $7, $8, $9::jsonb, $10, $10)
        ON CONFLICT (tenant, name) DO NOTHING
        RETURNING *
    """
    JOB_BY_NAME = "SELECT * FROM jobs WHERE tenant = $1 AND name = $2"
    # Ids in [low, high): those starting with a prefix (common.id_prefix_range), through the primary key.
    JOBS_BY_ID_RANGE = (
        "SELECT * FROM jobs WHERE job_id >= $1 AND job_id < $2 AND tenant = $3 ORDER BY job_id LIMIT $4"
    )
    # Names in [low, high) in byte order ("C"), through jobs_by_name_bytes (migration 15): a locale's
    # collation would order "a-b" after "ab" and a prefix would not be one range of it.
    JOBS_BY_NAME_RANGE = (
        'SELECT * FROM jobs WHERE tenant = $1 AND name COLLATE "C" >= $2 AND name COLLATE "C" < $3 '
        'ORDER BY name COLLATE "C" LIMIT $4'
    )
    RUNS_BY_ID_RANGE = (
        "SELECT * FROM runs WHERE run_id >= $1 AND run_id < $2 AND tenant = $3 ORDER BY run_id LIMIT $4"
    )
    GET_JOB = "SELECT * FROM jobs WHERE job_id = $1 AND tenant = $2"
    LOCK_JOB = "SELECT * FROM jobs WHERE job_id = $1 AND tenant = $2 FOR UPDATE"
    LIST_JOBS = """
        SELECT * FROM jobs
        WHERE tenant = $1 AND job_id > $2
          AND (cardinality($3::text[]) = 0 OR state = ANY($3::text[])) AND ($4::text IS NULL OR job_type = $4)
        ORDER BY job_id LIMIT $5
    """
    # How many of a tenant's jobs a filter takes (a bulk action's dry run).
    COUNT_SELECTED_JOBS = (
        "SELECT count(*) FROM jobs WHERE tenant = $1 AND state = ANY($2::text[]) AND ($3::text IS NULL OR job_type = $3)"
    )
    UPDATE_JOB = """
        UPDATE jobs SET job_type = $3, priority = $4, payload = $5, policies = $6::jsonb,
                        next_fire_at = $7, state = $8, version = version + 1, updated_at = $9
        WHERE job_id = $1 AND tenant = $2
        RETURNING *
    """
    SET_JOB_ASIDE = (
        "UPDATE jobs SET state = $2, error = $3, version = version + 1, updated_at = clock_timestamp() "
        "WHERE job_id = $1 RETURNING shard_id, tenant"
    )
    COUNT_JOBS = "SELECT count(*) FROM jobs WHERE state = $1"
    CHANGE_JOB_STATE = (
        "UPDATE jobs SET state = $2, error = NULL, pause_reason = $3, version = version + 1, "
        "updated_at = clock_timestamp() "
        "WHERE job_id = $1 RETURNING *"
    )
    DELETE_JOB = "DELETE FROM jobs WHERE job_id = $1 AND tenant = $2 RETURNING shard_id"
    CANCEL_RUNS_OF_DELETED_JOB = (
        "UPDATE runs SET state = 'cancelled', finished_at = clock_timestamp(), updated_at = clock_timestamp(), "
        f"last_error = 'job deleted' WHERE job_id = $1 AND state IN ({WAITING}) AND finished_at IS NULL"
    )

    # -- the fast lane -----------------------------------------------------------------------------

    LOAD_DUE_JOBS = f"""
        SELECT job_id, shard_id, next_fire_at,
               {DUE_JOB_SCHEDULE.format(kind="policies->'schedule'->>'kind'", schedule="policies->'schedule'")},
               policies->'misfire', job_type, tenant, priority
        FROM jobs
        WHERE state = 'active' AND shard_id = ANY($1::int[]) AND next_fire_at < $2
          AND ($3::timestamptz IS NULL OR next_fire_at >= $3)
          AND ($5::timestamptz IS NULL OR (next_fire_at, job_id) > ($5, $6))
        ORDER BY next_fire_at, job_id LIMIT $4
    """
    # Batch(shard_id, owner, token). Locks the fenced shard rows FOR KEY SHARE: a takeover (which
    # locks the row FOR UPDATE) waits for this transaction, so the fence holds until commit; the
    # owner's own lease renewal (a plain UPDATE, a weaker lock) does not, so renewals never queue
    # behind data transactions. One statement for a batch's every shard: a batch under load
    # spans them all, and a query per shard is a round trip each.
    FENCE = """
        SELECT s.shard_id FROM shards s
        JOIN unnest($1::int[], $2::text[], $3::bigint[]) AS f(shard_id, owner, token)
          ON s.shard_id = f.shard_id AND s.owner = f.owner AND s.token = f.token
        WHERE s.lease_expires_at > clock_timestamp()
        FOR KEY SHARE OF s
    """
    # Batch(job_id, expected, next_fire_at), shard ids.
    ADVANCE_JOBS = """
        UPDATE jobs j
        SET next_fire_at = o.next_fire_at, updated_at = clock_timestamp(),
            state = CASE WHEN o.next_fire_at IS NULL THEN 'completed' ELSE j.state END
        FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[]) AS o(job_id, expected, next_fire_at)
        WHERE j.job_id = o.job_id AND j.next_fire_at = o.expected
          AND j.state = 'active' AND j.shard_id = ANY($4::int[])
        RETURNING j.job_id, j.policies->>'overlap' AS overlap
    """
    JOBS_BY_IDS = "SELECT * FROM jobs WHERE job_id = ANY($1::text[])"
    ACTIVE_RUNS_OF_JOBS = (
        "SELECT job_id, run_id, state FROM runs WHERE job_id = ANY($1::text[]) AND finished_at IS NULL "
        f"AND state IN ({OVERLAP_ACTIVE}) FOR UPDATE"
    )
    CANCEL_FOR_OVERLAP = (
        "UPDATE runs SET state = 'cancelled', finished_at = clock_timestamp(), updated_at = clock_timestamp(), "
        "last_error = $2 WHERE run_id = ANY($1::text[]) RETURNING *"
    )
    REQUEST_CANCEL_FOR_OVERLAP = (
        "UPDATE runs SET cancel_requested = true, last_error = $2, updated_at = clock_timestamp() "
        "WHERE run_id = ANY($1::text[]) RETURNING *"
    )
    # Batch(run_id, job_id, scheduled_for, state, last_error). One time for the statement (not
    # clock_timestamp()): its runs share one created_at, kept once in memory (codec.build_runs).
    INSERT_RUNS = """
        INSERT INTO runs (run_id, job_id, tenant, job_type, shard_id, scheduled_for, available_at, state,
                          payload, priority, manual, delivery, lease_ttl_ms, timeout_ms, retry,
                          created_at, updated_at, finished_at, last_error, concurrency_key, concurrency_limit)
        SELECT o.run_id, j.job_id, j.tenant, j.job_type, j.shard_id, o.scheduled_for, o.scheduled_for,
               o.state, j.payload, j.priority, false, j.policies->>'delivery',
               ((j.policies->>'lease_ttl')::float8 * 1000)::bigint,
               ((j.policies->>'timeout')::float8 * 1000)::bigint, j.policies->'retry',
               statement_timestamp(), statement_timestamp(),
               CASE WHEN o.state = 'skipped' THEN statement_timestamp() END, o.last_error,
               j.policies->>'concurrency_key', (j.policies->>'concurrency_limit')::integer
        FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[], $5::text[])
             AS o(run_id, job_id, scheduled_for, state, last_error)
        JOIN jobs j ON j.job_id = o.job_id
        ON CONFLICT (job_id, scheduled_for, (CASE WHEN manual THEN run_id ELSE '' END)) DO NOTHING  -- runs_of_job
        RETURNING *
    """
    PENDING_RUN_IDS = (
        "SELECT run_id FROM runs WHERE state = 'scheduled' AND shard_id = ANY($1::int[]) "
        "AND finished_at IS NULL AND available_at < $2 ORDER BY available_at"
    )
    PENDING_RUNS = "SELECT * FROM runs WHERE run_id = ANY($1::text[]) AND state = 'scheduled'"
    EXPIRED_RUNS = (
        f"SELECT * FROM runs WHERE shard_id = $1 AND finished_at IS NULL AND state IN ({WITH_A_WORKER}) "
        "AND lease_expires_at < clock_timestamp() ORDER BY lease_expires_at FOR UPDATE SKIP LOCKED"
    )
    SHARDS_WITH_EXPIRED_LEASES = (
        f"SELECT DISTINCT shard_id FROM runs WHERE state IN ({WITH_A_WORKER}) "
        "AND shard_id = ANY($1::int[]) AND finished_at IS NULL AND lease_expires_at < clock_timestamp()"
    )
    # Microseconds until the earliest attempt lease of these shards runs out (negative: already out).
    NEXT_LEASE_EXPIRY = (
        "SELECT (extract(epoch FROM min(lease_expires_at) - clock_timestamp()) * 1000000)::bigint FROM runs "
        f"WHERE state IN ({WITH_A_WORKER}) AND shard_id = ANY($1::int[]) AND finished_at IS NULL"
    )

    # -- runs --------------------------------------------------------------------------------------

    # A job of another tenant, or one deleted meanwhile, inserts nothing: not found.
    INSERT_MANUAL_RUN = """
        INSERT INTO runs (run_id, job_id, tenant, job_type, shard_id, scheduled_for, available_at, state,
                          payload, priority, manual, delivery, lease_ttl_ms, timeout_ms, retry,
                          created_at, updated_at, concurrency_key, concurrency_limit)
        SELECT $1, j.job_id, j.tenant, j.job_type, j.shard_id, clock_timestamp(), clock_timestamp(),
               'scheduled', j.payload, j.priority, true, j.policies->>'delivery',
               ((j.policies->>'lease_ttl')::float8 * 1000)::bigint,
               ((j.policies->>'timeout')::float8 * 1000)::bigint, j.policies->'retry',
               clock_timestamp(), clock_timestamp(),
               j.policies->>'concurrency_key', (j.policies->>'concurrency_limit')::integer
        FROM jobs j WHERE j.job_id = $2 AND j.tenant = $3
        RETURNING *
    """
    GET_RUN = "SELECT * FROM runs WHERE run_id = $1 AND tenant = $2"
    LOCK_RUN = "SELECT * FROM runs WHERE run_id = $1 AND tenant = $2 FOR UPDATE"
    RUN_STATE = "SELECT state FROM runs WHERE run_id = $1 AND tenant = $2 FOR UPDATE"
    REQUEST_CANCEL = (
        "UPDATE runs SET cancel_requested = true, updated_at = clock_timestamp() WHERE run_id = $1 RETURNING *"
    )
    CANCEL_RUN = (
        "UPDATE runs SET state = 'cancelled', finished_at = clock_timestamp(), updated_at = clock_timestamp(), "
        "last_error = $2 WHERE run_id = $1 RETURNING *"
    )
    RETRY_RUN = (
        "UPDATE runs SET state = 'scheduled', available_at = clock_timestamp(), finished_at = NULL, "
        "cancel_requested = false, updated_at = clock_timestamp() WHERE run_id = $1 RETURNING *"
    )
    SCHEDULED_AMONG = "SELECT run_id FROM runs WHERE run_id = ANY($1::text[]) AND state = 'scheduled'"
    # Batch(tenant, key).
    COUNT_ACTIVE_BY_KEY = f"""
        SELECT r.tenant, r.concurrency_key, count(*) AS active FROM runs r
        JOIN unnest($1::text[], $2::text[]) AS k(tenant, key) ON r.tenant = k.tenant AND r.concurrency_key = k.key
        WHERE r.concurrency_key IS NOT NULL AND r.finished_at IS NULL AND r.state IN ({WITH_A_WORKER})
        GROUP BY r.tenant, r.concurrency_key
    """
    # Batch(run_id, lease_token).
    # When the handler began, as the worker said (corrected to the node's clock), else now.
    MARK_ATTEMPTS_STARTED = """
        UPDATE attempts a SET started_at = coalesce(a.started_at, s.started_at, clock_timestamp())
        FROM unnest($1::text[], $2::bigint[], $3::timestamptz[]) AS s(run_id, lease_token, started_at)
        WHERE a.run_id = s.run_id AND a.lease_token = s.lease_token
    """
    RESULT_RUNS = "SELECT * FROM runs WHERE run_id = ANY($1::text[]) ORDER BY run_id FOR UPDATE"
    # Batch(run_id, state, available_at, finished_at, last_error).
    APPLY_RUN_RESULTS = """
        UPDATE runs r SET state = u.state, available_at = u.available_at, finished_at = u.finished_at,
                          last_error = u.last_error, lease_token = NULL, lease_expires_at = NULL,
                          updated_at = clock_timestamp()
        FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::text[])
             AS u(run_id, state, available_at, finished_at, last_error)
        WHERE r.run_id = u.run_id
    """
    # Batch(run_id, lease_token, outcome, error_code, error_message, started_at, finished_at,
    # error_traceback). A stale result (superseded) never overwrites a decided attempt.
    APPLY_ATTEMPT_RESULTS = """
        UPDATE attempts a SET outcome = u.outcome, error_code = u.error_code, error_message = u.error_message,
                              error_traceback = u.error_traceback,
                              started_at = coalesce(u.started_at, a.started_at), finished_at = u.finished_at
        FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::timestamptz[],
                    $7::timestamptz[], $8::text[])
             AS u(run_id, lease_token, outcome, error_code, error_message, started_at, finished_at, error_traceback)
        WHERE a.run_id = u.run_id AND a.lease_token = u.lease_token
          AND (a.outcome IN ('pending', 'lease_expired') OR u.outcome <> 'superseded')
    """
    # The oldest buffered run of each job that has no other active run left.
    RELEASE_BUFFERED = f"""
        UPDATE runs SET state = 'scheduled', available_at = clock_timestamp(), updated_at = clock_timestamp()
        WHERE state = 'buffered' AND job_id = ANY($1::text[]) AND finished_at IS NULL
          AND scheduled_for = (SELECT min(b.scheduled_for) FROM runs b
                               WHERE b.job_id = runs.job_id AND b.finished_at IS NULL AND b.state = 'buffered')
          AND NOT EXISTS (SELECT 1 FROM runs a WHERE a.job_id = runs.job_id AND a.finished_at IS NULL
                          AND a.state IN ({AHEAD_OF_THE_BUFFER}))
        RETURNING *
    """
    # With when its first attempt started (its handler was entered), for the start lag `runs list` shows.
    LIST_RUNS = """
        SELECT runs.*, (SELECT a.started_at FROM attempts a WHERE a.run_id = runs.run_id
                        AND a.started_at IS NOT NULL ORDER BY a.attempt LIMIT 1) AS first_started_at
        FROM runs
        WHERE tenant = $1 AND ($2::text IS NULL OR job_id = $2)
          AND (cardinality($3::text[]) = 0 OR state = ANY($3::text[]))
          AND ($4::timestamptz IS NULL OR (scheduled_for, run_id) < ($4, $5))
          AND ($6::timestamptz IS NULL OR scheduled_for >= $6)
          AND ($7::timestamptz IS NULL OR scheduled_for < $7)
          AND ($9::text IS NULL OR job_type = $9)
          AND ($10::text IS NULL OR backfill_id = $10)
        ORDER BY scheduled_for DESC, run_id DESC LIMIT $8
    """
    # How many of a tenant's runs a filter takes (a bulk action's dry run).
    COUNT_RUNS = """
        SELECT count(*) FROM runs
        WHERE tenant = $1 AND ($2::text IS NULL OR job_id = $2) AND ($3::text IS NULL OR job_type = $3)
          AND state = ANY($4::text[])
          AND ($5::timestamptz IS NULL OR scheduled_for >= $5)
          AND ($6::timestamptz IS NULL OR scheduled_for < $6)
          AND ($7::text IS NULL OR backfill_id = $7)
    """
    LIST_ATTEMPTS = "SELECT * FROM attempts WHERE run_id = $1 ORDER BY attempt"
    # What a handler returned: shown with the run, and a workflow step's input to the steps after it
    # (only results that carry one).
    SET_OUTPUT = "UPDATE runs SET output = $2 WHERE run_id = $1"
    # Late reports (fastlane.storage.late_reports): which attempts of these runs have rows, the rows
    # made from the reports, and what they change on their runs and on the runs' other attempts.
    ATTEMPT_KEYS = "SELECT run_id, lease_token FROM attempts WHERE run_id = ANY($1::text[])"
    INSERT_LATE_ATTEMPT = """
        INSERT INTO attempts (run_id, attempt, lease_token, worker_id, node_id, outcome, dispatched_at, started_at,
                              finished_at, error_code, error_message, error_traceback, reported_late)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, true)
    """
    COUNT_LATE_ATTEMPT = """
        UPDATE runs SET attempts = greatest(attempts, $1), first_attempt_at = coalesce(first_attempt_at, $2),
                        updated_at = clock_timestamp()
        WHERE run_id = $3
    """
    MARK_REDELIVERIES = """
        UPDATE attempts SET redelivery = true
        WHERE run_id = $1 AND attempt <> $2 AND NOT reported_late AND (finished_at IS NULL OR finished_at >= $3)
    """

    # -- shards ------------------------------------------------------------------------------------

    # A shard token acquired on timeline t is at least (t - 1) << 32: tokens handed out after a
    # promotion never equal one handed out before it, even when the standby lost the commit of
    # that older token's bump (see postgres.server_identity). Free and expired shards whose rows
    # nobody has locked: nodes acquiring at once split them instead of queueing (SKIP LOCKED).
    ACQUIRE_SHARDS = f"""
        UPDATE shards SET owner = $1,
                          token = {TOKEN_FLOOR},
                          lease_expires_at = clock_timestamp() + $2 * interval '1 microsecond'
        WHERE shard_id IN (
            SELECT shard_id FROM shards
            WHERE (owner = '' OR lease_expires_at IS NULL OR lease_expires_at <= clock_timestamp())
              AND ($4::int[] IS NULL OR shard_id = ANY($4::int[]))
            ORDER BY shard_id LIMIT $3
            FOR UPDATE SKIP LOCKED
        )
        RETURNING *
    """
    # Expired shards, waiting (up to lock_timeout) for a row still locked, typically by the FENCE of
    # a transaction its old owner opened before its lease ran out. Rows are locked in shard order; a
    # row taken meanwhile by another node fails the recheck of the lease after the wait and is
    # left. Only where rows are locked (not Capabilities.one_writer).
    ACQUIRE_EXPIRED_SHARDS = f"""
        UPDATE shards SET owner = $1,
                          token = {TOKEN_FLOOR},
                          lease_expires_at = clock_timestamp() + $2 * interval '1 microsecond'
        WHERE shard_id IN (
            SELECT shard_id FROM shards
            WHERE owner <> '' AND lease_expires_at <= clock_timestamp()
              AND ($4::int[] IS NULL OR shard_id = ANY($4::int[]))
            ORDER BY shard_id LIMIT $3
            FOR UPDATE
        )
        RETURNING *
    """
    # Batch(shard_id, token), owner, TTL in microseconds.
    RENEW_SHARDS = """
        UPDATE shards s SET lease_expires_at = clock_timestamp() + $4 * interval '1 microsecond'
        FROM unnest($1::int[], $2::bigint[]) AS l(shard_id, token)
        WHERE s.shard_id = l.shard_id AND s.token = l.token AND s.owner = $3
          AND s.lease_expires_at > clock_timestamp()
        RETURNING s.*
    """
    # Batch(shard_id, token), owner.
    RELEASE_SHARDS = """
        UPDATE shards s SET owner = '', lease_expires_at = NULL
        FROM unnest($1::int[], $2::bigint[]) AS l(shard_id, token)
        WHERE s.shard_id = l.shard_id AND s.token = l.token AND s.owner = $3
    """
    LIST_SHARDS = "SELECT * FROM shards ORDER BY shard_id"

    # -- membership --------------------------------------------------------------------------------

    # Returns whether the node joined (inserted) rather than beat again (updated).
    HEARTBEAT_NODE = """
        INSERT INTO nodes (node_id, address, started_at, heartbeat_at, clock_offset_ms, shards_owned,
                           workers, eligible, note)
        VALUES ($1, $2, clock_timestamp(), clock_timestamp(), $3, $4, $5, $6, $7)
        ON CONFLICT (node_id) DO UPDATE
        SET address = excluded.address, heartbeat_at = excluded.heartbeat_at,
            clock_offset_ms = excluded.clock_offset_ms, shards_owned = excluded.shards_owned,
            workers = excluded.workers, eligible = excluded.eligible, note = excluded.note
        RETURNING xmax = 0
    """
    LIVE_NODES = (
        "SELECT * FROM nodes WHERE heartbeat_at > clock_timestamp() - $1 * interval '1 microsecond' "
        "ORDER BY node_id"
    )
    REMOVE_NODE = "DELETE FROM nodes WHERE node_id = $1"
    LIST_NODES = "SELECT * FROM nodes ORDER BY node_id"

    # -- API tokens --------------------------------------------------------------------------------

    # created_at is the database clock's; a new token starts unrevoked and unused, whatever its record says.
    INSERT_TOKEN = """
        INSERT INTO api_tokens (token_id, tenant, role, name, secret_hash, created_at, expires_at)
        VALUES ($1, $2, $3, $4, $5, clock_timestamp(), $6)
        ON CONFLICT (token_id) DO NOTHING
        RETURNING *
    """
    GET_TOKEN = "SELECT * FROM api_tokens WHERE token_id = $1"
    LIST_TOKENS = "SELECT * FROM api_tokens WHERE ($1::text IS NULL OR tenant = $1) ORDER BY created_at, token_id"
    # coalesce: revoking again keeps the first time. A token of another tenant is left alone and
    # returns no row, exactly as an unknown one does.
    REVOKE_TOKEN = """
        UPDATE api_tokens SET revoked_at = coalesce(revoked_at, clock_timestamp())
        WHERE token_id = $1 AND ($2::text IS NULL OR tenant = $2)
        RETURNING *
    """
    # Batch(token_id, used_at). Only rows whose time moves forward are written: a node reporting
    # late never moves it back.
    TOUCH_TOKENS = """
        UPDATE api_tokens t SET last_used_at = u.used_at
        FROM unnest($1::text[], $2::timestamptz[]) AS u(token_id, used_at)
        WHERE t.token_id = u.token_id AND (t.last_used_at IS NULL OR t.last_used_at < u.used_at)
    """

    # -- the audit trail ---------------------------------------------------------------------------

    # Batch(tenant, action, target_kind, target_id, job_id, token_id, actor, detail), in its order
    # (WITH ORDINALITY), so event ids follow it; at is the database clock's.
    INSERT_AUDIT_EVENTS = """
        INSERT INTO audit_events (tenant, at, action, target_kind, target_id, job_id, token_id, actor, detail)
        SELECT e.tenant, clock_timestamp(), e.action, e.target_kind, e.target_id, e.job_id, e.token_id, e.actor,
               e.detail
        FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[])
             WITH ORDINALITY AS e(tenant, action, target_kind, target_id, job_id, token_id, actor, detail, position)
        ORDER BY e.position
    """
    # A job's history: its own events and its runs' (they carry its id), newest first.
    LIST_JOB_AUDIT = """
        SELECT * FROM audit_events WHERE tenant = $1 AND job_id = $2
        ORDER BY at DESC, event_id DESC LIMIT $3
    """
    LIST_RUN_AUDIT = """
        SELECT * FROM audit_events WHERE tenant = $1 AND target_kind = 'run' AND target_id = $2
        ORDER BY at DESC, event_id DESC LIMIT $3
    """

    # -- tenant quotas -----------------------------------------------------------------------------

    COUNT_TENANT_JOBS = "SELECT count(*) FROM jobs WHERE tenant = $1"  # jobs_by_tenant
    # runs_unfinished_by_tenant: a tenant's runs not ended.
    COUNT_WAITING_RUNS = """
        SELECT count(*) FROM runs
        WHERE tenant = $1 AND finished_at IS NULL AND state = 'scheduled' AND available_at <= clock_timestamp()
    """
    LIST_QUOTA_OVERRIDES = "SELECT tenant, max_jobs, job_creations_per_second, max_waiting_runs FROM tenant_quotas"
    SET_QUOTA_OVERRIDE = """
        INSERT INTO tenant_quotas (tenant, max_jobs, job_creations_per_second, max_waiting_runs, updated_at)
        VALUES ($1, $2, $3, $4, clock_timestamp())
        ON CONFLICT (tenant) DO UPDATE SET max_jobs = excluded.max_jobs,
            job_creations_per_second = excluded.job_creations_per_second,
            max_waiting_runs = excluded.max_waiting_runs, updated_at = excluded.updated_at
    """
    DELETE_QUOTA_OVERRIDE = "DELETE FROM tenant_quotas WHERE tenant = $1"


def statement_names() -> list[str]:
    return [name for name in vars(Statements) if name.isupper()]


def compiled(dialect: type[Statements], translate: Callable[[str], str]) -> Statements:
    """An instance of ``dialect`` (a subclass of :class:`Statements`, or it) whose every
    statement is in the dialect's SQL: its own where it writes one, else the shared one translated."""
    own = _own(dialect)
    statements = dialect()
    for name in statement_names():
        if name not in own:
            setattr(statements, name, translate(getattr(Statements, name)))
    return statements


def _own(dialect: type[Statements]) -> set[str]:
    names: set[str] = set()
    for cls in dialect.__mro__:
        if cls is Statements:
            break
        names.update(name for name in vars(cls) if name.isupper())
    return names
