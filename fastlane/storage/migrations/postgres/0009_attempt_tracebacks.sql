-- fastlane schema, version 9: a failed attempt keeps its handler's traceback.

-- Cut by the node to MAX_ERROR_TRACEBACK characters; NULL for attempts that did not raise (and
-- for those recorded before this version).
ALTER TABLE attempts ADD COLUMN error_traceback text;
