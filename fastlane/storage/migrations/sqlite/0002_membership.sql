-- fastlane schema, version 2: cluster membership.

-- One row per live node, refreshed by its heartbeat; judged by the database clock like leases.
CREATE TABLE nodes (
    node_id         text PRIMARY KEY,
    address         text NOT NULL,
    started_at      integer NOT NULL,
    heartbeat_at    integer NOT NULL,
    clock_offset_ms real NOT NULL DEFAULT 0,
    shards_owned    integer NOT NULL DEFAULT 0,
    workers         integer NOT NULL DEFAULT 0,
    eligible        integer NOT NULL DEFAULT 1,  -- false while its clock is off or it drains
    note            text NOT NULL DEFAULT ''
);
