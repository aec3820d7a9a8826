"""Which entity partitions this file holds the resources of: the worker's shard of the catalog."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection

from schemas.plan_partition import plan_partition
from schemas.routed_batch import SHARED
from state.catalog_resources import drop_resources, held_entities
from state.store import Store

_TABLE = "held_shards"


@dataclass(frozen=True)
class ShardFigures:
    """What a shard holds, for /healthz and the metrics."""

    by_partition: dict[int, int]
    """Live resources per held partition (replicated ones, about no entity, not counted)."""
    entities_by_partition: dict[int, int]
    """Distinct entities those resources are about, per held partition."""

    def resources(self, partitions: Collection[int]) -> int:
        """Live resources held for these partitions."""
        return sum(n for p, n in self.by_partition.items() if p in partitions)

    def entities(self, partitions: Collection[int]) -> int:
        """Entities the resources of these partitions are about."""
        return sum(n for p, n in self.entities_by_partition.items() if p in partitions)


class ShardState:
    """The held partitions, kept in the file with the resources they describe (same transactions).

    A file that never recorded any holds every partition: it was written by a worker that
    applied every resource (a fresh file holds every partition's nothing). Resources about no
    entity are every worker's (replicated), as are principals, entities, policies and revocations.
    """

    def __init__(self, store: Store, partitions: int) -> None:
        self.store = store
        self.partitions = partitions
        db = store.db
        if not db.execute(f"SELECT 1 FROM duckdb_tables() WHERE table_name = '{_TABLE}'").fetchone():
            db.execute(f"CREATE TABLE {_TABLE} (partition INTEGER PRIMARY KEY)")
            db.execute(f"INSERT INTO {_TABLE} SELECT range FROM range(?)", [partitions])
            db.execute("CHECKPOINT")  # as the store does: DDL must not wait in the WAL
        self.held: frozenset[int] = frozenset(r[0] for r in db.execute(f"SELECT partition FROM {_TABLE}").fetchall())
        """Read by the applier on every batch; replaced, never changed in place."""
        self.restoring: frozenset[int] = frozenset()
        """Partitions being restored right now (read by the loop to refuse their selects)."""
        self.copies: frozenset[int] = frozenset()
        """Held partitions that are warm standby copies, not owned (set by each move; not in the file)."""
        self.catching: frozenset[int] = frozenset()
        """Partitions whose lanes are read from their start to restore them: applied, not held yet (not in the file)."""
        self.moves = 0
        """Moves ended (committed or rolled back): a reader off the writer that saw it change re-reads."""

    def partition_of(self, entity_id: str) -> int:
        """The entity partition of an entity id (its plans' partition too)."""
        return plan_partition(entity_id, self.partitions)

    def mine(self, entity: str | None) -> bool:
        """Whether a resource about this entity is applied here: replicated (no entity), or in a held partition."""
        if entity is None:
            return True
        partition = plan_partition(entity, self.partitions)
        return partition in self.held or partition in self.catching

    def lane_of(self, entity: str | None) -> int:
        """The routed lane of a resource about this entity: its partition, or SHARED for none."""
        return SHARED if entity is None else plan_partition(entity, self.partitions)

    def owns_lane(self, lane: int) -> bool:
        """Whether this worker owns an entity lane (holds it, and not only as a standby copy)."""
        return lane in self.held - self.copies

    def owns(self, entity: str | None) -> bool:
        """Whether this worker owns the entity's partition (held, and not only as a standby copy): the one that
        reports what is wrong with a resource about it. Resources about no entity are everyone's."""
        return entity is None or (plan_partition(entity, self.partitions) in self.held - self.copies)

    def drop(self, partitions: Collection[int]) -> int:
        """Stop holding these partitions: their resources are removed (inside the caller's transaction)."""
        lost = set(partitions) & self.held
        if not lost:
            return 0
        entities = [e for e in held_entities(self.store) if self.partition_of(e) in lost]
        dropped = drop_resources(self.store, entities)
        self._set(self.held - lost)
        self.store.bump_many({"shard_resources_dropped": dropped, "shards_dropped": len(lost)})
        return dropped

    def add(self, partitions: Collection[int]) -> None:
        """Hold these partitions from now on (their resources were restored in the caller's transaction)."""
        self._set(self.held | frozenset(partitions))

    def _set(self, held: frozenset[int]) -> None:
        db = self.store.db
        db.execute(f"DELETE FROM {_TABLE}")
        if held:
            db.execute(f"INSERT INTO {_TABLE} SELECT unnest(?::INTEGER[])", [sorted(held)])
        self.held = frozenset(held)

    def figures(self, store: Store | None = None, held: frozenset[int] | None = None) -> ShardFigures:
        """Counts over the held partitions (or `held`, as the caller read it), read through `store` (a view's
        cursor off the writer)."""
        db = (store or self.store).db
        held = self.held if held is None else held
        rows = db.execute("SELECT entity, count(*) FROM resources WHERE entity IS NOT NULL AND NOT deleted "
                          "GROUP BY entity").fetchall()
        by_partition = dict.fromkeys(sorted(held), 0)
        entities = dict.fromkeys(sorted(held), 0)
        for entity, count in rows:
            partition = self.partition_of(entity)
            if partition in by_partition:
                by_partition[partition] += count
                entities[partition] += 1
        return ShardFigures(by_partition, entities)

    def reload(self) -> None:
        """Read the held partitions back from the file (after a rolled-back move)."""
        self.held = frozenset(r[0] for r in self.store.db.execute(f"SELECT partition FROM {_TABLE}").fetchall())
