"""Tests for fastlane.domain.schedules.

Expected instants are worked out by hand from the 2027 DST rules, never from the code under test:

- America/New_York: EST (-05) -> EDT (-04) on Sun 14 Mar at 02:00 (07:00Z); back on Sun 7 Nov at
  02:00 EDT (06:00Z), so 01:00-01:59 happens twice (05:xxZ, then 06:xxZ).
- Australia/Sydney: AEST (+10) -> AEDT (+11) on Sun 3 Oct at 02:00 (2 Oct 16:00Z); back on Sun 4
  Apr at 03:00 AEDT (3 Apr 16:00Z), so 02:00-02:59 happens twice (15:xxZ, then 16:xxZ).
- Europe/London: GMT -> BST (+01) on Sun 28 Mar at 01:00 (01:00Z); back on Sun 31 Oct at 02:00 BST
  (01:00Z), so 01:00-01:59 happens twice (00:xxZ, then 01:xxZ).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from fastlane.domain.models import Schedule, ScheduleKind
from fastlane.domain.schedules import (
    fire_notes,
    first_fire,
    local_time,
    next_fire_after,
    parse_at,
    parse_cron,
    preview,
    validate_schedule,
    zone,
)
from fastlane.errors import ScheduleError, UnknownTimeZone

NY, SYD, LON = "America/New_York", "Australia/Sydney", "Europe/London"


def utc(text: str) -> datetime:
    """An aware UTC datetime from 'YYYY-MM-DDTHH:MM[:SS]Z' (independent of parse_at)."""
    return datetime.fromisoformat(text.removesuffix("Z")).replace(tzinfo=UTC)


def cron_preview(expr: str, tz: str, after: str, count: int) -> list[datetime]:
    return preview(Schedule.cron_expr(expr, tz), utc(after), count)


def utcs(*texts: str) -> list[datetime]:
    return [utc(t) for t in texts]


# -- cron across DST: fixed hour ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected"),
    [
        # 02:30 does not exist on 14 Mar: one fire at 03:00 EDT, then 02:30 EDT on later days.
        ("30 2 * * *", NY, "2027-03-13T12:00Z", ["2027-03-14T07:00Z", "2027-03-15T06:30Z", "2027-03-16T06:30Z"]),
        # 02:30 does not exist on 3 Oct: one fire at 03:00 AEDT, then 02:30 AEDT.
        ("30 2 * * *", SYD, "2027-10-02T00:00Z", ["2027-10-02T16:00Z", "2027-10-03T15:30Z", "2027-10-04T15:30Z"]),
        # 01:30 does not exist on 28 Mar: one fire at 02:00 BST, then 01:30 BST.
        ("30 1 * * *", LON, "2027-03-27T12:00Z", ["2027-03-28T01:00Z", "2027-03-29T00:30Z", "2027-03-30T00:30Z"]),
        # Seconds-first 6-field form behaves the same.
        ("0 30 2 * * *", NY, "2027-03-13T12:00Z", ["2027-03-14T07:00Z", "2027-03-15T06:30Z", "2027-03-16T06:30Z"]),
    ],
)
def test_fixed_hour_time_in_spring_forward_gap_fires_once_at_end_of_gap(expr, tz, after, expected):
    assert cron_preview(expr, tz, after, 3) == utcs(*expected)


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected"),
    [
        # 01:30 happens twice on 7 Nov: only the EDT pass fires.
        ("30 1 * * *", NY, "2027-11-06T12:00Z", ["2027-11-07T05:30Z", "2027-11-08T06:30Z", "2027-11-09T06:30Z"]),
        # 02:30 happens twice on 4 Apr: only the AEDT pass fires.
        ("30 2 * * *", SYD, "2027-04-03T00:00Z", ["2027-04-03T15:30Z", "2027-04-04T16:30Z", "2027-04-05T16:30Z"]),
        # 01:30 happens twice on 31 Oct: only the BST pass fires.
        ("30 1 * * *", LON, "2027-10-30T12:00Z", ["2027-10-31T00:30Z", "2027-11-01T01:30Z", "2027-11-02T01:30Z"]),
        (
            "30 30 1 * * *", NY, "2027-11-06T12:00Z",
            ["2027-11-07T05:30:30Z", "2027-11-08T06:30:30Z", "2027-11-09T06:30:30Z"],
        ),
    ],
)
def test_fixed_hour_time_repeated_by_fall_back_fires_only_in_first_pass(expr, tz, after, expected):
    assert cron_preview(expr, tz, after, 3) == utcs(*expected)


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected"),
    [
        # 02:15 and 02:45 are skipped; together they fire once at 03:00 EDT.
        (
            "15,45 1-3 * * *", NY, "2027-03-14T05:00Z",
            ["2027-03-14T06:15Z", "2027-03-14T06:45Z", "2027-03-14T07:00Z", "2027-03-14T07:15Z",
             "2027-03-14T07:45Z", "2027-03-15T05:15Z"],
        ),
        (
            "15,45 1-3 * * *", SYD, "2027-10-02T14:00Z",
            ["2027-10-02T15:15Z", "2027-10-02T15:45Z", "2027-10-02T16:00Z", "2027-10-02T16:15Z",
             "2027-10-02T16:45Z", "2027-10-03T14:15Z"],
        ),
        # Seconds inside the gap collapse too: 02:30:00 and 02:30:30 -> one fire at 03:00 EDT.
        (
            "*/30 30 2 * * *", NY, "2027-03-13T12:00Z",
            ["2027-03-14T07:00Z", "2027-03-15T06:30Z", "2027-03-15T06:30:30Z", "2027-03-16T06:30Z",
             "2027-03-16T06:30:30Z", "2027-03-17T06:30Z"],
        ),
    ],
)
def test_fixed_hour_list_and_range_collapse_gap_times_into_one_fire(expr, tz, after, expected):
    assert cron_preview(expr, tz, after, 6) == utcs(*expected)


def test_fixed_hour_range_skips_whole_second_pass_of_repeated_hour():
    # 01:15 and 01:45 EDT fire; 01:15 and 01:45 EST do not; 02:15 EST follows.
    got = cron_preview("15,45 1-3 * * *", NY, "2027-11-07T04:00Z", 5)
    assert got == utcs(
        "2027-11-07T05:15Z", "2027-11-07T05:45Z", "2027-11-07T07:15Z", "2027-11-07T07:45Z", "2027-11-07T08:15Z"
    )


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ("2027-11-07T05:10Z", "2027-11-07T05:30Z"),  # 01:10 EDT: today's 01:30 EDT is still ahead
        ("2027-11-07T05:30Z", "2027-11-08T06:30Z"),  # exactly the fire: strictly after means tomorrow
        ("2027-11-07T06:10Z", "2027-11-08T06:30Z"),  # 01:10 EST: the second pass must not fire
    ],
)
def test_fixed_hour_next_fire_when_after_lies_inside_repeated_hour(after, expected):
    assert next_fire_after(Schedule.cron_expr("30 1 * * *", NY), utc(after)) == utc(expected)


def test_fixed_hour_next_fire_just_before_gap_is_end_of_gap():
    # 01:59:59 EST; 02:30 does not exist, so the fire is at 03:00 EDT, one second later.
    assert next_fire_after(Schedule.cron_expr("30 2 * * *", NY), utc("2027-03-14T06:59:59Z")) == utc(
        "2027-03-14T07:00Z"
    )


# -- cron across DST: hour wildcard ------------------------------------------------------------


@pytest.mark.parametrize(
    ("tz", "after", "expected"),
    [
        # 00:30 EDT, 01:30 EDT, 01:30 EST, 02:30 EST.
        (NY, "2027-11-07T04:00Z", ["2027-11-07T04:30Z", "2027-11-07T05:30Z", "2027-11-07T06:30Z", "2027-11-07T07:30Z"]),
        # 01:30 AEDT, 02:30 AEDT, 02:30 AEST, 03:30 AEST.
        (SYD, "2027-04-03T14:00Z", ["2027-04-03T14:30Z", "2027-04-03T15:30Z", "2027-04-03T16:30Z", "2027-04-03T17:30Z"]),
        # 00:30 BST, 01:30 BST, 01:30 GMT, 02:30 GMT.
        (LON, "2027-10-30T23:00Z", ["2027-10-30T23:30Z", "2027-10-31T00:30Z", "2027-10-31T01:30Z", "2027-10-31T02:30Z"]),
    ],
)
def test_hour_wildcard_fires_in_both_passes_of_repeated_hour(tz, after, expected):
    assert cron_preview("30 * * * *", tz, after, 4) == utcs(*expected)


@pytest.mark.parametrize(
    ("tz", "after", "expected"),
    [
        # 00:30 EST, 01:30 EST, [02:30 missing], 03:30 EDT, 04:30 EDT.
        (NY, "2027-03-14T05:00Z", ["2027-03-14T05:30Z", "2027-03-14T06:30Z", "2027-03-14T07:30Z", "2027-03-14T08:30Z"]),
        # 00:30 AEST, 01:30 AEST, [02:30 missing], 03:30 AEDT, 04:30 AEDT.
        (SYD, "2027-10-02T14:00Z", ["2027-10-02T14:30Z", "2027-10-02T15:30Z", "2027-10-02T16:30Z", "2027-10-02T17:30Z"]),
        # 00:30 GMT, [01:30 missing], 02:30 BST, 03:30 BST.
        (LON, "2027-03-28T00:00Z", ["2027-03-28T00:30Z", "2027-03-28T01:30Z", "2027-03-28T02:30Z", "2027-03-28T03:30Z"]),
    ],
)
def test_hour_wildcard_fires_nothing_for_times_in_gap(tz, after, expected):
    # Elapsed time: still one fire per real hour, and no extra fire at the end of the gap.
    assert cron_preview("30 * * * *", tz, after, 4) == utcs(*expected)


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        # From 00:50 EDT: every 20 elapsed minutes through both passes of 01:xx.
        ("2027-11-07T04:50Z", ["05:00", "05:20", "05:40", "06:00", "06:20", "06:40", "07:00", "07:20"]),
        # From 01:50 EDT, inside the first pass: the second pass starts 10 minutes later.
        ("2027-11-07T05:50Z", ["06:00", "06:20", "06:40", "07:00"]),
        # From 01:10 EST, inside the second pass.
        ("2027-11-07T06:10Z", ["06:20", "06:40", "07:00"]),
    ],
)
def test_hour_wildcard_steps_follow_elapsed_time_through_fall_back(after, expected):
    got = cron_preview("*/20 * * * *", NY, after, len(expected))
    assert got == [utc(f"2027-11-07T{hhmm}Z") for hhmm in expected]


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ("2027-11-07T04:30Z", ["2027-11-07T05:00Z", "2027-11-07T06:00Z", "2027-11-07T07:00Z"]),  # 00:30 EDT
        # 01:30 EDT: no 01:xx wall time is left in the first pass, but 01:00 EST still is ahead.
        ("2027-11-07T05:30Z", ["2027-11-07T06:00Z", "2027-11-07T07:00Z", "2027-11-07T08:00Z"]),
    ],
)
def test_hourly_nickname_follows_elapsed_time(after, expected):
    assert cron_preview("@hourly", NY, after, 3) == utcs(*expected)


def test_daily_nickname_is_midnight_local():
    got = cron_preview("@daily", SYD, "2027-01-01T00:00Z", 2)
    assert got == utcs("2027-01-01T13:00Z", "2027-01-02T13:00Z")  # midnight AEDT (+11)


@pytest.mark.parametrize("expr", ["30 * * * *", "*/20 * * * *", "30 1 * * *", "15,45 1-3 * * *", "*/30 30 2 * * *"])
@pytest.mark.parametrize(
    ("tz", "start"), [(NY, "2027-11-06T20:00Z"), (NY, "2027-03-13T20:00Z"), (SYD, "2027-04-03T06:00Z")]
)
def test_chained_next_fire_after_reproduces_preview(expr, tz, start):
    # The scheduler calls next_fire_after on each fire time; it must walk the same sequence.
    schedule = Schedule.cron_expr(expr, tz)
    expected = preview(schedule, utc(start), 12)
    walked, at = [], utc(start)
    for _ in range(12):
        at = next_fire_after(schedule, at)
        walked.append(at)
    assert walked == expected
    assert all(a < b for a, b in zip(expected, expected[1:], strict=False))


# -- cron: seconds and parsing -----------------------------------------------------------------


def test_six_field_seconds_first_fires_four_times_a_minute():
    got = cron_preview("*/15 * * * * *", "UTC", "2026-12-31T23:59:59Z", 5)
    assert got == utcs(
        "2027-01-01T00:00:00Z", "2027-01-01T00:00:15Z", "2027-01-01T00:00:30Z", "2027-01-01T00:00:45Z",
        "2027-01-01T00:01:00Z",
    )


def test_after_with_microseconds_is_not_rounded_down():
    got = cron_preview("*/15 * * * * *", "UTC", "2027-01-01T00:00:00.500000Z", 1)
    assert got == utcs("2027-01-01T00:00:15Z")


def test_day_of_week_and_names():
    # 1 Jan 2027 is a Friday; mon-fri at 09:00 UTC.
    got = cron_preview("0 9 * * mon-fri", "UTC", "2027-01-01T10:00Z", 3)
    assert got == utcs("2027-01-04T09:00Z", "2027-01-05T09:00Z", "2027-01-06T09:00Z")


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # Both day fields restricted: either may match (Mondays, and the 15th, a Friday).
        ("0 0 15 * mon", ["2027-01-04T00:00Z", "2027-01-11T00:00Z", "2027-01-15T00:00Z"]),
        # Day-of-month starts with "*": Vixie cron ANDs them; 1 Feb, 1 Mar and 31 May 2027 are Mondays.
        ("0 0 */15 * mon", ["2027-02-01T00:00Z", "2027-03-01T00:00Z", "2027-05-31T00:00Z"]),
    ],
)
def test_day_of_month_and_day_of_week_combine_like_vixie_cron(expr, expected):
    assert cron_preview(expr, "UTC", "2027-01-01T00:00Z", 3) == utcs(*expected)


def test_seven_is_sunday():
    got = cron_preview("0 0 * * 7", "UTC", "2027-01-01T00:00Z", 1)
    assert got == utcs("2027-01-03T00:00Z")  # the first Sunday of 2027


def test_a_minute_or_hour_field_beginning_with_a_star_makes_a_wildcard_expression():
    """Debian's entry.c: MIN_STAR / HR_STAR from the first character of those fields."""
    for wildcard in ("30 * * * *", "30 */2 * * *", "*/7 2 * * *", "*/20 1,2 * * SUN", "0 30 * * * *"):
        assert parse_cron(wildcard).is_wildcard, wildcard
    for fixed in ("30 2 * * *", "15,45 1-3 * * *", "*/30 30 2 * * *", "0 0 1 1 *"):
        assert not parse_cron(fixed).is_wildcard, fixed


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected"),
    [
        # Found by comparing with Debian cron: a stepped minute or hour follows elapsed time.
        (  # both passes of the repeated hour fire
            "*/20 1,2 * * SUN", "Europe/London", "2027-10-30T21:28Z",
            ["2027-10-31T00:00Z", "2027-10-31T00:20Z", "2027-10-31T00:40Z", "2027-10-31T01:00Z",
             "2027-10-31T01:20Z", "2027-10-31T01:40Z", "2027-10-31T02:00Z"],
        ),
        (  # nothing fires for minutes inside the gap
            "*/7 2 * * *", NY, "2027-03-14T00:55Z", ["2027-03-15T06:00Z"],
        ),
        (  # the stepped hour's 02:00 falls in the gap: skipped, not moved to 03:00 EDT
            "0 */2 * * *", NY, "2027-03-14T04:00Z",
            ["2027-03-14T05:00Z", "2027-03-14T08:00Z", "2027-03-14T10:00Z", "2027-03-14T12:00Z",
             "2027-03-14T14:00Z", "2027-03-14T16:00Z"],
        ),
        (  # */1 is a wildcard hour: 01:30 fires in both passes of the fall-back
            "30 */1 * * *", NY, "2027-11-07T04:00Z",
            ["2027-11-07T04:30Z", "2027-11-07T05:30Z", "2027-11-07T06:30Z", "2027-11-07T07:30Z"],
        ),
    ],
)
def test_wildcard_minute_or_hour_follows_elapsed_time_like_debian(expr, tz, after, expected):
    assert cron_preview(expr, tz, after, len(expected)) == utcs(*expected)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("* * * *", "expected 5 fields (min hour dom month dow) or 6 with seconds first, got 4"),
        ("* * * * * * *", "got 7"),
        ("", "got 0"),
        ("0 25 * * *", "field 'hour' out of range: 25 (0-23)"),
        ("60 * * * *", "field 'minute' out of range: 60 (0-59)"),
        ("60 0 0 * * *", "field 'second' out of range: 60 (0-59)"),
        ("0 0 32 * *", "field 'day_of_month' out of range: 32 (1-31)"),
        ("0 0 0 * *", "field 'day_of_month' out of range: 0 (1-31)"),
        ("0 0 * 13 *", "field 'month' out of range: 13 (1-12)"),
        ("0 0 * * 8", "field 'day_of_week' out of range: 8 (0-7)"),
        ("x * * * *", "field 'minute' has an unknown value: 'x' (0-59)"),
        ("0 0 L * *", "field 'day_of_month' has an unknown value: 'L' (1-31)"),
        ("0 5-2 * * *", "field 'hour' has a backwards range: '5-2' (0-23)"),
        ("*/0 * * * *", "field 'minute' has a bad step: 0 (1-59)"),
        ("0 0 ? * *", "field 'day_of_month' is not understood: '?' (1-31)"),
        ("0 0 30 2 *", "day_of_month '30' never occurs in month '2'"),
        ("@reboot", "unsupported nickname '@reboot'"),
    ],
)
def test_parse_cron_rejects_with_field_and_range(expr, message):
    with pytest.raises(ScheduleError) as info:
        parse_cron(expr)
    assert info.value.field == "cron"
    assert message in info.value.problem


