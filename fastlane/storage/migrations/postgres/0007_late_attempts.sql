-- fastlane schema, version 7: attempts whose dispatch was never recorded, and the redeliveries they caused.

-- reported_late: the attempt is known from its worker's report only (its node sent it and died
-- before recording the dispatch); dispatched_at is then the earliest time the report gives.
-- redelivery: the run was sent again while that unrecorded attempt was under way.
ALTER TABLE attempts ADD COLUMN reported_late boolean NOT NULL DEFAULT false;
ALTER TABLE attempts ADD COLUMN redelivery boolean NOT NULL DEFAULT false;
