-- fastlane schema, version 16: a paused job keeps the reason its pause was given (`jobs pause
-- --reason`), shown wherever its state is; a resume clears it.
ALTER TABLE jobs ADD COLUMN pause_reason text;
