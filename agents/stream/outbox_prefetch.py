"""The records due as the last apply job read them after its commit, for the flush it kicks to send at once."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from state.local_state import LocalState

log = logging.getLogger(__name__)

Row = tuple[int, str, bytes | None, bytes]  # (seq, topic, key, value)


@dataclass(frozen=True, slots=True)
class Prefetched:
    """One read of the records due, made on the writer thread."""

    queued: int
    """`Outbox.queued` then: records queued since come after the last of `rows`, and are not among them."""
    mark: int
    """How many records had been acknowledged or refused when the read began (see `OutboxPrefetch.gone`)."""
    promoted: int
    """`Outbox.promoted` then: a standby record promoted since may come before the last of `rows`."""
    rebases: int
    """`Store.rebases` then: a rebase promotes standby records too."""
    rows: list[Row]
    """The records due, in sequence order."""


class OutboxPrefetch:
    """Reads the records due last thing in each apply job, so that the flush it kicks needs no writer read.

    Read in a writer job of its own, that read queued behind the next input batch: under 1,000
    events/s the writer's announcements waited another 100-300 ms before they were sent. A record
    due leaves the outbox only once this worker's producer had it acknowledged or refused (both
    are reported to `gone`), and a record comes due before older ones only when a standby record
    is promoted or the file is rebased: so the records read, less those gone since, are exactly
    what a read now would find up to the last of them, unless one of those two happened (then
    the flush reads the outbox as before).
    """

    def __init__(self, state: LocalState, read_rows: int) -> None:
        self.state = state
        self.read_rows = read_rows
        self._last: Prefetched | None = None
        self._queued = -1  # `Outbox.queued` at the last read: unchanged, nothing new is due
        self._lock = threading.Lock()  # the loop adds to `_gone`, the writer's read marks it
        self._gone: list[int] = []  # sequence numbers acknowledged or refused since number `_gone_from` of them
        self._gone_from = 0
        self.counts = {"used": 0, "passed_over": 0, "failed": 0}  # for /healthz

    def read(self) -> None:
        """Read what is due now (on the writer thread, after the apply job committed); never raises."""
        outbox = self.state.outbox
        if outbox.queued == self._queued:
            self._last = None  # nothing queued since the last read: a flush reads what that one left
            return
        self._queued = outbox.queued
        with self._lock:  # before the read: a record acknowledged while it runs counts as gone
            self._gone_from += len(self._gone)
            self._gone = []
            mark = self._gone_from
        try:
            self._last = Prefetched(outbox.queued, mark, outbox.promoted, self.state.store.rebases,
                                    outbox.pending(self.read_rows, None))
        except Exception:  # noqa: BLE001 - the batch is committed: the flush reads the outbox itself instead
            self._last = None
            self.counts["failed"] += 1
            if self.counts["failed"] == 1:
                log.exception("reading the outbox after an apply batch failed; flushes read it themselves")

    def gone(self, seqs: list[int]) -> None:
        """Records the producer had acknowledged or refused: no longer due, whatever a read before found."""
        if seqs:
            with self._lock:
                self._gone.extend(seqs)

    def due(self) -> bool | None:
        """Whether a record is due, from the last read (None: unknown, read the outbox)."""
        fetched = self._last
        rows = self._still_due(fetched)
        if rows is None or (not rows and fetched.queued != self.state.outbox.queued):
            return None
        return bool(rows)

    def take(self) -> tuple[list[Row], bool] | None:
        """The records of the last read still due, once, and whether they are all that is due (nothing queued
        since); None: read the outbox (nothing read since the last take, or what was may not be all up to its
        last record, or nothing is left of it and more was queued)."""
        fetched, self._last = self._last, None
        if fetched is None:
            return None
        rows = self._still_due(fetched)
        complete = fetched.queued == self.state.outbox.queued
        if rows is None or (not rows and not complete):
            self.counts["passed_over"] += 1
            return None
        self.counts["used"] += 1
        return rows, complete

    def _still_due(self, fetched: Prefetched | None) -> list[Row] | None:
        """The records read and not gone since; None if they may not be all that is due up to the last of them."""
        outbox = self.state.outbox
        if fetched is None or fetched.promoted != outbox.promoted or fetched.rebases != self.state.store.rebases:
            return None
        with self._lock:
            if fetched.mark < self._gone_from:  # read before the last read: its marks are gone
                return None
            gone = set(self._gone[fetched.mark - self._gone_from:])
        gone.update(outbox.acked.current())
        return [row for row in fetched.rows if row[0] not in gone] if gone else fetched.rows
