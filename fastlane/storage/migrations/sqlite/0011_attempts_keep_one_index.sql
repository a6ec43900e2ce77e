-- fastlane schema, version 11: attempts keep one index. attempts_by_token (run_id, lease_token)
-- only duplicated the primary key (run_id, attempt): the lookups by lease token find a run's few
-- attempts through the primary key's run_id and check the token, and every attempt written paid
-- for the second index.
DROP INDEX IF EXISTS attempts_by_token;
