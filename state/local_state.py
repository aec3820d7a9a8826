"""Everything a worker keeps on disk, opened together from one DuckDB file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from state.catalog import Catalog
from state.dependency_index import DependencyIndex
from state.key_changes import KeyChanges
from state.checkpoints import DEFAULT_WAL_LIMIT
from state.outbox import Outbox, OutboundLimit
from state.plan_store import PlanStore
from state.recompile_queue import RecompileQueue
from state.retention import Retention
from state.store import Store


@dataclass
class LocalState:
    """The store and the views over it that agents use."""

    store: Store
    """The DuckDB connection, transactions, offsets, clock and counters."""
    catalog: Catalog
    """Resources, principals, entities, policy bundles: the compiler's view."""
    index: DependencyIndex
    """Dependency key -> plan keys."""
    plans: PlanStore
    """Plans, plan heads and receipts."""
    outbox: Outbox
    """Records to publish."""
    queue: RecompileQueue
    """Plan keys announced invalidated, successors still to compile."""
    retention: Retention
    """Select stamps, eviction of unused plans, expiry of old plan rows and receipts."""
    key_changes: KeyChanges
    """Where each dependency key last changed: what a take-over judges plans by, without compiling."""

    @classmethod
    def open(cls, path: Path | str, outbound: OutboundLimit | None = None,
             wal_limit: int = DEFAULT_WAL_LIMIT) -> "LocalState":
        """Open (or create) the state file; `outbound` bounds what the outbox sends, `wal_limit` its log (bytes)."""
        store = Store(path, wal_limit)
        outbox = Outbox(store, outbound)
        return cls(store, Catalog(store), DependencyIndex(store), PlanStore(store), outbox,
                   RecompileQueue(store), Retention(store, outbox), KeyChanges(store))

    def reader(self) -> "LocalState":
        """The same views over a cursor of their own, for reads beside a writer thread (committed state only).

        Nothing may be written through it: the read-write connection has one owner. Python-level
        caches (the catalog's compiled policies) are the reader's own, never shared across threads.
        """
        store = self.store.view()
        outbox = Outbox(store, acked=self.outbox.acked)
        return LocalState(store, Catalog(store), DependencyIndex(store), PlanStore(store), outbox,
                          RecompileQueue(store), Retention(store, outbox, ensure_schema=False), KeyChanges(store))

    def close(self) -> None:
        """Close the file."""
        self.store.close()
