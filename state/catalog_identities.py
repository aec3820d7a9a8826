"""Principal, revocation and entity changes applied in bulk: one read and one write per table per batch."""

from __future__ import annotations

import functools
import re
from typing import Callable, Sequence

import orjson
import pyarrow as pa

from compiler import dependency_keys as dk
from compiler.policy import principal_representable
from schemas.records import Entity, Principal, Revocation, SourceChange
from state.store import Store

_WORD = re.compile(r"\w+")
_WHEN = pa.timestamp("us", tz="UTC")
_STRINGS = pa.list_(pa.string())

Identity = SourceChange | Revocation  # a principal or entity change, or a revocation

# What the writer's store remembers of these tables for the catalog (`Store.cached`); a write here drops it.
PRINCIPAL_MEMO = ("catalog.principals",)
ENTITY_MEMO = ("catalog.entity_matches", "catalog.entities_named")
IDENTITY_MEMO = PRINCIPAL_MEMO + ENTITY_MEMO


def apply_identities(store: Store, items: Sequence[Identity],
                     policy_texts: Callable[[], list[str]]) -> list[list[str] | None]:
    """Apply the changes in order, as one by one; the dependency keys each touched (None: older than stored).

    The batch's rows are read once, the changes played over them in memory (a revocation before
    its principal's upsert, repeats of one id), and each table's resulting rows written once.
    `policy_texts()` returns the stored Cedar texts (read lazily: most batches never need them).
    """
    db = store.db
    pids = sorted({i.record_id for i in items if isinstance(i, SourceChange) and i.kind == "principal"}
                  | {i.principal for i in items if isinstance(i, Revocation)})
    eids = sorted({i.record_id for i in items if isinstance(i, SourceChange) and i.kind == "entity"})
    # id -> [roles, attributes (JSON text), delegation_version, deleted]
    principals = {r[0]: list(r[1:]) for r in db.execute(
        "SELECT id, roles, attributes, delegation_version, deleted FROM principals WHERE id IN (SELECT unnest(?))",
        [pids]).fetchall()} if pids else {}
    # (principal, kind, value) -> [effective_at, issued_by, event_id, delegation_version]
    revoked = {tuple(r[:3]): list(r[3:]) for r in db.execute(
        "SELECT principal, kind, value, effective_at, issued_by, event_id, delegation_version FROM revoked "
        "WHERE principal IN (SELECT unnest(?))", [pids]).fetchall()} if pids else {}
    entities = {r[0]: [r[1], r[2]] for r in db.execute(
        "SELECT id, aliases, deleted FROM entities WHERE id IN (SELECT unnest(?))", [eids]).fetchall()} if eids else {}
    changed_p: set[str] = set()
    changed_r: set[tuple] = set()
    changed_e: set[str] = set()
    # principal -> its revocations of unknown delegation version: a principal's upsert settles them
    # without scanning every revocation read (a principal revoked often has thousands).
    unversioned: dict[str, set[tuple]] = {}
    for key, row in revoked.items():
        if row[3] is None:
            unversioned.setdefault(key[0], set()).add(key)
    out: list[list[str] | None] = []
    for item in items:
        if isinstance(item, Revocation):
            out.append(_revoke(item, principals, revoked, changed_r, unversioned))
        elif item.kind == "principal":
            out.append(_principal(item, principals, revoked, changed_p, changed_r, policy_texts, unversioned))
        else:
            out.append(_entity(item, entities, changed_e))
    if changed_p:
        rows = [(pid, *principals[pid]) for pid in sorted(changed_p)]
        store.insert_rows("principals", pa.table({
            "id": [r[0] for r in rows], "roles": pa.array([list(r[1] or ()) for r in rows], _STRINGS),
            "attributes": pa.array([r[2] for r in rows], pa.string()),
            "delegation_version": pa.array([r[3] for r in rows], pa.int64()),
            "deleted": pa.array([bool(r[4]) for r in rows], pa.bool_())}))
    if changed_r:
        rows = [(*key, *revoked[key]) for key in sorted(changed_r)]
        store.insert_rows("revoked", pa.table({
            "principal": [r[0] for r in rows], "kind": [r[1] for r in rows], "value": [r[2] for r in rows],
            "effective_at": pa.array([r[3] for r in rows], _WHEN), "issued_by": pa.array([r[4] for r in rows],
                                                                                          pa.string()),
            "event_id": pa.array([r[5] for r in rows], pa.string()),
            "delegation_version": pa.array([r[6] for r in rows], pa.int64())}))
    if changed_p or changed_r:
        store.forget(*PRINCIPAL_MEMO)
    if changed_e:
        rows = [(eid, *entities[eid]) for eid in sorted(changed_e)]
        store.heads.remove_names()  # a name held for cached selects may resolve otherwise now
        store.insert_rows("entities", pa.table({
            "id": [r[0] for r in rows], "aliases": pa.array([list(r[1] or ()) for r in rows], _STRINGS),
            "deleted": pa.array([bool(r[2]) for r in rows], pa.bool_())}))
        store.forget(*ENTITY_MEMO)
        store.heads_changed()
    return out


