"""Schedules: parsing, validation and fire-time arithmetic. Pure functions, no I/O.

All instants in and out are timezone-aware; results are UTC. Cron expressions are read in an IANA
zone with Debian/Vixie cron DST semantics:

- a *fixed-time* expression (neither its minute nor its hour field begins with ``*``) fires
  wall-clock times skipped by a spring-forward once, at the first instant after the gap, and
  repeated wall-clock times only in their first pass;
- a *wildcard* expression (its minute or its hour field begins with ``*``: ``*/15 * * * *``,
  ``*/7 2 * * *``, ``30 */1 * * *``) follows elapsed time: it fires in both passes of a repeated
  hour and not at all for times inside a gap (Debian's ``entry.c`` sets ``MIN_STAR``/``HR_STAR``
  from the first character of those fields).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import cache, lru_cache
from itertools import islice, takewhile
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import CroniterBadDateError, croniter

from fastlane.domain.limits import LAST_INSTANT, MIN_INTERVAL
from fastlane.domain.models import Schedule, ScheduleKind
from fastlane.errors import ScheduleError, UnknownTimeZone

_ZERO = timedelta(0)
_MICROSECOND = timedelta(microseconds=1)
_EXAMPLE_AT = "write e.g. 2027-03-14T07:00:00Z"

# -- time zones --------------------------------------------------------------------------------


@cache
def _known_zones() -> frozenset[str]:
    # Scanning the zone path is slow; the set does not change while the process runs.
    return frozenset(available_timezones())


def zone(name: str) -> ZoneInfo:
    """Load an IANA time zone such as ``"America/New_York"``, or ``"UTC"``.

    Raises:
        UnknownTimeZone: The name is unknown, or a legacy name without a "/" such as ``"EST"``,
            ``"CET"`` or ``"Japan"``: tzdata has files for some, but abbreviations mean different
            things to different people, so a schedule must not depend on them.
    """
    # Membership in the zone list also keeps out paths such as "posix/..." or "../etc".
    if (name != "UTC" and "/" not in name) or name not in _known_zones():
        raise UnknownTimeZone(name)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise UnknownTimeZone(name) from None


def local_time(instant: datetime, tz_name: str) -> datetime:
    """The wall-clock time of ``instant`` in zone ``tz_name`` (aware, with ``fold`` set)."""
    return _require_aware(instant, "instant").astimezone(zone(tz_name))


# -- instants ----------------------------------------------------------------------------------

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(Z|[+-]\d{2}:\d{2})?$")


def parse_at(text: str) -> datetime:
    """Parse an RFC 3339 instant such as ``2027-03-14T07:00:00Z`` into an aware UTC datetime.

    Fractions beyond microseconds are truncated.

    Raises:
        ScheduleError: On field ``at``, if the text is not RFC 3339 or carries no offset.
    """
    normal = text.strip().upper()  # RFC 3339 allows "t" and "z"; fromisoformat does not
    match = _RFC3339.match(normal)
    if match is None:
        raise ScheduleError("at", f"{text!r} is not an RFC 3339 instant; {_EXAMPLE_AT}")
    if match.group(1) is None:
        raise ScheduleError("at", f"{text!r} has no offset; {_EXAMPLE_AT}")
    try:
        parsed = datetime.fromisoformat(normal)
    except ValueError as exc:
        raise ScheduleError("at", f"{text!r} is not a valid instant: {exc}") from None
    return parsed.astimezone(UTC)


def _require_aware(value: datetime, name: str) -> datetime:
    # A naive datetime here is a programming error, not bad user input.
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got {value!r}")
    return value


# -- cron expressions --------------------------------------------------------------------------

_NICKNAMES = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
_MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), 1)}
_WEEKDAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
# (name, lowest, highest, names usable instead of numbers)
_SPECS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("second", 0, 59, {}), ("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day_of_month", 1, 31, {}),
    ("month", 1, 12, _MONTHS), ("day_of_week", 0, 7, _WEEKDAYS),  # 0 and 7 are both Sunday, as in Vixie
)
_ITEM = re.compile(r"^(?:(\*)|([0-9a-z]+)(?:-([0-9a-z]+))?)(?:/(\d+))?$", re.IGNORECASE)
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February at its longest


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A validated cron expression.

    Attributes:
        text: The expression as written, nicknames expanded.
        fields: ``(second, minute, hour, day_of_month, month, day_of_week)``; second is "0" for 5 fields.
    """

    text: str
    fields: tuple[str, str, str, str, str, str]

    @property
    def is_wildcard(self) -> bool:
        """True when the minute or the hour field begins with ``*`` (``*/15``, ``*``): the
        expression follows elapsed time across DST, as Debian cron's ``MIN_STAR``/``HR_STAR``
        jobs do. Otherwise it is a fixed-time expression."""
        return self.fields[1].startswith("*") or self.fields[2].startswith("*")

    def iterator(self, start: datetime) -> croniter[datetime]:
        """A croniter over naive wall-clock times strictly after the naive ``start``."""
        # implement_cron_bug: like Vixie cron, day-of-month and day-of-week are ANDed when
        # either starts with "*" (e.g. "*/2"), ORed only when both are restricted.
        text = " ".join(self.fields)
        return croniter(text, start, ret_type=datetime, second_at_beginning=True, implement_cron_bug=True)


