"""Who may read what a job or a run carries: a job's payload, a run's input, output and checkpoint.

They are the tenant's data, not the scheduler's: a viewer token sees a job's and a run's metadata
only, every other role that may read them sees them too, and a node started with
``--hide-payloads`` shows them to nobody (the console included, as it calls the same servicers).
"""

from __future__ import annotations

from fastlane.auth.caller import current_caller
from fastlane.domain.access import Role


def payloads_shown(hidden: bool) -> bool:
    """Whether the current call's caller may read payloads on a node whose ``--hide-payloads`` is ``hidden``."""
    return not hidden and current_caller.get().role is not Role.VIEWER
