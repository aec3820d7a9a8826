"""The rule that orders a MySQL change without a version column against the stored row, on its own."""

from __future__ import annotations

from state.log_order import at_or_after, newer

TICK = 1_788_080_400_000
POINT = "mysql-bin.000004:157"


def test_binlog_positions_compare_by_file_number_then_offset():
    assert at_or_after("mysql-bin.1000000:4", "mysql-bin.999999:9000") is True  # not as text
    assert at_or_after("mysql-bin.000005:4", POINT) is True
    assert at_or_after(POINT, POINT) is True
    assert at_or_after("mysql-bin.000004:156", POINT) is False
    assert at_or_after("mysql-bin.000003:9000", POINT) is False
    assert at_or_after("binlog.000005:4", POINT) is None  # another server's binlog name
    assert at_or_after("mysql-bin:4", POINT) is None


def test_positions_decide_only_for_a_streamed_change_over_a_snapshot_row():
    assert newer(TICK - 30_000, "mysql-bin.000004:900", False, TICK, POINT)        # committed during the snapshot
    assert not newer(TICK, "mysql-bin.000004:120", False, TICK, POINT)            # before the point, same tick
    assert newer(TICK + 1, "mysql-bin.000001:4", False, TICK, POINT)              # a reset since: later tick
    assert not newer(TICK - 30_000, "mysql-bin.000004:900", False, TICK, None)   # over a streamed row: ticks
    assert newer(TICK, "mysql-bin.000004:900", False, TICK, None)                 # the same tick: log order
    assert newer(TICK + 60_000, "mysql-bin.000001:157", True, TICK, POINT)        # a later snapshot, lower point
    assert not newer(TICK - 1, "mysql-bin.000009:157", True, TICK, POINT)         # an earlier read, higher point
    assert not newer(TICK - 30_000, None, False, TICK, POINT)                     # no position: ticks
