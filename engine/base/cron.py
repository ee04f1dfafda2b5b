"""Five-field cron schedules read on the wall clock of a time zone.

We wrote this parser rather than use croniter because croniter 7 accepts a sixth
(seconds) field, so a Quartz-style `0 9 ? * MON-FRI *` would mean something else
than its author meant, and it does not raise when built for an expression that can
never fire (`0 0 30 2 *`); both should fail when the workflow is defined, not
when a worker first asks for the next run.

Days follow Debian/Vixie cron: when the day-of-month or the day-of-week field
starts with `*`, a day must match both; when both are restricted, either.
Daylight saving time: a wall time in the spring gap fires once, at the instant
the gap ends; a wall time that occurs twice fires on its first occurrence only.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterator, Mapping
from datetime import MAXYEAR, UTC, date, datetime, time
from typing import NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from engine.base.errors import ConfigurationError, InvalidArgumentError

# The longest wait of a valid expression: Sunday the 29th of February
# (`0 0 29 2 */7`) fires in 2088 and next in 2128, because 2100 is not a leap year.
SEARCH_YEARS = 40  # years
MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"),
        start=1,
    )
}
DAY_NAMES = {
    name: number for number, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))
}
# Quartz extensions (`?`, last `L`, weekday `W`, nth `#`) that five-field cron does not have.
QUARTZ = re.compile(r"\?|LW?|[0-9]*L|[0-9]+W|[0-9A-Z]+#[0-9]+", re.IGNORECASE)
DIGITS = re.compile(r"[0-9]+")
LEAP_YEAR = 2000  # a year whose February has 29 days, to check what can ever fire


class _Field(NamedTuple):
    name: str
    low: int
    high: int
    names: Mapping[str, int]


FIELDS = (
    _Field("minute", 0, 59, {}),
    _Field("hour", 0, 23, {}),
    _Field("day-of-month", 1, 31, {}),
    _Field("month", 1, 12, MONTH_NAMES),
    _Field("day-of-week", 0, 7, DAY_NAMES),
)


def _parse_value(expression: str, field: _Field, text: str) -> int:
    """One number or name, checked against the field's range."""
    if DIGITS.fullmatch(text):
        value = int(text)
    elif text.upper() in field.names:
        return field.names[text.upper()]
    elif QUARTZ.fullmatch(text):
        raise ConfigurationError(
            f"Cron expression {expression!r} uses {text!r} in its {field.name} field, "
            "a Quartz extension (? L W #) that five-field cron does not have."
        )
    else:
        raise ConfigurationError(
            f"Cron expression {expression!r} has {text!r} in its {field.name} field, "
            "which is not a number or a name."
        )
    if not field.low <= value <= field.high:
        raise ConfigurationError(
            f"Cron expression {expression!r} has {value} in its {field.name} field, "
            f"outside {field.low}-{field.high}."
        )
    return value


def _parse_field(expression: str, field: _Field, text: str) -> tuple[int, ...]:
    """The sorted values a field allows: comma lists of `*`, `a`, `a-b`, each with `/n`."""
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise ConfigurationError(
                f"Cron expression {expression!r} has an empty list item in its {field.name} field."
            )
        base, slash, step_text = item.partition("/")
        if base == "*":
            low, high = field.low, field.high
        elif "-" in base:
            first, _, last = base.partition("-")
            low = _parse_value(expression, field, first)
            high = _parse_value(expression, field, last)
            if low > high:
                raise ConfigurationError(
                    f"Cron expression {expression!r} has the reversed range {base!r} "
                    f"in its {field.name} field."
                )
        else:
            low = _parse_value(expression, field, base)
            high = field.high if slash else low  # `a/n` runs from a to the field's end
        step = 1
        if slash:
            if not DIGITS.fullmatch(step_text) or int(step_text) == 0:
                raise ConfigurationError(
                    f"Cron expression {expression!r} has the step {step_text!r} in its "
                    f"{field.name} field; a step must be a whole number of at least 1."
                )
            step = int(step_text)
        values.update(range(low, high + 1, step))
    if field.name == "day-of-week" and 7 in values:
        values = (values - {7}) | {0}  # 7 is Sunday too
    return tuple(sorted(values))