def _value(token: str, name: str, low: int, high: int, names: dict[str, int]) -> int:
    if token.isdigit():
        number = int(token)
    elif token.lower() in names:
        number = names[token.lower()]
    else:
        raise ScheduleError("cron", f"field {name!r} has an unknown value: {token!r} ({low}-{high})")
    if not low <= number <= high:
        raise ScheduleError("cron", f"field {name!r} out of range: {number} ({low}-{high})")
    return number


def _expand(text: str, name: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    """The values a field matches; raises ScheduleError naming the field on any problem."""
    values: set[int] = set()
    for item in text.split(","):
        match = _ITEM.match(item)
        if match is None:
            raise ScheduleError("cron", f"field {name!r} is not understood: {item!r} ({low}-{high})")
        star, first, last, step_text = match.groups()
        step = int(step_text) if step_text else 1
        if star:
            start, stop = low, high
        else:
            start = _value(first, name, low, high, names)
            stop = _value(last, name, low, high, names) if last else start
            if step_text and not last:
                raise ScheduleError("cron", f"field {name!r}: a step needs '*' or a range: {item!r}")
        if start > stop:
            raise ScheduleError("cron", f"field {name!r} has a backwards range: {item!r} ({low}-{high})")
        if not 1 <= step <= high:
            raise ScheduleError("cron", f"field {name!r} has a bad step: {step} (1-{high})")
        values.update(range(start, stop + 1, step))
    return values


@lru_cache(maxsize=4096)  # the scheduler re-reads the same expressions on every fire
def parse_cron(expr: str) -> CronExpr:
    """Parse and validate a cron expression.

    Accepts 5 fields (``min hour dom month dow``), 6 with seconds first (``sec min hour dom month
    dow``), or a nickname (``@hourly @daily @midnight @weekly @monthly @yearly @annually``). Fields
    take numbers, ``*``, ``a-b``, ``*/n``, ``a-b/n``, lists, and English month and weekday names.

    Raises:
        ScheduleError: On field ``cron``, naming the cron field and its allowed range.
    """
    text = expr.strip()
    if text.startswith("@"):
        if text.lower() not in _NICKNAMES:
            raise ScheduleError("cron", f"unsupported nickname {text!r}; use one of {', '.join(_NICKNAMES)}")
        text = _NICKNAMES[text.lower()]
    parts = text.split()
    if len(parts) not in (5, 6):
        expected = "expected 5 fields (min hour dom month dow) or 6 with seconds first"
        raise ScheduleError("cron", f"{expected}, got {len(parts)}")
    fields = tuple(parts) if len(parts) == 6 else ("0", *parts)
    expanded = [_expand(f, *spec) for f, spec in zip(fields, _SPECS, strict=True)]
    # When day-of-week starts with "*" the day fields are ANDed (see CronExpr.iterator), so only
    # day-of-month picks days; refuse dates that never exist rather than never fire silently.
    days, months = expanded[3], expanded[4]
    if fields[5].startswith("*") and not any(d <= _DAYS_IN_MONTH[m - 1] for d in days for m in months):
        raise ScheduleError("cron", f"day_of_month {fields[3]!r} never occurs in month {fields[4]!r}")
    return CronExpr(text=text, fields=fields)  # type: ignore[arg-type]


# -- cron iteration across DST -----------------------------------------------------------------


def _transition(before: datetime, after: datetime, tz: ZoneInfo) -> datetime:
    """The first instant in ``(before, after]`` whose UTC offset differs from ``before``'s."""
    # tzdata transitions fall on whole seconds, so search whole seconds from a whole second.
    before = before.replace(microsecond=0)
    old = before.astimezone(tz).utcoffset()
    low, high = 0, int((after - before).total_seconds())  # offset(low) == old != offset(high)
    while high - low > 1:
        middle = (low + high) // 2
        if (before + timedelta(seconds=middle)).astimezone(tz).utcoffset() == old:
            low = middle
        else:
            high = middle
    return before + timedelta(seconds=high)


def _folds(wall: datetime, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """The UTC instants of a naive wall time read with fold=0 and fold=1.

    Equal for an ordinary time; earlier < later for a repeated one; reversed inside a gap, where
    zoneinfo reads fold=0 with the offset from before the jump.
    """
    return wall.replace(tzinfo=tz, fold=0).astimezone(UTC), wall.replace(tzinfo=tz, fold=1).astimezone(UTC)


def _repeated_walls(first: datetime, second: datetime, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """The naive wall-time range ``[start, end)`` repeated by the fall-back between two instants."""
    fall_back = _transition(first, second, tz)
    old, new = first.astimezone(tz).utcoffset() or _ZERO, fall_back.astimezone(tz).utcoffset() or _ZERO
    return (fall_back + new).replace(tzinfo=None), (fall_back + old).replace(tzinfo=None)


def _second_pass(cron: CronExpr, tz: ZoneInfo, start: datetime, end: datetime) -> Iterator[datetime]:
    """The fold=1 instants of the candidates in the repeated wall range ``[start, end)``."""
    for candidate in cron.iterator(start - timedelta(seconds=1)):  # candidates are whole seconds
        if candidate >= end:
            return
        yield candidate.replace(tzinfo=tz, fold=1).astimezone(UTC)


def _candidate_instants(cron: CronExpr, tz: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """Fire instants in increasing order, possibly repeating or not after ``after``."""
    local = after.astimezone(tz)
    wall = local.replace(tzinfo=None)
    in_second_pass = local.fold == 1  # then the first pass of these wall times is already behind
    due: tuple[datetime, datetime] | None = None  # a repeated range whose second pass is owed
    if cron.is_wildcard and not in_second_pass and (folds := _folds(wall, tz))[0] < folds[1]:
        due = _repeated_walls(*folds, tz)  # after is in a first pass: the second pass is ahead
    for candidate in cron.iterator(wall):
        first, second = _folds(candidate, tz)
        if first < second:  # a repeated wall time (fall-back)
            if not cron.is_wildcard:
                yield first
            elif in_second_pass:
                yield second
            else:
                yield first
                due = due or _repeated_walls(first, second, tz)
            continue
        if due is not None:  # past the repeated range: its second pass comes before this
            yield from _second_pass(cron, tz, *due)
            due = None
        in_second_pass = False
        if first == second:
            yield first
        elif not cron.is_wildcard:  # in a gap: fire once, at the first instant after it
            yield _transition(second, first, tz)


def _cron_instants(cron: CronExpr, tz: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """Fire instants (UTC, strictly increasing) strictly after ``after``."""
    last = after
    if after >= LAST_INSTANT:
        return
    try:
        for instant in _candidate_instants(cron, tz, after):
            if instant >= LAST_INSTANT:
                return  # the supported range ends: so does the schedule
            if instant > last:  # also collapses several gap times into one fire
                last = instant
                yield instant
    except (CroniterBadDateError, OverflowError):
        return  # croniter found no further date within its search horizon or datetime's range


# -- schedules ---------------------------------------------------------------------------------

_OWN_FIELDS = {
    ScheduleKind.NOW: (), ScheduleKind.AT: ("at",), ScheduleKind.CRON: ("cron",),
    ScheduleKind.INTERVAL: ("every", "anchor"),
}


def validate_schedule(s: Schedule) -> None:
    """Check that a schedule sets exactly the fields of its kind, each valid.

    Raises:
        ScheduleError: Naming the offending field (``kind``, ``at``, ``cron``, ``timezone``,
            ``every`` or ``anchor``).
    """
    try:
        kind = ScheduleKind(s.kind)
    except ValueError:
        raise ScheduleError("kind", f"unknown schedule kind {s.kind!r} (now, at, cron, interval)") from None
    for name in ("at", "cron", "every", "anchor"):
        if name not in _OWN_FIELDS[kind] and getattr(s, name) is not None:
            raise ScheduleError(name, f"must not be set for a {kind} schedule")
    if s.jitter is not None and s.is_one_shot:
        raise ScheduleError("jitter", f"spreads the runs of a recurring schedule: a {kind} schedule takes none")
    if kind != ScheduleKind.CRON and s.timezone != "UTC":
        raise ScheduleError("timezone", f"only cron schedules take a time zone, got {s.timezone!r}")
    if kind == ScheduleKind.AT:
        if s.at is None:
            raise ScheduleError("at", "is required for an at schedule")
        _check_aware(s.at, "at")
    elif kind == ScheduleKind.CRON:
        if not s.cron:
            raise ScheduleError("cron", "is required for a cron schedule")
        parse_cron(s.cron)
        zone(s.timezone)
    elif kind == ScheduleKind.INTERVAL:
        if s.every is None:
            raise ScheduleError("every", "is required for an interval schedule")
        if s.every < MIN_INTERVAL:
            raise ScheduleError("every", f"{s.every.total_seconds()} s is too short (at least 0.1 s)")
        if s.anchor is not None:
            _check_aware(s.anchor, "anchor")


def _check_aware(value: datetime, name: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError(name, f"{value.isoformat()} has no offset; {_EXAMPLE_AT}")


def _interval_fires(s: Schedule, after: datetime) -> Iterator[datetime]:
    if s.anchor is None:
        raise ValueError("an interval schedule needs its anchor (the store sets it to created_at)")
    if s.every is None or s.every <= _ZERO:
        raise ValueError(f"an interval schedule needs a positive 'every', got {s.every!r}")
    anchor = s.anchor.astimezone(UTC)
    if anchor >= LAST_INSTANT:
        return
    # timedelta is exact integer microseconds, so anchor + k * every never drifts. The last k
    # is computed before multiplying, so no occurrence past the supported range is ever formed.
    last_k = (LAST_INSTANT - anchor - _MICROSECOND) // s.every  # the range ends before LAST_INSTANT
    k = 0 if after < anchor else min((after - anchor) // s.every + 1, last_k + 1)
    while k <= last_k:
        yield anchor + s.every * k
        k += 1


def _fires(s: Schedule, after: datetime) -> Iterator[datetime]:
    """Fire times strictly after the aware ``after``, as aware UTC, increasing."""
    after = _require_aware(after, "after").astimezone(UTC)
    if s.kind == ScheduleKind.CRON:
        assert s.cron is not None
        return _cron_instants(parse_cron(s.cron), zone(s.timezone), after)
    if s.kind == ScheduleKind.INTERVAL:
        return _interval_fires(s, after)
    if s.kind == ScheduleKind.AT and s.at is not None and s.at > after:
        return iter([s.at.astimezone(UTC)])
    return iter([])  # "now" has no fire time of its own: it fires at creation


def fires_after(s: Schedule, after: datetime) -> Iterator[datetime]:
    """Every fire time strictly after the aware ``after``, in order, from one iterator (cheaper
    than :func:`next_fire_after` again and again over a long range)."""
    return _fires(s, after)


def next_fire_after(s: Schedule, after: datetime) -> datetime | None:
    """The first fire time strictly after the aware ``after``, as aware UTC.

    Returns None for one-shot kinds (``now``, ``at``), for a cron expression that never fires
    again, and when the next fire time would fall past the supported range (``LAST_INSTANT``):
    the schedule ends there rather than overflow.

    Raises:
        ValueError: ``after`` is naive, or an interval schedule has no anchor (the store sets it).
    """
    if s.is_one_shot:
        return None
    return next(_fires(s, after), None)


def first_fire(s: Schedule, created_at: datetime) -> datetime | None:
    """The first fire time of a schedule created at ``created_at``.

    ``now`` fires at creation; ``at`` at its instant, even if past (the misfire policy decides);
    cron at its first time strictly after creation; interval at its anchor if later than creation,
    else at the first ``anchor + k * every`` strictly after creation (anchor default: creation).
    """
    created_at = _require_aware(created_at, "created_at").astimezone(UTC)
    if s.kind == ScheduleKind.NOW:
        return created_at
    if s.kind == ScheduleKind.AT:
        return s.at.astimezone(UTC) if s.at is not None else None
    if s.kind == ScheduleKind.INTERVAL and s.anchor is None:
        s = replace(s, anchor=created_at)
    return next_fire_after(s, created_at)


def preview(s: Schedule, after: datetime, count: int) -> list[datetime]:
    """The next ``count`` fire times strictly after ``after``, as aware UTC.

    For ``at``: its instant if later than ``after``. For ``now``, which fires at creation: none.
    An interval schedule without an anchor is previewed as if anchored at ``after``.
    """
    if s.kind == ScheduleKind.INTERVAL and s.anchor is None:
        s = replace(s, anchor=_require_aware(after, "after"))
    return list(islice(_fires(s, after), max(count, 0)))


# -- why a fire time is where it is ------------------------------------------------------------


def fire_notes(s: Schedule, fires: list[datetime], after: datetime) -> list[str | None]:
    """For each of ``fires`` (as :func:`preview` returned them after ``after``), why a daylight
    saving transition moved it, repeated it or skipped times before it; None when nothing did.

    This is what users ask of a scheduler around DST, so ``fastlane jobs preview`` prints it.
    """
    if s.kind != ScheduleKind.CRON or s.cron is None:
        return [None] * len(fires)
    cron, tz = parse_cron(s.cron), zone(s.timezone)
    notes: list[str | None] = []
    previous = _require_aware(after, "after").astimezone(UTC)
    for instant in fires:
        parts = [part for part in (_pass_note(cron, tz, instant), _moved_note(cron, tz, instant),
                                   _skipped_note(cron, tz, previous, instant)) if part]
        notes.append("; ".join(parts) or None)
        previous = instant
    return notes


def _pass_note(cron: CronExpr, tz: ZoneInfo, instant: datetime) -> str | None:
    local = instant.astimezone(tz)
    first, second = _folds(local.replace(tzinfo=None), tz)
    if first >= second:
        return None  # not a repeated wall time
    if local.fold:
        return f"second pass of the repeated {local:%H:%M} (clocks went back)"
    if cron.is_wildcard:
        return f"first pass of the repeated {local:%H:%M}; it fires again in the second"
    return f"first pass of the repeated {local:%H:%M}; a fixed-time expression does not fire in the second"


def _moved_note(cron: CronExpr, tz: ZoneInfo, instant: datetime) -> str | None:
    wall = instant.astimezone(tz).replace(tzinfo=None)
    if next(cron.iterator(wall - timedelta(seconds=1))) == wall:
        return None  # the expression names this wall time itself
    before = (instant - timedelta(seconds=1)).astimezone(tz)
    jumped_from = (instant + (before.utcoffset() or _ZERO)).replace(tzinfo=None)  # the old wall clock
    return (f"moved: its time fell in the gap when clocks jumped from {jumped_from:%H:%M} to {wall:%H:%M}; "
            "it fires at the first valid instant after")


def _skipped_note(cron: CronExpr, tz: ZoneInfo, previous: datetime, instant: datetime) -> str | None:
    if not cron.is_wildcard or previous.astimezone(tz).utcoffset() == instant.astimezone(tz).utcoffset():
        return None
    jump = _transition(previous, instant, tz)
    old = (jump - timedelta(seconds=1)).astimezone(tz).utcoffset() or _ZERO
    new = jump.astimezone(tz).utcoffset() or _ZERO
    if new <= old:
        return None  # clocks went back: nothing is skipped
    gap_start, gap_end = (jump + old).replace(tzinfo=None), (jump + new).replace(tzinfo=None)
    skipped = list(islice(takewhile(lambda wall: wall < gap_end, cron.iterator(gap_start - timedelta(seconds=1))), 4))
    if not skipped:
        return None
    shown = ", ".join(f"{wall:%H:%M}" for wall in skipped[:3]) + (", ..." if len(skipped) > 3 else "")
    return f"skipped {shown}: inside the gap when clocks jumped from {gap_start:%H:%M} to {gap_end:%H:%M}"


__all__ = [
    "MIN_INTERVAL", "CronExpr", "fire_notes", "fires_after", "first_fire", "local_time", "next_fire_after", "parse_at",
    "parse_cron",
    "preview", "validate_schedule", "zone",
]
