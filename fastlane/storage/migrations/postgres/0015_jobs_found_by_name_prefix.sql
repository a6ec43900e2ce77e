-- fastlane schema, version 15: jobs are found by the start of their name (the console's search).
-- The unique (tenant, name) index is in the database's collation, in which a locale may order
-- "a-b" after "ab": the names that start with a prefix are then not one range of it. This index
-- orders names by their bytes, so a prefix is one range scan however many jobs the tenant has.
CREATE INDEX IF NOT EXISTS jobs_by_name_bytes ON jobs (tenant, name COLLATE "C");
