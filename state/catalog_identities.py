"""Principal, revocation and entity changes applied in bulk: one read and one write per table per batch."""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Callable, Sequence

import orjson
import pyarrow as pa

from compiler import dependency_keys as dk
from compiler.policy import principal_representable
from schemas.errors import InvalidEvent
from schemas.records import Entity, Principal, Revocation, SourceChange
from state.lookups import remember
from state.policy_reads import read_by_policy
from state.store import Store

log = logging.getLogger(__name__)

_WORD = re.compile(r"\w+")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_WHEN = pa.timestamp("us", tz="UTC")
_STRINGS = pa.list_(pa.string())

Identity = SourceChange | Revocation  # a principal or entity change, or a revocation

# What the writer's store remembers of these tables for the catalog (`Store.cached`); a write here drops it.
PRINCIPAL_MEMO = ("catalog.principals",)
ENTITY_MEMO = ("catalog.entity_matches", "catalog.entities_named")
# The rows `apply_identities` read or wrote, by key: a batch reads only principals and revocations it has not met
# (at 1,000 events/s a batch held some 13 principal records and read the three tables each time, 2.3 ms of about
# 45). Only it writes these tables; a rollback drops what the store remembers.
PRINCIPAL_ROWS, REVOKED_ROWS, HORIZON_ROWS = "identities.principals", "identities.revoked", "identities.horizons"
IDENTITY_MEMO = PRINCIPAL_MEMO + ENTITY_MEMO + (PRINCIPAL_ROWS, REVOKED_ROWS, HORIZON_ROWS)


