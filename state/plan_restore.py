"""Take over plans from their published `plans` records: heads and index edges in bulk, no compiling."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat
from datetime import datetime
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

import orjson
import pyarrow as pa

from compiler.request import parse_request, plan_key
from schemas.outbound import Cause
from schemas.plan_partition import plan_partition
from schemas.timefmt import parse_instant
from state.dependency_index import HORIZON_MEMO, replace_edges
from state.store import Store

WIRE_ONLY = ("compiled_as_of", "compiled_in", "dependencies", "receipt", "replaces")
"""Fields the internal record adds to the compiled plan; the stored plan is what compile produced."""


@dataclass(frozen=True)
class RestoreResult:
    """What a restore did with each record."""

    restored: list[str] = field(default_factory=list)
    """Plan ids now current for their plan keys, indexed under their dependency keys."""
    not_owned: int = 0
    """Records whose entity belongs to a partition not in `owned_partitions`."""
    unrestorable: list[tuple[str | None, str]] = field(default_factory=list)
    """(plan id, why) of records that cannot stand in for a compilation; their plan keys need one."""
    known_invalidated: list[str] = field(default_factory=list)
    """Plan ids this file already holds as invalidated (unless compiled again since): heads, still invalidated."""
    displaced: list[tuple[str, str]] = field(default_factory=list)
    """(plan key, plan id) of fresh heads their key's parked record replaced: the caller announces them."""


@dataclass(frozen=True)
class PreparedPlan:
    """A record in the shape restore writes: what a parked plan keeps so a take-over needs no Python pass."""

    plan_id: str
    """The plan id."""
    plan_key: str
    """The plan key."""
    live: bool
    """Whether its decision time is "now" (its validity horizon moves with the clock)."""
    valid_until: datetime | None
    """When it stops being valid."""
    request: str
    """The request, as JSON text."""
    plan: str
    """The stored plan (the record without its wire-only fields), as JSON text."""
    receipt_id: str | None
    """Its receipt id."""
    dependencies: tuple[str, ...]
    """Its dependency keys, sorted and distinct."""
    rank: tuple[int, int]
    """(progress, position): of several records of one key the highest wins."""
    receipt: str | None = None
    """Its receipt as JSON text, when the record carries it (`plan-dependencies` does; `plans` does not)."""


@dataclass(frozen=True)
class ParkedRestore:
    """What a restore of parked plans did, in counts (a take-over moves too many plans to list)."""

    considered: int = 0
    """Parked plans of the partitions."""
    restored: int = 0
    """Plans now current for their plan keys."""
    unrestorable: int = 0
    """Parked records that cannot stand in for a compilation; their plan keys need one."""
    known_invalidated: list[str] = field(default_factory=list)
    """Plan ids this file already holds as invalidated (unless compiled again since): heads, still invalidated."""


