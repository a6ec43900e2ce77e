"""fastlane's cron fire times across DST against a simulation of Debian's cron daemon.

The reference (``tests/unit/debian_cron.py``) replays the main loop of Vixie/Debian ``cron.c``
minute by minute around each DST transition; it shares no code with ``fastlane.domain.schedules``. For
every 2027 transition of each zone, and each expression, fastlane's fire times in the window from
6 hours before the transition to 6 hours after must equal the instants at which the simulated
daemon runs the job. A zone without 2027 transitions is compared over a fixed day instead.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import debian_cron
import pytest

from fastlane.domain.models import Schedule
from fastlane.domain.schedules import preview

ZONES = (
    "America/New_York", "Europe/London",
    "Europe/Dublin",  # negative DST: winter GMT is the "summer" time of the rules
    "Australia/Lord_Howe",  # 30-minute shifts
    "America/Santiago", "America/Havana",  # transitions at midnight
    "America/Asuncion",  # permanent -03 since tzdata 2024b: no 2027 transition (see EXTRA_YEARS)
    "Pacific/Chatham",  # +12:45 / +13:45
    "Africa/Casablanca",  # Ramadan: negative DST in February-March
    "Australia/Sydney", "UTC",
)
# Asuncion is listed for its midnight transitions; its last ones were in 2024.
EXTRA_YEARS = {"America/Asuncion": (2024,)}
FIXED_DAY = datetime(2027, 3, 1, tzinfo=UTC)  # a Monday and the 1st, for zones with no 2027 transition

EXPRESSIONS = (
    "30 2 * * *", "0 2 * * *", "30 1 * * *", "15,45 1-3 * * *", "*/15 * * * *", "*/7 2 * * *",
    "0 */2 * * *", "30 */1 * * *", "*/20 1,2 * * SUN", "0 0 * * *", "30 0 * * *", "0 * * * *",
    "45 23 * * *", "0 9 1,15 * MON", "*/10 0-3 * * *", "59 1 * * *", "0,30 0-3 * * *",
    "50 2,3 * * *", "5 3 * * *", "*/30 0-4 * * SAT,SUN", "15 23 * * SAT", "0 1 4,5,31 * *",
)
WINDOW = timedelta(hours=6)
MINUTE = timedelta(minutes=1)


@cache
def transitions(zone: str, year: int) -> tuple[datetime, ...]:
    """The instants (UTC) in ``year`` at which ``zone``'s UTC offset changes, scanned hour by hour."""
    tz, found = ZoneInfo(zone), []
    hour = datetime(year, 1, 1, tzinfo=UTC)
    while hour.year == year:
        nxt = hour + timedelta(hours=1)
        if hour.astimezone(tz).utcoffset() != nxt.astimezone(tz).utcoffset():
            instant = hour  # then to the minute (all known transitions fall on whole minutes)
            while instant.astimezone(tz).utcoffset() == hour.astimezone(tz).utcoffset():
                instant += MINUTE
            found.append(instant)
        hour = nxt
    return tuple(found)


def windows(zone: str) -> list[tuple[str, datetime, datetime]]:
    """``(label, after, end)``: 6 hours either side of each transition, or the fixed day."""
    points = [t for year in (2027, *EXTRA_YEARS.get(zone, ())) for t in transitions(zone, year)]
    if not transitions(zone, 2027):
        return [("no transition", FIXED_DAY, FIXED_DAY + 4 * WINDOW)] + [
            (f"{t:%Y-%m-%dT%H:%MZ}", t - WINDOW, t + WINDOW) for t in points]
    return [(f"{t:%Y-%m-%dT%H:%MZ}", t - WINDOW, t + WINDOW) for t in points]


def fastlane_fires(expr: str, zone: str, after: datetime, end: datetime) -> list[datetime]:
    """Every fastlane fire time in ``(after, end]``, read from ``preview`` a chunk at a time."""
    schedule, fires, cursor = Schedule.cron_expr(expr, zone), [], after
    while True:
        chunk = preview(schedule, cursor, 64)
        fires.extend(t for t in chunk if t <= end)
        if len(chunk) < 64 or chunk[-1] >= end:
            return fires
        cursor = chunk[-1]


