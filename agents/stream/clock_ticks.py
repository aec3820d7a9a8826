"""Clock ticks: event time moves forward per clock partition, within a bound of the time each tick was published."""

from __future__ import annotations

from datetime import datetime, timedelta

from schemas.errors import InvalidEvent
from schemas.records import ClockTick


def play_tick(tick: ClockTick, partition: int, written_at: datetime, clocks: dict[int, datetime],
              ticked: dict[int, datetime], max_clock_jump: timedelta | None) -> list[str] | InvalidEvent | None:
    """Play a tick over the clock partitions' last ticks: [] when it moves its partition, None for a repeat."""
    now = max(clocks.values(), default=None)
    # One wild tick must not move event time for good (later correct ticks would all regress).
    if now is not None and max_clock_jump is not None and tick.now - now > max_clock_jump:
        return InvalidEvent("clock_jump", f"tick is more than {_iso(max_clock_jump)} past the "
                            "current now; fix the clock producer, or raise FRESHPLAN_MAX_CLOCK_JUMP")
    # Nor may steps each under the bound add up to years: event time leads the record's own
    # (broker) time by at most the bound, which a replay of the same records judges alike.
    if max_clock_jump is not None and tick.now - written_at > max_clock_jump:
        return InvalidEvent("clock_jump", f"tick is more than {_iso(max_clock_jump)} ahead of the time "
                            "it was published; fix the clock producer, or raise FRESHPLAN_MAX_CLOCK_JUMP")
    last = clocks.get(partition)
    if last is not None and tick.now <= last:
        if tick.now == last:
            return None
        return InvalidEvent("clock_regression", "now is older than the last tick on clock partition "
                            f"{partition}; event time only moves forward")
    clocks[partition] = ticked[partition] = tick.now
    return []


def _iso(span: timedelta) -> str:
    """A span as an ISO 8601 duration of days and seconds."""
    return f"P{span.days}D" + (f"T{span.seconds}S" if span.seconds else "")