class Cron:
    """A five-field cron schedule read on the wall clock of a time zone."""

    __slots__ = (
        "_days",
        "_either",
        "_expression",
        "_hours",
        "_minutes",
        "_months",
        "_tz",
        "_weekdays",
        "_zone",
    )

    def __init__(self, expression: str, zone: str = "UTC") -> None:
        self._expression = expression
        self._zone = zone
        texts = expression.split()
        if expression.strip().startswith("@"):
            raise ConfigurationError(
                f"Cron expression {expression!r} is a macro, which is not supported; "
                "write the five fields, e.g. '0 0 * * *' for @daily."
            )
        if len(texts) != len(FIELDS):
            raise ConfigurationError(
                f"Cron expression {expression!r} has {len(texts)} fields; it needs exactly five "
                "(minute hour day-of-month month day-of-week), without seconds or year."
            )
        minutes, hours, days, months, weekdays = (
            _parse_field(expression, field, text) for field, text in zip(FIELDS, texts, strict=True)
        )
        self._minutes, self._hours = minutes, hours  # sorted: fire times are tried in order
        self._days, self._months, self._weekdays = (
            frozenset(days),
            frozenset(months),
            frozenset(weekdays),
        )
        # Vixie cron: a day field written with `*` (even `*/2`) narrows; both restricted widen.
        self._either = not texts[2].startswith("*") and not texts[4].startswith("*")
        if not self._either and not any(
            day <= calendar.monthrange(LEAP_YEAR, month)[1] for month in months for day in days
        ):
            raise ConfigurationError(
                f"Cron expression {expression!r} can never fire: none of its days of month "
                "exists in any of its months."
            )
        try:
            self._tz = ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ConfigurationError(f"Time zone {zone!r} is not a known IANA time zone.") from exc

    def __call__(self, now: datetime) -> datetime:
        """The first fire time strictly after `now`, in UTC, so the engine can store it as due."""
        if now.tzinfo is None or now.utcoffset() is None:
            raise ConfigurationError(f"Cron needs an aware datetime for now, and {now!r} is naive.")
        after = now.astimezone(UTC)
        for day in self._matching_days(after.astimezone(self._tz).date()):
            for hour in self._hours:
                # Instants never decrease along the wall clock, so skip hours wholly past.
                if self._instant(day, hour, self._minutes[-1]) <= after:
                    continue
                for minute in self._minutes:
                    fire = self._instant(day, hour, minute)
                    if fire > after:
                        return fire
        raise InvalidArgumentError(f"{self!r} does not fire within {SEARCH_YEARS} years of {now}.")

    def _matching_days(self, start: date) -> Iterator[date]:
        """Local days from `start` that the month and day fields allow, month by month."""
        year, month, first = start.year, start.month, start.day
        while year <= min(start.year + SEARCH_YEARS, MAXYEAR):
            if month in self._months:
                for number in range(first, calendar.monthrange(year, month)[1] + 1):
                    day = date(year, month, number)
                    in_month = number in self._days
                    in_week = (day.weekday() + 1) % 7 in self._weekdays  # cron's Sunday is 0
                    if (in_month or in_week) if self._either else (in_month and in_week):
                        yield day
            year, month, first = year + month // 12, month % 12 + 1, 1

    def _instant(self, day: date, hour: int, minute: int) -> datetime:
        """The UTC instant of a wall time: its first occurrence, or the end of its gap."""
        wall = datetime.combine(day, time(hour, minute))
        instant = wall.replace(tzinfo=self._tz).astimezone(UTC)  # fold=0: the first occurrence
        if instant.astimezone(self._tz).replace(tzinfo=None) == wall:
            return instant
        # The wall time is skipped; the two folds bracket the transition, which we bisect
        # to the second, since the first valid instant after the gap is when it fires.
        other = wall.replace(tzinfo=self._tz, fold=1).astimezone(UTC)
        low, high = sorted((int(instant.timestamp()), int(other.timestamp())))
        while high - low > 1:
            middle = (low + high) // 2
            if datetime.fromtimestamp(middle, self._tz).replace(tzinfo=None) > wall:
                high = middle
            else:
                low = middle
        return datetime.fromtimestamp(high, UTC)

    @property
    def expression(self) -> str:
        """The five fields as written; read-only, since the schedule was parsed from it."""
        return self._expression

    @property
    def zone(self) -> str:
        """The time zone whose wall clock the fields are read on."""
        return self._zone

    def __repr__(self) -> str:
        return f"Cron({self.expression!r}, {self.zone!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cron):
            return NotImplemented
        return (self.expression, self.zone) == (other.expression, other.zone)

    def __hash__(self) -> int:
        return hash((self.expression, self.zone))
