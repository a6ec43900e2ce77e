"""A reference for cron across DST: a minute-by-minute simulation of Debian's (Vixie) cron daemon.

It shares no code with ``fastlane.domain.schedules`` (no croniter either): it parses crontab time fields
itself and replays the main loop of Vixie cron's ``cron.c`` (the loop Debian's ``cron`` 3.0pl1
package carries, ``timeRunning`` / ``virtualTime`` / ``wakeupKind``) against a simulated system
clock that advances one real (UTC) minute at a time.

Modelled from the sources:

- ``set_time``: ``clockTime = (now + GMToff) / 60``, local wall-clock minutes; ``GMToff`` is
  re-read only when ``tm_isdst`` changes. Here: naive local datetimes, the offset taken from
  zoneinfo, and ``isdst`` read as ``dst() != 0`` (nonzero also for Dublin's and Casablanca's
  negative DST).
- ``entry.c``: ``MIN_STAR`` / ``HR_STAR`` / ``DOM_STAR`` / ``DOW_STAR`` are set when the field's
  first character is ``*``; a job is a "wildcard" job when ``MIN_STAR|HR_STAR``.
- ``find_jobs(vtime, doWild, doNonWild)``: the bit tests on ``gmtime(vtime * 60)`` (the local
  wall-clock fields), days ANDed when either day field is starred, else ORed; then
  ``doNonWild`` admits fixed-time jobs, ``doWild`` wildcard jobs.
- ``job_add`` keeps a job at most once in the run queue, and every job queued while handling one
  wake-up runs in that same real minute; a run is recorded as the UTC instant of that minute.

Simplifications: one crontab entry per expression, running jobs takes no time (so the medium-jump
loop, which also stops when ``set_time`` sees the minute change, always completes in its minute;
``sleep(10)`` after a non-empty queue is ignored); runs of one job in the same real minute are
recorded once, since a fire list is a list of distinct instants.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

MINUTE = timedelta(minutes=1)
MINUTE_COUNT = 60  # cron.h: minutes per hour; cron.c's "large" jump is > 3 * MINUTE_COUNT

_MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), 1)}
_DAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}


def _number(token: str, names: dict[str, int]) -> int:
    return names[token.lower()] if token.lower() in names else int(token)


def _field(text: str, low: int, high: int, names: dict[str, int] | None = None) -> frozenset[int]:
    """entry.c get_list/get_range: ``*``, ``n``, ``a-b``, each with an optional ``/step``, comma lists."""
    values: set[int] = set()
    for item in text.split(","):
        body, _, step_text = item.partition("/")
        step = int(step_text) if step_text else 1
        if body == "*":
            first, last = low, high
        else:
            a, _, b = body.partition("-")
            first = _number(a, names or {})
            last = _number(b, names or {}) if b else first
        values.update(range(first, last + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Entry:
    """One parsed crontab line (entry.c ``load_entry``), without the command."""

    text: str
    minute: frozenset[int]
    hour: frozenset[int]
    dom: frozenset[int]
    month: frozenset[int]
    dow: frozenset[int]  # 0-6, Sunday 0 (entry.c folds 7 onto 0)
    min_star: bool
    hr_star: bool
    dom_star: bool
    dow_star: bool

    @property
    def wild(self) -> bool:
        """find_jobs: ``(e->flags & (MIN_STAR|HR_STAR)) != 0``."""
        return self.min_star or self.hr_star

    def matches(self, wall: datetime) -> bool:
        """find_jobs' bit tests for the virtual minute ``wall`` (local wall-clock fields)."""
        dow = (wall.weekday() + 1) % 7  # Python: Monday 0; tm_wday: Sunday 0
        this_dom, this_dow = wall.day in self.dom, dow in self.dow
        days = (this_dom and this_dow) if (self.dom_star or self.dow_star) else (this_dom or this_dow)
        return wall.minute in self.minute and wall.hour in self.hour and wall.month in self.month and days


