-- fastlane schema, version 13: a run's dispatch, start and lease renewals write no index entry.

-- The indexes that find runs not yet ended (waiting, in flight, buffered behind an overlapping
-- run) were partial on `state`. A column in an index's predicate counts as indexed, so every
-- state change (dispatched, then running) was an update that is never heap-only: a new entry in
-- every index of runs, five or six per step, and the same again when it ended. They are now
-- partial on `finished_at IS NULL` instead, which a run keeps from its insert until it ends (a
-- retry sets it back to NULL), and none of them keys on the lease: dispatching a run, its start
-- and the extension of its lease change no indexed column, so each can be heap-only, given room
-- on the page for the new row version (fillfactor 70: a run is rewritten about twice in place).
-- The queries state `finished_at IS NULL` themselves, for the planner to use these indexes, and
-- filter on `state` as before; the in-flight runs a lease scan reads are few beside the rest.
--
--   runs_unfinished_by_shard: runs waiting or in flight, per shard (the lane's pending scan after
--     a takeover, expired leases);
--   runs_unfinished_by_job: a job's runs not ended (overlap policies, buffered runs released,
--     the runs of a deleted job cancelled);
--   runs_unfinished_by_tenant: a tenant's waiting runs (the max_waiting_runs quota);
--   runs_unfinished_by_key: runs with a concurrency key (their limit counts the ones in flight).

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
ALTER TABLE runs SET (fillfactor = 70);
-- An attempt's result changes no indexed column either, but at thousands of runs a second its
-- row sits on a page filled by the same batch insert, with no room left for the new version, so
-- almost none of those updates could be heap-only (at a tenth of that load most are: version 11).
-- The same room makes them so.
ALTER TABLE attempts SET (fillfactor = 70);
