-- fastlane schema, version 11: attempts keep one index.

-- attempts_by_token (run_id, lease_token) only duplicated the primary key (run_id, attempt): the
-- lookups by lease token (a result, a heartbeat's start) find a run's few attempts through the
-- primary key's run_id and check the token, and every attempt inserted paid for a second index
-- entry. (A result's update changes no indexed column, and at a moderate load nearly all of them
-- are heap-only already, the newest page having room for them, so no fillfactor is set here: it
-- would cost a third more pages for the last few percent.)
DROP INDEX IF EXISTS attempts_by_token;
