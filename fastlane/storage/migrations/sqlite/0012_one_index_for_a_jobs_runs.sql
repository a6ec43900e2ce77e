-- fastlane schema, version 12: one index of runs by job instead of two (as on PostgreSQL).

-- runs_one_per_occurrence (job_id, scheduled_for) WHERE manual = 0 kept each occurrence of a job
-- to one run, and runs_by_job (job_id, scheduled_for DESC, run_id) listed a job's runs: two
-- B-trees over nearly the same keys. SQLite updates only the indexes whose columns an update
-- changes, so here the saving is an entry per run inserted and per run trimmed by the history
-- retention. One unique index does both jobs. Its third column is empty for a scheduled
-- occurrence, so those stay one per (job, instant), and is the run id for a manual run (RunNow),
-- which may share an instant with anything. The existing rows satisfy it: the old unique index
-- held for scheduled runs, run ids are unique and never empty.
CREATE UNIQUE INDEX runs_of_job ON runs (job_id, scheduled_for, (CASE WHEN manual THEN run_id ELSE '' END));
DROP INDEX runs_one_per_occurrence;
DROP INDEX runs_by_job;
