-- fastlane schema, version 5: the audit trail, who changed which job or run and when.

-- One row per change made through the API (fastlane/domain/audit.py). No foreign key: the events
-- of a job outlive it, as its runs do. event_id follows the order events are recorded in; at
-- comes from the database clock. token_id is NULL and actor '' when the node ran without
-- authentication.
CREATE TABLE audit_events (
    event_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant      text NOT NULL,
    at          timestamptz NOT NULL,
    action      text NOT NULL,
    target_kind text NOT NULL,
    target_id   text NOT NULL,
    job_id      text NOT NULL,
    token_id    text,
    actor       text NOT NULL,
    detail      text NOT NULL
);
-- list_audit of a run (LIST_RUN_AUDIT), in its order: newest first.
CREATE INDEX audit_by_target ON audit_events (tenant, target_kind, target_id, at DESC, event_id DESC);
-- list_audit of a job (LIST_JOB_AUDIT): its own events and its runs', newest first.
CREATE INDEX audit_by_job ON audit_events (tenant, job_id, at DESC, event_id DESC);