# -- time zones --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["Mars/Olympus", "EST", "PST", "CET", "EDT", "MST", "EET", "Japan", "", "America", "posix/America/New_York"],
)
def test_zone_rejects_unknown_names_and_abbreviations(name):
    with pytest.raises(UnknownTimeZone) as info:
        zone(name)
    assert info.value.field == "timezone"
    assert repr(name) in info.value.problem


def test_zone_rejects_tzdata_legacy_abbreviation_even_though_a_file_exists():
    with pytest.raises(UnknownTimeZone, match="abbreviations like 'EST' are ambiguous"):
        zone("EST")


@pytest.mark.parametrize("name", ["UTC", "Etc/UTC", NY, SYD, LON])
def test_zone_accepts_iana_names(name):
    assert zone(name).key == name


def test_local_time_marks_second_pass_with_fold():
    first, second = local_time(utc("2027-11-07T05:30Z"), NY), local_time(utc("2027-11-07T06:30Z"), NY)
    assert (first.hour, first.minute, first.fold, first.utcoffset()) == (1, 30, 0, timedelta(hours=-4))
    assert (second.hour, second.minute, second.fold, second.utcoffset()) == (1, 30, 1, timedelta(hours=-5))


# -- parse_at ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2027-03-14T07:00:00Z", "2027-03-14T07:00:00Z"),
        ("2027-03-14T02:00:00-05:00", "2027-03-14T07:00:00Z"),
        ("2027-03-14T18:30:00+11:30", "2027-03-14T07:00:00Z"),
        ("2027-03-14t07:00:00.250z", "2027-03-14T07:00:00.250000Z"),
    ],
)
def test_parse_at_returns_utc(text, expected):
    got = parse_at(text)
    assert got == utc(expected)
    assert got.utcoffset() == timedelta(0)


