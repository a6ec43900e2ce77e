-- fastlane schema, version 6: per-tenant quota overrides, and the index the waiting-runs quota counts with.

-- One row per tenant whose quotas differ from the nodes' defaults; a NULL limit is the default.
CREATE TABLE tenant_quotas (
    tenant                   text PRIMARY KEY,
    max_jobs                 bigint,
    job_creations_per_second double precision,
    max_waiting_runs         bigint,
    updated_at               timestamptz NOT NULL
);
-- The waiting-runs quota (COUNT_WAITING_RUNS): due runs of one tenant that no worker has taken.
-- Partial, so it holds only runs in state 'scheduled', a small set next to the run history.
CREATE INDEX runs_waiting_by_tenant ON runs (tenant, available_at) WHERE state = 'scheduled';
