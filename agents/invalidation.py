"""Apply input events to local state, find affected plans, invalidate and recompile them."""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Sequence

import orjson

from compiler.errors import RequestError
from compiler.pipeline import CompiledPlan, compile_request
from schemas.codec import decode
from schemas.cdc_mapping import CdcMapping
from schemas.errors import InvalidEvent, SkippedEvent
from schemas.records import ClockTick, InputEvent, PolicyBundle, Revocation, SourceChange
from schemas.outbound import input_dead_letter
from schemas.timefmt import format_instant
from state.catalog_snapshot import CatalogSnapshot
from state.local_state import LocalState
from streams.incarnation import record_mark

log = logging.getLogger(__name__)


REASONS = {"resource": "source_changed", "scope": "scope_changed", "principal": "principal_changed",
           "policy": "policy_changed", "contract": "contract_changed", "time": "time_passed",
           "entity": "source_changed", "alias": "source_changed"}


@dataclass(frozen=True, slots=True)
class RawMessage:
    """One consumed record, before decoding."""

    topic: str
    """Logical topic name."""
    partition: int
    """Partition it was read from."""
    offset: int
    """Its offset in that partition."""
    key: bytes | None
    """Message key."""
    value: bytes | None
    """Message value (None for a tombstone)."""
    timestamp: float | None = None
    """Broker timestamp in epoch seconds, for event-to-invalidation latency."""


def _iso(span: timedelta) -> str:
    """A span as an ISO 8601 duration of days and seconds."""
    return f"P{span.days}D" + (f"T{span.seconds}S" if span.seconds else "")


def wall_now() -> str:
    """Wall-clock time for `invalidated_at` stamps (latency is measured against it)."""
    return format_instant(datetime.now(timezone.utc))


