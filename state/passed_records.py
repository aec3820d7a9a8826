"""Records a worker passed by unread, kept until the group commits past them: the dead letters they may owe."""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from state.store import Store

Position = tuple[str, int]  # (logical input topic, partition)
Row = tuple[int, int, bytes | None, bytes | None, bool]  # (partition, offset, key, value, refused by the source rules)


class PassedRecords:
    """Input records nobody here judged (another shard's, on an input partition another worker judges).

    Kept with their bytes in the same transaction as the offsets that passed them, so whoever
    gains their partition judges them from the file (no second read of the topic, no record
    missed because retention or a broker reset took it), and dropped once the group has
    committed past them: their partition's owner published what they owe.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, topic: str, rows: Sequence[Row]) -> None:
        """Keep these records of one input topic (one statement)."""
        if not rows:
            return
        self.store.insert_rows("passed_records", pa.table({
            "src_topic": pa.array([topic] * len(rows), pa.string()),
            "src_partition": pa.array([r[0] for r in rows], pa.int32()),
            "src_offset": pa.array([r[1] for r in rows], pa.int64()),
            "key": pa.array([r[2] for r in rows], pa.binary()),
            "value": pa.array([r[3] for r in rows], pa.binary()),
            "refused": pa.array([r[4] for r in rows], pa.bool_())}), verb="INSERT INTO", columns=True)

    def take(self, topic: str, since: dict[int, int] | None = None) -> list[Row]:
        """The kept records of these partitions from each offset on (every partition's, with no `since`), in
        order; every kept record of those partitions is forgotten (those below were their owner's)."""
        db = self.store.db
        if since is None:
            rows = db.execute("SELECT src_partition, src_offset, key, value, refused FROM passed_records "
                              "WHERE src_topic = ? "
                              "ORDER BY src_partition, src_offset", [topic]).fetchall()
            db.execute("DELETE FROM passed_records WHERE src_topic = ?", [topic])
            return rows
        if not since:
            return []
        parts, floors = list(since), [since[p] for p in since]
        rows = db.execute(
            "SELECT r.src_partition, r.src_offset, r.key, r.value, r.refused FROM passed_records r "
            "JOIN (SELECT unnest(?::INTEGER[]) p, unnest(?::BIGINT[]) o) f ON r.src_partition = f.p "
            "WHERE r.src_topic = ? AND r.src_offset >= f.o ORDER BY 1, 2", [parts, floors, topic]).fetchall()
        db.execute("DELETE FROM passed_records WHERE src_topic = ? AND src_partition IN (SELECT unnest(?::INTEGER[]))",
                   [topic, parts])
        return rows

    def prune(self, committed: dict[Position, int]) -> None:
        """Forget the records the group has committed past (one statement)."""
        if not committed:
            return
        keys = list(committed)
        self.store.db.execute(
            "DELETE FROM passed_records USING (SELECT unnest(?::VARCHAR[]) t, unnest(?::INTEGER[]) p, "
            "unnest(?::BIGINT[]) o) c WHERE passed_records.src_topic = c.t AND passed_records.src_partition = c.p "
            "AND passed_records.src_offset < c.o", [[t for t, _ in keys], [p for _, p in keys], [committed[k] for k in keys]])

    def size(self) -> int:
        """Records kept."""
        return self.store.db.execute("SELECT count(*) FROM passed_records").fetchone()[0]