def apply_identities(store: Store, items: Sequence[Identity], times: Sequence[datetime | None] | None,
                     policy_texts: Callable[[], list[str]]) -> list[list[str] | InvalidEvent | None]:
    """Apply the changes in order, as one by one; the dependency keys each touched (None: older than stored).

    An upsert that left fields out (Debezium's unchanged TOASTed columns) keeps the stored
    values of those fields, and is an InvalidEvent (`unavailable_value`) when none are stored.

    `times` are the events' times (None or the epoch: unknown), which the revocation rule reads
    (see `revocation_applies`). The batch's rows are read once, the changes played over them in
    memory, and each table's resulting rows written once. `policy_texts()` returns the stored
    Cedar texts (read lazily: most batches never need them).
    """
    db = store.db
    times = list(times) if times is not None else [None] * len(items)
    pids = sorted({i.record_id for i in items if isinstance(i, SourceChange) and i.kind == "principal"}
                  | {i.principal for i in items if isinstance(i, Revocation)})
    eids = sorted({i.record_id for i in items if isinstance(i, SourceChange) and i.kind == "entity"})
    rkeys = sorted({(i.principal, i.revoke, i.value) for i in items if isinstance(i, Revocation)})
    # id -> [roles, attributes (JSON text), delegation_version, deleted, made_at]; copies: the changes edit them
    principals = {p: list(row) for p, row in _known(store, PRINCIPAL_ROWS, pids, lambda ids: {
        r[0]: list(r[1:]) for r in db.execute("SELECT id, roles, attributes, delegation_version, deleted, made_at "
                                              "FROM principals WHERE id IN (SELECT unnest(?))", [ids]).fetchall()}
    ).items() if row is not None}
    # (principal, kind, value) -> [effective_at, issued_by, event_id, delegation_version]; only the batch's keys
    # are remembered (a principal may hold many rows)
    revoked = {k: list(row) for k, row in _known(store, REVOKED_ROWS, rkeys, lambda keys: _revoked_rows(db, keys)
                                                 ).items() if row is not None}
    # principal -> the latest effective_at of its revocations: an upsert reads this one value, never the list
    horizons = {p: at for p, at in _known(store, HORIZON_ROWS, pids, lambda ids: dict(db.execute(
        "SELECT principal, effective_at FROM revocation_horizons WHERE principal IN (SELECT unnest(?))",
        [ids]).fetchall())).items() if at is not None}
    entities = {r[0]: [r[1], r[2]] for r in db.execute(
        "SELECT id, aliases, deleted FROM entities WHERE id IN (SELECT unnest(?))", [eids]).fetchall()} if eids else {}
    stored_r = set(revoked)  # rows the file holds: updated, not upserted
    stored_roles = {pid: tuple(row[0] or ()) for pid, row in principals.items()}  # as stored; rows held, likewise
    changed_p: set[str] = set()
    changed_r: set[tuple] = set()
    changed_h: set[str] = set()
    changed_e: set[str] = set()
    counts: Counter[str] = Counter()
    out: list[list[str] | InvalidEvent | None] = []
    for item, at in zip(items, times, strict=True):
        if isinstance(item, Revocation):
            out.append(_revoke(item, principals, revoked, horizons, changed_r, changed_h, counts))
        elif item.kind == "principal":
            out.append(_principal(item, known_time(at), principals, horizons, changed_p, policy_texts, counts))
        else:
            out.append(_entity(item, entities, changed_e))
    if changed_p:
        _write_principals(store, [(pid, *principals[pid]) for pid in sorted(changed_p)], stored_roles)
    if changed_r:
        # A revocation is mostly of a key never revoked: a plain insert costs half an upsert (3 rows: 1.5 against
        # 2.9 ms). Only this function writes the table, and a key it holds nothing for is still free.
        for keys, verb in ((changed_r - stored_r, "INSERT INTO"), (changed_r & stored_r, "INSERT OR REPLACE INTO")):
            rows = [(*key, *revoked[key]) for key in sorted(keys)]
            store.insert_rows("revoked", pa.table({
                "principal": [r[0] for r in rows], "kind": [r[1] for r in rows], "value": [r[2] for r in rows],
                "effective_at": pa.array([r[3] for r in rows], _WHEN), "issued_by": pa.array([r[4] for r in rows],
                                                                                              pa.string()),
                "event_id": pa.array([r[5] for r in rows], pa.string()),
                "delegation_version": pa.array([r[6] for r in rows], pa.int64())}), verb=verb, columns=True)
    if changed_h:
        store.insert_rows("revocation_horizons", pa.table({
            "principal": sorted(changed_h), "effective_at": pa.array([horizons[p] for p in sorted(changed_h)],
                                                                     _WHEN)}), columns=True)
    if changed_p or changed_r:
        # A principal as the compiler sees it is its row less its revocations: only the changed ones are stale.
        compiled = store.cached(PRINCIPAL_MEMO[0], dict)
        for pid in changed_p | {key[0] for key in changed_r}:
            compiled.pop(pid, None)
    _remember_written(store, principals, changed_p, revoked, changed_r, horizons, changed_h)
    if changed_e:
        rows = [(eid, *entities[eid]) for eid in sorted(changed_e)]
        store.heads.remove_names()  # a name held for cached selects may resolve otherwise now
        store.insert_rows("entities", pa.table({
            "id": [r[0] for r in rows], "aliases": pa.array([list(r[1] or ()) for r in rows], _STRINGS),
            "deleted": pa.array([bool(r[2]) for r in rows], pa.bool_())}))
        store.forget(*ENTITY_MEMO)
        store.heads_changed()
    if counts:
        store.bump_many(counts)
    return out


