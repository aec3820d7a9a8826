"""Fresh plan heads and entity names held in memory, so a cached select reads no DuckDB."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import orjson

Offsets = dict[str, dict[int, int]]  # input topic -> partition -> next offset not applied
MAX_HEADS = 50_000  # past this, the oldest entries go: a miss only costs a DuckDB read
MAX_HEAD_BYTES = 64 * 1024 * 1024  # and past this many bytes of plan documents (a plan carries what it admits)
MAX_NAMES = 100_000


@dataclass(frozen=True, slots=True)
class Head:
    """A plan key's current plan while it is fresh."""

    plan_id: str
    """The plan's id."""
    plan: bytes
    """The stored plan document, as JSON (parsed per answer: smaller than the parsed form, never shared)."""
    facts: "HeadFacts | None" = None
    """What the fast path indexes the head by, taken from the document the caller parsed (None: parse `plan`)."""


@dataclass(frozen=True, slots=True)
class HeadFacts:
    """What a plan document says of the plan's dependencies on resources and its principal."""

    admitted: tuple[tuple[str, int], ...]
    """(resource id, version) of every resource the plan admitted."""
    entity_id: str | None
    """The entity the plan is about."""
    principal: str | None
    """The principal it was compiled for."""

    @classmethod
    def of(cls, doc: dict) -> "HeadFacts":
        """The facts of a parsed plan document (raises on a malformed one)."""
        entity_id = doc.get("entity_id")
        principal = (doc.get("request") or {}).get("principal")
        return cls(tuple((item["resource_id"], int(item["version"])) for item in doc.get("admitted") or ()),
                   entity_id if isinstance(entity_id, str) else None, principal if isinstance(principal, str) else None)


def head_of(plan_id: str, plan: bytes, doc: dict | None = None) -> Head:
    """A head, with its facts read from `doc` (the parsed `plan`) when the caller has it."""
    try:
        facts = None if doc is None else HeadFacts.of(doc)
    except (AttributeError, KeyError, TypeError, ValueError):
        facts = None
    return Head(plan_id, plan, facts)


@dataclass(frozen=True, slots=True)
class Admitting:
    """A held head that admitted a resource: an edit of that resource makes it stale."""

    plan_key: str
    """The head's plan key."""
    plan_id: str
    """The head's plan id."""
    version: int
    """The version of the resource the head admitted."""
    entity_id: str | None
    """The entity the plan is about (its partition says who owns the plan)."""
    principal: str | None = None
    """The principal the plan was compiled for."""


