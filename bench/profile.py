"""Where the apply path spends its time: pyinstrument over the in-process invalidator."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

from pyinstrument import Profiler

from agents.plans.backlog import recompile_queued
from bench.workload import Workload, warm_in_process
from state.local_state import LocalState


def profile_apply(workload: Workload, events: int = 600, batch: int = 50) -> tuple[str, dict[str, float]]:
    """Apply part of the change stream in worker-sized batches under the profiler.

    Returns the profile as text and the share of time per part of the path.
    """
    with tempfile.TemporaryDirectory(prefix="fpbench-profile-") as tmp:
        state = LocalState.open(Path(tmp) / "state.duckdb")
        try:
            inv, stream = warm_in_process(state, workload, events)
            profiler = Profiler(interval=0.0005)
            profiler.start()
            for i in range(0, len(stream), batch):
                inv.apply(stream[i:i + batch])
                # The worker's backlog loop between batches: the successors of what the batch announced.
                while recompile_queued(inv.plans, 16):
                    pass
            session = profiler.stop()
        finally:
            state.close()
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    return text, _shares(session.root_frame(), session.duration)


PARTS = {"PlanWriter.compile_all": "compiling (passes 1-6, incl. catalog reads)",
         "announce_first": "announcing touched plans before recompiling (DuckDB)",
         "CatalogSnapshot.prefetch": "fetching entities and candidates (DuckDB)",
         "PlanStore.heads": "reading plan heads (DuckDB)",
         "PlanWriter.store": "storing plans, receipts, index edges, outbox (DuckDB)",
         "PlanWriter.announce": "queueing invalidations (DuckDB)",
         "PlanStore.invalidate_many": "marking plans invalidated (DuckDB)",
         "Catalog.apply_resources": "applying resource changes (DuckDB)",
         "Catalog.apply_principals": "applying principal changes (DuckDB)",
         "Catalog._apply_principal": "applying principal changes (DuckDB)",
         "Catalog.apply_revocations": "applying revocations (DuckDB)",
         "Catalog.apply_revocation": "applying revocations (DuckDB)",
         "EventApplier._affected": "finding affected plans (DuckDB)",
         "KeyChanges.record": "recording key changes (DuckDB)",
         "Store.claim_events": "event-id dedupe (DuckDB)",
         "Store.save_offsets": "saving offsets (DuckDB)",
         "Store.bump_many": "counters (DuckDB)",
         "decode": "decoding events",
         "Store.transaction": "transaction begin/commit (DuckDB)"}


def _shares(root, duration: float) -> dict[str, float]:
    totals: Counter[str] = Counter()

    def walk(frame, inside: frozenset) -> None:
        name = frame.function if not frame.class_name else f"{frame.class_name}.{frame.function}"
        if name in PARTS and name not in inside:
            totals[PARTS[name]] += frame.time
            inside = inside | {name}
        for child in frame.children:
            walk(child, inside)

    if root is not None:
        walk(root, frozenset())
    return {part: round(seconds / duration, 4) for part, seconds in totals.most_common()} if duration else {}