def _write_principals(store: Store, rows: list[tuple], stored: dict[str, tuple]) -> None:
    """Write changed principal rows: those the file holds (`stored`: their roles) are updated in place (10 rows: 2.9
    against 3.6 ms for an upsert), the rest upserted; should fewer rows be updated than held, all are upserted.

    Roles are set only when some held row's changed: DuckDB updates a row in place only when no list column is set
    (see `catalog_resources._write`)."""
    rows = [(pid, list(roles or ()), attributes, version, bool(deleted), made_at)
            for pid, roles, attributes, version, deleted, made_at in rows]
    held = [r for r in rows if r[0] in stored]
    updated = 0
    if held and all(tuple(r[1]) == stored[r[0]] for r in held):
        updated = store.update_rows("principals", ("id",), _PRINCIPAL_COLUMNS[1:], [(r[0], *r[2:]) for r in held],
                                    _PRINCIPAL_SET)
    elif held:
        updated = store.update_rows("principals", ("id",), _PRINCIPAL_COLUMNS, held, _ROLES_SET + _PRINCIPAL_SET)
    if held and updated == len(held):
        rows = [r for r in rows if r[0] not in stored]
    if rows:
        store.insert_rows("principals", pa.table({
            "id": [r[0] for r in rows], "roles": pa.array([r[1] for r in rows], _STRINGS),
            "attributes": pa.array([r[2] for r in rows], pa.string()),
            "delegation_version": pa.array([r[3] for r in rows], pa.int64()),
            "deleted": pa.array([r[4] for r in rows], pa.bool_()),
            "made_at": pa.array([r[5] for r in rows], _WHEN)}), columns=True)


_PRINCIPAL_COLUMNS = ("roles", "attributes", "delegation_version", "deleted", "made_at")
_ROLES_SET = "roles = CAST({roles} AS VARCHAR[]), "
_PRINCIPAL_SET = ("attributes = CAST({attributes} AS VARCHAR), "
                  "delegation_version = CAST({delegation_version} AS BIGINT), deleted = CAST({deleted} AS BOOLEAN), "
                  "made_at = CAST({made_at} AS TIMESTAMPTZ)")


def _known(store: Store, key: str, ids: Sequence, load: Callable[[list], dict]) -> dict:
    """Each id's remembered row (None: none stored), reading those not remembered with `load(missing)`."""
    memo = store.cached(key, dict)
    rows = {i: memo[i] for i in ids if i in memo}
    missing = [i for i in ids if i not in rows]
    if missing:
        found = load(missing)
        rows.update((i, found.get(i)) for i in missing)
        remember(memo, {i: rows[i] for i in missing})
    return rows


def _revoked_rows(db, keys: list[tuple[str, str, str]]) -> dict[tuple, list]:
    """The stored rows of these revocation keys, found through the index on principal (a key built of the three
    columns would scan every row)."""
    wanted = set(keys)
    return {tuple(r[:3]): list(r[3:]) for r in db.execute(
        "SELECT principal, kind, value, effective_at, issued_by, event_id, delegation_version FROM revoked "
        "WHERE principal IN (SELECT unnest(?))", [sorted({k[0] for k in keys})]).fetchall() if tuple(r[:3]) in wanted}


def _remember_written(store: Store, principals: dict, changed_p: set, revoked: dict, changed_r: set,
                      horizons: dict, changed_h: set) -> None:
    """Remember the rows just written as the file now holds them."""
    remember(store.cached(PRINCIPAL_ROWS, dict), {p: list(principals[p]) for p in changed_p})
    remember(store.cached(REVOKED_ROWS, dict), {key: list(revoked[key]) for key in changed_r})
    remember(store.cached(HORIZON_ROWS, dict), {p: horizons[p] for p in changed_h})


def known_time(at: datetime | None) -> datetime | None:
    """An event time, or None when it is unknown (CDC without a commit time is dated the epoch)."""
    return at if at is not None and at > _EPOCH else None


def revocation_applies(made_at: datetime | None, version: int | None, effective_at: datetime | None,
                       as_of: int | None) -> bool:
    """Whether a revocation withdraws from the stored principal record (the one rule; read order plays no part).

    It withdraws from every record made at or before its `effective_at`, and from every record
    whose version is at most the version it names (`as_of`, explicit only). A record of unknown
    time is taken as made before (fail closed); so is a revocation of unknown time.
    """
    if made_at is None or effective_at is None or made_at <= effective_at:
        return True
    return as_of is not None and (version or 0) <= as_of