def parse(text: str) -> Entry:
    """A 5-field crontab time specification (no nicknames, no seconds: Debian has neither here)."""
    m, h, dom, mon, dow = text.split()
    days = frozenset(d % 7 for d in _field(dow, 0, 7, _DAYS))
    return Entry(
        text=text, minute=_field(m, 0, 59), hour=_field(h, 0, 23), dom=_field(dom, 1, 31),
        month=_field(mon, 1, 12, _MONTHS), dow=days,
        # entry.c: "if (ch == '*') e->flags |= MIN_STAR" etc., on the field's first character
        min_star=m.startswith("*"), hr_star=h.startswith("*"),
        dom_star=dom.startswith("*"), dow_star=dow.startswith("*"),
    )


def system_clock(tz: ZoneInfo, start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """``(real UTC minute, clockTime)`` for each real minute in ``[start, end]`` (whole minutes).

    Models ``set_time``: ``GMToff`` is re-read only when ``tm_isdst`` differs from the last call's.
    """
    clock: list[tuple[datetime, datetime]] = []
    isdst: bool | None = None
    gmtoff = timedelta(0)
    now = start.astimezone(UTC)
    while now <= end:
        local = now.astimezone(tz)
        dst = bool(local.dst())
        if isdst is None or dst != isdst:  # "if (initialize || tm.tm_isdst != isdst)"
            isdst, gmtoff = dst, local.utcoffset() or timedelta(0)
        clock.append((now, (now + gmtoff).replace(tzinfo=None)))
        now += MINUTE
    return clock


def simulate(entries: Iterable[Entry], clock: list[tuple[datetime, datetime]]) -> dict[str, list[datetime]]:
    """Replay cron.c's main loop over ``clock``; the UTC run instants of each entry, by its text.

    The first minute of ``clock`` is the daemon's start (``timeRunning = virtualTime =
    clockTime``): nothing runs for it, as cron only runs jobs after the minute changes.
    """
    entries = list(entries)
    runs: dict[str, list[datetime]] = {e.text: [] for e in entries}

    def find_jobs(vtime: datetime, do_wild: bool, do_non_wild: bool, real: datetime) -> None:
        for e in entries:
            if e.matches(vtime) and ((do_non_wild and not e.wild) or (do_wild and e.wild)):
                if not runs[e.text] or runs[e.text][-1] != real:  # job_add: once per queue/minute
                    runs[e.text].append(real)

    time_running = virtual_time = clock[0][1]
    for real, clock_time in clock[1:]:
        # "do { cron_sleep(timeRunning + 1); set_time(FALSE); } while (clockTime == timeRunning)"
        if clock_time == time_running:
            continue
        time_running = clock_time
        time_diff = (time_running - virtual_time) // MINUTE
        if time_diff == 1:  # "shortcut for the most common case"
            virtual_time = time_running
            find_jobs(virtual_time, True, True, real)
        elif time_diff > 3 * MINUTE_COUNT or time_diff < -3 * MINUTE_COUNT:
            # wakeupKind large: "time has changed a *lot*, jump virtual time, and run everything"
            virtual_time = time_running
            find_jobs(time_running, True, True, real)
        elif time_diff > 5:
            # wakeupKind medium ("DST begins"): wildcard jobs for the current minute only, then
            # fixed-time jobs for each virtual minute up to and including the current one.
            find_jobs(time_running, True, False, real)
            while True:
                virtual_time += MINUTE
                find_jobs(virtual_time, False, True, real)
                if not virtual_time < time_running:
                    break
        elif time_diff > 0:
            # wakeupKind small ("woke up late"): every job for each virtual minute until caught up.
            while True:
                virtual_time += MINUTE
                find_jobs(virtual_time, True, True, real)
                if not virtual_time < time_running:
                    break
        else:
            # wakeupKind negative ("DST ends"): wildcard jobs for the current minute only; fixed-time
            # jobs "probably have already run"; virtualTime stays until the clock catches up.
            find_jobs(time_running, True, False, real)
    return runs
