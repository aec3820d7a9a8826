"""RFC 3339 instants and ISO 8601 day/time durations, parsed strictly and printed in UTC."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

_DURATION = re.compile(
    r"^P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?$"
)


def parse_instant(text: str) -> datetime:
    """Parse an RFC 3339 timestamp (or a bare date) into an aware UTC datetime."""
    if not isinstance(text, str):
        raise ValueError(f"expected an RFC 3339 timestamp string, got {type(text).__name__}")
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"{text!r} is not an RFC 3339 timestamp such as 2026-08-30T00:00:00Z") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:
        # 0001-01-01T00:00:00+14:00 is a valid text of an instant before year 1 in UTC.
        raise ValueError("the instant lies outside 0001-01-01T00:00:00Z..9999-12-31T23:59:59Z once "
                         "converted to UTC") from None


def format_instant(value: datetime) -> str:
    """Print an aware datetime as RFC 3339 UTC with a Z suffix."""
    text = value.astimezone(timezone.utc).isoformat()
    return text.replace("+00:00", "Z")


def parse_duration(text: str) -> timedelta:
    """Parse an ISO 8601 duration of weeks, days, hours, minutes and seconds (e.g. P400D)."""
    match = _DURATION.match(text or "")
    if not match or text in ("P", "PT"):
        raise ValueError(f"{text!r} is not an ISO 8601 duration such as P400D or PT12H")
    parts = {k: int(v) for k, v in match.groupdict().items() if v}
    try:
        return timedelta(weeks=parts.get("w", 0), days=parts.get("d", 0), hours=parts.get("h", 0),
                         minutes=parts.get("m", 0), seconds=parts.get("s", 0))
    except OverflowError:
        raise ValueError(f"the duration is longer than the longest supported (P{timedelta.max.days}D)") from None


def add_or_none(instant: datetime, span: timedelta) -> datetime | None:
    """`instant + span`, or None when that lies beyond the last representable instant (never)."""
    try:
        return instant + span
    except OverflowError:
        return None


def epoch_seconds(value: datetime) -> int:
    """Whole seconds since the Unix epoch."""
    return int(value.timestamp())
