"""Answer selects from local state: serve a fresh plan from the store or compile one."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable

import duckdb
import orjson

from compiler.errors import RequestError
from compiler.request import Limits, parse_request, plan_key
from compiler.resolve import resolve_entity
from schemas.freshness import encode_token
from agents.plans.plan_writer import PlanWriter
from agents.web.early_waits import EarlyWaits, refusal
from agents.web.peers import NotOwner, Peers
from agents.web.plan_facts import plan_facts
from agents.web.select_compiles import SelectCompiles
from agents.web.token_keys import TokenKeys
from state.head_cache import head_of
from state.local_state import LocalState

log = logging.getLogger(__name__)

COMPILE_ROUNDS = 3  # compiles a select tries while each is announced stale as it is stored; then 503
PUBLISH_WAIT_SECONDS = 2.0  # longest a select waits for its compiled plan's records to be acknowledged

# Errors that say the file itself cannot be read: once seen, nothing read from it is trusted.
STORAGE_ERRORS = (duckdb.IOException, duckdb.FatalException, duckdb.InternalException,
                  duckdb.SerializationException, duckdb.ConnectionException)


class StateError(RequestError):
    """The worker's own state cannot be read: not the caller's fault, and nothing is served."""
    pass_name = "state"


MayRead = Callable[[str | None], bool]  # may the caller see a plan or receipt of this principal (None: unknown)

class QueryService:
    """The read path: plan key lookup, then cache or compile."""

    def __init__(self, state: LocalState, writer: PlanWriter, guard=None, *, peers: Peers | None = None,
                 limits: Limits | None = None, tokens: TokenKeys | None = None,
                 position: Callable[[], dict[str, dict[int, int]]] | None = None,
                 last_events: dict[str, dict] | None = None, on_compile=None, check_heads: bool = False,
                 early: EarlyWaits | None = None) -> None:
        self.state = state  # what selects, status and health read: in a worker, a cursor of their own
        self.writer = writer  # compiles and stores on the read-write connection (its state)
        self.guard = guard  # a LagWatcher; None only where no broker exists (unit tests)
        self.peers = Peers() if peers is None else peers  # a lone worker by default
        self.limits = Limits() if limits is None else limits  # largest request fields a select accepts
        self.tokens = TokenKeys.ephemeral() if tokens is None else tokens  # a worker's: the group's key file
        # The input offsets applied and committed, kept in memory (the replica's); None: read them from the file.
        self.position = position
        self.last_events = {} if last_events is None else last_events  # the applier's latest event per topic
        self.on_compile = on_compile  # seconds per compilation on the read path
        self.check_heads = check_heads  # tests: compare every in-memory hit with the file (see `_check_hit`)
        self.early = EarlyWaits() if early is None else early
        self.selects: Counter[str] = Counter()  # per process; the read path writes nothing it need not
        self.selected: set[str] = set()  # plan keys selected since the last retention pass (stamped there)
        self.compiles = SelectCompiles(self._compile_many, self.selects.update)  # selects compiling share a job
        self.unreadable: str | None = None  # why the state file failed a read; sticky until a restart
        self._token_cache: tuple[object, bytes, str] | None = None

    def state_failed(self, exc: Exception, counted: bool = True) -> StateError:
        """Record a failed read of the state file and return the refusal to send (never a 500)."""
        if isinstance(exc, STORAGE_ERRORS) and self.unreadable is None:
            self.unreadable = type(exc).__name__
            log.error("the state file cannot be read (%s): selects are refused with state_unreadable; stop the "
                      "worker, move the file aside and run `freshplan replay`", type(exc).__name__,
                      extra={"error_class": "state_unreadable", "path": str(self.state.store.path)})
        else:
            log.warning("a read of the state file failed (%s)", type(exc).__name__,
                        extra={"error_class": "state_unreadable"})
        if counted:
            self.selects["refused.state_unreadable"] += 1
        return self._unreadable_error()

    def _unreadable_error(self) -> StateError:
        return StateError("state_unreadable", "This worker cannot read its local state file (it is damaged or "
                          "unreadable), so it serves no plan; use another worker. Operators: stop it, move the "
                          "DuckDB file aside and run `freshplan replay`.", status=503)

    def token(self) -> str:
        """Freshness token of the state as it is now."""
        return self.sign(self.state.store.position())

    def sign(self, position: tuple[dict[str, dict[int, int]], str | None, int]) -> str:
        """The signed token of a position (offsets, cluster id, rebase epoch)."""
        return encode_token(*position, key=self.tokens.sign_with())

    def select(self, doc: Any) -> dict[str, Any]:
        """Return the plan for a select body, compiling on this thread; raises RequestError for bad requests."""
        self._refuse_if_unreadable()
        try:
            found = self._lookup(doc)
            if found.plan is None:
                found = self._merge(self._compile(found))
        except duckdb.Error as exc:
            raise self.state_failed(exc) from None
        return self._answer(found)

    async def select_async(self, doc: Any, run: Callable[..., Awaitable[Any]],
                           read: Callable[..., Awaitable[Any]] | None = None,
                           published: Callable[[int, float], Awaitable[bool]] | None = None) -> dict[str, Any]:
        """As `select`, but a plan that must be compiled is compiled by `run` (the writer thread), and a lookup
        the head cache cannot answer reads the file through `read` (a thread with a cursor of its own;
        None: this service's cursor, on the caller's thread). A compiled plan is answered once `published`
        (the publisher's) says its records were acknowledged, or after `PUBLISH_WAIT_SECONDS` regardless: a
        worker killed after answering leaves its successor the plan's `plan-dependencies` record to judge.

        The head cache answers from memory; a miss reads committed state, so no lookup waits for a write.
        """
        self._refuse_if_unreadable()
        try:
            request, degraded = self._admit(doc)
            for _ in range(COMPILE_ROUNDS):
                found = self._held(request, degraded)
                if found is None:
                    found = (self._read(request, degraded) if read is None else
                             await read(lambda state: self._read(request, degraded, state)))
                # Looked at after the lookup: an announcement sent while a file read was under way counts too.
                position = self.early.waiting(found.key)
                announced = found.plan is not None and self.early.announced(str(found.plan.get("plan_id")))
                if position is not None or announced:
                    # Announced invalid: answer once its cause is applied, from state that has it (a read that
                    # found it fresh although its cause is applied began before the announcement: read again).
                    self.selects["selects.waited_for_early_announcement" if position is not None
                                 else "selects.read_again_after_early_announcement"] += 1
                    if position is not None:
                        await self.early.wait(position)
                    found = self._read(request, degraded) if read is None else \
                        await read(lambda state: self._read(request, degraded, state))
                    # Missing as asked once it waited: a plan found now was stored meanwhile, not a cache hit.
                    found = found if position is None else replace(found, served_from="recompiled")
                self.selected.add(found.key)
                if found.plan is not None:
                    break
                found = self._merge(await self.compiles.compile(found, run))
                # Compiled while an edit of what it admitted was fetched: announced as it was stored, so it is
                # no answer; the next round waits for that edit and looks again.
                if await self.early.settled(found.key, str(found.plan.get("plan_id"))):
                    break
                self.selects["selects.compiled_again_after_early_announcement"] += 1
            else:
                raise refusal()
            if found.queued_through is not None and published is not None and \
                    not await published(found.queued_through, PUBLISH_WAIT_SECONDS):
                # Bounded: with the broker gone the records stay queued for the flush timer, and the
                # caller still gets its answer within the request's deadline.
                log.warning("the compiled plan's records are still queued; the flush timer publishes them")
        except duckdb.Error as exc:
            raise self.state_failed(exc) from None
        return self._answer(found)

    def _refuse_if_unreadable(self) -> None:
        if self.unreadable is not None:
            self.selects["refused.state_unreadable"] += 1
            raise self._unreadable_error()

    def _lookup(self, doc: Any) -> "Found":
        """Parse, check the guard, resolve the entity and look for a fresh plan: in memory, else in the file."""
        request, degraded = self._admit(doc)
        found = self._held(request, degraded)
        if found is None:
            found = self._read(request, degraded)
        self.selected.add(found.key)
        return found

    def _admit(self, doc: Any) -> tuple[Any, list[str]]:
        """The parsed request and the inputs that may make its answer less current; raises when the guard refuses."""
        if isinstance(doc, dict):
            doc = {k: v for k, v in doc.items() if k != "at_least_as_fresh"}
        request = parse_request(doc, self.limits)
        degraded: list[str] = []
        if self.guard is not None:
            self.guard.check()
            degraded = self.guard.degraded()
        return request, degraded

    def _held(self, request, degraded: list[str]) -> "Found | None":
        """The answer from the head cache alone, if it holds the name and the key (no DuckDB read).

        The token names the position the cache published with its last commit, read before the
        head and only when the cache did not change until the head was read: the head was then
        fresh at it (see `HeadCache`). The replica's offsets reach the loop after the heads of
        their batch: until they match that position, the file answers.
        """
        if self.position is None:
            return None
        heads = self.state.store.heads
        version = heads.version
        published = heads.position
        offsets = self.position()
        if published is None or (offsets is not published[0] and offsets != published[0]):
            return None
        entity_id = heads.entity(request.entity)
        if entity_id is None:
            return None
        partition = self.peers.foreign_partition(entity_id)
        if partition is not None:  # only the owner indexes its plans: a plan here may be stale
            raise NotOwner(entity_id, partition)
        key = plan_key(request, entity_id)
        head = heads.head(key)
        if head is None or heads.version != version:
            return None
        found = Found(request, key, orjson.loads(head.plan), self._token_at(published), "cache", degraded,
                      entity_id=entity_id)
        if self.check_heads and not self._check_hit(found, head.plan_id, version):
            return None
        self.selects["selects.held"] += 1  # answered from memory, without reading the file
        return found

    def _read(self, request, degraded: list[str], state: LocalState | None = None) -> "Found":
        """Resolve and look the plan up in the file (one snapshot, through `state`'s cursor; this service's by
        default), and hold what was found."""
        state = self.state if state is None else state
        store = state.store
        generation = store.heads.generation  # noted before the snapshot: a removal since refuses the fill
        # One snapshot: the token must name the state the plan was read from, not a later one.
        with store.transaction():
            entity_id = resolve_entity(request.entity, state.catalog.entity_matches(request.entity))
            partition = self.peers.foreign_partition(entity_id)
            if partition is not None:  # only the owner indexes its plans: a plan here may be stale
                raise NotOwner(entity_id, partition)
            key = plan_key(request, entity_id)
            plan = state.plans.fresh_plan(key)
            token = self.sign(store.position()) if plan is not None else None
        head = (head_of(plan["plan_id"], orjson.dumps(plan), plan)
                if plan is not None and isinstance(plan.get("plan_id"), str) else None)
        store.heads.fill(generation, key if head else None, head, request.entity, entity_id)
        return Found(request, key, plan, token, "cache", degraded, entity_id=entity_id)

    def _token_at(self, position: tuple[dict[str, dict[int, int]], str | None, int]) -> str:
        """The token of a published position (signed once per position and key, not per select)."""
        cached, key = self._token_cache, self.tokens.sign_with()
        if cached is None or cached[0] is not position or cached[1] is not key:
            cached = self._token_cache = (position, key, encode_token(*position, key=key))
        return cached[2]

    def _check_hit(self, found: "Found", plan_id: str, version: int) -> bool:
        """Whether the file agrees with an in-memory hit; a disagreement is logged and counted (tests fail on it).

        Only judged when the cache did not change from before the hit to after the read: then a
        held head must be the key's fresh head in the file too.
        """
        try:
            with self.state.store.transaction():
                entity_id = resolve_entity(found.request.entity,
                                           self.state.catalog.entity_matches(found.request.entity))
                plan = self.state.plans.fresh_plan(found.key)
        except RequestError:
            entity_id, plan = None, None
        if self.state.store.heads.version != version:
            return True
        # The whole document: a recompilation with the same outcome keeps the plan id, not its valid_until.
        if entity_id == found.entity_id and plan == found.plan:
            return True
        self.selects["head_cache_disagreements"] += 1
        log.error("head cache disagrees with the state file: key %s held plan %s, the file has %s for entity %s",
                  found.key, plan_id, plan and plan.get("plan_id"), entity_id,
                  extra={"error_class": "head_cache_disagreement"})
        return False

    def _compile(self, found: "Found") -> "Found":
        """Compile and store a missing plan on the writer's connection (run on the writer thread)."""
        [result], counts = self._compile_many([found])
        if isinstance(result, BaseException):
            raise result
        return replace(result, counts=counts)

    def _compile_many(self, founds: list["Found"]) -> tuple[list["Found | Exception"], Counter[str]]:
        """Compile and store missing plans together (on the writer thread); per select its answer or its error,
        and what the job counted (merged into `selects` on the caller's thread)."""
        state = self.writer.state
        out: list[Found | Exception | None] = [None] * len(founds)
        due = []
        for i, found in enumerate(founds):
            partition = self.peers.foreign_partition(found.entity_id)
            if partition is not None:  # the partition moved while this select waited for the writer
                out[i] = NotOwner(found.entity_id, partition)
                continue
            plan = state.plans.fresh_plan(found.key)  # compiled while this select waited for the writer
            if plan is None:
                due.append(i)
            else:  # not "cache": the plan was missing when asked, and the answer waited for a compile
                out[i] = replace(found, plan=plan, served_from="recompiled")
        counts: Counter[str] = Counter()
        if due:
            compiled = self.writer.compile_selects([founds[i].request for i in due], counts, self.on_compile)
            queued_through = state.outbox.newest()
            for i, result in zip(due, compiled, strict=True):
                out[i] = result if isinstance(result, Exception) else replace(
                    founds[i], plan=result.plan, served_from="compiled", queued_through=queued_through)
        # The writer's remembered position: committed (no transaction is open here), and no read of the file.
        token = self.sign(state.store.remembered_position())
        return [replace(r, token=token) if isinstance(r, Found) else r for r in out], counts

    def _merge(self, found: "Found") -> "Found":
        self.selects.update(found.counts)  # counted here: the selects counter belongs to the caller's thread
        return found

    def _answer(self, found: "Found") -> dict[str, Any]:
        self.selects[f"selects.{found.served_from}"] += 1
        out = dict(found.plan, freshness_token=found.token, served_from=found.served_from)
        if self.peers.served_by:
            out["served_by"] = self.peers.served_by
        if found.degraded:
            out["degraded"] = found.degraded  # paused inputs that can make this answer less current
        return out

    def take_selected(self) -> set[str]:
        """The plan keys selected since the last call (for the retention pass to stamp)."""
        taken, self.selected = self.selected, set()
        return taken

    def plan_status(self, plan_id: str, may_read: MayRead = lambda principal: True) -> dict[str, Any] | None:
        """Public status of a plan id (an evicted one is invalidated, reason `evicted`), or None when unknown.

        Raises NotOwner for a plan of another worker's partition that is not invalidated here: only
        its owner hears of its invalidations, so "fresh" from here (a plan handed back, or one known
        only parked) may be stale. An invalidation known here is final and answered here (the owner
        keeps only each key's latest plan of what it took over). A plan whose principal `may_read`
        refuses (None: the principal is not known here) is None, as an unknown one, before any owner is asked.
        """
        try:
            facts = plan_facts(self.state, plan_id)
        except duckdb.Error as exc:
            raise self.state_failed(exc) from None
        return self._owned_status(*facts, may_read)

    async def plan_status_async(self, plan_id: str, read: Callable[..., Awaitable[Any]],
                                may_read: MayRead) -> dict[str, Any] | None:
        """As `plan_status`, the file read by `read` (the status thread, with a cursor of its own): never on the loop.

        Subscribers ask after every announcement they hear, so these reads come as often as invalidations.
        """
        self._refuse_if_unreadable()
        try:
            facts = await read(lambda state: plan_facts(state, plan_id))
        except duckdb.Error as exc:
            raise self.state_failed(exc) from None
        return self._owned_status(*facts, may_read)

    def _owned_status(self, status: dict[str, Any] | None, entity_id: str | None, principal: str | None,
                      may_read: MayRead) -> dict[str, Any] | None:
        if (status is not None or entity_id is not None) and not may_read(principal):
            return None  # no existence oracle: a plan the caller may not ask about is unknown to it
        if status is not None and status["status"] == "invalidated":
            return status
        partition = None if entity_id is None else self.peers.foreign_partition(entity_id)
        if partition is not None:
            raise NotOwner(entity_id, partition)
        return status

    def health(self, figures: dict[str, Any] | None) -> dict[str, Any]:
        """Liveness plus what the worker has applied, given the file's figures (`file_health`; None: unreadable)."""
        revocations = self.guard.status().as_dict() if self.guard else None
        if figures is None:
            doc: dict[str, Any] = {"status": "state_unreadable", "revocations": revocations}
        else:
            doc = {"status": "ok", **{k: v for k, v in figures.items() if k not in ("counters", "position")},
                   "freshness_token": self.sign(figures["position"]),
                   "head_cache": self.state.store.heads.sizes(),
                   "counters": dict(Counter(figures["counters"]) + self.selects), "revocations": revocations,
                   "lag": self.guard.lags() if self.guard else {}, "last_events": dict(self.last_events)}
        if self.unreadable is not None:
            doc.update(status="state_unreadable", state_error=self.unreadable)
        return doc


@dataclass(frozen=True)
class Found:
    """What a select found: its parsed request, plan key, and the plan with the token of the state it came from."""

    request: Any
    """The parsed decision request."""
    key: str
    """Its plan key."""
    plan: dict[str, Any] | None
    """The fresh plan, None when it must be compiled."""
    token: str | None
    """Freshness token of the state the plan was read or compiled from."""
    served_from: str
    """cache (fresh when asked), compiled (for this select) or recompiled (compiled while it waited, elsewhere)."""
    degraded: list[str]
    """Paused inputs that can make the answer less current."""
    counts: Counter = field(default_factory=Counter)
    """Counters the compiling thread gathered, merged into `selects` by the caller."""
    entity_id: str = ""
    """The canonical entity id the request resolved to (its partition owns the plan)."""
    queued_through: int | None = None
    """A compiled plan: the outbox sequence number of its last record (answered once that is published)."""

