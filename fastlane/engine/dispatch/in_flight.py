"""The attempts a node has sent and not yet heard the end of, with counts by job type and tenant.

A mapping of ``(run_id, lease_token)`` to the worker session holding the attempt, shared by the
dispatcher and the journal. Attempts the dispatcher assigned (:meth:`InFlight.assign`) are also
counted under their job type and tenant: for a tenant's cap on attempts in flight
(``--tenant-max-in-flight``) and for ``fastlane_in_flight_runs``. Attempts assigned as *ordinary* (below the
urgent priority of ``--priority-reserve``) are also counted per worker session, whose credits
beyond the reserve are all they may hold. Every assignment also adds to a running total per job
type and tenant, never taken back (:meth:`InFlight.assigned_totals`): the pace at which each
queue's runs go to workers, from which its backlog limit follows. An attempt put in without its
run (the journal vouching for one sent before a reconnect) is in flight but not counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, MutableMapping

from fastlane.domain.models import Run
from fastlane.engine.dispatch.messages import AttemptKey, WorkerSession

Label = tuple[str, str]  # (job type, tenant)


class InFlight(MutableMapping[AttemptKey, WorkerSession]):
    def __init__(self) -> None:
        self._sessions: dict[AttemptKey, WorkerSession] = {}
        self._labels: dict[AttemptKey, Label] = {}
        self._by_label: Counter[Label] = Counter()
        self._by_tenant: Counter[str] = Counter()
        self._assigned: Counter[Label] = Counter()  # every assignment since the node started
        self._sessions_counted: dict[AttemptKey, WorkerSession] = {}  # the session of each counted attempt
        self._counted_by_session: Counter[WorkerSession] = Counter()
        self._ordinary: dict[AttemptKey, WorkerSession] = {}
        self._ordinary_by_session: Counter[WorkerSession] = Counter()

    def assign(self, key: AttemptKey, session: WorkerSession, run: Run, *, ordinary: bool = False) -> None:
        """An attempt of ``run`` sent to ``session``: in flight and counted (``ordinary``: also per session)."""
        self.pop(key, None)
        self._sessions[key] = session
        label = self._labels[key] = (run.job_type, run.tenant)
        self._by_label[label] += 1
        self._assigned[label] += 1
        self._by_tenant[run.tenant] += 1
        self._sessions_counted[key] = session
        self._counted_by_session[session] += 1
        if ordinary:
            self._ordinary[key] = session
            self._ordinary_by_session[session] += 1

    def per_session(self) -> Counter[WorkerSession]:
        """Attempts in flight on each session (counted now: for a status call, not the fire path)."""
        return Counter(self._sessions.values())

    def counted(self, session: WorkerSession) -> int:
        """Attempts this node assigned to ``session`` and has not heard the end of."""
        return self._counted_by_session[session]

    def ordinary_count(self, session: WorkerSession) -> int:
        """Ordinary attempts (see the module's docstring) in flight on ``session``."""
        return self._ordinary_by_session[session]

    def tenant_count(self, tenant: str) -> int:
        """Attempts of ``tenant``'s runs in flight from this node."""
        return self._by_tenant[tenant]

    def assigned_totals(self) -> dict[Label, int]:
        """Attempts assigned since the node started, by (job type, tenant)."""
        return dict(self._assigned)

    def counts(self) -> dict[Label, int]:
        """Attempts in flight by (job type, tenant); read by the metrics thread (one step under the GIL)."""
        return {label: count for label, count in list(self._by_label.items()) if count}

    # -- the mapping: dict speed on the fire path, counts kept on every removal ------------------

    def __getitem__(self, key: AttemptKey) -> WorkerSession:
        return self._sessions[key]

    def get(self, key: AttemptKey, default: WorkerSession | None = None) -> WorkerSession | None:  # type: ignore[override]
        return self._sessions.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._sessions

    def __setitem__(self, key: AttemptKey, session: WorkerSession) -> None:
        self._sessions[key] = session  # not counted: see the module's docstring

    def __delitem__(self, key: AttemptKey) -> None:
        del self._sessions[key]
        self._uncount(key)

    def pop(self, key: AttemptKey, default: WorkerSession | None = None) -> WorkerSession | None:  # type: ignore[override]
        session = self._sessions.pop(key, default)
        self._uncount(key)
        return session

    def __iter__(self) -> Iterator[AttemptKey]:
        return iter(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    def _uncount(self, key: AttemptKey) -> None:
        if (session := self._ordinary.pop(key, None)) is not None:
            self._ordinary_by_session[session] -= 1
            if not self._ordinary_by_session[session]:
                del self._ordinary_by_session[session]
        label = self._labels.pop(key, None)
        if label is None:
            return
        session = self._sessions_counted.pop(key)
        self._counted_by_session[session] -= 1
        if not self._counted_by_session[session]:
            del self._counted_by_session[session]
        self._by_label[label] -= 1
        self._by_tenant[label[1]] -= 1
        if not self._by_label[label]:
            del self._by_label[label]
        if not self._by_tenant[label[1]]:
            del self._by_tenant[label[1]]
