-- fastlane schema, version 14: workflows (versioned DAGs of steps whose runs wait for other runs).

-- One row per version of a workflow; job_id is the same for every version (its schedule's job,
-- and the job of its runs).
CREATE TABLE workflows (
    workflow_id text PRIMARY KEY,
    tenant      text NOT NULL,
    name        text NOT NULL,
    version     integer NOT NULL,
    job_id      text NOT NULL,
    definition  text NOT NULL,
    created_at  timestamptz NOT NULL,
    UNIQUE (tenant, name, version)
);
CREATE INDEX workflows_by_job ON workflows (job_id, version DESC);

-- A workflow run; its id is the id of the run that started it (a run of the workflow's job).
-- settled: steps that ended without runs of their own (skipped, cancelled before they were made).
-- ended_seen: how many of its step runs had ended when it was last advanced; the sweep that
-- catches an advance a crashed node never made looks for runs whose count differs.
CREATE TABLE workflow_runs (
    workflow_run_id text PRIMARY KEY,
    tenant          text NOT NULL,
    workflow_id     text NOT NULL,
    job_id          text NOT NULL,
    shard_id        integer NOT NULL,
    state           text NOT NULL,
    input           bytea NOT NULL,
    settled         text NOT NULL DEFAULT '{}',
    ended_seen      integer NOT NULL DEFAULT 0,
    error           text,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    finished_at     timestamptz
);
CREATE INDEX workflow_runs_by_job ON workflow_runs (tenant, job_id, created_at DESC, workflow_run_id);
CREATE INDEX workflow_runs_running ON workflow_runs (shard_id) WHERE state = 'running';

-- A step run is an ordinary run that knows its workflow run, step and item (0 unless fanned out),
-- and keeps the small JSON output its handler returned, for the steps after it.
ALTER TABLE runs ADD COLUMN workflow_run_id text;
ALTER TABLE runs ADD COLUMN step text;
ALTER TABLE runs ADD COLUMN item integer;
ALTER TABLE runs ADD COLUMN output bytea;
-- Exactly once per step: whichever node advances a workflow run, and however often.
CREATE UNIQUE INDEX runs_one_per_step ON runs (workflow_run_id, step, item) WHERE workflow_run_id IS NOT NULL;
