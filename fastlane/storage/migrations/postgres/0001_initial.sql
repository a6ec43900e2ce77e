-- fastlane schema, version 1 (PostgreSQL).

CREATE TABLE fastlane_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

-- One row per shard. token only ever grows: each acquisition increments it, so a write fenced on
-- (owner, token) from a node that lost the lease can never succeed again.
CREATE TABLE shards (
    shard_id         integer PRIMARY KEY,
    owner            text NOT NULL DEFAULT '',
    token            bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz
);

CREATE TABLE jobs (
    job_id       text PRIMARY KEY,
    tenant       text NOT NULL,
    name         text NOT NULL,
    job_type     text NOT NULL,
    shard_id     integer NOT NULL,
    state        text NOT NULL,
    next_fire_at timestamptz,
    priority     integer NOT NULL DEFAULT 0,
    payload      bytea NOT NULL,
    policies     jsonb NOT NULL,
    version      integer NOT NULL DEFAULT 1,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    UNIQUE (tenant, name)
);
-- The due set: what the window loader reads, per shard, in fire-time order.
CREATE INDEX jobs_due ON jobs (shard_id, next_fire_at) WHERE state = 'active';
CREATE INDEX jobs_by_tenant ON jobs (tenant, job_id);

CREATE TABLE runs (
    run_id           text PRIMARY KEY,
    job_id           text NOT NULL,
    tenant           text NOT NULL,
    job_type         text NOT NULL,
    shard_id         integer NOT NULL,
    scheduled_for    timestamptz NOT NULL,
    available_at     timestamptz NOT NULL,
    state            text NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    payload          bytea NOT NULL,
    priority         integer NOT NULL DEFAULT 0,
    manual           boolean NOT NULL DEFAULT false,
    delivery         text NOT NULL,
    lease_ttl_ms     bigint NOT NULL,
    timeout_ms       bigint,
    cancel_requested boolean NOT NULL DEFAULT false,
    retry            jsonb NOT NULL,
    lease_token      bigint,
    lease_expires_at timestamptz,
    worker_id        text,
    progress         real NOT NULL DEFAULT 0,
    checkpoint       bytea,
    last_error       text,
    first_attempt_at timestamptz,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz
);
-- The last line of defence against double firing: one run per occurrence, whoever writes it.
CREATE UNIQUE INDEX runs_one_per_occurrence ON runs (job_id, scheduled_for) WHERE NOT manual;
CREATE INDEX runs_pending ON runs (shard_id, available_at) WHERE state = 'scheduled';
CREATE INDEX runs_leased ON runs (shard_id, lease_expires_at) WHERE state IN ('dispatched', 'running');
-- Active runs of a job, for overlap policies and the release of buffered runs.
CREATE INDEX runs_active_by_job ON runs (job_id, scheduled_for)
    WHERE state IN ('buffered', 'scheduled', 'dispatched', 'running');
CREATE INDEX runs_by_job ON runs (job_id, scheduled_for DESC, run_id);
CREATE INDEX runs_by_tenant ON runs (tenant, scheduled_for DESC, run_id);
-- Retention deletes finished history oldest first.
CREATE INDEX runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE attempts (
    run_id        text NOT NULL,
    attempt       integer NOT NULL,
    lease_token   bigint NOT NULL,
    worker_id     text NOT NULL,
    node_id       text NOT NULL,
    outcome       text NOT NULL,
    dispatched_at timestamptz NOT NULL,
    started_at    timestamptz,
    finished_at   timestamptz,
    error_code    text,
    error_message text,
    PRIMARY KEY (run_id, attempt)
);
CREATE INDEX attempts_by_token ON attempts (run_id, lease_token);
