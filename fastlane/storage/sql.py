"""SQL text both dialects share, as templates each dialect's ``queries`` module fills in once."""

from __future__ import annotations

# The window's columns: the schedule only for recurring jobs (a one-shot has no next occurrence,
# and leaving its instant out lets every one-shot with the same misfire policy share one Timing).
DUE_JOB_SCHEDULE = "CASE WHEN {kind} IN ('now', 'at') THEN NULL ELSE {schedule} END"
