"""Jobs written at an older schema version, read by today's code (a helper module of the
migration tests).

Today's code reads columns later versions added (a pause's reason, schema 16); the node that
wrote jobs at an older version did not. A test that makes jobs at such a version, before
migrating, calls :func:`read_jobs_without_later_columns` so the rows it is handed back stand in
for them; ``monkeypatch.undo()`` (or the test's end) takes it back.
"""

from __future__ import annotations

from typing import Any

import pytest

from fastlane.storage import codec

LATER_JOB_COLUMNS: dict[str, Any] = {"pause_reason": None}


def read_jobs_without_later_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    build_job = codec.build_job
    monkeypatch.setattr(codec, "build_job", lambda row: build_job({**LATER_JOB_COLUMNS, **dict(row)}))
