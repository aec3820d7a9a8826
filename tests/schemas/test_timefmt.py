"""Instants and durations at the edges of what Python can represent."""

from __future__ import annotations

from datetime import timedelta

import pytest

from schemas.timefmt import add_or_none, parse_duration, parse_instant


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-01:00"])
def test_instants_that_leave_the_range_in_utc_are_value_errors(text):
    with pytest.raises(ValueError) as err:
        parse_instant(text)
    assert "0001-01-01T00:00:00Z..9999-12-31T23:59:59Z" in str(err.value) and text not in str(err.value)


def test_the_ends_of_the_range_parse():
    assert parse_instant("9999-12-31T23:59:59Z").year == 9999
    assert parse_instant("0001-01-01T00:00:00Z").year == 1


def test_durations_past_timedelta_are_value_errors_and_sums_past_the_end_are_none():
    with pytest.raises(ValueError):
        parse_duration("P9999999999D")
    last = parse_instant("9999-12-31T23:59:59Z")
    assert add_or_none(last, timedelta(seconds=1)) is None
    assert add_or_none(last, timedelta(0)) == last
