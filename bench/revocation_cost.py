"""What principal upserts cost once their principal holds many revocations, beside the same upserts with none."""

from __future__ import annotations

import itertools
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from schemas.records import Principal, Revocation, SourceChange
from state.local_state import LocalState

T = datetime(2026, 8, 30, 9, 0, tzinfo=timezone.utc)


def measure(upserts: int = 2_000, revocations: int = 20_000, batch: int = 100) -> dict:
    """Seconds to apply `upserts` principal upserts in batches of `batch`, with and without `revocations` stored.

    The upserts are made after every revocation, so each one is judged against them all by the rule.
    """
    with tempfile.TemporaryDirectory(prefix="fpbench-revocations-") as tmp:
        bare = _upserts(Path(tmp) / "bare.duckdb", upserts, 0, batch)
        loaded = _upserts(Path(tmp) / "loaded.duckdb", upserts, revocations, batch)
    return {"upserts": upserts, "revocations": revocations, "batch": batch, "without_revocations_s": bare,
            "with_revocations_s": loaded, "ratio": round(loaded / bare, 2) if bare else None}


def _upserts(path: Path, upserts: int, revocations: int, batch: int) -> float:
    state = LocalState.open(path)
    try:
        with state.store.transaction():
            state.catalog.apply_identities([SourceChange("principal", "upsert", "maya",
                                                         Principal("maya", ("credit_analyst",), {}, 1))], [T])
        for lo in range(0, revocations, 5_000):
            items = [Revocation("maya", "grant", f"g-{n}", T + timedelta(seconds=n), "iam")
                     for n in range(lo, min(revocations, lo + 5_000))]
            with state.store.transaction():
                state.catalog.apply_identities(items, [r.effective_at for r in items])
        versions = itertools.count(2)
        after = T + timedelta(days=1)
        started = time.perf_counter()
        for lo in range(0, upserts, batch):
            items = [SourceChange("principal", "upsert", "maya", Principal(
                "maya", ("credit_analyst",), {"grants": ["g-1"]}, next(versions)))
                for _ in range(min(batch, upserts - lo))]
            with state.store.transaction():
                state.catalog.apply_identities(items, [after] * len(items))
        return round(time.perf_counter() - started, 3)
    finally:
        state.close()
