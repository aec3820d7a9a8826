"""Decode, dedupe and apply input events to local state, and find the plans each batch touched."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Callable, Sequence

from compiler.trust import unsourced
from agents.plans.plan_writer import PlanWriter, Touched, wall_now
from agents.stream.clock_ticks import play_tick
from agents.stream.lane_events import by_position, event_ids, moves_to_apply
from agents.stream.raw_message import RawMessage
from agents.stream.touched_plans import AppliedEvent, mark_due, touched_plans
from schemas.cdc_mapping import CdcMapping
from schemas.codec import decode
from schemas.errors import InvalidEvent, SkippedEvent
from schemas.outbound import Cause, input_dead_letter, letter_key
from schemas.routed_batch import SHARED
from schemas.records import ClockTick, InputEvent, PolicyBundle, Revocation, SourceChange
from schemas.timefmt import format_instant
from state.catalog_resources import Mine, OtherShard, everything
from state.invalidations import Touch
from state.local_state import LocalState
from streams.incarnation import record_mark

log = logging.getLogger(__name__)

OVERSIZED = ("the event is larger than the largest record this service can route between its workers "
             "(FRESHPLAN_MAX_RECORD_BYTES); split it or raise both limits")



def warn_unsourced(bundle: PolicyBundle) -> None:
    """Say once per loaded version which authoritative classes no source may assert under it."""
    for decision_type, classes in unsourced(bundle).items():
        log.warning("policy bundle %s v%d names no sources for %s, which %s accepts as an authoritative "
                    "source: every item of those classes is rejected as untrusted_source. Name the provenance "
                    "groups in the bundle's sources, or set source_trust false to opt out (docs/plans.md)",
                    bundle.bundle_id, bundle.version, ", ".join(classes), decision_type)


def _published_at(m: RawMessage) -> datetime:
    """When a record was published: its broker timestamp, but never later than this worker's wall clock.

    A producer can stamp its records (CreateTime): a stamp in the future would loosen every
    bound judged against it, so the wall caps it; a replay judges old records by their stamps.
    """
    wall = datetime.now(timezone.utc)
    return min(datetime.fromtimestamp(m.timestamp, timezone.utc), wall) if m.timestamp else wall


def _entity_of(event: InputEvent) -> str | None:
    """The entity a resource upsert is about (None for anything else, or one about no entity)."""
    payload = event.payload
    if isinstance(payload, SourceChange) and payload.kind == "resource" and payload.record is not None:
        return payload.record.entity  # type: ignore[union-attr]
    return None


class EventApplier:
    """Turns batches of input messages into state changes and outbox records, transactionally.

    What the touched plans become (recompiled, announced, adopted) is the plan writer's job.
    """

    def __init__(self, state: LocalState, plans: PlanWriter, max_event_bytes: int = 1_000_000,
                 max_clock_jump: timedelta | None = timedelta(days=400), cdc: CdcMapping | None = None,
                 max_event_skew: timedelta = timedelta(minutes=5), mine: Mine = everything,
                 owns: Mine = everything, early: Callable[[Sequence[RawMessage]], dict] | None = None,
                 lane_of: Callable[[str | None], int] | None = None,
                 owns_lane: Callable[[int], bool] = lambda lane: True) -> None:
        self.state = state
        # The plans announced stale from memory by events of a batch (`FastPath.announced`): invalidated here
        # under the same cause whatever applying the event found.
        self.early = early
        self.mine = mine  # whether a resource's entity is in this worker's shard (see `ShardState.mine`)
        self.owns = owns  # whether it is owned here, not only copied (see `ShardState.owns`)
        self.lane_of = lane_of  # the routed lane of a resource about an entity (see `ShardState.lane_of`)
        self.owns_lane = owns_lane  # whether an entity lane is owned here, not only copied
        self.plans = plans
        self.cdc = cdc  # the CDC mapping file, loaded once at start-up
        self.max_event_bytes = max_event_bytes
        self.max_clock_jump = max_clock_jump  # a tick further past now is refused; None: unbounded
        self.max_event_skew = max_event_skew  # a principal record dated further ahead of its publication: time unknown
        self.last_event: dict[str, dict] = {}  # topic -> the latest applied event, for operators
        self.now: datetime | None = state.store.now()  # event time after the last batch, read by the wall clock
        self.applied_in: str | None = None  # name of the thread that applied the last batch (the writer's)
        self._standby = False
        self.held_on_standby = False  # whether the last batch queued records on standby (only dead letters do)

    def apply(self, messages: Sequence[RawMessage], standby: bool = False,
              positions: dict[tuple[str, int], int] | None = None) -> None:
        """Apply a batch in one transaction; on an unexpected error, retry one by one.

        With `standby`, what the events cause is queued for the owner of their partitions to
        promote (see `Outbox`) instead of being published by this worker outright. `positions`
        are next offsets the batch reaches beyond its records (a lane merge's marks), saved with it.
        """
        if not messages:
            if positions:
                with self.state.store.transaction():
                    self.state.store.save_offsets(positions)
            return
        self._standby = standby
        self.held_on_standby = False
        self.applied_in = threading.current_thread().name
        try:
            with self.state.store.transaction():
                self._apply_all(messages, positions or {})
                # The publisher's acknowledged rows go in this commit, not one of their own.
                forgotten = self.state.outbox.forget_acked()
            self.state.outbox.acked.deleted(forgotten)
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
                    self.state.catalog.forget_cached()
                    counts: Counter[str] = Counter()
                    with self.state.store.transaction():
                        self.state.store.save_offsets({(message.topic, message.partition): message.offset + 1})
                        self._dead_letter(message, "processing_error",
                                          f"{type(exc).__name__} while applying", counts)
                        self.state.store.bump_many(counts)
            if positions:
                with self.state.store.transaction():
                    self.state.store.save_offsets(positions)

    def _apply_all(self, messages: Sequence[RawMessage], positions: dict[tuple[str, int], int] | None = None) -> None:
        store = self.state.store
        applied = store.next_offsets()
        # Judged against what was applied before the batch: a lane merge gives a record and move notices one offset.
        before = {topic: dict(parts) for topic, parts in applied.items()}
        counts: Counter[str] = Counter()
        offsets: dict[tuple[str, int], int] = {}
        marks: dict[tuple[str, int], tuple[int, RawMessage]] = {}
        decoded: list[tuple[RawMessage, InputEvent]] = []
        for m in messages:
            if m.offset < before.get(m.topic, {}).get(m.partition, 0):
                counts["redelivered_skipped"] += 1
                continue
            applied.setdefault(m.topic, {})[m.partition] = offsets[(m.topic, m.partition)] = m.offset + 1
            if not m.notice and m.original_size is None:  # a notice or a cut record is not the record there
                marks[(m.topic, m.partition)] = (m.offset, m)  # the mark is computed once, for the last record
            if m.original_size is not None:
                self._dead_letter(m, "oversized", OVERSIZED, counts)
                continue
            if m.notice:
                decoded.append((m, None))  # type: ignore[arg-type] # see `moves_to_apply`
                continue
            try:
                decoded.append((m, decode(m.topic, m.key, m.value, position=f"{m.partition}:{m.offset}",
                                          max_bytes=self.max_event_bytes, cdc=self.cdc)))
            except SkippedEvent as exc:
                counts[f"cdc_skipped.{exc.kind}"] += 1
            except InvalidEvent as exc:
                self._dead_letter(m, exc.error_class, exc.message, counts)
        decoded = moves_to_apply(decoded, self.now, self.state.catalog.live_resources)
        for pos, nxt in (positions or {}).items():  # saved with the records' offsets: one statement, not two
            offsets[pos] = max(offsets.get(pos, nxt), nxt)
        store.save_offsets(offsets, {pos: (o, record_mark(m.key, m.value, m.timestamp and round(m.timestamp * 1e3)))
                                     for pos, (o, m) in marks.items()})
        # The clock is idempotent by monotonicity; its ticks need no event-id ledger. Nor are the ids of
        # other shards' resources claimed: a shard gained later must not take them for applied.
        claimed = [m.topic != "clock" and not m.notice and not self._elsewhere(e) for m, e in decoded]
        verdicts = iter(store.claim_events([(m.topic, e.event_id, e.content_hash)
                                            for (m, e), claim in zip(decoded, claimed, strict=True) if claim]))
        fresh: list[tuple[RawMessage, InputEvent]] = []
        for (m, e), claim in zip(decoded, claimed, strict=True):
            verdict = next(verdicts) if claim else "new"
            if verdict == "new":
                fresh.append((m, e))
            elif verdict == "duplicate":
                counts["duplicate_events"] += 1
            elif m.topic == "revocations":
                # Dropping a withdrawal grants access; applying one twice is harmless (fail closed).
                fresh.append((m, e))
                counts["conflicting_revocations_applied"] += 1
                self._dead_letter(m, "event_id_conflict", "this event_id was already applied on revocations "
                                  "with different content; the revocation was applied anyway (a withdrawal is "
                                  "never dropped); give every distinct event its own event_id", counts)
            else:
                self._dead_letter(m, "event_id_conflict", f"this event_id was already applied on {m.topic} "
                                  "with different content; give every distinct event its own event_id", counts,
                                  about=_entity_of(e))
        applied = self._apply_events(fresh, counts)
        # Every worker records where each key changed, owner or not: a later owner judges by it.
        # A record and a move notice can share an offset (a lane merge): their keys are recorded together.
        self.state.key_changes.record(by_position(((e.cause.topic, e.cause.partition, e.cause.offset), e.keys)
                                                  for e in applied),
                                      event_ids(((e.cause.topic, e.cause.partition, e.cause.offset), e.cause.event_id)
                                                for e in applied))
        touched = touched_plans(self.state.index, applied)
        early = self._honour_early(messages, touched) if self.early is not None else frozenset()
        # Only plans of owned partitions are indexed here, so what they cause is this worker's to publish.
        self.plans.recompile(touched, counts, announced=early)
        store.bump_many(counts)

    def _honour_early(self, messages: Sequence[RawMessage], touched: Touched) -> frozenset[str]:
        """Touch the plans announced early by these events under the cause they were announced with, whatever
        applying touched (nothing, for an edit refused or older under log order; another event first): what
        subscribers were told must hold in the file too. Their keys, which must be announced, not recompiled."""
        early = self.early(messages) if self.early is not None else {}
        stamps = {(m.topic, m.partition, m.offset): m.timestamp for m in messages}
        keys: set[str] = set()
        for position, entries in early.items():
            topic, partition, offset = position
            for entry in entries:
                if entry.plan_key not in keys:  # the first event that announced it
                    keys.add(entry.plan_key)
                    cause = Cause(topic, entry.event_id, partition, offset, at=stamps.get(position))
                    touched[entry.plan_key] = Touch(entry.dependency_key, cause)
        return frozenset(keys)

    def _elsewhere(self, event: InputEvent) -> bool:
        """Whether an event is an upsert of a resource about another shard's entity (a move away is applied
        unclaimed: versions make a repeat of it harmless)."""
        payload = event.payload
        return (isinstance(payload, SourceChange) and payload.kind == "resource" and payload.record is not None
                and not self.mine(payload.record.entity))  # type: ignore[union-attr]

    def _apply_events(self, fresh: list[tuple[RawMessage, InputEvent]],
                      counts: Counter[str]) -> list[AppliedEvent]:
        """Apply events in order, in bulk; (keys, plans due by time, cause) per applied event.

        Resource changes are one bulk write; principal, entity and revocation changes and clock
        ticks one per run between policy bundles (a bundle changes which principal attributes
        matter), so a batch costs a constant number of statements however many events it holds.
        """
        resources = [(i, e.payload) for i, (_, e) in enumerate(fresh)
                     if isinstance(e.payload, SourceChange) and e.payload.kind == "resource"]
        left = {j: SHARED if fresh[i][0].lane is None else fresh[i][0].lane
                for j, (i, _) in enumerate(resources) if fresh[i][0].notice}
        results: dict[int, list[str] | InvalidEvent | None] = dict(zip(
            (i for i, _ in resources), self.state.catalog.apply_resources([c for _, c in resources], self.mine,
                                                                          left, self.lane_of),
            strict=True))
        resource_at = {i for i, _ in resources}
        clocks: dict[int, datetime] | None = None
        ticked: dict[int, datetime] = {}
        run: list[int] = []
        for i, (m, event) in enumerate(fresh):
            payload = event.payload
            if isinstance(payload, PolicyBundle):
                self._apply_identities(fresh, run, results, counts)
                run = []
                try:
                    results[i] = self.state.catalog.apply_policy(payload)
                except InvalidEvent as exc:
                    results[i] = exc
                else:
                    if results[i] is not None:
                        warn_unsourced(payload)
            elif isinstance(payload, ClockTick):
                clocks = self.state.store.clocks() if clocks is None else clocks
                results[i] = play_tick(payload, m.partition, _published_at(m), clocks, ticked, self.max_clock_jump)
            elif isinstance(payload, Revocation) or (isinstance(payload, SourceChange) and payload.kind != "resource"):
                run.append(i)
            elif i not in results:
                results[i] = InvalidEvent("schema_violation", f"no handler for {type(payload).__name__}")
        self._apply_identities(fresh, run, results, counts)
        self.state.store.set_clocks(ticked)
        if ticked:
            self.now = max(self.state.store.clocks().values())
        applied: list[AppliedEvent] = []
        ticks: list[tuple[datetime, int]] = []
        latest: dict[str, tuple[RawMessage, InputEvent]] = {}
        for i, (m, event) in enumerate(fresh):
            keys = results[i]
            if isinstance(keys, OtherShard):
                counts["resources_of_other_shards"] += 1
                continue
            if isinstance(keys, InvalidEvent):
                # Columns left out are filled from the stored row, which only the resource's holder has: it
                # alone judges them, and it may not be the duty owner that promotes standby letters.
                alone = i in resource_at and keys.error_class == "unavailable_value"
                self._dead_letter(m, keys.error_class, keys.message, counts, about=_entity_of(event) if alone else None)
                continue
            if keys is None:
                counts["ignored_old_versions"] += 1
                continue
            counts[f"applied.{m.topic}"] += 1
            latest[m.topic] = (m, event)
            cause = Cause(m.topic, event.event_id, m.partition, m.offset, at=m.timestamp)
            if isinstance(event.payload, ClockTick):
                ticks.append((event.payload.now, len(applied)))
            applied.append(AppliedEvent(keys, cause))
        mark_due(self.state.index, ticks, applied)
        if latest:  # formatted once per topic and batch, not per event
            applied_at = wall_now()
            for topic, (m, event) in latest.items():
                self.last_event[topic] = {"event_id": event.event_id, "partition": m.partition, "offset": m.offset,
                                          "occurred_at": format_instant(event.occurred_at), "applied_at": applied_at}
        return applied

    def _apply_identities(self, fresh: list[tuple[RawMessage, InputEvent]], run: list[int],
                          results: dict[int, list[str] | InvalidEvent | None], counts: Counter[str]) -> None:
        if run:
            results.update(zip(run, self.state.catalog.apply_identities(
                [fresh[i][1].payload for i in run], [self._made_at(*fresh[i], counts) for i in run]), strict=True))

    def _made_at(self, m: RawMessage, event: InputEvent, counts: Counter[str]) -> datetime | None:
        """An identity record's time, as far as it can be believed (None: unknown, for the revocation rule).

        A record dated ahead of its own publication would be immune to every later revocation.
        """
        payload = event.payload
        if isinstance(payload, SourceChange) and event.occurred_at - _published_at(m) > self.max_event_skew:
            counts["principal_time_ahead"] += 1
            return None
        return event.occurred_at

    def dead_letter_lane_record(self, m: RawMessage, error_class: str, message: str, counts: Counter[str]) -> None:
        """Dead-letter a refused record of an entity lane this worker is gaining as its owner (history its old
        owner never reported), outright and inside the caller's transaction: the lane is not held yet."""
        self._letter(m, error_class, message, counts, standby=False)

    def keep_lane_letter(self, m: RawMessage, error_class: str, message: str, counts: Counter[str]) -> None:
        """Keep a refused history record of an entity lane held as a copy, for its owner (see `Outbox.add_many`)."""
        counts["dead_letters_left_to_owner"] += 1
        self._letter(m, error_class, message, counts, standby=True, lane=m.lane)

    def _dead_letter(self, m: RawMessage, error_class: str, message: str, counts: Counter[str],
                     about: str | None = None) -> None:
        """Queue a dead letter: on standby for the duty owner of its input partition when every worker judges
        the record alike; sent outright by the owner of the entity `about` when only its holders can (the
        stored row decides, or only they claim its event id), and by no other worker."""
        standby = self._standby
        if m.lane is not None:
            # Read from an entity lane: only the lane's holders judged it, and its owner reports it. A copy
            # keeps it for the owner, which may die before sending it (see `Outbox.add_many`).
            if not self.owns_lane(m.lane):
                return self.keep_lane_letter(m, error_class, message, counts)
            standby = False
        elif about is not None:
            if not self.owns(about):
                counts["dead_letters_left_to_owner"] += 1
                return
            standby = False
        self._letter(m, error_class, message, counts, standby)

    def _letter(self, m: RawMessage, error_class: str, message: str, counts: Counter[str], standby: bool,
                lane: int | None = None) -> None:
        record = input_dead_letter(self.plans.topic_of(m.topic), m.partition, m.offset, error_class, message, m.value,
                                   m.original_size)
        self.state.outbox.add_many([(self.plans.topic_of("dead-letters"), letter_key(m.key), record)],
                                   [(m.topic, m.partition, m.offset)], standby=standby, lane=lane)
        if lane is not None:
            return  # the lane owner's letter, kept in case it dies: counted as left to it
        self.held_on_standby = self.held_on_standby or standby
        counts[f"dead_letters.{error_class}"] += 1
        log.warning("dead-lettered %s/%d/%d: %s", m.topic, m.partition, m.offset, error_class,
                    extra={"topic": m.topic, "partition": m.partition, "offset": m.offset,
                           "error_class": error_class})
