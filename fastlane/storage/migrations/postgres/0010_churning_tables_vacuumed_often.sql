-- fastlane schema, version 10: the tables that churn are vacuumed and analysed often.

-- Every run inserts a row into runs and attempts and updates each, and advances its job: at
-- 1,000 runs a second these tables gain thousands of dead rows a second. PostgreSQL's defaults
-- vacuum a table once a fifth of its rows are dead and analyse it once a tenth have changed: on a
-- table of ten million runs that is two million dead index entries that every scan of a partial
-- index (runs waiting, runs leased) steps over first, and statistics from when the table was far
-- smaller, which the plans of the node's prepared statements keep. A fresh database is the same
-- in small: until the tables are first analysed, plans made when they were empty scan them whole,
-- and scans of a partial index step over every dead entry. A fiftieth keeps the work per vacuum
-- small and the statistics current. (How often the autovacuum launcher looks,
-- autovacuum_naptime, is the server's: see deploy/README.md.)
ALTER TABLE runs SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
                      autovacuum_vacuum_insert_scale_factor = 0.02);
ALTER TABLE attempts SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
                          autovacuum_vacuum_insert_scale_factor = 0.02);
ALTER TABLE jobs SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