def _principal(change: SourceChange, made_at: datetime | None, principals: dict, horizons: dict, changed: set,
               policy_texts: Callable[[], list[str]],
               counts: Counter[str]) -> list[str] | InvalidEvent | None:
    new: Principal | None = change.record  # type: ignore[assignment]
    old = principals.get(change.record_id)
    if new is not None and change.unavailable:
        kept = _kept_principal(change, new, old, made_at)
        if not isinstance(kept, Principal):
            return kept
        new = kept
    if new is None:
        if old is not None and old[3]:
            return None
        if made_at is None:
            counts["principal_time_unknown"] += 1
            _warn_unknown_time(change.record_id)
        changed.add(change.record_id)
        if old is None:
            # A tombstone: an upsert made before this delete cannot bring the principal back later.
            principals[change.record_id] = [(), "{}", None, True, made_at]
            return []
        # A delete keeps the version it deleted; its slot for the record's time holds the delete's.
        principals[change.record_id] = old[:3] + [True, made_at]
        return [dk.principal(change.record_id)]
    if old is not None and old[3]:
        if not _recreates(old, new, made_at):
            if old[2] is None or new.delegation_version > old[2]:
                old[2] = new.delegation_version  # a later re-create must pass every version refused here
                changed.add(new.id)
            return None
    elif old is not None and _rank(new.delegation_version, made_at) < _rank(old[2], old[4]):
        return None
    horizon = horizons.get(new.id)
    if made_at is None and horizon is not None:
        counts["principal_time_unknown"] += 1
        _warn_unknown_time(new.id)
    principals[new.id] = [list(new.roles), orjson.dumps(dict(new.attributes)).decode(),
                          new.delegation_version, False, made_at]
    changed.add(new.id)
    if old is not None and not old[3] and not _crosses(old[4], made_at, horizon) \
            and not _matters(old, new, policy_texts):
        return []
    return [dk.principal(change.record_id)]


def _kept_principal(change: SourceChange, new: Principal, old: list | None,
                    made_at: datetime | None) -> Principal | InvalidEvent | None:
    """An upsert that left fields out, with the stored record's values of them; or what to answer instead.

    Only a live stored record has values to keep. Over a deleted one the upsert goes on with
    its own (empty) fields when it is refused all the same (made before the delete, or at no
    higher version: only its version and time are read, as of a whole record, so a refusal
    still raises the tombstone's version); when it would bring the principal back, or its
    version is what was left out, nothing can complete it and it is dead-lettered, changing nothing.
    """
    fields = {f for f, _ in change.unavailable}
    if old is not None and not old[3]:
        stored = {"roles": tuple(old[0] or ()), "attributes": MappingProxyType(orjson.loads(old[1] or "{}")),
                  "delegation_version": old[2] or 0}
        return replace(new, **{f: stored[f] for f in fields if f in stored})
    if old is not None and "delegation_version" not in fields and not _recreates(old, new, made_at):
        return new
    return unavailable_value(change, "principal")


def unavailable_value(change: SourceChange, kind: str) -> InvalidEvent:
    """The dead letter of an upsert whose left-out fields have no stored value to keep."""
    return InvalidEvent("unavailable_value", "column " + ", ".join(c for _, c in change.unavailable)
                        + f": Debezium did not send this unchanged TOASTed value, and no stored {kind} holds a value "
                        "to keep; set REPLICA IDENTITY FULL on the source table (ALTER TABLE ... REPLICA IDENTITY "
                        "FULL) so that updates carry every column")


def _rank(version: int | None, made_at: datetime | None) -> tuple:
    """Which of two records of a principal is the later: the version, then the time (unknown is earliest).

    At an equal version and time the record read last wins, as it always has.
    """
    return (version or 0, made_at or _EPOCH)


def _recreates(old: list, new: Principal, made_at: datetime | None) -> bool:
    """Whether an upsert brings a deleted principal back: a version above any deleted or refused, made after."""
    if old[2] is not None and new.delegation_version <= old[2]:
        return False
    return old[4] is None or (made_at is not None and made_at > old[4])


def _crosses(before: datetime | None, after: datetime | None, horizon: datetime | None) -> bool:
    """Whether a record's new time can change what some revocation withdraws (both past the latest: no)."""
    if horizon is None or before == after:
        return False
    return before is None or after is None or min(before, after) <= horizon


