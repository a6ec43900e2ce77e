"""The SQL of :mod:`fastlane.storage.workflows`, written once for both backends.

PostgreSQL's dialect, with three placeholders each backend fills in: ``{NOW}`` (the database
clock), ``{LOCK}`` (``FOR UPDATE`` or nothing) and ``{IN}`` (membership in a list parameter).
"""

from __future__ import annotations

from fastlane.domain.lifecycle import FINAL, RERUNNABLE, WAITING, WITH_A_WORKER, sql_list
from fastlane.domain.models import RunState

# Every state but those a step may be run again from, as the NOT IN list of RESCHEDULE.
_NOT_RERUNNABLE = sql_list(frozenset(RunState) - RERUNNABLE)


INSERT_WORKFLOW = """
    INSERT INTO workflows (workflow_id, tenant, name, version, job_id, definition, created_at)
    VALUES ($1, $2, $3, $4, $5, $6, {NOW}) RETURNING *
"""
LATEST_WORKFLOW = "SELECT * FROM workflows WHERE tenant = $1 AND name = $2 ORDER BY version DESC LIMIT 1"
WORKFLOW_VERSION = "SELECT * FROM workflows WHERE tenant = $1 AND name = $2 AND version = $3"
WORKFLOW_BY_ID = "SELECT * FROM workflows WHERE workflow_id = $1"
LATEST_OF_JOB = "SELECT * FROM workflows WHERE job_id = $1 ORDER BY version DESC LIMIT 1"
LIST_WORKFLOWS = """
    SELECT w.* FROM workflows w
    WHERE w.tenant = $1 AND w.name > $2
      AND w.version = (SELECT max(v.version) FROM workflows v WHERE v.tenant = w.tenant AND v.name = w.name)
    ORDER BY w.name LIMIT $3
"""
START_TRIGGER = """
    UPDATE runs SET state = 'running', attempts = attempts + 1, first_attempt_at = coalesce(first_attempt_at, {NOW}),
                    updated_at = {NOW}
    WHERE run_id = $1 AND state = 'scheduled' RETURNING *
"""
INSERT_TRIGGER = """
    INSERT INTO runs (run_id, job_id, tenant, job_type, shard_id, scheduled_for, available_at, state, attempts,
                      payload, priority, manual, delivery, lease_ttl_ms, retry, first_attempt_at, created_at,
                      updated_at)
    VALUES ($1, $2, $3, $4, $5, {NOW}, {NOW}, 'running', 1, $6, 0, true, 'at_least_once', 30000, $7, {NOW},
            {NOW}, {NOW})
    RETURNING *
"""
END_TRIGGER = """
    UPDATE runs SET state = $2, finished_at = {NOW}, updated_at = {NOW}, last_error = $3, cancel_requested = false
    WHERE run_id = $1 AND state = 'running' RETURNING *
"""
REOPEN_TRIGGER = """
    UPDATE runs SET state = 'running', finished_at = NULL, updated_at = {NOW}, last_error = NULL
    WHERE run_id = $1 RETURNING *
"""
INSERT_WORKFLOW_RUN = """
    INSERT INTO workflow_runs (workflow_run_id, tenant, workflow_id, job_id, shard_id, state, input, created_at,
                               updated_at)
    VALUES ($1, $2, $3, $4, $5, 'running', $6, {NOW}, {NOW})
    ON CONFLICT DO NOTHING RETURNING *
"""
WORKFLOW_RUN_COLUMNS = """
    SELECT r.*, w.name AS workflow_name, w.version FROM workflow_runs r JOIN workflows w ON w.workflow_id = r.workflow_id
"""
LOCK_WORKFLOW_RUN = WORKFLOW_RUN_COLUMNS + " WHERE r.workflow_run_id = $1 {LOCK}"
GET_WORKFLOW_RUN = WORKFLOW_RUN_COLUMNS + " WHERE r.workflow_run_id = $1 AND r.tenant = $2"
WORKFLOW_RUNS_BY_ID_RANGE = WORKFLOW_RUN_COLUMNS + """
    WHERE r.workflow_run_id >= $1 AND r.workflow_run_id < $2 AND r.tenant = $3 ORDER BY r.workflow_run_id LIMIT $4
"""
LIST_WORKFLOW_RUNS = WORKFLOW_RUN_COLUMNS + """
    WHERE r.tenant = $1 AND r.job_id = $2
      AND (CAST($3 AS text) IS NULL OR r.created_at < $4 OR (r.created_at = $4 AND r.workflow_run_id < $3))
    ORDER BY r.created_at DESC, r.workflow_run_id DESC LIMIT $5
"""
UPDATE_WORKFLOW_RUN = """
    UPDATE workflow_runs SET state = $2, settled = $3, ended_seen = $4, error = $5, updated_at = {NOW},
                             finished_at = CASE WHEN $2 = 'running' THEN NULL ELSE {NOW} END
    WHERE workflow_run_id = $1
"""
STEP_RUNS = """
    SELECT run_id, step, item, state, output, last_error FROM runs WHERE workflow_run_id = $1 ORDER BY step, item
"""
INSERT_STEP_RUN = """
    INSERT INTO runs (run_id, job_id, tenant, job_type, shard_id, scheduled_for, available_at, state, payload,
                      priority, manual, delivery, lease_ttl_ms, timeout_ms, retry, last_error, created_at, updated_at,
                      finished_at, workflow_run_id, step, item)
    VALUES ($1, $2, $3, $4, $5, {NOW}, {NOW}, $6, $7, $8, true, 'at_least_once', $9, $10, $11, $12, {NOW}, {NOW},
            CASE WHEN $6 = 'scheduled' THEN NULL ELSE {NOW} END, $13, $14, $15)
    ON CONFLICT DO NOTHING RETURNING *
"""
CANCEL_QUEUED = f"""
    UPDATE runs SET state = 'cancelled', finished_at = {{NOW}}, updated_at = {{NOW}}, last_error = $2
    WHERE run_id = $1 AND state IN ({sql_list(WAITING)}) RETURNING *
"""
REQUEST_CANCEL = f"""
    UPDATE runs SET cancel_requested = true, updated_at = {{NOW}}
    WHERE run_id = $1 AND state IN ({sql_list(WITH_A_WORKER)}) RETURNING *
"""
RESCHEDULE = f"""
    UPDATE runs SET state = 'scheduled', available_at = {{NOW}}, finished_at = NULL, cancel_requested = false,
                    last_error = NULL, updated_at = {{NOW}}
    WHERE run_id = $1 AND state NOT IN ({_NOT_RERUNNABLE}) RETURNING *
"""
TO_ADVANCE = f"""
    SELECT w.workflow_run_id FROM workflow_runs w
    WHERE w.state = 'running' AND w.shard_id {{IN}}
      AND w.ended_seen <> (SELECT count(*) FROM runs r WHERE r.workflow_run_id = w.workflow_run_id
                           AND r.state IN ({sql_list(FINAL)}))
    LIMIT $2
"""
