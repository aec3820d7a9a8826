"""Bytes per plan (index, plan, receipt) and restart time with a million indexed plans, on DuckDB files on disk."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from agents.plans.plan_writer import PlanWriter
from agents.stream.event_apply import EventApplier
from agents.web.query import QueryService
from bench.workload import Workload, apply_catalog
from state.dependency_index import EDGES_MEMO, WRITTEN_MEMO
from state.local_state import LocalState

# The dependency set of one bench plan (see bench/workload.py), with {i} the plan's number:
# principal, policy, contract, entity and alias, the scope of absent evidence, four resources.
EDGE_TEMPLATES = ("principal:u' || (i % 1000) || '", "policy:bench", "contract:bench.review",
                  "entity:E' || i || '", "alias:e' || i || '", "scope:E' || i || '/record",
                  "resource:E' || i || '-r0", "resource:E' || i || '-r1", "resource:E' || i || '-r2",
                  "resource:E' || i || '-r3")


def _fill(state: LocalState, plans: int) -> None:
    """Write `plans` plan heads with their dependency edges, as compiled plans would leave them."""
    keys = " UNION ALL ".join(f"SELECT 'pk-' || md5(i::VARCHAR) AS plan_key, '{t}' AS dep_key "
                              f"FROM range({plans}) r(i)" for t in EDGE_TEMPLATES)
    db = state.store.db
    db.execute("DROP INDEX IF EXISTS dependency_index_key")
    db.execute(f"INSERT INTO dependency_index SELECT dep_key, plan_key FROM ({keys})")
    db.execute(f"INSERT INTO plan_heads SELECT 'pk-' || md5(i::VARCHAR), 'plan-' || md5(i::VARCHAR), true, NULL "
               f"FROM range({plans}) r(i)")
    db.execute("CREATE INDEX dependency_index_key ON dependency_index (dep_key)")
    db.execute("CHECKPOINT")
    state.store.forget(EDGES_MEMO, WRITTEN_MEMO)  # edges written behind the index's back: its memos are stale


def _index_bytes(db) -> int:
    """Bytes DuckDB holds for the index table, its ART index and the plan heads."""
    rows = db.execute("SELECT sum(estimated_size) FROM duckdb_tables() WHERE table_name IN "
                      "('dependency_index', 'plan_heads')").fetchone()
    return int(rows[0] or 0)


def measure(plans: int = 100_000, restart_plans: int = 1_000_000) -> dict:
    """Bytes per indexed plan (file and memory) and the time to reopen and query a large index."""
    with tempfile.TemporaryDirectory(prefix="fpbench-index-") as tmp:
        empty_path = Path(tmp) / "empty.duckdb"
        LocalState.open(empty_path).close()
        empty_size = empty_path.stat().st_size
        path = Path(tmp) / "index.duckdb"
        state = LocalState.open(path)
        db = state.store.db
        before = db.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()[0]
        _fill(state, plans)
        db.execute("SELECT count(*), count(DISTINCT plan_key) FROM dependency_index").fetchone()
        state.index.affected_pairs(["policy:bench"])
        after = db.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()[0]
        state.close()
        file_bytes = path.stat().st_size - empty_size
        memory = {"plans": plans, "edges": plans * len(EDGE_TEMPLATES),
                  "file_bytes_per_plan": round(file_bytes / plans, 1),
                  "buffer_bytes_per_plan": round(max(0, after - before) / plans, 1)}

        big = Path(tmp) / "restart.duckdb"
        state = LocalState.open(big)
        built = time.perf_counter()
        _fill(state, restart_plans)
        build_seconds = time.perf_counter() - built
        state.close()
        started = time.perf_counter()
        state = LocalState.open(big)
        opened = time.perf_counter() - started
        hit = state.index.affected_pairs(["entity:E777"])
        first_lookup = time.perf_counter() - started - opened
        fanout = len(state.index.affected_pairs(["policy:bench"]))
        all_keys = time.perf_counter() - started - opened - first_lookup
        state.close()
        restart = {"plans": restart_plans, "edges": restart_plans * len(EDGE_TEMPLATES),
                   "file_mb": round(big.stat().st_size / 2**20, 1), "build_seconds": round(build_seconds, 2),
                   "open_seconds": round(opened, 3), "first_lookup_seconds": round(first_lookup, 4),
                   "first_lookup_plans": len(hit), "policy_fanout_lookup_seconds": round(all_keys, 3),
                   "policy_fanout_plans": fanout, "cpu_count": os.cpu_count()}
    return {"memory_per_plan": memory, "restart": restart}


def stored_plan_bytes(workload: Workload) -> dict:
    """What each compiled plan keeps on disk besides its index: plan row and receipt (what retention bounds)."""
    with tempfile.TemporaryDirectory(prefix="fpbench-plans-") as tmp:
        path = Path(tmp) / "plans.duckdb"
        state = LocalState.open(path)
        try:
            inv = EventApplier(state, PlanWriter(state, lambda name: name))
            apply_catalog(inv, workload.catalog)
            db = state.store.db
            db.execute("CHECKPOINT")
            before = path.stat().st_size
            query = QueryService(state, inv.plans)
            for body in workload.requests:
                query.select(body)
            db.execute("CHECKPOINT")
            grown = path.stat().st_size - before
            plans, plan_text = db.execute("SELECT count(*), sum(strlen(plan) + strlen(request)) FROM plans").fetchone()
            receipt_text = db.execute("SELECT sum(strlen(receipt)) FROM receipts").fetchone()[0]
        finally:
            state.close()
    plans = max(plans, 1)
    return {"plans": plans, "plan_json_bytes_per_plan": round((plan_text or 0) / plans, 1),
            "receipt_json_bytes_per_plan": round((receipt_text or 0) / plans, 1),
            "file_bytes_per_plan": round(grown / plans, 1)}