def test_parse_at_without_offset_is_rejected():
    with pytest.raises(ScheduleError) as info:
        parse_at("2027-03-14T07:00:00")
    assert info.value.field == "at"
    assert info.value.problem == "'2027-03-14T07:00:00' has no offset; write e.g. 2027-03-14T07:00:00Z"


@pytest.mark.parametrize("text", ["tomorrow", "2027-03-14", "20270314T070000Z", "2027-02-30T00:00:00Z"])
def test_parse_at_rejects_non_rfc3339(text):
    with pytest.raises(ScheduleError) as info:
        parse_at(text)
    assert info.value.field == "at"


# -- interval ----------------------------------------------------------------------------------

ANCHOR = utc("2027-01-01T00:00Z")


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ("2026-12-31T00:00Z", "2027-01-01T00:00Z"),  # before the anchor: the anchor itself
        ("2027-01-01T00:00Z", "2027-01-01T01:30Z"),  # on the anchor: strictly after
        ("2027-01-01T04:00Z", "2027-01-01T04:30Z"),
        ("2027-01-01T04:30Z", "2027-01-01T06:00Z"),  # on a fire time: the next one
    ],
)
def test_interval_next_fire_is_anchor_plus_multiple_of_every(after, expected):
    schedule = Schedule.interval(timedelta(minutes=90), anchor=ANCHOR)
    assert next_fire_after(schedule, utc(after)) == utc(expected)


