"""Resource upserts and deletes applied in bulk, and resources as rows: what the writer remembers needs no read."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Collection, Sequence

import orjson
import pyarrow as pa

from compiler import dependency_keys as dk
from schemas.errors import InvalidEvent
from schemas.records import LOG_TICK_BITS, Resource, SourceChange
from state.catalog_identities import unavailable_value
from state.log_order import newer
from state.lookups import remember
from state.row_writes import SMALL_INSERT_ROWS, insert_values
from state.store import Store

Mine = Callable[[str | None], bool]
"""Whether a resource about this entity (None: about none) belongs to this worker's shards."""


class OtherShard:
    """The result of a change that belongs to another worker's shard: not applied here."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "OTHER_SHARD"


OTHER_SHARD = OtherShard()


def everything(entity: str | None) -> bool:
    """A shard predicate that takes every resource (one worker, a replay)."""
    return True


# How a batch writes the stored resources it edits, by their number. In DuckDB 1.5 over 22,000 rows, commit included:
# up to UPDATE_RESOURCES an update in place is cheapest (20 rows: 4.4 ms, against 6.9 for `INSERT OR REPLACE`; 40:
# 6.5 against 9.0; 96: 11.7 against 14.0; at 170 the upsert wins, 10.0 against 14.1); up to
# REPLACE_RESOURCES one upsert (170 rows: 10.0 ms, as a delete and an insert); beyond, a catch-up batch, a delete and
# an insert (500 rows: 15 against 25 ms; 1,500: 27 against 50), one statement more than a smaller batch costs.
UPDATE_RESOURCES = 96
REPLACE_RESOURCES = 256
# Those figures are of updates that set the list columns, which DuckDB makes a delete and an insert. An update that
# leaves them out is made in place and is cheapest up to about 500 rows (2026-12-08, median ms, in place against
# the thresholds above: 170 rows 16-17 against 21-22, 250 21 against 26, 500 35 against 35, 1,500 112 against 86).
IN_PLACE_RESOURCES = 512

RESOURCE_COLS = ("id, version, entity, evidence_class, tokens, title, content, supports, contradicts, "
                 "valid_from, valid_to, superseded_by, provenance_group, sensitivity, attributes, observed_at")

_RESOURCE_TYPES = {"version": "BIGINT", "entity": "VARCHAR", "evidence_class": "VARCHAR", "tokens": "BIGINT",
                   "title": "VARCHAR", "content": "VARCHAR", "supports": "VARCHAR[]", "contradicts": "VARCHAR[]",
                   "valid_from": "TIMESTAMPTZ", "valid_to": "TIMESTAMPTZ", "superseded_by": "VARCHAR",
                   "provenance_group": "VARCHAR", "sensitivity": "VARCHAR", "attributes": "VARCHAR",
                   "deleted": "BOOLEAN", "observed_at": "TIMESTAMPTZ", "log_tick": "BIGINT", "log_snapshot": "VARCHAR"}
_COLUMNS = ", ".join(("id", *_RESOURCE_TYPES))  # what `_values` and `resource_table` write, in their order


def resource_row(row: tuple) -> Resource:
    """A resource from a row of `RESOURCE_COLS`."""
    (rid, version, entity, cls, tokens, title, content, supports, contradicts, vf, vt, sup_by, group,
     sensitivity, attributes, observed_at) = row
    return Resource(id=rid, version=version, entity=entity, evidence_class=cls, tokens=tokens,
                    title=title or "", content=content or "", supports=tuple(supports or ()),
                    contradicts=tuple(contradicts or ()), valid_from=vf, valid_to=vt,
                    superseded_by=sup_by, provenance_group=group, sensitivity=sensitivity or "internal",
                    attributes=orjson.loads(attributes or "{}"), observed_at=observed_at)


def apply_resources(store: Store, changes: Sequence[SourceChange], rules: dict[str, set[str]],
                    mine: Mine = everything, left: dict[int, int] | None = None,
                    lane_of: Callable[[str | None], int] | None = None,
                    ) -> list[list[str] | InvalidEvent | OtherShard | None]:
    """Apply resource upserts and deletes in order with one read and one write; keys per change.

    `left` names the changes that are move notices (a delete that holds only while the row,
    as this batch has it so far, is about an entity of the lane it names: `lane_of` its entity).

    A change is None when it is older than what is stored, an InvalidEvent when its source may
    not assert its evidence class (the bundles' `sources` rules), and OTHER_SHARD when neither
    its entity nor the stored row's is `mine`. A row whose resource moved to another shard's
    entity becomes a tombstone once its keys are returned: the plans of its old entity are
    invalidated here, and the new entity's holder holds it from now on.
    """
    # Rows the writer read or wrote (see `_Batch.current`): a resource edited again (a hot one) needs no read.
    # Only this path writes resources.
    known = store.cached("catalog.resources", dict)
    ids = {c.record_id for c in changes}
    current: dict[str, tuple] = {i: known[i] for i in ids if i in known}
    if len(current) < len(ids):
        current.update((r[0], r[1:]) for r in store.db.execute(
            "SELECT id, version, deleted, entity, evidence_class, supports, contradicts, log_tick, log_snapshot "
            "FROM resources "
            "WHERE id IN (SELECT unnest(?))", [sorted(ids - set(current))]).fetchall())
    batch = _Batch(current, _kept(store, changes), rules, mine, left or {}, lane_of)
    out = [batch.apply(at, change) for at, change in enumerate(changes)]
    batch.write(store)
    remember(known, {rid: current[rid] for rid in set(current) & ids})
    return out


class _Batch:
    """One `apply_resources` call: the rows as the batch has them so far, and what it will write."""

    def __init__(self, current: dict[str, tuple], kept: dict[str, Resource], rules: dict[str, set[str]],
                 mine: Mine, left: dict[int, int], lane_of: Callable[[str | None], int] | None) -> None:
        self.current = current
        """id -> (version, deleted, entity, evidence_class, supports, contradicts, log_tick, log_snapshot)."""
        self.stored = set(current)  # ids with a row in the file before this batch
        self.entities = {rid: row[2] for rid, row in current.items()}  # as stored, before this batch
        self.lists = {rid: _lists(row[4], row[5]) for rid, row in current.items()}  # supports, contradicts as stored
        self.kept, self.rules, self.mine, self.left, self.lane_of = kept, rules, mine, left, lane_of
        self.written: dict[str, Resource | None] = {}  # None: deleted
        self.moved: set[str] = set()  # written about an entity of another shard: a tombstone here
        # Upserted, then deleted in this batch: written and then made a tombstone, so the file holds the row the
        # memo remembers (its version as a fence, its lists as the next batch compares them).
        self.dropped: set[str] = set()

    def apply(self, at: int, change: SourceChange) -> list[str] | InvalidEvent | OtherShard | None:
        """Judge the batch's `at`-th change against the row as the batch has it; its dependency keys if applied."""
        old = self.current.get(change.record_id)
        if at in self.left and (old is None or old[1] or self.lane_of is None
                                or self.lane_of(old[2]) != self.left[at]):
            return None  # the resource is not in the lane it left (any more): nothing to remove
        new_entity = change.record.entity if change.record is not None else None  # type: ignore[union-attr]
        if refused(change.record, change.unavailable, self.rules):  # type: ignore[arg-type]
            # The record alone decides, so any worker that reads it judges it alike (who reports it is the
            # applier's choice: the entity's owner, or the duty owner of its input partition).
            return _refusal()
        held = old is not None and self.mine(old[2])
        if not held and (change.record is None or not self.mine(new_entity)):
            return OTHER_SHARD
        keys = [dk.resource(change.record_id)]
        if old is not None:
            keys += dk.scope_keys(old[2], old[3], list(old[4] or ()) + list(old[5] or ()))
        new: Resource | None = change.record  # type: ignore[assignment]
        if new is None:
            if old is None or old[1]:
                return None
            self.current[change.record_id] = (old[0], True) + old[2:]
            if self.written.get(change.record_id) is None:
                self.written[change.record_id] = None
            else:
                self.dropped.add(change.record_id)
            return keys
        tick = new.version >> LOG_TICK_BITS if new.log_ordered else None
        if old is not None and not _newer(new, tick, old):
            return None
        if old is not None and new.version <= old[0]:
            # A later change of the stored tick (read in log order), or one committed during a snapshot
            # (its tick is below the snapshot row's): one above, so plan ids still move on.
            new = replace(new, version=old[0] + 1)
        if change.unavailable:
            # A dropped upsert is a deleted record: nothing of it is filled in (`_kept` reads only live rows).
            base = None if new.id in self.dropped else (
                self.written[new.id] if new.id in self.written else self.kept.get(new.id))
            if base is None:
                return unavailable_value(change, "resource")
            new = replace(new, **{f: getattr(base, f) for f, _ in change.unavailable})
        allowed = self.rules.get(new.provenance_group or "")
        if allowed is not None and new.evidence_class not in allowed:
            # Refused where it was going to: the new entity's holder reports it (once), the old row stays.
            return _refusal()
        point = new.log_position if new.log_snapshot else None
        self.current[new.id] = (new.version, False, new.entity, new.evidence_class, new.supports, new.contradicts,
                                tick, point)
        self.written[new.id] = new
        self.dropped.discard(new.id)
        if self.mine(new.entity):
            self.moved.discard(new.id)
        else:
            self.moved.add(new.id)
        return keys + dk.scope_keys(new.entity, new.evidence_class, new.supports + new.contradicts)

    def write(self, store: Store) -> None:
        """Write what the batch applied: upserts, deletes, and tombstones of rows moved to another shard or deleted
        after an upsert in the batch."""
        upserts = [r for r in self.written.values() if r is not None]
        order = {r.id: self.current[r.id][6:] for r in upserts}
        _write(store, [r for r in upserts if r.id not in self.stored], [r for r in upserts if r.id in self.stored],
               order, self.entities, self.lists)
        # Moved rows too, after the write: a tombstone at its new entity, the version staying as a fence (an older
        # change about the old entity arriving later is ignored); the new entity's holder has the row.
        tombstones = sorted({rid for rid, r in self.written.items() if r is None} | self.moved | self.dropped)
        if tombstones:
            store.db.execute("UPDATE resources SET deleted = true WHERE id IN (SELECT unnest(?))", [tombstones])
        for rid in self.moved:
            self.current[rid] = (self.current[rid][0], True) + self.current[rid][2:]


def held_entities(store: Store) -> list[str]:
    """Entities that stored resources are about (those about none are every worker's)."""
    return [r[0] for r in store.db.execute("SELECT DISTINCT entity FROM resources WHERE entity IS NOT NULL").fetchall()]


def live_resources(store: Store, ids: Collection[str]) -> set[str]:
    """Of these resource ids, those stored and not deleted: rows the writer remembers, and one read for the rest."""
    known = store.cached("catalog.resources", dict)
    live = {i for i in ids if i in known and not known[i][1]}
    rest = sorted(i for i in ids if i not in known)
    if rest:
        live.update(r[0] for r in store.db.execute(
            "SELECT id FROM resources WHERE id IN (SELECT unnest(?)) AND NOT deleted", [rest]).fetchall())
    return live


def drop_resources(store: Store, entities: Sequence[str]) -> int:
    """Remove the stored rows (tombstones too) of these entities' resources; how many went."""
    if not entities:
        return 0
    (count,) = store.db.execute("SELECT count(*) FROM resources WHERE entity IN (SELECT unnest(?::VARCHAR[]))",
                                [list(entities)]).fetchone()
    store.db.execute("DELETE FROM resources WHERE entity IN (SELECT unnest(?::VARCHAR[]))", [list(entities)])
    store.forget("catalog.resources")
    return int(count)


def refused(record: Resource | None, unavailable: Sequence[tuple[str, str]], rules: dict[str, set[str]]) -> bool:
    """Whether an upsert's source may not assert its evidence class, as far as the record itself says."""
    if record is None or {"provenance_group", "evidence_class"} & {f for f, _ in unavailable}:
        return False  # a delete; or filled from the stored row first, and judged then
    allowed = rules.get(record.provenance_group or "")
    return allowed is not None and record.evidence_class not in allowed


def _refusal() -> InvalidEvent:
    return InvalidEvent("class_not_allowed_for_source", "the resource's provenance_group may not assert its "
                        "evidence_class (see the policy bundle's sources); the resource is not applied")


def _newer(new: Resource, tick: int | None, old: tuple) -> bool:
    """Whether an upsert replaces the stored row `old` (a tuple of `apply_resources`' memo)."""
    if tick is None:
        return new.version > old[0]
    # Rows stored before ticks were kept have never been raised above their tick: it is their version's.
    stored_tick = old[6] if old[6] is not None else old[0] >> LOG_TICK_BITS
    return newer(tick, new.log_position, new.log_snapshot, stored_tick, old[7])


def _kept(store: Store, changes: Sequence[SourceChange]) -> dict[str, Resource]:
    """The stored rows of resources whose upserts left columns out (read only when one does)."""
    ids = sorted({c.record_id for c in changes if c.unavailable and c.record is not None})
    if not ids:
        return {}
    return {r[0]: resource_row(r) for r in store.db.execute(
        f"SELECT {RESOURCE_COLS} FROM resources WHERE NOT deleted AND id IN (SELECT unnest(?))", [ids]).fetchall()}


def _write(store: Store, new: list[Resource], stored: list[Resource], order: dict[str, tuple],
           entities: dict[str, str | None], lists: dict[str, tuple]) -> None:
    """Insert new resources and update stored ones in place: a few rows' upsert costs several times either.

    `order` holds each row's (log_tick, log_snapshot): what later log-ordered changes are judged against;
    `entities` the stored rows' entities, `lists` their (supports, contradicts).
    """
    # Columns by name: files migrated from different versions hold them in different orders. Every column is
    # written, so a row deleted and inserted again is the row an update would leave.
    # DuckDB updates a row in place only when no list column is set: setting one deletes the row and inserts it
    # again (1.5 against 1.0 ms for one row, 3.3-4.0 against 1.7 for 40), and the deleted row stays in the file
    # until its row group is merged. Most edits leave both lists as they were: then an update in place wins up to
    # IN_PLACE_RESOURCES rows.
    same_lists = all(_lists(r.supports, r.contradicts) == lists.get(r.id) for r in stored)
    if len(stored) > (IN_PLACE_RESOURCES if same_lists else REPLACE_RESOURCES):
        rows = resource_table(new + stored, order)  # built first: nothing is deleted for a row that cannot be
        store.db.execute("DELETE FROM resources WHERE id IN (SELECT unnest(?))", [[r.id for r in stored]])
        store.insert_rows("resources", rows, verb="INSERT INTO", columns=True)
        return
    if len(stored) > UPDATE_RESOURCES and not same_lists:
        store.insert_rows("resources", resource_table(new + stored, order), columns=True)
        return
    if len(new) > SMALL_INSERT_ROWS:
        store.insert_rows("resources", resource_table(new, order), verb="INSERT INTO", columns=True)
    elif new:
        insert_values(store.db, f"resources ({_COLUMNS})", [_values(r, order) for r in new], verb="INSERT INTO")
    if stored:
        # Setting an indexed column costs its index entries even to the same value (0.7 of a 2.9 ms point
        # update): entity is left out when no row moves.
        skip = {"entity"} if all(r.entity == entities.get(r.id) for r in stored) else set()
        if same_lists:
            skip |= {"supports", "contradicts"}
        at = [i for i, c in enumerate(("id", *_RESOURCE_TYPES)) if c not in skip]
        types = {c: t for c, t in _RESOURCE_TYPES.items() if c not in skip}
        store.update_rows("resources", ("id",), tuple(types), [tuple(v[i] for i in at) for v in
                                                               (_values(r, order) for r in stored)],
                          ", ".join(f"{c} = CAST({{{c}}} AS {t})" for c, t in types.items()))


def _lists(supports: Sequence[str] | None, contradicts: Sequence[str] | None) -> tuple:
    """A row's list columns, comparable whether read from the file (lists) or from a record (tuples)."""
    return tuple(supports or ()), tuple(contradicts or ())


def _values(r: Resource, order: dict[str, tuple]) -> tuple:
    """A resource's row in the order of `_COLUMNS` (as `resource_table`)."""
    return (r.id, r.version, r.entity, r.evidence_class, r.tokens, r.title, r.content, list(r.supports),
            list(r.contradicts), r.valid_from, r.valid_to, r.superseded_by, r.provenance_group, r.sensitivity,
            orjson.dumps(dict(r.attributes)).decode(), False, r.observed_at, *order.get(r.id, (None, None)))


def resource_table(resources: Sequence[Resource], order: dict[str, tuple] | None = None) -> pa.Table:
    """Arrow rows in the order of `_COLUMNS` (`order`: as `_write`'s)."""
    ticks = [(order or {}).get(r.id, (None, None)) for r in resources]
    strings = pa.list_(pa.string())
    when = pa.timestamp("us", tz="UTC")
    return pa.table({
        "id": [r.id for r in resources], "version": pa.array([r.version for r in resources], pa.int64()),
        "entity": [r.entity for r in resources], "evidence_class": [r.evidence_class for r in resources],
        "tokens": pa.array([r.tokens for r in resources], pa.int64()), "title": [r.title for r in resources],
        "content": [r.content for r in resources],
        "supports": pa.array([list(r.supports) for r in resources], strings),
        "contradicts": pa.array([list(r.contradicts) for r in resources], strings),
        "valid_from": pa.array([r.valid_from for r in resources], when),
        "valid_to": pa.array([r.valid_to for r in resources], when),
        "superseded_by": pa.array([r.superseded_by for r in resources], pa.string()),
        "provenance_group": pa.array([r.provenance_group for r in resources], pa.string()),
        "sensitivity": [r.sensitivity for r in resources],
        "attributes": [orjson.dumps(dict(r.attributes)).decode() for r in resources],
        "deleted": pa.array([False] * len(resources), pa.bool_()),
        "observed_at": pa.array([r.observed_at for r in resources], when),
        "log_tick": pa.array([t for t, _ in ticks], pa.int64()),
        "log_snapshot": pa.array([p for _, p in ticks], pa.string()),
    })
