"""Bounded maps of what the writer looked up in the file, kept between batches (a miss only costs a read)."""

from __future__ import annotations

MEMO_ENTRIES = 20_000  # entries of one remembered lookup before it starts over


def remember(memo: dict, found: dict) -> None:
    """Add lookups to a remembered map, starting it over past MEMO_ENTRIES (a miss only costs a read)."""
    if len(memo) + len(found) > MEMO_ENTRIES:
        memo.clear()
    memo.update(found)