def compare(zone: str) -> tuple[list[tuple[str, str, str, list[str], list[str]]], int, int]:
    """``(differences, cases, fire times compared)`` for all windows and expressions of ``zone``."""
    entries = [debian_cron.parse(e) for e in EXPRESSIONS]
    differences, cases, compared = [], 0, 0
    for label, after, end in windows(zone):
        clock = debian_cron.system_clock(ZoneInfo(zone), after, end)  # shared by all expressions
        debian = debian_cron.simulate(entries, clock)
        for expr in EXPRESSIONS:
            ours, theirs = fastlane_fires(expr, zone, after, end), debian[expr]
            cases += 1
            compared += len(set(ours) | set(theirs))
            if ours != theirs:
                only_ours = [f"{t:%m-%dT%H:%MZ}" for t in ours if t not in theirs]
                only_theirs = [f"{t:%m-%dT%H:%MZ}" for t in theirs if t not in ours]
                if not only_ours and not only_theirs:
                    only_ours = ["(order or repeats differ)", *map(str, ours)]
                differences.append((label, expr, f"{after:%Y-%m-%dT%H:%MZ}", only_ours, only_theirs))
    return differences, cases, compared


def table(zone: str, differences: list[tuple[str, str, str, list[str], list[str]]]) -> str:
    head = f"{'zone':20} {'expression':18} {'transition':17} {'only in fastlane':30} only in debian"
    rows = [f"{zone:20} {expr:18} {label:17} {' '.join(ours) or '-':30} {' '.join(theirs) or '-'}"
            for label, expr, _after, ours, theirs in differences]
    return "\n".join([head, *rows])


@pytest.mark.parametrize("zone", ZONES)
def test_fire_times_match_debian_cron(zone: str) -> None:
    differences, cases, compared = compare(zone)
    assert cases >= len(EXPRESSIONS)
    assert compared > 0
    assert not differences, f"{len(differences)} of {cases} cases differ:\n{table(zone, differences)}"


def test_zones_have_the_expected_2027_transitions() -> None:
    counts = {zone: len(transitions(zone, 2027)) for zone in ZONES}
    assert counts == {zone: 0 if zone in ("UTC", "America/Asuncion") else 2 for zone in ZONES}
    assert len(transitions("America/Asuncion", 2024)) == 2


# -- the reference itself, against the behaviour worked out by hand from cron.c ----------------


def _runs(expr: str, zone: str, start: str, hours: int) -> list[str]:
    after = datetime.fromisoformat(start).replace(tzinfo=UTC)
    clock = debian_cron.system_clock(ZoneInfo(zone), after, after + timedelta(hours=hours))
    return [f"{t:%H:%M}" for t in debian_cron.simulate([debian_cron.parse(expr)], clock)[expr]]


def test_reference_spring_forward_new_york() -> None:
    # 01:59 EST (06:59Z) -> 03:00 EDT (07:00Z): timeDiff 61, "medium": fixed-time jobs for each
    # skipped minute run at 07:00Z; wildcard jobs only for 03:00.
    assert _runs("30 2 * * *", "America/New_York", "2027-03-14T05:00", 4) == ["07:00"]
    assert _runs("15,45 1-3 * * *", "America/New_York", "2027-03-14T05:00", 4) == [
        "06:15", "06:45", "07:00", "07:15", "07:45"]
    assert _runs("*/7 2 * * *", "America/New_York", "2027-03-14T05:00", 4) == []
    assert _runs("*/20 * * * *", "America/New_York", "2027-03-14T06:30", 1) == ["06:40", "07:00", "07:20"]


def test_reference_fall_back_new_york() -> None:
    # 01:59 EDT (05:59Z) -> 01:00 EST (06:00Z): timeDiff -59, "negative": wildcard jobs only
    # until the clock reaches virtualTime again.
    assert _runs("30 1 * * *", "America/New_York", "2027-11-07T04:00", 4) == ["05:30"]
    assert _runs("*/30 1 * * *", "America/New_York", "2027-11-07T04:00", 4) == [
        "05:00", "05:30", "06:00", "06:30"]
    assert _runs("30 */1 * * *", "America/New_York", "2027-11-07T04:00", 4) == [
        "04:30", "05:30", "06:30", "07:30"]


def test_reference_day_fields() -> None:
    mon_1st = debian_cron.parse("0 9 1,15 * MON")  # both restricted: either day field may match
    assert mon_1st.matches(datetime(2027, 3, 8, 9)) and mon_1st.matches(datetime(2027, 3, 15, 9))
    assert not mon_1st.matches(datetime(2027, 3, 9, 9))
    starred = debian_cron.parse("0 9 */1 * MON")  # DOM_STAR: both must match
    assert starred.matches(datetime(2027, 3, 8, 9)) and not starred.matches(datetime(2027, 3, 9, 9))
    assert debian_cron.parse("0 0 * * 7").dow == {0}
