"""The records due as the last apply job read them after its commit, for the flush it kicks to send at once."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from state.local_state import LocalState
from state.outbox import Due

log = logging.getLogger(__name__)

Row = Due  # (seq, topic, key, value, partition or None)


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
    failed_forgets: int
    """`OutboxPrefetch.failed_forgets` then: records the read passed over as `leaving` may be due again since."""
    rows: list[Row]
    """The records due, in sequence order."""


class OutboxPrefetch:
    """Reads the records due last thing in each apply job, so that the flush it kicks needs no writer read.

    Read in a writer job of its own, that read queued behind the next input batch: under 1,000
    events/s the writer's announcements waited another 100-300 ms before they were sent. A record
    due leaves the outbox only once this worker's producer had it acknowledged or refused. Either
    it joins `Outbox.acked` (which reads pass over) until the next apply job deletes it, or, from
    `FORGET_NOW` records on and when refused, it is `leaving` until the job deleting it has run
    (the read passes over those too). Both are logged for the read that is live (`gone`), which
    may have been made before. A record comes due before older ones only when a standby record
    is promoted or the file is rebased: then the flush reads the outbox as before.
    """

    def __init__(self, state: LocalState, read_rows: int) -> None:
        self.state = state
        self.read_rows = read_rows
        self._last: Prefetched | None = None
        self._queued = -1  # `Outbox.queued` at the last read: unchanged, nothing new is due
        self._lock = threading.Lock()  # the loop reports what left, the writer's read marks and filters
        self._gone: list[int] = []  # sequence numbers acknowledged or refused since number `_gone_from` of them
        self._gone_from = 0
        self._reading = False  # a read has marked `_gone` and not yet become `_last`
        self._leaving: set[int] = set()  # acknowledged or refused, not in `Outbox.acked`, not deleted yet
        self.failed_forgets = 0  # jobs deleting `leaving` records that did not commit: those are due again
        self.counts = {"used": 0, "passed_over": 0, "failed": 0}  # for /healthz

    def read(self) -> None:
        """Read what is due now (on the writer thread, after the apply job committed); never raises."""
        outbox = self.state.outbox
        with self._lock:  # before the read: a record that leaves while it runs is logged after the mark
            self._gone_from += len(self._gone)  # the last read is replaced: nothing needs the log before this
            self._gone = []
            mark = self._gone_from
            self._reading = outbox.queued != self._queued
            if not self._reading:
                self._last = None  # nothing queued since the last read: a flush reads what that one left
                return
        self._queued = outbox.queued
        try:
            rows = outbox.due(self.read_rows, None)
            with self._lock:  # jobs that delete `leaving` records run on this thread: none has since the read
                rows = [row for row in rows if row[0] not in self._leaving] if self._leaving else rows
            self._last = Prefetched(outbox.queued, mark, outbox.promoted, self.state.store.rebases,
                                    self.failed_forgets, rows)
        except Exception:  # noqa: BLE001 - the batch is committed: the flush reads the outbox itself instead
            self._last = None
            self.counts["failed"] += 1
            if self.counts["failed"] == 1:
                log.exception("reading the outbox after an apply batch failed; flushes read it themselves")
        finally:
            with self._lock:
                self._reading = False

    def gone(self, seqs: list[int]) -> None:
        """Records acknowledged and added to `Outbox.acked` (call after): no longer due, whatever the live read
        found."""
        if seqs:
            with self._lock:
                if self._last is not None or self._reading:
                    self._gone.extend(seqs)

    def leaving(self, seqs: list[int]) -> None:
        """Records acknowledged or refused that a writer job is about to delete, not in `Outbox.acked`: reads
        pass over them until `deleted` (call before submitting that job)."""
        if seqs:
            with self._lock:
                self._leaving.update(seqs)
                if self._last is not None or self._reading:
                    self._gone.extend(seqs)

    def deleted(self, seqs: list[int], committed: bool = True) -> None:
        """The job deleting records `leaving` has run (on the writer thread). Not committed, they are due again,
        before records a read made meanwhile found: that read is passed over (`failed_forgets`)."""
        if seqs:
            with self._lock:
                self._leaving.difference_update(seqs)
                self.failed_forgets += not committed

    def due(self) -> bool | None:
        """Whether a record is due, from the last read (None: unknown, read the outbox)."""
        fetched = self._last
        rows = self._still_due(fetched)
        if rows is None or (not rows and fetched.queued != self.state.outbox.queued):
            return None
        return bool(rows)

    def take(self) -> tuple[list[Row], bool] | None:
        """The records of the last read still due, once, and whether they are all that is due (nothing queued
        since, and the read was not cut short); None: read the outbox (nothing read since the last take, or what
        was may not be all up to its last record, or nothing is left of it and more was queued)."""
        fetched, self._last = self._last, None
        if fetched is None:
            return None
        rows = self._still_due(fetched)
        # A read cut at `read_rows` is not all that is due either, however few of its records are left.
        complete = fetched.queued == self.state.outbox.queued and len(fetched.rows) < self.read_rows
        if rows is None or (not rows and not complete):
            self.counts["passed_over"] += 1
            return None
        self.counts["used"] += 1
        return rows, complete

    def _still_due(self, fetched: Prefetched | None) -> list[Row] | None:
        """The records read and not gone since; None if they may not be all that is due up to the last of them."""
        outbox = self.state.outbox
        if fetched is None or fetched.promoted != outbox.promoted or fetched.rebases != self.state.store.rebases \
                or fetched.failed_forgets != self.failed_forgets:
            return None
        with self._lock:
            if fetched.mark < self._gone_from:  # a later read replaced it: its part of the log is gone
                return None
            gone = set(self._gone[fetched.mark - self._gone_from:]) | self._leaving
        gone.update(outbox.acked.current())
        return [row for row in fetched.rows if row[0] not in gone] if gone else fetched.rows
