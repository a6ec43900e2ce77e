-- fastlane schema, version 15: jobs are found by the start of their name (the console's search).
-- Nothing to build on SQLite: text compares bytewise there, so the unique (tenant, name) index
-- already holds a prefix's names as one range. (PostgreSQL adds an index in byte order.)
SELECT 1;