def _principal(change: SourceChange, principals: dict, revoked: dict, changed: set, changed_r: set,
               policy_texts: Callable[[], list[str]], unversioned: dict[str, set[tuple]]) -> list[str] | None:
    new: Principal | None = change.record  # type: ignore[assignment]
    old = principals.get(change.record_id)
    if new is None:
        if old is None or old[3]:
            return None
        principals[change.record_id] = old[:3] + [True]
    else:
        if old is not None and not old[3] and new.delegation_version < old[2]:
            return None
        principals[new.id] = [list(new.roles), orjson.dumps(dict(new.attributes)).decode(),
                              new.delegation_version, False]
        # A revocation that arrived before its principal applies as of the first version seen.
        for key in unversioned.pop(new.id, ()):
            revoked[key][3] = new.delegation_version
            changed_r.add(key)
        changed.add(new.id)
        if old is not None and not old[3] and not _matters(old, new, policy_texts):
            return []
    changed.add(change.record_id)
    return [dk.principal(change.record_id)]


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
    texts = [spelt for text in policy_texts() for spelt in (text, _unescaped(text))]
    # Not \b: a name that starts or ends with a non-word character ("level!") has no word boundary there.
    if any(re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) for name in changed for text in texts):
        return True
    # A principal Cedar cannot hold is denied everything, whatever the policies read (asked last: it costs a call).
    return not (principal_representable(before) and principal_representable(after))


def _json(value: object) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


@functools.lru_cache(maxsize=1024)  # the stored texts change rarely; principal updates come often
def _unescaped(text: str) -> str:
    """The text with Cedar's string escapes resolved: `principal["\\u{61}ge"]` reads `age`."""
    def one(m: re.Match) -> str:
        code = m.group(1)
        if code.startswith("u{"):
            try:
                return chr(int(code[2:-1], 16))
            except ValueError:
                return m.group(0)
        return _ESCAPED.get(code, code)
    return _ESCAPE.sub(one, text)


_ESCAPE = re.compile(r"\\(u\{[0-9a-fA-F]{1,6}\}|.)", re.DOTALL)
_ESCAPED = {"n": "\n", "r": "\r", "t": "\t", "0": "\0"}


def _revoke(revocation: Revocation, principals: dict, revoked: dict, changed: set,
            unversioned: dict[str, set[tuple]]) -> list[str]:
    """A withdrawal applies at once, as of the event's delegation version, else the stored principal's."""
    version = revocation.delegation_version
    if version is None:
        row = principals.get(revocation.principal)
        version = row[2] if row else None
    key = (revocation.principal, revocation.revoke, revocation.value)
    old = revoked.get(key)
    if old is None:
        revoked[key] = [revocation.effective_at, revocation.issued_by, None, version]
    else:
        # A repeat can only raise the version it applies as of; unknown (NULL) on either side stays unknown.
        merged = None if old[3] is None or version is None else max(old[3], version)
        revoked[key] = [revocation.effective_at, revocation.issued_by, old[2], merged]
    if revoked[key][3] is None:
        unversioned.setdefault(revocation.principal, set()).add(key)
    else:
        unversioned.get(revocation.principal, set()).discard(key)
    changed.add(key)
    return [dk.principal(revocation.principal)]


def _entity(change: SourceChange, entities: dict, changed: set) -> list[str] | None:
    new: Entity | None = change.record  # type: ignore[assignment]
    row = entities.get(change.record_id)
    old = row[0] if row is not None and not row[1] else None
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