class Invalidator:
    """Turns batches of input messages into state changes and outbox records, transactionally."""

    def __init__(self, state: LocalState, topic_of, max_event_bytes: int = 1_000_000,
                 on_latency=None, on_compile=None, eager_limit: int = 500,
                 max_clock_jump: timedelta | None = timedelta(days=400), cdc: CdcMapping | None = None) -> None:
        self.state = state
        self.cdc = cdc  # the CDC mapping file, loaded once at start-up
        self.topic_of = topic_of  # logical name -> broker-side name
        self.max_event_bytes = max_event_bytes
        self.max_clock_jump = max_clock_jump  # a tick further past now is refused; None: unbounded
        self.on_latency = on_latency  # seconds from an event's broker timestamp to its invalidation
        self.on_compile = on_compile  # seconds per recompilation
        self.last_event: dict[str, dict] = {}  # topic -> the latest applied event, for operators
        self._standby = False
        self.eager_limit = eager_limit  # larger fan-outs are announced first and recompiled later
        self.queue_pending = state.queue.size() > 0  # saves a statement per batch while the queue is empty

    def apply(self, messages: Sequence[RawMessage], standby: bool = False) -> None:
        """Apply a batch in one transaction; on an unexpected error, retry one by one.

        With `standby`, what the events cause is queued for the owner of their partitions to
        promote (see `Outbox`) instead of being published by this worker outright.
        """
        self._standby = standby
        try:
            with self.state.store.transaction():
                self._apply_all(messages)
        except Exception:  # noqa: BLE001 - one policy: isolate the poison message, never crash
            log.exception("batch of %d failed; applying one by one", len(messages))
            self.state.catalog.forget_cached()
            for message in messages:
                try:
                    with self.state.store.transaction():
                        self._apply_all([message])
                except Exception as exc:  # noqa: BLE001
                    log.exception("event at %s/%d/%d could not be applied", message.topic,
                                  message.partition, message.offset)
                    counts: Counter[str] = Counter()
                    with self.state.store.transaction():
                        self.state.store.save_offsets({(message.topic, message.partition): message.offset + 1})
                        self._dead_letter(message, "processing_error",
                                          f"{type(exc).__name__} while applying", counts)
                        self.state.store.bump_many(counts)

    def _apply_all(self, messages: Sequence[RawMessage]) -> None:
        store = self.state.store
        applied = store.next_offsets()
        counts: Counter[str] = Counter()
        offsets: dict[tuple[str, int], int] = {}
        marks: dict[tuple[str, int], tuple[int, RawMessage]] = {}
        decoded: list[tuple[RawMessage, InputEvent]] = []
        for m in messages:
            if m.offset < applied.get(m.topic, {}).get(m.partition, 0):
                counts["redelivered_skipped"] += 1
                continue
            applied.setdefault(m.topic, {})[m.partition] = offsets[(m.topic, m.partition)] = m.offset + 1
            marks[(m.topic, m.partition)] = (m.offset, m)  # the mark is computed once, for the last record
            try:
                decoded.append((m, decode(m.topic, m.key, m.value, position=f"{m.partition}:{m.offset}",
                                          max_bytes=self.max_event_bytes, cdc=self.cdc)))
            except SkippedEvent as exc:
                counts[f"cdc_skipped.{exc.kind}"] += 1
            except InvalidEvent as exc:
                self._dead_letter(m, exc.error_class, exc.message, counts)
        store.save_offsets(offsets, {pos: (o, record_mark(m.key, m.value, m.timestamp and round(m.timestamp * 1e3)))
                                     for pos, (o, m) in marks.items()})
        # The clock is idempotent by monotonicity; its ticks need no event-id ledger.
        verdicts = iter(store.claim_events([(m.topic, e.event_id, e.content_hash)
                                            for m, e in decoded if m.topic != "clock"]))
        fresh: list[tuple[RawMessage, InputEvent]] = []
        for m, e in decoded:
            verdict = "new" if m.topic == "clock" else next(verdicts)
            if verdict == "new":
                fresh.append((m, e))
            elif verdict == "duplicate":
                counts["duplicate_events"] += 1
            else:
                self._dead_letter(m, "event_id_conflict", f"this event_id was already applied on {m.topic} "
                                  "with different content; give every distinct event its own event_id", counts)
        keyed = self._apply_events(fresh, counts)
        touched = self._affected(keyed)
        self._recompile(touched, counts)
        store.bump_many(counts)

    def _apply_events(self, fresh: list[tuple[RawMessage, InputEvent]],
                      counts: Counter[str]) -> list[tuple[list[str], dict[str, str], dict]]:
        """Apply events in order (resource changes in one bulk write); (keys, cause) per applied event."""
        resources = [(i, e.payload) for i, (_, e) in enumerate(fresh)
                     if isinstance(e.payload, SourceChange) and e.payload.kind == "resource"]
        results: dict[int, list[str] | InvalidEvent | None] = dict(zip(
            (i for i, _ in resources), self.state.catalog.apply_resources([c for _, c in resources]), strict=True))
        keyed: list[tuple[list[str], dict[str, str], dict]] = []
        for i, (m, event) in enumerate(fresh):
            try:
                keys = results[i] if i in results else self._apply_event(event, m.partition)
                if isinstance(keys, InvalidEvent):
                    raise keys
            except InvalidEvent as exc:
                self._dead_letter(m, exc.error_class, exc.message, counts)
                continue
            if keys is None:
                counts["ignored_old_versions"] += 1
                continue
            counts[f"applied.{m.topic}"] += 1
            self.last_event[m.topic] = {"event_id": event.event_id, "partition": m.partition, "offset": m.offset,
                                        "occurred_at": format_instant(event.occurred_at), "applied_at": wall_now()}
            cause = {"topic": m.topic, "partition": m.partition, "offset": m.offset, "event_id": event.event_id,
                     "_timestamp": m.timestamp}
            due = self.state.index.due(event.payload.now) if isinstance(event.payload, ClockTick) else {}
            keyed.append((keys, due, cause))
        return keyed

    def _affected(self, keyed: list[tuple[list[str], dict[str, str], dict]]) -> dict[str, tuple[str, dict]]:
        """Plan keys touched by the batch, each with the first dependency key and event that touched it."""
        first: dict[str, tuple[int, dict]] = {}
        touched: dict[str, tuple[int, str, dict]] = {}
        for order, (keys, due, cause) in enumerate(keyed):
            for key in keys:
                first.setdefault(key, (order, cause))
            for plan_key, time_key in due.items():
                touched.setdefault(plan_key, (order, time_key, cause))
        for plan_key, dep_key in self.state.index.affected_pairs(list(first)):
            order, cause = first[dep_key]
            if plan_key not in touched or order < touched[plan_key][0]:
                touched[plan_key] = (order, dep_key, cause)
        return {k: (dep_key, cause) for k, (_, dep_key, cause) in touched.items()}

    def _apply_event(self, event: InputEvent, partition: int = 0) -> list[str] | None:
        payload = event.payload
        catalog = self.state.catalog
        if isinstance(payload, SourceChange):
            return catalog.apply_source_change(payload)
        if isinstance(payload, PolicyBundle):
            return catalog.apply_policy(payload)
        if isinstance(payload, Revocation):
            return catalog.apply_revocation(payload)
        if isinstance(payload, ClockTick):
            now = self.state.store.now()
            # One wild tick must not move event time for good (later correct ticks would all regress).
            if now is not None and self.max_clock_jump is not None and payload.now - now > self.max_clock_jump:
                raise InvalidEvent("clock_jump", f"tick is more than {_iso(self.max_clock_jump)} past the "
                                   "current now; fix the clock producer, or raise FRESHPLAN_MAX_CLOCK_JUMP")
            moved = self.state.store.advance_clock(payload.now, partition)
            if moved is None:
                raise InvalidEvent("clock_regression", "now is older than the last tick on clock partition "
                                   f"{partition}; event time only moves forward")
            return [] if moved else None
        raise InvalidEvent("schema_violation", f"no handler for {type(payload).__name__}")

    def _recompile(self, touched: dict[str, tuple[str, dict]], counts: Counter[str]) -> None:
        state = self.state
        now = state.store.now()
        heads = state.plans.heads(list(touched), parse=False)
        if len(heads) > self.eager_limit:
            self._announce_first(touched, heads, now, counts)
            return
        heads = {k: (plan_id, orjson.loads(request), status) for k, (plan_id, request, status) in heads.items()}
        visible = self._discoverable(touched, heads)
        view = CatalogSnapshot(state.catalog)
        view.prefetch([request for _, request, _ in heads.values()])
        current: list[CompiledPlan] = []
        successors: list[CompiledPlan] = []
        invalidated: list[tuple[str, str, dict, str | None]] = []
        announcements: list[tuple[str, bytes, bytes]] = []
        sources: list[tuple[str, int, int]] = []
        successor_sources: list[tuple[str, int, int]] = []
        dropped: list[str] = []
        for plan_key, (dep_key, cause) in touched.items():
            if plan_key not in heads:
                continue
            old_id, request, status = heads[plan_key]
            compiled = self.compile_one(plan_key, request, view, now)
            if compiled is not None and compiled.plan_id == old_id:
                # Same outcome: refresh horizon and edges, announce nothing (over-invalidation).
                current.append(compiled)
                counts["unchanged_recompilations"] += 1
                continue
            if compiled is None:
                dropped.append(plan_key)
            if status != "invalidated":  # an invalidated head was announced already; only its successor is due
                # A crossed time key is a policy change when another bundle version now governs the plan.
                took_over = view.policy_took_over(dep_key, request, now)
                rows, source, entry = self._announcement(old_id, plan_key, dep_key, cause, compiled, now,
                                                         visible=visible.get(old_id),
                                                         reason="policy_changed" if took_over else None)
                announcements.extend(rows)
                sources.extend([source] * len(rows))
                invalidated.append(entry)
            if compiled is not None:
                successors.append(compiled)
                successor_sources.append((cause["topic"], cause["partition"], cause["offset"]))
        counts["invalidations"] += len(invalidated)
        state.outbox.add_many(announcements, sources, standby=self._standby)
        self.store_compiled(successors, now, counts, publish=True, sources=successor_sources)
        self.store_compiled(current, now, counts, publish=False)
        state.plans.invalidate_many(invalidated, now)
        state.plans.drop_heads(dropped)
        state.index.drop_many(dropped)
        if self.queue_pending:
            state.queue.remove(list(touched))

    def compile_one(self, plan_key: str, request: dict, view, now: datetime | None) -> CompiledPlan | None:
        """Recompile one plan key; None when it can no longer compile (its plan is dropped)."""
        started = time.perf_counter()
        try:
            return compile_request(request, view, now)
        except RequestError as exc:
            log.info("plan key %s can no longer compile: %s", plan_key, exc.code)
            return None
        finally:
            if self.on_compile:
                self.on_compile(time.perf_counter() - started)

    def _discoverable(self, touched: dict[str, tuple[str, dict]], heads: dict) -> dict[str, set[str]]:
        """For plans touched through a resource key: the resource ids their principal may learn of."""
        by_resource = [heads[k][0] for k, (dep_key, _) in touched.items()
                       if k in heads and dep_key.startswith("resource:")]
        return self.state.plans.discoverable(by_resource)

    def _announcement(self, old_id: str, plan_key: str, dep_key: str, cause: dict, compiled: CompiledPlan | None,
                      now: datetime | None, memo: dict | None = None, quiet: bool = False,
                      visible: set[str] | None = None, reason: str | None = None,
                      ) -> tuple[tuple[str, bytes, bytes], tuple[str, int, int], tuple]:
        """The plan-invalidations record of one plan, its source position, and its plan-store update.

        `memo` shares what plans of one batch have in common (cause, stamps) across a fan-out. A
        resource the plan neither admitted nor rejected by name (withheld, or new) is not named
        to the plan's subscribers: the cause says `resource:withheld`, and the full cause goes
        to auditors on `receipts`. `reason` overrides the one the dependency key's kind implies.
        """
        memo = {} if memo is None else memo
        redact = dep_key.startswith("resource:") and dep_key[len("resource:"):] not in (visible or ())
        shared = memo.get((id(cause), dep_key, redact))
        if shared is None:
            full_cause = {k: v for k, v in cause.items() if not k.startswith("_")}
            full_cause.update(topic=self.topic_of(cause["topic"]), dependency_key=dep_key)
            public = dict(full_cause, dependency_key="resource:withheld", event_id="withheld") if redact else full_cause
            shared = memo[(id(cause), dep_key, redact)] = (REASONS.get(dep_key.split(":", 1)[0], "source_changed"),
                                                           public, full_cause)
        public_cause, full_cause = shared[1:]
        reason = reason or shared[0]
        if "stamps" not in memo:
            memo["stamps"] = (wall_now(), now and format_instant(now))
        stamp = cause.get("_timestamp")
        if self.on_latency and stamp:
            self.on_latency(max(0.0, time.time() - stamp))
        successor = compiled.plan_id if compiled else None
        record = {"schema_version": 1, "plan_id": old_id, "plan_key": plan_key, "reason": reason,
                  "cause": public_cause, "invalidated_at": memo["stamps"][0], "as_of": memo["stamps"][1],
                  "successor_plan_id": successor}
        if not quiet:
            log.info("invalidated plan %s (%s)", old_id, reason,
                     extra={"plan_id": old_id, "reason": reason, "dependency_key": public_cause["dependency_key"],
                            "event_id": public_cause["event_id"], "successor_plan_id": successor})
        rows = [(self.topic_of("plan-invalidations"), old_id.encode(), orjson.dumps(record))]
        if public_cause is not full_cause:
            audit = {"schema_version": 1, "kind": "invalidation", "plan_id": old_id, "reason": reason,
                     "cause": full_cause, "invalidated_at": memo["stamps"][0], "successor_plan_id": successor}
            audit["receipt_id"] = "rcpt-inv-" + hashlib.sha256(orjson.dumps(audit)).hexdigest()[:20]
            rows.append((self.topic_of("receipts"), audit["receipt_id"].encode(), orjson.dumps(audit)))
        return (rows, (cause["topic"], cause["partition"], cause["offset"]), (old_id, reason, public_cause, successor))

    def _announce_first(self, touched: dict[str, tuple[str, dict]], heads: dict, now: datetime | None,
                        counts: Counter[str]) -> None:
        """A fan-out larger than `eager_limit`: announce every plan now, compile successors later.

        Announcements then cost an index lookup and a record each, whatever compiling costs; the
        successor id is published on `plans` when `recompile_queued` gets to it.
        """
        rows, sources, invalidated, queued = [], [], [], []
        memo: dict = {}
        events: Counter[str] = Counter()
        visible = self._discoverable(touched, heads)
        view = CatalogSnapshot(self.state.catalog)
        for plan_key, (dep_key, cause) in touched.items():
            if plan_key not in heads or heads[plan_key][2] == "invalidated":
                continue  # no plan, or announced already and waiting in the queue
            events[cause["event_id"]] += 1
            took_over = view.policy_took_over(dep_key, heads[plan_key][1], now)
            plan_rows, source, entry = self._announcement(heads[plan_key][0], plan_key, dep_key, cause, None, now,
                                                          memo, quiet=True, visible=visible.get(heads[plan_key][0]),
                                                          reason="policy_changed" if took_over else None)
            rows.extend(plan_rows)
            sources.extend([source] * len(plan_rows))
            invalidated.append(entry)
            queued.append((plan_key, *source))
        self.state.outbox.add_many(rows, sources, standby=self._standby)
        self.state.plans.invalidate_many(invalidated, now)
        self.state.queue.add_many(queued)
        self.queue_pending = self.queue_pending or bool(queued)
        counts["invalidations"] += len(invalidated)
        counts["deferred_recompilations"] += len(queued)
        for event_id, n in events.items():  # one line per event: the plan ids are on the topic
            log.info("invalidated %d plans, successors to follow", n,
                     extra={"event_id": event_id, "plans": n, "reason": "fan_out"})

    def store_compiled(self, plans: Sequence[CompiledPlan], now: datetime | None, counts: Counter[str],
                       publish: bool = True, sources: Sequence[tuple[str, int, int]] | None = None) -> None:
        """Make compilations current: plans, receipts, index edges, and (if new) both on the outbox.

        A published plan carries `compiled_as_of`, the input offsets its state reflected, so
        that other workers know when their own state is fresh enough to adopt it.
        """
        if not plans:
            return
        state = self.state
        state.plans.save_many(plans, now)
        state.index.replace_many({p.plan_key: p.dependencies for p in plans})
        if publish:
            as_of = state.store.next_offsets()
            cluster_id = state.store.incarnation()[0]
            rows, row_sources = [], []
            for i, p in enumerate(plans):
                rows.append((self.topic_of("plans"), p.plan_id.encode(),
                             orjson.dumps(dict(p.plan, compiled_as_of=as_of, compiled_in=cluster_id),
                                         option=orjson.OPT_NON_STR_KEYS)))
                rows.append((self.topic_of("receipts"), p.receipt_id.encode(), orjson.dumps(p.receipt)))
                row_sources += [sources[i] if sources else None] * 2
            state.outbox.add_many(rows, row_sources, standby=self._standby)
        counts["compilations"] += len(plans)
        counts["policy_errors"] += sum(p.receipt.get("policy_errors", 0) for p in plans)

    def _dead_letter(self, m: RawMessage, error_class: str, message: str, counts: Counter[str]) -> None:
        record = input_dead_letter(self.topic_of(m.topic), m.partition, m.offset, error_class, message, m.value)
        self.state.outbox.add_many([(self.topic_of("dead-letters"), m.key, record)],
                                   [(m.topic, m.partition, m.offset)], standby=self._standby)
        counts[f"dead_letters.{error_class}"] += 1
        log.warning("dead-lettered %s/%d/%d: %s", m.topic, m.partition, m.offset, error_class,
                    extra={"topic": m.topic, "partition": m.partition, "offset": m.offset,
                           "error_class": error_class})
