-- fastlane schema, version 12: one index of runs by job instead of two.

-- runs_one_per_occurrence (job_id, scheduled_for) WHERE NOT manual kept each occurrence of a job
-- to one run, and runs_by_job (job_id, scheduled_for DESC, run_id) listed a job's runs: two
-- B-trees over nearly the same keys, each given an entry by every insert and every update that
-- moves a run's state (which, being in partial index predicates, is never heap-only): about three
-- entries of each per run. One unique index does both jobs. Its third column is empty for a
-- scheduled occurrence, so those stay one per (job, instant), and is the run id for a manual run
-- (RunNow), which may share an instant with anything. Listing a job's runs newest first reads it
-- backwards; the few manual runs that share an instant are put in run id order by an incremental
-- sort. The existing rows satisfy it: the old unique index held for scheduled runs, run ids are
-- unique and never empty. (Built inside the migration's transaction: on a large table this holds
-- writes to runs until it is built, as every schema change does.)
CREATE UNIQUE INDEX runs_of_job ON runs (job_id, scheduled_for, (CASE WHEN manual THEN run_id ELSE '' END));
DROP INDEX runs_one_per_occurrence;
DROP INDEX runs_by_job;