_warned: set[str] = set()


def _warn_unknown_time(pid: str) -> None:
    if not _warned:  # said once per process: a connector without commit times would flood the log
        _warned.add(pid)
        log.warning("a principal record of unknown event time cannot undo a revocation of it (fail closed); "
                    "configure the producer or connector to send the record's commit time (counter "
                    "principal_time_unknown)")


def _matters(old: list, new: Principal, policy_texts: Callable[[], list[str]]) -> bool:
    """Whether an upsert can change any plan: roles, delegation, or an attribute some policy reads.

    Cedar reads attributes only by name (an identifier, or a string literal that may spell it
    with escapes), so an attribute whose name appears in no stored policy text, escapes
    resolved, cannot change an authorisation; the compiler itself reads only the
    revocable lists. Anything else (a department rename, a phone number) invalidates nothing.
    """
    if new.delegation_version != old[2] or sorted(new.roles) != sorted(old[0] or ()):
        return True
    before, after = orjson.loads(old[1] or "{}"), dict(new.attributes)
    # Compared as JSON, not by ==: Python holds 1 == 1.0 == True, where Cedar has a Long, a decimal and a Bool.
    changed = {k for k in set(before) | set(after) if _json(before.get(k)) != _json(after.get(k))}
    if not changed:
        return False
    if changed & {"grants", "delegations", "sessions"}:
        return True
    texts = tuple(policy_texts())
    if any(read_by_policy(name, texts) for name in changed):
        return True
    # A principal Cedar cannot hold is denied everything, whatever the policies read (asked last: it costs a call).
    return not (principal_representable(before) and principal_representable(after))


def _json(value: object) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _revoke(revocation: Revocation, principals: dict, revoked: dict, horizons: dict, changed: set,
            changed_h: set, counts: Counter[str]) -> list[str]:
    """A withdrawal applies at once; copies keep the latest effective_at and the highest version named."""
    key = (revocation.principal, revocation.revoke, revocation.value)
    old = revoked.get(key)
    when, issued_by, version = revocation.effective_at, revocation.issued_by, revocation.delegation_version
    if old is not None:
        if old[0] is not None and old[0] > when:
            when, issued_by = old[0], old[1]
        if old[3] is not None:
            version = old[3] if version is None else max(old[3], version)
    revoked[key] = [when, issued_by, old[2] if old else None, version]
    row = principals.get(revocation.principal)
    if revocation.delegation_version is not None and row is not None and not row[3] \
            and (row[2] or 0) > revocation.delegation_version:
        # Stale: the version rule withdraws nothing from the stored record; the time rule still may.
        counts["stale_revocation_versions"] += 1
    horizon = horizons.get(revocation.principal)
    if horizon is None or horizon < when:
        horizons[revocation.principal] = when
        changed_h.add(revocation.principal)
    changed.add(key)
    return [dk.principal(revocation.principal)]


def _entity(change: SourceChange, entities: dict, changed: set) -> list[str] | InvalidEvent | None:
    new: Entity | None = change.record  # type: ignore[assignment]
    row = entities.get(change.record_id)
    old = row[0] if row is not None and not row[1] else None
    if new is not None and any(f == "aliases" for f, _ in change.unavailable):  # its only field but the id
        if row is None or row[1]:
            return unavailable_value(change, "entity")
        new = replace(new, aliases=tuple(old or ()))
    names = {change.record_id.lower()} | {a.lower() for a in (old or ())}
    if new is None:
        if row is None or row[1]:
            return None
        entities[change.record_id] = [row[0], True]
    else:
        names |= {a.lower() for a in new.aliases}
        entities[new.id] = [list(new.aliases), False]
    changed.add(change.record_id)
    words = sorted({w for n in names for w in _WORD.findall(n)})
    return ([dk.entity(change.record_id)] + [dk.alias(n) for n in sorted(names)]
            + [dk.name_word(w) for w in words])