def restore(store: Store, records: Iterable[Mapping[str, Any]], owned_partitions: Collection[int], *,
            partitions: int, compiled_at: datetime | None, parked: Collection[str] = (),
            topic_of: Callable[[str], str] = str) -> RestoreResult:
    """Make these `plans` records the current plans of their keys, in a constant number of statements.

    Only records of entities owned here (by `plan_partition`) count. Of several records of one
    plan key the one compiled from the most advanced offsets wins (later in `records` on a tie);
    judge staleness (`KeyChanges.stale_plans`) before or after: this writes what was published,
    it decides nothing. The caller holds the transaction. A record's receipt (on `plan-dependencies`,
    not on `plans`) is stored with it, so the new owner can show what it serves.

    A record whose plan id is in `parked` (its key's parked record, see `parked_plans.succession`)
    wins over the others of its key whatever their offsets.

    A record of a key that has a fresh plan here is not made current, unless it is the key's parked
    one (see `RestoreResult.displaced`): an owner keeps its own heads current (its index sees every
    change), and an older record read late (a restart re-reading the feed) would replace a newer
    plan only to be found stale.
    """
    owned = set(owned_partitions)
    chosen: dict[str, PreparedPlan] = {}
    unrestorable: list[tuple[str | None, str]] = []
    not_owned = 0
    for position, record in enumerate(records):
        try:
            entity_id = record.get("entity_id")
            if not isinstance(entity_id, str):
                raise ValueError("it names no canonical entity id")
            if plan_partition(entity_id, partitions) not in owned:
                not_owned += 1
                continue
            row = prepare(record, entity_id, position)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            plan_id = record.get("plan_id") if isinstance(record, Mapping) else None
            unrestorable.append((plan_id if isinstance(plan_id, str) else None, str(exc) or type(exc).__name__))
            continue
        held = chosen.get(row.plan_key)
        if held is None or (row.plan_id in parked) > (held.plan_id in parked) or (
                (row.plan_id in parked) == (held.plan_id in parked) and row.rank >= held.rank):
            chosen[row.plan_key] = row
    displaced: list[tuple[str, str]] = []
    if chosen:
        # A fresh head stays, unless its key's parked record is another plan: that
        # replaces it, and the caller announces the head, as nobody is known to have announced it.
        heads = dict(store.db.execute(
            "SELECT h.plan_key, h.plan_id FROM plan_heads h JOIN plans p USING (plan_id) WHERE p.status = 'fresh' "
            "AND h.plan_key IN (SELECT unnest(?::VARCHAR[]))", [list(chosen)]).fetchall())
        for key in [k for k in chosen if k in heads]:
            if chosen[key].plan_id != heads[key] and chosen[key].plan_id in parked:
                displaced.append((key, heads[key]))
            else:
                del chosen[key]
    restored, invalidated = _write(store, list(chosen.values()), compiled_at, topic_of)
    return RestoreResult(restored, not_owned, unrestorable, invalidated, displaced)


def prepare(record: Mapping[str, Any], entity_id: str, position: int = 0) -> PreparedPlan:
    """The stored shape of one record, or ValueError when it is not a whole compilation."""
    plan_id, key, request = record["plan_id"], record["plan_key"], record["request"]
    if not isinstance(plan_id, str) or not isinstance(key, str) or not isinstance(request, dict):
        raise ValueError("it lacks a plan id, plan key or request object")
    deps = record.get("dependencies")
    if not isinstance(deps, list) or not all(map(isinstance, deps, repeat(str))):
        raise ValueError("it carries no dependency keys")
    if request.get("query_truncated") or any(isinstance(i, dict) and i.get("content_omitted")
                                             for i in record.get("admitted") or ()):
        raise ValueError("it was published compacted (content or query left out)")
    budget = request.get("budget") or {}
    if any(isinstance(v, float) for v in budget.values()) and plan_key(parse_request(request), entity_id) != key:
        # The plan's request rounds floats for display; a rounded budget is another plan key.
        raise ValueError("its request's budget was rounded in publication")
    plan = {k: v for k, v in record.items() if k not in WIRE_ONLY}
    valid_until = record.get("valid_until")
    as_of = record.get("compiled_as_of") or {}
    progress = sum(int(o) for by_partition in as_of.values() for o in by_partition.values())
    return PreparedPlan(plan_id, key, request.get("decision_time") in (None, "now"),
                parse_instant(valid_until) if valid_until else None, orjson.dumps(request).decode(),
                orjson.dumps(plan).decode(), record.get("receipt_id"), tuple(sorted(set(deps))), (progress, position),
                _receipt(record))


def _receipt(record: Mapping[str, Any]) -> str | None:
    """The record's receipt as JSON text, if it carries one of its own plan (another plan's is ignored)."""
    receipt = record.get("receipt")
    if isinstance(receipt, dict) and receipt.get("receipt_id") == record.get("receipt_id") \
            and receipt.get("plan_id") == record.get("plan_id"):
        return orjson.dumps(receipt).decode()
    return None


# A plan id this file holds as invalidated stays so (`known_invalidated`), unless the parked
# record of it is a later compilation: compiled from offsets past the event that invalidated it
# here, or by a lineage that went on from the successor it was invalidated for (A -> B -> A).
# Reopened, it is judged like any other record (stale ones are announced).
_NOT_FRESH = """
SELECT p.plan_id, p.cause, p.successor_plan_id, k.superseded, k.as_of
FROM plans p JOIN parked_plans k ON k.plan_id = p.plan_id AND k.plan_key = p.plan_key
WHERE p.status != 'fresh' AND p.plan_id IN (SELECT unnest(?::VARCHAR[]))"""