def test_interval_arithmetic_is_exact_over_decades():
    # 30 * 365 days = 946,080,000 s; in 100 ms steps that is an exact multiple, so the next fire
    # is 100 ms later to the microsecond.
    schedule = Schedule.interval(timedelta(milliseconds=100), anchor=ANCHOR)
    after = ANCHOR + timedelta(days=30 * 365)
    assert next_fire_after(schedule, after) == after + timedelta(microseconds=100_000)
    # 1/3-ish seconds: 333,333 us; 3 steps = 999,999 us after the anchor.
    odd = Schedule.interval(timedelta(microseconds=333_333), anchor=ANCHOR)
    assert next_fire_after(odd, ANCHOR + timedelta(microseconds=999_998)) == ANCHOR + timedelta(microseconds=999_999)


def test_interval_anchor_in_other_offset_gives_utc():
    anchor = datetime(2027, 1, 1, 9, 0, tzinfo=timezone(timedelta(hours=9)))  # 00:00Z
    schedule = Schedule.interval(timedelta(hours=1), anchor=anchor)
    got = next_fire_after(schedule, utc("2027-01-01T00:30Z"))
    assert got == utc("2027-01-01T01:00Z")
    assert got.tzinfo == UTC


def test_interval_without_anchor_cannot_compute_next_fire():
    with pytest.raises(ValueError, match="anchor"):
        next_fire_after(Schedule.interval(timedelta(minutes=5)), ANCHOR)


