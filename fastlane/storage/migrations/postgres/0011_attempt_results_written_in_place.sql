-- fastlane schema, version 11: an attempt's result is written in place.

-- Every attempt is inserted when its run is dispatched and updated once, with its outcome. The
-- update changes no indexed column, so PostgreSQL may write it as a heap-only tuple (a new version
-- in the same page, no index entry), but only if that page has room: inserts fill pages full, so
-- most results were written elsewhere, with an entry in every index of the table. Pages of
-- attempts now keep 30 % free for them (fillfactor 70, new pages; old ones as they are rewritten).
-- attempts_by_token (run_id, lease_token) only duplicated the primary key (run_id, attempt): the
-- lookups by lease token (a result, a heartbeat's start) find a run's few attempts through the
-- primary key's run_id and check the token, and every attempt written paid for the second index.
DROP INDEX IF EXISTS attempts_by_token;
ALTER TABLE attempts SET (fillfactor = 70);
