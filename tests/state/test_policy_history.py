"""Which kept bundle version governs a decision type at an instant."""

from __future__ import annotations

from datetime import datetime, timezone

from state.policy_history import governing


def at(month: int, day: int = 1) -> datetime:
    return datetime(2026, month, day, tzinfo=timezone.utc)


# (bundle, version, effective_at, body of the decision type in that version or None)
CREDIT = [("credit", 1, at(1), "v1"), ("credit", 2, at(6), "v2"), ("credit", 3, at(12), "v3")]


def test_the_highest_version_in_effect_governs_and_knows_when_the_next_takes_over():
    found = governing(CREDIT, at(8))
    assert (found.version, found.body, found.superseded_at) == (2, "v2", at(12))
    assert governing(CREDIT, at(6)).version == 2                 # effective_at is inclusive
    assert governing(CREDIT, at(12, 2)).superseded_at is None
    assert governing(CREDIT, None).version == 3                  # no time: the latest


def test_a_later_version_effective_earlier_supersedes_one_not_yet_in_effect():
    rows = CREDIT + [("credit", 4, at(9), "v4")]
    assert (governing(rows, at(8)).version, governing(rows, at(8)).superseded_at) == (2, at(9))
    assert governing(rows, at(12, 15)).version == 4              # v3 never governs: v4 outranks it


def test_before_any_version_the_earliest_future_one_is_returned_to_be_refused():
    found = governing(CREDIT, datetime(2025, 6, 1, tzinfo=timezone.utc))
    assert (found.version, found.effective_at, found.superseded_at) == (1, at(1), None)


def test_a_decision_type_retired_by_the_version_in_effect_is_not_governed():
    rows = [("credit", 1, at(1), "v1"), ("credit", 2, at(6), None)]
    assert governing(rows, at(3)).superseded_at == at(6)
    assert governing(rows, at(7)) is None
    assert governing([], at(7)) is None


def test_a_decision_type_rehomed_to_another_bundle_follows_the_newer_version():
    rows = [("credit", 1, at(1), "old"), ("credit", 2, at(6), None), ("lending", 1, at(7), "new")]
    assert governing(rows, at(3)).bundle_id == "credit"
    assert governing(rows, at(6, 15)).effective_at == at(7)   # not yet effective there: refused
    assert governing(rows, at(8)).bundle_id == "lending"