def test_interval_preview():
    schedule = Schedule.interval(timedelta(minutes=90), anchor=ANCHOR)
    got = preview(schedule, utc("2027-01-01T01:00Z"), 3)
    assert got == utcs("2027-01-01T01:30Z", "2027-01-01T03:00Z", "2027-01-01T04:30Z")


# -- first_fire, next_fire_after and preview per kind ------------------------------------------

CREATED = utc("2027-01-01T10:00Z")


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        (Schedule.now(), "2027-01-01T10:00Z"),
        (Schedule.at_instant(utc("2027-06-01T12:00Z")), "2027-06-01T12:00Z"),
        (Schedule.at_instant(utc("2026-06-01T12:00Z")), "2026-06-01T12:00Z"),  # past: misfire decides
        (Schedule.cron_expr("0 * * * *"), "2027-01-01T11:00Z"),  # creation on a fire time: the next
        (Schedule.cron_expr("0 9 * * *", NY), "2027-01-01T14:00Z"),  # 09:00 EST
        (Schedule.interval(timedelta(minutes=10)), "2027-01-01T10:10Z"),  # anchored at creation
        (Schedule.interval(timedelta(minutes=10), anchor=CREATED), "2027-01-01T10:10Z"),
        (Schedule.interval(timedelta(minutes=10), anchor=utc("2027-01-01T12:00Z")), "2027-01-01T12:00Z"),
        (Schedule.interval(timedelta(minutes=10), anchor=utc("2027-01-01T09:55Z")), "2027-01-01T10:05Z"),
    ],
)
def test_first_fire_per_kind(schedule, expected):
    assert first_fire(schedule, CREATED) == utc(expected)


