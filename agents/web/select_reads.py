"""The select path's reads of the state file, on a thread and cursor of their own: never on the HTTP loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agents.stream.read_thread import ReadThread

if TYPE_CHECKING:
    from state.local_state import LocalState

THREAD_NAME = "freshplan-select"


class SelectReads(ReadThread):
    """Runs a select's cache-miss lookup (entity names, the key's fresh plan, the token's position) on one thread.

    The loop also carries the replica's fetches, the publisher's sends and every other request.
    A DuckDB read there takes what the writer leaves it: under 1,000 events/s such reads held the
    loop up to 5 s (cached select p99 1.3 s, and the announcements of the events behind them
    waited as long). Memory hits stay on the loop.
    """

    def __init__(self, state: "LocalState") -> None:
        super().__init__(state, THREAD_NAME)
