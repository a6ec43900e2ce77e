-- fastlane schema, version 8: concurrency keys.

-- A run carries its job's key and limit (copied when the run is made, as its payload is), so the
-- dispatch that claims a place under the cap reads them from the run itself.
ALTER TABLE runs ADD COLUMN concurrency_key text;
ALTER TABLE runs ADD COLUMN concurrency_limit integer;
-- Serves the count of a key's active runs that every capped dispatch makes (COUNT_ACTIVE_BY_KEY).
CREATE INDEX runs_active_by_key ON runs (tenant, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND state IN ('dispatched', 'running');