@pytest.mark.parametrize("schedule", [Schedule.now(), Schedule.at_instant(utc("2027-06-01T12:00Z"))])
def test_next_fire_after_is_none_for_one_shots(schedule):
    assert next_fire_after(schedule, CREATED) is None


def test_preview_of_at_is_its_instant_only_while_in_the_future():
    schedule = Schedule.at_instant(utc("2027-06-01T12:00Z"))
    assert preview(schedule, CREATED, 5) == utcs("2027-06-01T12:00Z")
    assert preview(schedule, utc("2027-06-01T12:00Z"), 5) == []


def test_preview_of_now_is_empty():
    assert preview(Schedule.now(), CREATED, 3) == []


def test_naive_after_is_a_programming_error():
    with pytest.raises(ValueError, match="timezone-aware"):
        next_fire_after(Schedule.cron_expr("* * * * *"), datetime(2027, 1, 1))


# -- validate_schedule -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule.now(),
        Schedule.at_instant(CREATED),
        Schedule.cron_expr("*/15 * * * * *", SYD),
        Schedule.interval(timedelta(milliseconds=100)),
        Schedule.interval(timedelta(hours=1), anchor=CREATED),
    ],
)
def test_validate_accepts_well_formed_schedules(schedule):
    validate_schedule(schedule)