def _compiled_again(store: Store, plan_ids: list[str], topic_of: Callable[[str], str]) -> set[str]:
    """Of these plan ids held here as not fresh, those a parked record shows compiled again since; made fresh.

    `topic_of` maps a logical topic (as in `compiled_as_of`) to the broker-side name causes carry.
    """
    if not plan_ids or not store.db.execute(
            "SELECT 1 FROM duckdb_tables() WHERE table_name = 'parked_plans'").fetchone():
        return set()
    again = []
    for plan_id, cause, successor, replaced, as_of in store.db.execute(_NOT_FRESH, [plan_ids]).fetchall():
        if successor is not None and successor in (orjson.loads(replaced) if replaced else ()):
            again.append(plan_id)
            continue
        try:
            at = Cause.from_wire(orjson.loads(cause or "{}"))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            continue  # no input position to compare with: it stays invalidated
        if at.partition is not None and at.offset is not None and any(
                (topic_of(a["topic"]), a["partition"]) == (at.topic, at.partition) and a["next_offset"] > at.offset
                for a in orjson.loads(as_of or "[]")):
            again.append(plan_id)
    if again:
        store.db.execute("UPDATE plans SET status = 'fresh', reason = NULL, cause = NULL, successor_plan_id = NULL, "
                         "invalidated_at = NULL WHERE plan_id IN (SELECT unnest(?::VARCHAR[]))", [again])
    return set(again)


def _write(store: Store, rows: list[PreparedPlan], compiled_at: datetime | None,
           topic_of: Callable[[str], str] = str) -> tuple[list[str], list[str]]:
    if not rows:
        return [], []
    when = pa.timestamp("us", tz="UTC")
    n = len(rows)
    tables = {
        "_restore_plans": pa.table({
            "plan_id": [r.plan_id for r in rows], "plan_key": [r.plan_key for r in rows],
            "live": pa.array([r.live for r in rows], pa.bool_()),
            "valid_until": pa.array([r.valid_until for r in rows], when),
            "request": [r.request for r in rows], "plan": [r.plan for r in rows],
            "receipt_id": pa.array([r.receipt_id for r in rows], pa.string()),
            "compiled_at": pa.array([compiled_at] * n, when),
            "receipt": pa.array([r.receipt for r in rows], pa.string())}),
        "_restore_edges": pa.table({
            "dep_key": pa.array([d for r in rows for d in r.dependencies], pa.string()),
            "plan_key": pa.array([r.plan_key for r in rows for _ in r.dependencies], pa.string())}),
    }
    db = store.db
    store.heads.remove_all()  # restored heads replace held ones
    store.forget(HORIZON_MEMO)  # and may hold an earlier horizon than the writer remembers
    for name, table in tables.items():
        db.register(name, table)
    try:
        # An id this file already holds keeps its row: if it was invalidated here, it stays so (`_compiled_again`).
        held = dict(db.execute("SELECT plan_id, status FROM plans SEMI JOIN _restore_plans USING (plan_id)").fetchall())
        held.update(dict.fromkeys(_compiled_again(store, [i for i, status in held.items() if status != "fresh"],
                                                  topic_of), "fresh"))
        db.execute("INSERT INTO plans SELECT plan_id, plan_key, 'fresh', live, valid_until, request, plan, receipt_id, "
                   "NULL, NULL, NULL, compiled_at, NULL FROM _restore_plans ANTI JOIN plans USING (plan_id)")
        stale = [plan_id for plan_id, status in held.items() if status != "fresh"]
        # Invalidated ones too are their keys' heads, indexed, as in `restore_parked` (the caller requeues them).
        db.execute("INSERT OR REPLACE INTO plan_heads SELECT plan_key, plan_id, live, valid_until FROM _restore_plans")
        db.execute("INSERT INTO receipts (receipt_id, plan_id, receipt, stored_at) SELECT DISTINCT ON (receipt_id) "
                   "receipt_id, plan_id, receipt, compiled_at FROM _restore_plans "
                   "WHERE receipt IS NOT NULL AND receipt_id NOT IN (SELECT receipt_id FROM receipts)")
        replace_edges(store, "SELECT plan_key FROM _restore_plans", "SELECT dep_key, plan_key FROM _restore_edges")
    finally:
        for name in tables:
            db.unregister(name)
        store.heads_changed()
    stale_ids = set(stale)
    return [r.plan_id for r in rows if r.plan_id not in stale_ids], [r.plan_id for r in rows if r.plan_id in stale_ids]


