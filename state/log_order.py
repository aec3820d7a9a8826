"""Whether a log-ordered (MySQL, no version column) change is newer than the stored row of the same resource."""

from __future__ import annotations


def newer(tick: int, position: str | None, snapshot: bool, stored_tick: int, stored_point: str | None) -> bool:
    """Whether a change at commit `tick` and binlog `position` (a `snapshot` read or not) replaces the stored row.

    `stored_tick` is the stored row's commit tick (a snapshot row's: when its table's read began);
    `stored_point` the binlog position a stored snapshot row was read at, else None.

    Commit ticks order changes, and one at the stored tick is a later one, read in log order. A
    stored snapshot row is the row as of its point, but its tick is later: a change committed
    after the point and before the read streams afterwards with an earlier tick, and is newer.
    So a streamed change over a snapshot row is judged by position when both are in one binlog
    (one file name): at or after the point it is newer; before it, older unless its tick is
    later (a binlog reset since restarts the positions). Snapshot rows themselves are judged by
    their ticks: a later snapshot (after a reset, at a lower position) replaces an earlier one.
    """
    if stored_point is not None and not snapshot and position is not None:
        after = at_or_after(position, stored_point)
        if after is not None:
            return after or tick > stored_tick
    return tick >= stored_tick


def at_or_after(position: str, point: str) -> bool | None:
    """Whether binlog `position` is at or after `point` (`<file>:<pos>`); None when not of one binlog."""
    here, there = _parse(position), _parse(point)
    if here is None or there is None or here[0] != there[0]:
        return None
    return here[1:] >= there[1:]


def _parse(position: str) -> tuple[str, int, int] | None:
    """(base name, file number, offset) of `mysql-bin.000042:154`; None for anything else."""
    file, _, offset = position.rpartition(":")
    base, _, number = file.rpartition(".")
    if not (base and number.isdigit() and offset.isdigit()):
        return None
    # Numbers, not text: the file after mysql-bin.999999 is mysql-bin.1000000.
    return base, int(number), int(offset)
