-- fastlane schema, version 1 (SQLite: instants are integer microseconds since the Unix epoch, UTC).

CREATE TABLE fastlane_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

-- One row per shard. token only ever grows: each acquisition increments it, so a write fenced on
-- (owner, token) from a node that lost the lease can never succeed again.
CREATE TABLE shards (
    shard_id         integer PRIMARY KEY,
    owner            text NOT NULL DEFAULT '',
    token            integer NOT NULL DEFAULT 0,
    lease_expires_at integer
);

CREATE TABLE jobs (
    job_id       text PRIMARY KEY,
    tenant       text NOT NULL,
    name         text NOT NULL,
    job_type     text NOT NULL,
    shard_id     integer NOT NULL,
    state        text NOT NULL,
    next_fire_at integer,
    priority     integer NOT NULL DEFAULT 0,
    payload      blob NOT NULL,
    policies     text NOT NULL,
    version      integer NOT NULL DEFAULT 1,
    created_at   integer NOT NULL,
    updated_at   integer NOT NULL,
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
    scheduled_for    integer NOT NULL,
    available_at     integer NOT NULL,
    state            text NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    payload          blob NOT NULL,
    priority         integer NOT NULL DEFAULT 0,
    manual           integer NOT NULL DEFAULT 0,
    delivery         text NOT NULL,
    lease_ttl_ms     integer NOT NULL,
    timeout_ms       integer,
    cancel_requested integer NOT NULL DEFAULT 0,
    retry            text NOT NULL,
    lease_token      integer,
    lease_expires_at integer,
    worker_id        text,
    progress         real NOT NULL DEFAULT 0,
    checkpoint       blob,
    last_error       text,
    first_attempt_at integer,
    created_at       integer NOT NULL,
    updated_at       integer NOT NULL,
    finished_at      integer
);
-- The last line of defence against double firing: one run per occurrence, whoever writes it.
CREATE UNIQUE INDEX runs_one_per_occurrence ON runs (job_id, scheduled_for) WHERE manual = 0;
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
    lease_token   integer NOT NULL,
    worker_id     text NOT NULL,
    node_id       text NOT NULL,
    outcome       text NOT NULL,
    dispatched_at integer NOT NULL,
    started_at    integer,
    finished_at   integer,
    error_code    text,
    error_message text,
    PRIMARY KEY (run_id, attempt)
);
CREATE INDEX attempts_by_token ON attempts (run_id, lease_token);