def restore_parked(store: Store, partitions: Collection[int], compiled_at: datetime | None,
                   topic_of: Callable[[str], str] = str, plan_ids: Sequence[str] | None = None) -> ParkedRestore:
    """Make the restorable parked plans of these partitions current, in SQL over `parked_plans` alone.

    The same rows as `restore` of their records (they were prepared when parked), without a
    Python pass over them; with `plan_ids`, only the parked plans with those ids. The caller
    holds the transaction.
    """
    if not partitions or plan_ids is not None and not plan_ids:
        return ParkedRestore()
    source = "parked_plans WHERE partition IN (SELECT unnest($1::INTEGER[]))"
    if plan_ids is None:
        return _restore_parked(store, sorted(partitions), compiled_at, topic_of, source)
    # A table of ids, not a subquery over `plans`: the plan rows this restore inserts must not change the set.
    store.db.register("_restore_ids", pa.table({"plan_id": pa.array(list(plan_ids), pa.string())}))
    try:
        return _restore_parked(store, sorted(partitions), compiled_at, topic_of,
                               f"{source} AND plan_id IN (SELECT plan_id FROM _restore_ids)")
    finally:
        store.db.unregister("_restore_ids")


def _restore_parked(store: Store, owned: list[int], compiled_at: datetime | None, topic_of: Callable[[str], str],
                    source: str) -> ParkedRestore:
    db = store.db
    considered, unrestorable = db.execute(
        f"SELECT count(*), count(*) FILTER (WHERE unrestorable IS NOT NULL) FROM {source}", [owned]).fetchone()
    mine = f"{source} AND unrestorable IS NULL"
    # An id this file already holds keeps its row: if it was invalidated here, it stays so (`_compiled_again`).
    held = [plan_id for (plan_id,) in db.execute(
        f"SELECT plan_id FROM plans WHERE status != 'fresh' AND plan_id IN (SELECT plan_id FROM {mine})",
        [owned]).fetchall()]
    again = _compiled_again(store, held, topic_of)
    stale = [plan_id for plan_id in held if plan_id not in again]
    db.execute("INSERT INTO plans SELECT plan_id, plan_key, 'fresh', live, valid_until, request, plan, receipt_id, "
               f"NULL, NULL, NULL, $2::TIMESTAMPTZ, NULL FROM (SELECT * FROM {mine}) ANTI JOIN plans USING (plan_id)",
               [owned, compiled_at])
    # A receipt of the record's own plan, kept when it was parked (`_receipt`).
    db.execute("INSERT INTO receipts (receipt_id, plan_id, receipt, stored_at) SELECT DISTINCT ON (receipt_id) "
               f"receipt_id, plan_id, receipt, $2::TIMESTAMPTZ FROM {mine} AND receipt IS NOT NULL "
               "AND receipt_id NOT IN (SELECT receipt_id FROM receipts)", [owned, compiled_at])
    # Invalidated ones too are their keys' heads, indexed: the caller announces them again and queues their keys,
    # so no parked plan of an owned key is left neither current nor announced (a peer may serve it again).
    store.heads.remove_all()  # restored heads replace held ones
    store.forget(HORIZON_MEMO)  # and may hold an earlier horizon than the writer remembers
    db.execute(f"INSERT OR REPLACE INTO plan_heads SELECT plan_key, plan_id, live, valid_until FROM {mine}", [owned])
    replace_edges(store, f"SELECT plan_key FROM {mine}",
                  f"SELECT unnest(from_json(deps, '[\"VARCHAR\"]')) AS dep_key, plan_key FROM {mine}", [owned])
    store.heads_changed()
    return ParkedRestore(considered, considered - unrestorable - len(stale), unrestorable, stale)
