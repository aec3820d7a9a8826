"""Compile, store, announce and adopt plans: the one write path of the apply path, backlog, plan feed, replay and
selects."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone
from typing import Callable, Mapping, Sequence

import orjson

from compiler.errors import RequestError
from compiler.batch import compile_many
from compiler.cedar_batch import SharedEntities
from compiler.pipeline import CompiledPlan, as_decided_at, compile_request
from schemas.outbound import Cause
from schemas.plan_partition import plan_partition
from schemas.timefmt import format_instant
from state.catalog_snapshot import CatalogSnapshot
from agents.plans import plan_facts
from agents.plans.announce_first import announce_first
from agents.plans.select_compile import compile_requests
from state.invalidations import Invalidation, Touch, reason_for
from state.local_state import LocalState

log = logging.getLogger(__name__)

COMPILE_CHUNK = 16  # plans per Cedar call: about 1,000 decisions, tens of ms with the GIL held

Source = tuple[str, int, int]  # (input topic, partition, offset) of the event a record is due to
Touched = dict[str, Touch]  # plan key -> how an event of the batch reached it


def _count_compiled(plans: Sequence[CompiledPlan], counts: Counter[str]) -> None:
    counts["compilations"] += len(plans)
    counts["policy_errors"] += sum(p.receipt.get("policy_errors", 0) for p in plans)


def wall_now() -> str:
    """Wall-clock time for `invalidated_at` stamps (latency is measured against it)."""
    return format_instant(datetime.now(timezone.utc))


class PlanWriter:
    """Turns compilations into stored plans, index edges and outbox records, inside the caller's transaction."""

    def __init__(self, state: LocalState, topic_of: Callable[[str], str], eager_limit: int = 0,
                 on_compile=None, on_latency=None,
                 sent_early: Callable[[str, Source], bool] = lambda plan_id, source: False,
                 partitions: int | None = None) -> None:
        self.state = state
        # `plan-dependencies` records go to their entity's partition of this many (None: the producer's
        # partitioner), so that a worker finds the records of the plans of a partition on that partition.
        self.partitions = partitions
        # Whether the broker acknowledged this plan's invalidation by this event, sent before the event was
        # applied (`agents.stream.fast_path`): its record is not queued again.
        self.sent_early = sent_early
        self.topic_of = topic_of  # logical name -> broker-side name
        self.eager_limit = eager_limit  # larger fan-outs (all, at 0) are announced first and recompiled later
        self.on_compile = on_compile  # seconds per recompilation
        self.on_latency = on_latency  # seconds from an event's broker timestamp to its invalidation
        self.queue_pending = state.queue.size() > 0  # saves a statement per batch while the queue is empty
        self.backlog_waits_for: int | None = None  # the last outbox record the backlog waits for (`announcements_out`)

    # -- compile -----------------------------------------------------------------------

    def snapshot(self, requests: Sequence[dict], now: datetime | None = None) -> CatalogSnapshot:
        """A memoising catalog view for compiling these requests together (`now`: the store's, if known)."""
        view = CatalogSnapshot(self.state.catalog)
        view.prefetch(list(requests), now)
        return view

    def compile_all(self, items: Sequence[tuple[str, dict]], view, now: datetime | None,
                    ) -> dict[str, CompiledPlan | None]:
        """Recompile (plan key, request) pairs in chunks, one Cedar call per chunk; None where one no longer compiles.

        Chunks keep each Cedar call (which holds the GIL) short, so the HTTP loop is not starved.
        """
        out: dict[str, CompiledPlan | None] = {}
        shared = SharedEntities()  # the chunks share principals and resources: convert and parse each once
        for start in range(0, len(items), COMPILE_CHUNK):
            chunk = items[start:start + COMPILE_CHUNK]
            started = time.perf_counter()
            results = compile_many([request for _, request in chunk], view, now, shared)
            if self.on_compile:
                each = (time.perf_counter() - started) / len(chunk)
                for _ in chunk:
                    self.on_compile(each)
            for (plan_key, _), result in zip(chunk, results, strict=True):
                if isinstance(result, RequestError):
                    log.info("plan key %s can no longer compile: %s", plan_key, result.code)
                    result = None
                out[plan_key] = result
        return out

    # -- store and adopt ---------------------------------------------------------------

    def store(self, plans: Sequence[CompiledPlan], now: datetime | None, counts: Counter[str],
              publish: bool = True, sources: Sequence[Source | None] | None = None, standby: bool = False,
              outbox: list | None = None, replaces: Mapping[str, str] | None = None) -> None:
        """Make compilations current: plans, receipts, index edges, and (if `publish`) both on the outbox.

        Without `publish` this adopts them: the same outcome another worker (or an earlier run)
        already announced. A published plan carries `compiled_as_of`, the input offsets its state
        reflected. Either way the internal `plan-dependencies` record is refreshed: a recompilation
        that came out the same still moves `compiled_as_of` past the change that caused it, else a
        later owner would judge the plan stale by that change and announce it for nothing.
        With `outbox` (a list), the records are appended to it for the caller to queue in one write.
        `replaces`: each plan key's current plan id before this (read here when not given).
        """
        if not plans:
            return
        state = self.state
        if replaces is None:
            replaces = state.plans.head_ids([p.plan_key for p in plans])
        state.plans.save_many(plans, now)
        plan_facts.remember(state, plans)
        state.index.replace_many({p.plan_key: p.dependencies for p in plans})
        self._queue_records(plans, publish, sources, standby, outbox, replaces)
        _count_compiled(plans, counts)

    def confirm(self, plans: Sequence[CompiledPlan], counts: Counter[str], outbox: list | None = None) -> None:
        """Compilations identical to the stored current plans (same plan and receipt): nothing stored changes.

        Only their `plan-dependencies` records are refreshed, so `compiled_as_of` moves past the
        change that caused the recompilation (see `store`). Rewriting the rows would cost a plan,
        a receipt and the index edges of each in the log (half of a 1,000/s batch's).
        """
        if plans:
            self._queue_records(plans, False, None, False, outbox, {p.plan_key: p.plan_id for p in plans})
            _count_compiled(plans, counts)

    def _queue_records(self, plans: Sequence[CompiledPlan], publish: bool, sources: Sequence[Source | None] | None,
                       standby: bool, outbox: list | None, replaces: Mapping[str, str]) -> None:
        """Outbox records of stored compilations: `plans` and `receipts` if `publish`; `plan-dependencies` always.

        A `plan-dependencies` record names the plan it replaced here (`replaces`): a worker parking
        it then knows it descends from that plan, whatever offsets the two were compiled at.
        """
        state = self.state
        as_of = state.store.next_offsets()
        cluster_id = state.store.incarnation()[0]
        rows, row_sources, places = [], [], []
        for i, p in enumerate(plans):
            published = dict(p.plan, compiled_as_of=as_of, compiled_in=cluster_id)
            source = sources[i] if sources else None
            if publish:
                rows.append((self.topic_of("plans"), p.plan_id.encode(),
                             orjson.dumps(published, option=orjson.OPT_NON_STR_KEYS)))
                rows.append((self.topic_of("receipts"), p.receipt_id.encode(), orjson.dumps(p.receipt)))
                row_sources += [source] * 2
                places += [None, None]
            # Internal: the keys name withheld resources. A new owner takes the plan over from it.
            rows.append((self.topic_of("plan-dependencies"), p.plan_key.encode(),
                         orjson.dumps(dict(published, dependencies=sorted(p.dependencies), receipt=p.receipt,
                                           replaces=replaces.get(p.plan_key)), option=orjson.OPT_NON_STR_KEYS)))
            row_sources.append(source)
            places.append(None if self.partitions is None else plan_partition(p.plan["entity_id"], self.partitions))
        if outbox is not None:
            outbox.append((rows, row_sources, places))
        else:
            state.outbox.add_many(rows, row_sources, standby=standby, partitions=places)

    # -- announce ----------------------------------------------------------------------

    def announce(self, invalidations: Sequence[Invalidation], sources: Sequence[Source | None] | None = None,
                 standby: bool = False, outbox: list | None = None) -> None:
        """Queue the `plan-invalidations` records (and audit receipts) of these invalidations (see `store`)."""
        rows, row_sources = [], []
        for i, entry in enumerate(invalidations):
            plan_rows = entry.rows(self.topic_of("plan-invalidations"), self.topic_of("receipts"))
            source = sources[i] if sources else None
            if entry.successor_plan_id is None and source is not None and self.sent_early(entry.plan_id, source):
                plan_rows = plan_rows[1:]  # the audit receipt (if any) still goes
            rows.extend(plan_rows)
            row_sources += [sources[i] if sources else None] * len(plan_rows)
        if outbox is not None:
            outbox.append((rows, row_sources, [None] * len(rows)))
        else:
            self.state.outbox.add_many(rows, row_sources, standby=standby)

    def caused(self, old_id: str, plan_key: str, dep_key: str, cause: Cause, successor: str | None,
               now: datetime | None, memo: dict, visible: set[str] | None = None, reason: str | None = None,
               quiet: bool = False) -> Invalidation:
        """The invalidation of one plan by an input event.

        `memo` shares what plans of one batch have in common (cause, stamps) across a fan-out. A
        resource the plan neither admitted nor rejected by name (withheld, or new) is not named
        to the plan's subscribers: the cause says `resource:withheld`, and the full cause goes
        to auditors on `receipts`. `reason` overrides the one the dependency key's kind implies.
        """
        redact = dep_key.startswith("resource:") and dep_key[len("resource:"):] not in (visible or ())
        shared = memo.get((cause, dep_key, redact))
        if shared is None:
            full_cause = replace(cause, topic=self.topic_of(cause.topic), dependency_key=dep_key).as_wire()
            public = dict(full_cause, dependency_key="resource:withheld", event_id="withheld") if redact else full_cause
            shared = memo[(cause, dep_key, redact)] = (reason_for(dep_key), public, full_cause)
        if "stamps" not in memo:
            memo["stamps"] = (wall_now(), now and format_instant(now))
        self.observe_latency(cause)
        entry = Invalidation(old_id, plan_key, reason or shared[0], shared[1], memo["stamps"][0], memo["stamps"][1],
                             successor, shared[2] if shared[1] is not shared[2] else None)
        if not quiet:
            log.info("invalidated plan %s (%s)", old_id, entry.reason,
                     extra={"plan_id": old_id, "reason": entry.reason, "dependency_key": entry.cause["dependency_key"],
                            "event_id": entry.cause["event_id"], "successor_plan_id": successor})
        return entry

    def observe_latency(self, cause: Cause) -> None:
        """One invalidation's latency: from its event's broker timestamp to now."""
        if self.on_latency and cause.at:
            self.on_latency(max(0.0, time.time() - cause.at))

    # -- the apply path: what one batch of input events touched ------------------------

    def recompile(self, touched: Touched, counts: Counter[str], standby: bool = False,
                  announced: frozenset[str] = frozenset()) -> None:
        """Announce the touched plans and queue their successors (`announce_first`); those it leaves (all, with an
        `eager_limit` above their number) are recompiled here: unchanged outcomes adopted, changed ones announced.

        `announced`: keys of plans subscribers were told are stale already (`FastPath`): announced, never adopted."""
        state = self.state
        now = state.store.now()
        if len(touched) > self.eager_limit or announced:
            touched = announce_first(self, touched, now, counts, standby, announced)
            if not touched:
                return
        heads = {k: head._replace(request=orjson.loads(head.request))
                 for k, head in state.plans.heads_stamped(list(touched)).items()}
        visible = self.discoverable(touched, heads)
        view = self.snapshot([head.request for head in heads.values()], now)
        current: list[CompiledPlan] = []
        settled: list[CompiledPlan] = []
        successors: list[CompiledPlan] = []
        announced: list[Invalidation] = []
        sources: list[Source] = []
        successor_sources: list[Source] = []
        dropped: list[str] = []
        memo: dict = {}
        # A plan touched many times in the batch is compiled once (touched holds each key once).
        compiled_all = self.compile_all([(k, heads[k].request) for k in touched if k in heads], view, now)
        for plan_key, touch in touched.items():
            if plan_key not in heads:
                continue
            dep_key, cause, head = touch.dependency_key, touch.cause, heads[plan_key]
            old_id = head.plan_id
            compiled = compiled_all[plan_key]
            if compiled is not None and compiled.plan_id == old_id:
                # Same outcome: refresh horizon and edges, announce nothing (over-invalidation).
                counts["unchanged_recompilations"] += 1
                same = head.status == "fresh" and head.compiled_at is not None and as_decided_at(
                    compiled, format_instant(head.compiled_at), head.receipt_id)
                if same:  # horizon and edges too: the stored rows are this compilation's already
                    settled.append(same)
                else:
                    current.append(compiled)
                continue
            if compiled is None:
                dropped.append(plan_key)
            source = (cause.topic, cause.partition, cause.offset)
            if head.status != "invalidated":  # an invalidated head was announced already; only its successor is due
                # A crossed time key is a policy change when another bundle version now governs the plan.
                took_over = view.policy_took_over(dep_key, head.request, now)
                announced.append(self.caused(old_id, plan_key, dep_key, cause, compiled and compiled.plan_id, now,
                                             memo, visible.get(old_id), "policy_changed" if took_over else None))
                sources.append(source)
            if compiled is not None:
                successors.append(compiled)
                successor_sources.append(source)
        counts["invalidations"] += len(announced)
        outbox: list = []  # announcements first, then successors: one outbox write for both
        self.announce(announced, sources, standby, outbox)
        self.store(successors, now, counts, publish=True, sources=successor_sources, standby=standby, outbox=outbox,
                   replaces={k: head.plan_id for k, head in heads.items()})
        self.confirm(settled, counts, outbox)
        state.outbox.add_many([r for rows, _, _ in outbox for r in rows], [s for _, srcs, _ in outbox for s in srcs],
                              standby=standby, partitions=[p for _, _, places in outbox for p in places])
        self.store(current, now, counts, publish=False, replaces={k: head.plan_id for k, head in heads.items()})
        state.plans.invalidate_many([e.history_entry() for e in announced], now)
        state.plans.drop_heads(dropped)
        state.index.drop_many(dropped)
        if self.queue_pending:
            state.queue.remove(list(touched))

    def discoverable(self, touched: Touched, heads: dict) -> dict[str, set[str]]:
        """For plans touched through a resource key: the resource ids their principal may learn of."""
        return plan_facts.discoverable(self.state, {heads[k].plan_id for k, touch in touched.items()
                                                    if k in heads and touch.dependency_key.startswith("resource:")})

    def restore(self, current: list[dict]) -> tuple[int, int]:
        """Replay: recompile each current plan; announce `state_rebuilt` where the outcome changed.

        Returns (plans restored, plans changed). Nothing is published on `plans` here: the
        records were published when they were first compiled.
        """
        state = self.state
        now = state.store.now()
        counts: Counter[str] = Counter()
        restored, announced = [], []
        for plan in current:
            try:
                compiled = compile_request(plan["request"], state.catalog, now)
            except RequestError:
                compiled = None
            if compiled is not None and compiled.plan_id == plan["plan_id"]:
                restored.append(compiled)
                continue
            if compiled:
                restored.append(compiled)
            stamp = wall_now()
            cause = Cause("replay", f"replay-{stamp}", dependency_key="replay").as_wire()  # no one record to blame
            announced.append(Invalidation(plan["plan_id"], plan["plan_key"], "state_rebuilt", cause, stamp, None,
                                          compiled.plan_id if compiled else None))
        with state.store.transaction():
            self.store(restored, now, counts, publish=False)
            self.announce(announced)  # published by the worker's outbox flush when it starts
        return len(restored), len(announced)

    # -- selects -----------------------------------------------------------------------

    def compile_select(self, request, counts: Counter[str], on_compile=None) -> CompiledPlan:
        """Compile a selected request against current state and store it (published on `plans`).

        Raises RequestError for a request no state can answer. `counts` are the caller's
        in-memory counters: a counter write would cost as much as the plan.
        """
        [result] = self.compile_selects([request], counts, on_compile)
        if isinstance(result, Exception):
            raise result
        return result

    def compile_selects(self, requests: Sequence, counts: Counter[str], on_compile=None,
                        ) -> list[CompiledPlan | Exception]:
        """As `compile_select` for selects that waited together: per request its plan or its RequestError.

        The plans are stored in one transaction: storing is most of a select's compile on the writer
        (some 10 ms of statements against 3.5 ms of compiling), and selects that arrive while an input
        batch holds the writer would otherwise each pay it after that batch.
        """
        now = self.state.store.now()
        out = compile_requests(self, requests, now, on_compile)
        # Two selects of one plan key compiled the same plan: it is stored once.
        compiled = list({p.plan_key: p for p in out if isinstance(p, CompiledPlan)}.values())
        if not compiled:
            return out
        with self.state.store.transaction():
            heads = self.state.plans.heads([p.plan_key for p in compiled])
            self.store(compiled, now, counts, replaces={key: head.plan_id for key, head in heads.items()})
            # Announced first: these selects compiled the successors.
            successors = [(heads[p.plan_key].plan_id, p.plan_id) for p in compiled
                          if p.plan_key in heads and heads[p.plan_key].status == "invalidated"]
            self.state.plans.set_successors(successors)
            unchanged = sum(old == new for old, new in successors)
            if unchanged:
                # The same plan again: that announcement was unnecessary. Counted in the file (as the backlog
                # counts what it compiles), or precision would look better the more plans selects compile.
                self.state.store.bump_many({"announced_unchanged": unchanged})
        return out

