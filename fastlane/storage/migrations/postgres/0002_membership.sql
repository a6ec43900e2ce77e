-- fastlane schema, version 2: cluster membership.

-- One row per live node, refreshed by its heartbeat; judged by the database clock like leases.
CREATE TABLE nodes (
    node_id         text PRIMARY KEY,
    address         text NOT NULL,
    started_at      timestamptz NOT NULL,
    heartbeat_at    timestamptz NOT NULL,
    clock_offset_ms double precision NOT NULL DEFAULT 0,
    shards_owned    integer NOT NULL DEFAULT 0,
    workers         integer NOT NULL DEFAULT 0,
    eligible        boolean NOT NULL DEFAULT true,  -- false while its clock is off or it drains
    note            text NOT NULL DEFAULT ''
);
