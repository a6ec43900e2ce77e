-- fastlane schema, version 17: a run written by a backfill (`fastlane jobs backfill`) names it, so
-- the backfill's progress is its runs' and cancelling it cancels them; the index finds them.
ALTER TABLE runs ADD COLUMN backfill_id text;
CREATE INDEX runs_of_backfill ON runs (tenant, backfill_id) WHERE backfill_id IS NOT NULL;