@pytest.mark.parametrize(
    ("schedule", "field", "message"),
    [
        (Schedule(kind=ScheduleKind.NOW, cron="* * * * *"), "cron", "must not be set for a now schedule"),
        (Schedule(kind=ScheduleKind.NOW, timezone=NY), "timezone", "only cron schedules take a time zone"),
        (Schedule(kind=ScheduleKind.AT), "at", "is required"),
        (Schedule.at_instant(datetime(2027, 3, 14, 7)), "at", "has no offset; write e.g. 2027-03-14T07:00:00Z"),
        (Schedule(kind=ScheduleKind.AT, at=CREATED, every=timedelta(1)), "every", "must not be set"),
        (Schedule(kind=ScheduleKind.CRON), "cron", "is required"),
        (Schedule.cron_expr("0 25 * * *"), "cron", "field 'hour' out of range: 25 (0-23)"),
        (Schedule.cron_expr("0 2 * * *", "Mars/Olympus"), "timezone", "unknown time zone 'Mars/Olympus'"),
        (Schedule.cron_expr("0 2 * * *", "EST"), "timezone", "unknown time zone 'EST'"),
        (Schedule(kind=ScheduleKind.INTERVAL), "every", "is required"),
        (Schedule.interval(timedelta(milliseconds=99)), "every", "too short (at least 0.1 s)"),
        (Schedule.interval(timedelta(minutes=1), anchor=datetime(2027, 1, 1)), "anchor", "has no offset"),
        (Schedule(kind="hourly"), "kind", "unknown schedule kind 'hourly'"),  # type: ignore[arg-type]
    ],
)
def test_validate_rejects_naming_the_field(schedule, field, message):
    with pytest.raises(ScheduleError) as info:
        validate_schedule(schedule)
    assert info.value.field == field
    assert message in info.value.problem


# -- why a fire time moved ---------------------------------------------------------------------


def notes_of(expr: str, tz: str, after: str, count: int) -> list[str | None]:
    schedule = Schedule.cron_expr(expr, tz)
    return fire_notes(schedule, preview(schedule, utc(after), count), utc(after))


def test_notes_say_what_a_transition_did_to_each_fire_time():
    moved, plain = notes_of("30 2 * * *", NY, "2027-03-13T12:00Z", 2)
    assert moved is not None and moved.startswith("moved:") and "from 02:00 to 03:00" in moved and plain is None
    before_gap, after_gap = notes_of("*/30 * * * *", NY, "2027-03-14T06:10Z", 2)
    assert before_gap is None
    assert after_gap == "skipped 02:00, 02:30: inside the gap when clocks jumped from 02:00 to 03:00"
    first, *_, second = notes_of("*/20 1,2 * * SUN", LON, "2027-10-30T23:50Z", 4)
    assert first == "first pass of the repeated 01:00; it fires again in the second"
    assert second == "second pass of the repeated 01:00 (clocks went back)"
    assert notes_of("30 1 * * *", NY, "2027-11-06T12:00Z", 1) == [
        "first pass of the repeated 01:30; a fixed-time expression does not fire in the second"
    ]
    assert notes_of("0 3 * * *", "UTC", "2027-01-01T00:00Z", 3) == [None, None, None]
    assert fire_notes(Schedule.interval(timedelta(hours=1)), [utc("2027-01-01T00:00Z")], utc("2026-12-31T23:00Z")) == [None]
