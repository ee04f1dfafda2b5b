"""Cron schedules: next fire times, the Vixie day rule, DST, and what is refused.

Every expected instant is written out in UTC, worked out by hand from the zone
rules (zdump): America/Los_Angeles jumps 02:00 PST -> 03:00 PDT at 10:00Z on
2025-03-09 and falls back 02:00 PDT -> 01:00 PST at 09:00Z on 2025-11-02;
Europe/Berlin jumps 02:00 CET -> 03:00 CEST at 01:00Z on 2025-03-30 and falls
back 03:00 CEST -> 02:00 CET at 01:00Z on 2025-10-26; Australia/Lord_Howe jumps
half an hour, 02:00 -> 02:30, at 15:30Z on 2025-10-04.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from engine.base.cron import Cron

LA = "America/Los_Angeles"
BERLIN = "Europe/Berlin"


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


NEXT_FIRES = [
    # expression, zone, now, the next fire time
    pytest.param(
        "* * * * *", "UTC", utc(2025, 6, 6, 12, 0, 30), utc(2025, 6, 6, 12, 1), id="every-minute"
    ),
    pytest.param(
        "* * * * *", "UTC", utc(2025, 6, 6, 12), utc(2025, 6, 6, 12, 1), id="strictly-after"
    ),
    pytest.param("* * * * *", "UTC", utc(2025, 12, 31, 23, 59), utc(2026, 1, 1), id="new-year"),
    # Friday 2025-06-06 09:00 PDT is 16:00Z; the next weekday is Monday the 9th.
    pytest.param("0 9 * * MON-FRI", LA, utc(2025, 6, 6, 16), utc(2025, 6, 9, 16), id="weekend"),
    pytest.param("0 9 * * mon-fri", LA, utc(2025, 6, 7, 20), utc(2025, 6, 9, 16), id="lowercase"),
    pytest.param(
        "0 9 * * MON-FRI", LA, utc(2025, 6, 6, 15, 59), utc(2025, 6, 6, 16), id="same-day"
    ),
    pytest.param("0 0 1 JAN *", "UTC", utc(2025, 6, 6), utc(2026, 1, 1), id="january"),
    pytest.param("0 0 1 JAN-MAR *", "UTC", utc(2025, 1, 1), utc(2025, 2, 1), id="jan-mar"),
    pytest.param("0 0 1 jan-Mar *", "UTC", utc(2025, 3, 1), utc(2026, 1, 1), id="jan-mar-wraps"),
    pytest.param("*/15 * * * *", "UTC", utc(2025, 6, 6, 12, 7), utc(2025, 6, 6, 12, 15), id="*/15"),
    pytest.param(
        "*/15 * * * *", "UTC", utc(2025, 6, 6, 12, 45), utc(2025, 6, 6, 13), id="*/15-hour"
    ),
    pytest.param(
        "5-20/5 * * * *", "UTC", utc(2025, 6, 6, 12, 6), utc(2025, 6, 6, 12, 10), id="a-b/n"
    ),
    pytest.param(
        "5-20/5 * * * *", "UTC", utc(2025, 6, 6, 12, 20), utc(2025, 6, 6, 13, 5), id="a-b/n-end"
    ),
    pytest.param(
        "10/20 * * * *", "UTC", utc(2025, 6, 6, 12, 30), utc(2025, 6, 6, 12, 50), id="a/n"
    ),
    pytest.param(
        "10/20 * * * *", "UTC", utc(2025, 6, 6, 12, 50), utc(2025, 6, 6, 13, 10), id="a/n-end"
    ),
    pytest.param("0,30 8,17 * * *", "UTC", utc(2025, 6, 6, 8, 30), utc(2025, 6, 6, 17), id="lists"),
    pytest.param(
        "0,30 8,17 * * *", "UTC", utc(2025, 6, 6, 17, 30), utc(2025, 6, 7, 8), id="lists-day"
    ),
    # May 2025: the 13th is a Tuesday; the Fridays are the 2nd, 9th, 16th, 23rd and 30th.
    pytest.param("0 0 13 * FRI", "UTC", utc(2025, 5, 10), utc(2025, 5, 13), id="either-13th"),
    pytest.param("0 0 13 * FRI", "UTC", utc(2025, 5, 13), utc(2025, 5, 16), id="either-friday"),
    pytest.param("0 0 */2 * FRI", "UTC", utc(2025, 5, 1), utc(2025, 5, 9), id="star-step-both"),
    pytest.param("0 0 */2 * FRI", "UTC", utc(2025, 5, 9), utc(2025, 5, 23), id="star-step-odd"),
    pytest.param("0 0 13 * *", "UTC", utc(2025, 5, 10), utc(2025, 5, 13), id="dom-only"),
    pytest.param("0 0 * * FRI", "UTC", utc(2025, 5, 10), utc(2025, 5, 16), id="dow-only"),
    pytest.param("0 0 1 * *", "UTC", utc(2025, 5, 9), utc(2025, 6, 1), id="first-of-month"),
    pytest.param(
        "0 0 30 2 MON", "UTC", utc(2025, 5, 10), utc(2026, 2, 2), id="either-saves-feb-30"
    ),
    pytest.param("0 0 29 2 *", "UTC", utc(2025, 1, 1), utc(2028, 2, 29), id="feb-29"),
    pytest.param("0 0 29 2 *", "UTC", utc(2096, 3, 1), utc(2104, 2, 29), id="feb-29-not-2100"),
    # Sunday 29 February: 2088, then 2128, as 2100 is no leap year; the longest wait there is.
    pytest.param("0 0 29 2 */7", "UTC", utc(2088, 3, 1), utc(2128, 2, 29), id="forty-years"),
    # Wednesday 2025-06-04; Sunday is the 8th.
    pytest.param("0 12 * * 0", "UTC", utc(2025, 6, 4), utc(2025, 6, 8, 12), id="sunday-0"),
    pytest.param("0 12 * * 7", "UTC", utc(2025, 6, 4), utc(2025, 6, 8, 12), id="sunday-7"),
    pytest.param("0 12 * * sun", "UTC", utc(2025, 6, 4), utc(2025, 6, 8, 12), id="sunday-name"),
    pytest.param("0 12 * * 5-7", "UTC", utc(2025, 6, 7, 13), utc(2025, 6, 8, 12), id="range-to-7"),
    # 18:00 in Tokyo on Friday 2025-06-06 is 09:00Z, 02:00 in Los Angeles.
    pytest.param(
        "0 9 * * MON-FRI",
        LA,
        datetime(2025, 6, 6, 18, tzinfo=ZoneInfo("Asia/Tokyo")),
        utc(2025, 6, 6, 16),
        id="now-in-other-zone",
    ),
    # Spring forward, Los Angeles: 02:30 does not exist on 2025-03-09.
    pytest.param("30 2 * * *", LA, utc(2025, 3, 8, 12), utc(2025, 3, 9, 10), id="la-gap-daily"),
    pytest.param("30 2 * * *", LA, utc(2025, 3, 9, 10), utc(2025, 3, 10, 9, 30), id="la-gap-once"),
    pytest.param("*/15 2 * * *", LA, utc(2025, 3, 9, 8), utc(2025, 3, 9, 10), id="la-gap-15"),
    pytest.param("*/15 2 * * *", LA, utc(2025, 3, 9, 10), utc(2025, 3, 10, 9), id="la-gap-15-once"),
    pytest.param("0 3 * * *", LA, utc(2025, 3, 9, 8), utc(2025, 3, 9, 10), id="la-03:00"),
    # Fall back, Los Angeles: 01:00-02:00 happens twice on 2025-11-02.
    pytest.param(
        "30 1 * * *", LA, utc(2025, 11, 1, 12), utc(2025, 11, 2, 8, 30), id="la-fold-first"
    ),
    pytest.param(
        "30 1 * * *", LA, utc(2025, 11, 2, 8, 30), utc(2025, 11, 3, 9, 30), id="la-fold-once"
    ),
    pytest.param(
        "30 2 * * *", LA, utc(2025, 11, 1, 12), utc(2025, 11, 2, 10, 30), id="la-fall-daily"
    ),
    pytest.param(
        "30 2 * * *", LA, utc(2025, 11, 2, 10, 30), utc(2025, 11, 3, 10, 30), id="la-fall-once"
    ),
    pytest.param("*/30 1 * * *", LA, utc(2025, 11, 2, 8, 30), utc(2025, 11, 3, 9), id="la-fold-30"),
    # Now is 01:10 PST, the second pass: nothing more fires that day.
    pytest.param(
        "*/30 1 * * *",
        LA,
        datetime(2025, 11, 2, 1, 10, tzinfo=ZoneInfo(LA), fold=1),
        utc(2025, 11, 3, 9),
        id="la-now-in-second-pass",
    ),
    # Spring forward, Berlin: 02:00-03:00 does not exist on 2025-03-30.
    pytest.param("30 2 * * *", BERLIN, utc(2025, 3, 29, 12), utc(2025, 3, 30, 1), id="berlin-gap"),
    pytest.param(
        "30 2 * * *", BERLIN, utc(2025, 3, 30, 1), utc(2025, 3, 31, 0, 30), id="berlin-gap-once"
    ),
    pytest.param(
        "*/20 2 * * *", BERLIN, utc(2025, 3, 29, 12), utc(2025, 3, 30, 1), id="berlin-gap-20"
    ),
    pytest.param(
        "*/20 2 * * *", BERLIN, utc(2025, 3, 30, 1), utc(2025, 3, 31), id="berlin-gap-20-once"
    ),
    # Fall back, Berlin: 02:00-03:00 happens twice on 2025-10-26.
    pytest.param(
        "30 2 * * *", BERLIN, utc(2025, 10, 25, 12), utc(2025, 10, 26, 0, 30), id="berlin-fold"
    ),
    pytest.param(
        "30 2 * * *",
        BERLIN,
        utc(2025, 10, 26, 0, 30),
        utc(2025, 10, 27, 1, 30),
        id="berlin-fold-once",
    ),
    # Lord Howe Island skips half an hour: 02:00 and 02:15 fire once, at 02:30, as 02:30 does.
    pytest.param(
        "0,15,30 2 * * *",
        "Australia/Lord_Howe",
        utc(2025, 10, 4, 12),
        utc(2025, 10, 4, 15, 30),
        id="half-hour-gap",
    ),
    pytest.param(
        "0,15,30 2 * * *",
        "Australia/Lord_Howe",
        utc(2025, 10, 4, 15, 30),
        utc(2025, 10, 5, 15),
        id="half-hour-gap-once",
    ),
]


@pytest.mark.parametrize(("expression", "zone", "now", "expected"), NEXT_FIRES)
def test_next_fire(expression: str, zone: str, now: datetime, expected: datetime) -> None:
    fire = Cron(expression, zone)(now)
    assert fire == expected
    assert fire.tzinfo is UTC


def run(cron: Cron, start: datetime, end: datetime) -> list[datetime]:
    """Feed each fire time back in as now, as the engine does, until `end`."""
    fires: list[datetime] = []
    now = start
    while (now := cron(now)) < end:
        fires.append(now)
    return fires


DAYS = [
    # expression, zone, local midnight and the next one, the fires between them
    # LA spring: 00:00 and 01:00 PST, then the 02:00 gap and 03:00 PDT are one instant.
    pytest.param(
        "0 * * * *",
        LA,
        utc(2025, 3, 9, 8),
        utc(2025, 3, 10, 7),
        [utc(2025, 3, 9, h) for h in range(8, 24)] + [utc(2025, 3, 10, h) for h in range(7)],
        id="la-spring-hourly",
    ),
    # LA spring: the four quarters of 02:xx collapse into 10:00Z, which 03:00 shares.
    pytest.param(
        "*/15 2,3 * * *",
        LA,
        utc(2025, 3, 9, 8),
        utc(2025, 3, 10, 7),
        [
            utc(2025, 3, 9, 10),  # 02:00, 02:15, 02:30, 02:45 and 03:00 PDT
            utc(2025, 3, 9, 10, 15),
            utc(2025, 3, 9, 10, 30),
            utc(2025, 3, 9, 10, 45),
        ],
        id="la-spring-quarters",
    ),
    # LA autumn: 00:00 and 01:00 PDT, no 01:00 PST, then 02:00 PST onwards.
    pytest.param(
        "0 * * * *",
        LA,
        utc(2025, 11, 2, 7),
        utc(2025, 11, 3, 8),
        [utc(2025, 11, 2, h) for h in (7, 8, *range(10, 24))]
        + [utc(2025, 11, 3, h) for h in range(8)],
        id="la-autumn-hourly",
    ),
    pytest.param(
        "*/30 1 * * *",
        LA,
        utc(2025, 11, 2, 7),
        utc(2025, 11, 3, 8),
        [utc(2025, 11, 2, 8), utc(2025, 11, 2, 8, 30)],
        id="la-autumn-half-hours",
    ),
    # Berlin spring: 00:00 and 01:00 CET, the 02:00 gap and 03:00 CEST at 01:00Z, then CEST.
    pytest.param(
        "0 * * * *",
        BERLIN,
        utc(2025, 3, 29, 23),
        utc(2025, 3, 30, 22),
        [utc(2025, 3, 29, 23)] + [utc(2025, 3, 30, h) for h in range(22)],
        id="berlin-spring-hourly",
    ),
    # Berlin autumn: 00:00-02:00 CEST, no second 02:00 (CET), then 03:00 CET onwards.
    pytest.param(
        "0 * * * *",
        BERLIN,
        utc(2025, 10, 25, 22),
        utc(2025, 10, 26, 23),
        [utc(2025, 10, 25, 22), utc(2025, 10, 25, 23), utc(2025, 10, 26, 0)]
        + [utc(2025, 10, 26, h) for h in range(2, 23)],
        id="berlin-autumn-hourly",
    ),
    pytest.param(
        "*/20 2 * * *",
        BERLIN,
        utc(2025, 10, 25, 22),
        utc(2025, 10, 26, 23),
        [utc(2025, 10, 26, 0), utc(2025, 10, 26, 0, 20), utc(2025, 10, 26, 0, 40)],
        id="berlin-autumn-twenties",
    ),
]


@pytest.mark.parametrize(("expression", "zone", "midnight", "next_midnight", "expected"), DAYS)
def test_whole_dst_day(
    expression: str,
    zone: str,
    midnight: datetime,
    next_midnight: datetime,
    expected: list[datetime],
) -> None:
    # Start a second before local midnight so midnight itself is the first fire.
    start = midnight - timedelta(seconds=1)
    assert run(Cron(expression, zone), start, next_midnight) == expected


INVALID = [
    pytest.param("0 9 ? * MON-FRI *", "UTC", "6 fields", id="quartz-six-fields"),
    pytest.param("0 0 9 * * MON", "UTC", "6 fields", id="seconds-field"),
    pytest.param("0 9 * *", "UTC", "4 fields", id="four-fields"),
    pytest.param("", "UTC", "0 fields", id="empty"),
    pytest.param("0 9 ? * MON", "UTC", "Quartz", id="question-mark"),
    pytest.param("0 0 L * *", "UTC", "Quartz", id="L"),
    pytest.param("0 0 15W * *", "UTC", "Quartz", id="W"),
    pytest.param("0 0 * * FRI#2", "UTC", "Quartz", id="hash"),
    pytest.param("0 0 * * 5L", "UTC", "Quartz", id="last-weekday"),
    pytest.param("61 * * * *", "UTC", "outside 0-59", id="minute-61"),
    pytest.param("* 24 * * *", "UTC", "outside 0-23", id="hour-24"),
    pytest.param("0 0 0 * *", "UTC", "outside 1-31", id="day-0"),
    pytest.param("0 0 * 13 *", "UTC", "outside 1-12", id="month-13"),
    pytest.param("0 0 * * 8", "UTC", "outside 0-7", id="weekday-8"),
    pytest.param("5-1 * * * *", "UTC", "reversed range", id="reversed"),
    pytest.param("0 0 * * FRI-MON", "UTC", "reversed range", id="reversed-names"),
    pytest.param("*/0 * * * *", "UTC", "step", id="step-0"),
    pytest.param("*/ * * * *", "UTC", "step", id="step-empty"),
    pytest.param("0 0 30 2 *", "UTC", "never fire", id="feb-30"),
    pytest.param("0 0 31 4 *", "UTC", "never fire", id="april-31"),
    pytest.param("0 0 31 4,6,9,11 *", "UTC", "never fire", id="short-months-31"),
    pytest.param("0 0 30,31 2 */2", "UTC", "never fire", id="feb-30-star-weekday"),
    pytest.param("@daily", "UTC", "macro", id="macro"),
    pytest.param("@reboot", "UTC", "macro", id="reboot"),
    pytest.param("1,,2 * * * *", "UTC", "empty list item", id="empty-item"),
    pytest.param("1, * * * *", "UTC", "empty list item", id="trailing-comma"),
    pytest.param("MON * * * *", "UTC", "not a number or a name", id="name-in-minutes"),
    pytest.param("1-2-3 * * * *", "UTC", "not a number or a name", id="double-range"),
    pytest.param("0 9 * * *", "Mars/Olympus_Mons", "Mars/Olympus_Mons", id="unknown-zone"),
    pytest.param("0 9 * * *", "", "Time zone", id="empty-zone"),
]


@pytest.mark.parametrize(("expression", "zone", "message"), INVALID)
def test_invalid(expression: str, zone: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        Cron(expression, zone)
    if zone == "UTC":
        assert repr(expression) in str(raised.value)


def test_naive_now_is_rejected() -> None:
    with pytest.raises(ValueError, match="naive"):
        Cron("* * * * *")(datetime(2025, 6, 6, 12))


@pytest.mark.parametrize(
    "expression",
    ["* * * * *", "0 9 * * MON-FRI", "*/15 2 * * *", "30 1 * * *", "0 0 13 * FRI", "0 0 29 2 *"],
)
@pytest.mark.parametrize("zone", ["UTC", LA, BERLIN])
def test_fire_is_aware_utc_and_after_now(expression: str, zone: str) -> None:
    cron = Cron(expression, zone)
    # Every 37 minutes across both 2025 DST weekends of both zones, at odd seconds.
    starts = [utc(2025, 3, 8), utc(2025, 3, 29), utc(2025, 10, 25), utc(2025, 11, 1)]
    for start in starts:
        for step in range(0, 3 * 24 * 60, 37):
            now = start + timedelta(minutes=step, seconds=13)
            fire = cron(now)
            assert fire.tzinfo is UTC
            assert fire > now
            assert (fire.second, fire.microsecond) == (0, 0)


def test_public_surface() -> None:
    cron = Cron("0 9 * * MON-FRI", LA)
    assert (cron.expression, cron.zone) == ("0 9 * * MON-FRI", LA)
    assert repr(cron) == "Cron('0 9 * * MON-FRI', 'America/Los_Angeles')"
    assert Cron("0 9 * * *").zone == "UTC"
    assert cron == Cron("0 9 * * MON-FRI", LA)
    assert hash(cron) == hash(Cron("0 9 * * MON-FRI", LA))
    assert cron != Cron("0 9 * * MON-FRI", BERLIN)
    assert cron != Cron("0 9 * * 1-5", LA)  # the same schedule, written differently
    assert cron != "0 9 * * MON-FRI"
    assert len({cron, Cron("0 9 * * MON-FRI", LA)}) == 1
