"""Rows written at an older schema version, read by today's code (a helper module of the
migration tests).

Today's code reads columns later versions added (a pause's reason, schema 16; a run's backfill,
schema 17); the node that wrote rows at an older version did not. A test that makes rows at such
a version, before migrating, calls :func:`read_without_later_columns` so the jobs it is handed
back stand in for them and the listings of runs do not filter on a column not there yet;
``monkeypatch.undo()`` (or the test's end) takes it back.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from fastlane.storage import codec
from fastlane.storage.postgres import queries as postgres_queries
from fastlane.storage.sqlite import queries as sqlite_queries

LATER_JOB_COLUMNS: dict[str, Any] = {"pause_reason": None}
# The statements that filter on a column of a later version, and the column.
_LATER_FILTERS = {"LIST_RUNS": "backfill_id", "COUNT_RUNS": "backfill_id"}


def read_without_later_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    build_job = codec.build_job
    monkeypatch.setattr(codec, "build_job", lambda row: build_job({**LATER_JOB_COLUMNS, **dict(row)}))
    for statements in (sqlite_queries.STATEMENTS, postgres_queries.STATEMENTS):
        for name, column in _LATER_FILTERS.items():
            # "column = $N" becomes "$N = $N": the same parameters, the filter always true.
            without = re.sub(rf"\b{column} = ([$?]\d+)", r"\1 = \1", getattr(statements, name))
            monkeypatch.setattr(statements, name, without)
