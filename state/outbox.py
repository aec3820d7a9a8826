"""Records to publish, written in the same transaction as the state that produced them."""

from __future__ import annotations

from state.store import Store


class Outbox:
    """A durable queue of (topic, key, value); rows go only after the broker acknowledged them."""

    def __init__(self, store: Store) -> None:
        self.db = store.db

    def add(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue one record for publication."""
        self.db.execute("INSERT INTO outbox (topic, key, value) VALUES (?, ?, ?)", [topic, key, value])

    def pending(self, limit: int = 5000) -> list[tuple[int, str, bytes | None, bytes]]:
        """The oldest queued records, in order."""
        return self.db.execute("SELECT seq, topic, key, value FROM outbox ORDER BY seq LIMIT ?",
                               [limit]).fetchall()

    def remove_through(self, seq: int) -> None:
        """Forget every record up to and including `seq` (they were acknowledged)."""
        self.db.execute("DELETE FROM outbox WHERE seq <= ?", [seq])

    def size(self) -> int:
        """Records waiting to be published."""
        return self.db.execute("SELECT count(*) FROM outbox").fetchone()[0]
