"""Records to publish, written in the same transaction as the state that produced them."""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from state.store import Store

Source = tuple[str, int, int]  # (input topic, partition, offset) of the event that caused a record


class Outbox:
    """A durable queue of (topic, key, value); rows go only after the broker acknowledged them.

    Every worker applies every input event (the catalog is replicated), but only the worker the
    consumer group gave an event's partition to publishes what the event caused. Rows caused by
    an input event are therefore queued on *standby*, tagged with the event's position, and
    promoted by the partition's owner; the others are pruned once the group has moved past them.
    """

    def __init__(self, store: Store) -> None:
        self.db = store.db

    def add_many(self, rows: list[tuple[str, bytes | None, bytes]], sources: Sequence[Source | None] | None = None,
                 standby: bool = False) -> None:
        """Queue records for publication, in order, in one statement."""
        if not rows:
            return
        sources = list(sources) if sources is not None else [None] * len(rows)
        table = pa.table({
            "topic": [r[0] for r in rows], "key": pa.array([r[1] for r in rows], pa.binary()),
            "value": pa.array([r[2] for r in rows], pa.binary()),
            "src_topic": pa.array([s and s[0] for s in sources], pa.string()),
            "src_partition": pa.array([s and s[1] for s in sources], pa.int32()),
            "src_offset": pa.array([s and s[2] for s in sources], pa.int64()),
            "standby": pa.array([standby and s is not None for s in sources], pa.bool_())})
        self.db.register("_outbox_rows", table)
        try:
            # rowid order of the Arrow scan is the list order, so seq keeps publication order.
            self.db.execute("INSERT INTO outbox (topic, key, value, src_topic, src_partition, src_offset, standby) "
                            "SELECT * FROM _outbox_rows")
        finally:
            self.db.unregister("_outbox_rows")

    def promote(self, topic: str, partition: int, first: int, last: int, drop_earlier: bool = True) -> int:
        """This worker owns events first..last of a partition: publish what they caused.

        With `drop_earlier` (events delivered by the consumer group), standby rows of earlier
        offsets are dropped: the group hands an owner its partition at the committed offset,
        so everything before it was published by the previous owner.
        """
        if drop_earlier:
            self.db.execute("DELETE FROM outbox WHERE standby AND src_topic = ? AND src_partition = ? "
                            "AND src_offset < ?", [topic, partition, first])
        return self.db.execute("UPDATE outbox SET standby = false WHERE standby AND src_topic = ? "
                               "AND src_partition = ? AND src_offset BETWEEN ? AND ?",
                               [topic, partition, first, last]).fetchone()[0]

    def prune(self, committed: dict[tuple[str, int], int]) -> None:
        """Drop standby rows of events the consumer group has committed (another owner published them)."""
        if not committed:
            return
        rows = pa.table({"t": [t for t, _ in committed], "p": pa.array([p for _, p in committed], pa.int32()),
                         "o": pa.array(list(committed.values()), pa.int64())})
        self.db.register("_committed", rows)
        try:
            self.db.execute("DELETE FROM outbox USING _committed c WHERE outbox.standby AND outbox.src_topic = c.t "
                            "AND outbox.src_partition = c.p AND outbox.src_offset < c.o")
        finally:
            self.db.unregister("_committed")

    def pending(self, limit: int = 5000) -> list[tuple[int, str, bytes | None, bytes]]:
        """The oldest records due for publication, in order."""
        return self.db.execute("SELECT seq, topic, key, value FROM outbox WHERE NOT standby ORDER BY seq LIMIT ?",
                               [limit]).fetchall()

    def remove(self, seqs: list[int]) -> None:
        """Forget these records (acknowledged, or permanently unpublishable)."""
        if seqs:
            self.db.execute("DELETE FROM outbox WHERE seq IN (SELECT unnest(?))", [seqs])

    def size(self) -> int:
        """Records due for publication."""
        return self.db.execute("SELECT count(*) FROM outbox WHERE NOT standby").fetchone()[0]

    def standby_size(self) -> int:
        """Records held for events whose partition another worker may own."""
        return self.db.execute("SELECT count(*) FROM outbox WHERE standby").fetchone()[0]
