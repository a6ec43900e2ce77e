-- fastlane schema, version 10: on PostgreSQL, the tables that churn are vacuumed and analysed
-- often. SQLite has no autovacuum of dead rows to tune (its pages are reused as rows go), so there
-- is nothing to do here; the version is kept so both stores count the same.
SELECT 1;
