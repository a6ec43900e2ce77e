-- fastlane schema, version 13: a run's dispatch, start and lease renewals write no index entry
-- (as on PostgreSQL).

-- The indexes that find runs not yet ended were partial on `state`, and SQLite rewrites the
-- indexes whose columns or predicate an update changes: every state change (dispatched, then
-- running) and every lease renewal wrote to several. They are now partial on `finished_at IS
-- NULL`, which a run keeps from its insert until it ends (a retry sets it back to NULL), and none
-- keys on the lease. The queries state `finished_at IS NULL` themselves, for the planner to use
-- them, and filter on `state` as before. See the PostgreSQL migration for what each one serves.

-- Any ended row without an end time (none is written so; kept from leaving the new indexes).
UPDATE runs SET finished_at = updated_at
WHERE finished_at IS NULL AND state NOT IN ('buffered', 'scheduled', 'dispatched', 'running');

DROP INDEX runs_pending;
DROP INDEX runs_leased;
DROP INDEX runs_active_by_job;
DROP INDEX runs_waiting_by_tenant;
DROP INDEX runs_active_by_key;
CREATE INDEX runs_unfinished_by_shard ON runs (shard_id, available_at) WHERE finished_at IS NULL;
CREATE INDEX runs_unfinished_by_job ON runs (job_id, scheduled_for) WHERE finished_at IS NULL;
CREATE INDEX runs_unfinished_by_tenant ON runs (tenant, available_at) WHERE finished_at IS NULL;
CREATE INDEX runs_unfinished_by_key ON runs (tenant, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND finished_at IS NULL;