class HeadCache:
    """What the DuckDB file says a cached select finds, without reading it.

    One writer thread changes the file; the event loop reads this. The rules that keep a hit
    no fresher than the file:

    - Whatever can make a head stale or a name resolve otherwise (an invalidation, a dropped
      or replaced head, an entity write) removes it *before* its transaction commits, and again
      right after (a fill from a snapshot read in between would otherwise bring it back).
    - A plan the writer stores becomes visible only once its transaction commits; a removal in
      the same transaction cancels it.
    - A fill by a reader (after a DuckDB read) is refused if anything was removed or stored since
      the reader noted `generation` before its read (a recompilation with the same outcome keeps
      the plan id but replaces its document), and while a commit is in flight (its snapshot may
      show that commit before `position` does).
    - `position` (the input offsets and incarnation a token names) is published with the heads
      of the commit that moved it, before them: a head held, read after it under an unchanged
      `version`, is fresh at it.
    """

    def __init__(self, max_heads: int = MAX_HEADS, max_names: int = MAX_NAMES,
                 max_bytes: int = MAX_HEAD_BYTES) -> None:
        self._lock = threading.Lock()  # a fill's check-and-set against the writer's removals
        self._heads: dict[str, Head] = {}  # plan key -> head
        self._keys_by_id: dict[str, str] = {}  # plan id -> plan key, to remove by plan id
        self._names: dict[str, str] = {}  # entity name as requested -> canonical entity id
        self._pending: dict[str, Head] = {}  # stored in the open transaction, shown at commit
        self._removed: set[str] = set()  # keys removed in the open transaction, removed again at commit
        self._removed_ids: set[str] = set()  # plan ids made stale in it, removed again at commit
        self._names_removed = False
        self._all_removed = False
        self._committing = False  # between the writer's COMMIT and `committed`: fills refused
        self.position: tuple[dict[str, dict[int, int]], Any, int] | None = None  # as of the last commit
        self.generation = 0  # bumped by every removal; a reader's fill names the one it read under
        self.version = 0  # bumped by every change: a consistency check skips a lookup that raced one
        self.max_heads, self.max_names, self.max_bytes = max_heads, max_names, max_bytes
        self._bytes = 0  # plan document bytes held
        # resource id -> plan key -> what that held head admitted of it (see `admitting`)
        self._admitted: dict[str, dict[str, Admitting]] = {}
        self._admits: dict[str, tuple[str, ...]] = {}  # plan key -> resource ids it is indexed under
        self._asked: dict[str, dict[str, Admitting]] = {}  # principal -> plan key -> its head (version 0)
        self._principal_of: dict[str, str] = {}  # plan key -> the principal it is indexed under
        self._watchers: list[Callable[[list[str]], object]] = []  # told of the keys each commit or fill put
        # told of each head stored, before its commit
        self._stored_watchers: list[Callable[[str, Head, Offsets], object]] = []
        self._put_keys: list[str] = []  # keys put under the lock, told to the watchers after it

    # -- the event loop's side ---------------------------------------------------------------

    def head(self, plan_key: str) -> Head | None:
        """The key's fresh head, if known here."""
        return self._heads.get(plan_key)

    def admitting(self, resource_id: str) -> list[Admitting]:
        """The held heads that admitted this resource (the fast path's index: `agents.stream.fast_path`)."""
        with self._lock:
            found = self._admitted.get(resource_id)
            return list(found.values()) if found else []

    def asked_by(self, principal: str) -> list[Admitting]:
        """The held heads compiled for this principal (`version` is 0: no resource is named)."""
        with self._lock:
            found = self._asked.get(principal)
            return list(found.values()) if found else []

    def principal_of(self, plan_key: str) -> str | None:
        """The principal the key's held head was compiled for."""
        with self._lock:
            return self._principal_of.get(plan_key)

    def admitted_by(self, plan_key: str) -> list[tuple[str, Admitting]]:
        """(resource id, what the head admitted of it) for each resource the key's held head admitted."""
        with self._lock:
            return [(rid, self._admitted[rid][plan_key]) for rid in self._admits.get(plan_key, ())
                    if plan_key in self._admitted.get(rid, {})]

    def watch(self, callback: Callable[[list[str]], object]) -> None:
        """Call `callback` with the plan keys each commit or fill made held (on the thread that made them)."""
        self._watchers.append(callback)

    def watch_stored(self, callback: Callable[[str, Head, Offsets], object]) -> None:
        """Call `callback(plan key, head, applied)` as the writer stores a head, before its transaction commits (on
        the writer's thread; `applied`: the next input offsets of that transaction, its own batch's included): what
        makes the head stale may be known before it is shown."""
        self._stored_watchers.append(callback)

    def _tell(self, keys: list[str]) -> None:
        for callback in self._watchers if keys else ():
            callback(keys)

    def entity(self, name: str) -> str | None:
        """The one canonical entity id this requested name resolved to, if known here."""
        return self._names.get(name)

    def fill(self, generation: int, plan_key: str | None = None, head: Head | None = None,
             name: str | None = None, entity_id: str | None = None) -> bool:
        """Remember what a read under `generation` found; refused if anything was removed since."""
        with self._lock:
            if generation != self.generation or self._committing:
                return False
            if plan_key is not None and head is not None:
                self._put(plan_key, head)
            if name is not None and entity_id is not None:
                if len(self._names) >= self.max_names:
                    self._names.pop(next(iter(self._names)))
                self._names[name] = entity_id
            self.version += 1
            put, self._put_keys = self._put_keys, []
        self._tell(put)
        return True

    # -- the writer's side -------------------------------------------------------------------

    def stored(self, plan_key: str, plan_id: str, plan: bytes, doc: dict | None = None,
               applied: Callable[[], Offsets] = dict) -> None:
        """The writer stored this plan (`doc` parsed, if at hand) as the key's head: shown once the transaction
        commits. `applied` gives the transaction's next input offsets, for `watch_stored`."""
        head = self._pending[plan_key] = head_of(plan_id, plan, doc)
        if self._stored_watchers:
            offsets = applied()
            for callback in self._stored_watchers:
                callback(plan_key, head, offsets)

    def remove_keys(self, plan_keys: Iterable[str]) -> None:
        """These keys' heads changed or went stale."""
        keys = set(plan_keys)
        if keys:
            with self._lock:
                self._remove(keys)
                self._removed |= keys

    def remove_plans(self, plan_ids: Iterable[str]) -> None:
        """These plans went stale (whatever keys they head)."""
        ids = set(plan_ids)
        if ids:
            with self._lock:
                for key in [k for k, h in self._pending.items() if h.plan_id in ids]:
                    del self._pending[key]  # a successor stored for the same key stands
                self._remove({self._keys_by_id[i] for i in ids if i in self._keys_by_id}, pending=False)
                self._removed_ids |= ids  # (the generation moves even when none is held: a fill may be reading one)

    def remove_all(self) -> None:
        """Anything may have changed (a take-over, a hand-back, a bulk invalidation)."""
        with self._lock:
            self._clear_heads()
            self._pending.clear()
            self._all_removed = True

    def remove_names(self) -> None:
        """An entity or alias changed: every name may resolve otherwise now."""
        with self._lock:
            self._names.clear()
            self.generation += 1
            self.version += 1
            self._names_removed = True

    def committing(self) -> None:
        """The writer is about to commit: a snapshot read from now on may show what `position` does not yet."""
        with self._lock:
            self._committing = True

    def committed(self, position: tuple[dict[str, dict[int, int]], Any, int] | None = None) -> None:
        """The writer's transaction committed: publish its `position` (if it moved), repeat its removals, then
        show what it stored."""
        with self._lock:
            if position is not None:
                self.position = position
            if self._all_removed:
                self._clear_heads()
            elif self._removed or self._removed_ids:
                self._remove(self._removed | {self._keys_by_id[i] for i in self._removed_ids if i in self._keys_by_id},
                             pending=False)  # what it stored after a removal stands
            if self._names_removed:
                self._names.clear()
                self.generation += 1
            for key, head in self._pending.items():
                self._put(key, head)
            if self._pending:  # a fill read before this commit may hold a document it replaced (same plan id)
                self.generation += 1
            self.version += 1
            self._reset()
            put, self._put_keys = self._put_keys, []
        self._tell(put)

    def rolled_back(self) -> None:
        """The writer's transaction rolled back: what it stored never happened."""
        with self._lock:
            self._reset()

    def sizes(self) -> dict[str, int]:
        """Entries held, for /healthz."""
        return {"heads": len(self._heads), "names": len(self._names), "bytes": self._bytes}

    # -- under the lock ----------------------------------------------------------------------

    def _reset(self) -> None:
        self._pending.clear()
        self._removed.clear()
        self._removed_ids.clear()
        self._names_removed = self._all_removed = self._committing = False

    def _put(self, plan_key: str, head: Head) -> None:
        self._drop(plan_key)
        if len(head.plan) > self.max_bytes:
            return  # never held: its selects read the file
        while self._heads and (len(self._heads) >= self.max_heads or self._bytes + len(head.plan) > self.max_bytes):
            self._drop(next(iter(self._heads)))  # the oldest
        self._heads[plan_key] = head
        self._keys_by_id[head.plan_id] = plan_key
        self._bytes += len(head.plan)
        self._index(plan_key, head)
        if self._watchers:
            self._put_keys.append(plan_key)

    def _index(self, plan_key: str, head: Head) -> None:
        """Index a head under the resources it admitted (a document that does not parse is not indexed)."""
        facts = head.facts
        if facts is None:
            try:
                facts = HeadFacts.of(orjson.loads(head.plan))
            except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
                return
        admitted, entity_id, principal = dict(facts.admitted), facts.entity_id, facts.principal
        for rid, version in admitted.items():
            self._admitted.setdefault(rid, {})[plan_key] = Admitting(plan_key, head.plan_id, version, entity_id,
                                                                       principal)
        self._admits[plan_key] = tuple(admitted)
        if principal is not None:
            self._asked.setdefault(principal, {})[plan_key] = Admitting(plan_key, head.plan_id, 0, entity_id,
                                                                          principal)
            self._principal_of[plan_key] = principal

    def _drop(self, plan_key: str) -> None:
        old = self._heads.pop(plan_key, None)
        if old is not None:
            self._keys_by_id.pop(old.plan_id, None)
            self._bytes -= len(old.plan)
        for rid in self._admits.pop(plan_key, ()):
            _unindex(self._admitted, rid, plan_key)
        principal = self._principal_of.pop(plan_key, None)
        if principal is not None:
            _unindex(self._asked, principal, plan_key)

    def _remove(self, keys: set[str], pending: bool = True) -> None:
        for key in keys:
            if pending:
                self._pending.pop(key, None)
            self._drop(key)
        self.generation += 1
        self.version += 1

    def _clear_heads(self) -> None:
        self._heads.clear()
        self._keys_by_id.clear()
        self._admitted.clear()
        self._admits.clear()
        self._asked.clear()
        self._principal_of.clear()
        self._bytes = 0
        self.generation += 1
        self.version += 1


def _unindex(index: dict[str, dict[str, Admitting]], name: str, plan_key: str) -> None:
    holders = index.get(name)
    if holders is not None:
        holders.pop(plan_key, None)
        if not holders:
            del index[name]
