"""Records to publish, written in the same transaction as the state that produced them."""

from __future__ import annotations

import pyarrow as pa

from state.store import Store


class Outbox:
    """A durable queue of (topic, key, value); rows go only after the broker acknowledged them."""

    def __init__(self, store: Store) -> None:
        self.db = store.db

    def add_many(self, rows: list[tuple[str, bytes | None, bytes]]) -> None:
        """Queue records for publication, in order, in one statement."""
        if not rows:
            return
        table = pa.table({"topic": [r[0] for r in rows], "key": pa.array([r[1] for r in rows], pa.binary()),
                          "value": pa.array([r[2] for r in rows], pa.binary())})
        self.db.register("_outbox_rows", table)
        try:
            # rowid order of the Arrow scan is the list order, so seq keeps publication order.
            self.db.execute("INSERT INTO outbox (topic, key, value) SELECT topic, key, value FROM _outbox_rows")
        finally:
            self.db.unregister("_outbox_rows")

    def pending(self, limit: int = 5000) -> list[tuple[int, str, bytes | None, bytes]]:
        """The oldest queued records, in order."""
        return self.db.execute("SELECT seq, topic, key, value FROM outbox ORDER BY seq LIMIT ?",
                               [limit]).fetchall()

    def remove(self, seqs: list[int]) -> None:
        """Forget these records (acknowledged, or permanently unpublishable)."""
        if seqs:
            self.db.execute("DELETE FROM outbox WHERE seq IN (SELECT unnest(?))", [seqs])

    def size(self) -> int:
        """Records waiting to be published."""
        return self.db.execute("SELECT count(*) FROM outbox").fetchone()[0]
