"""Apply input events to local state, find affected plans, invalidate and recompile them."""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Sequence

import orjson

from compiler.errors import RequestError
from compiler.pipeline import compile_request
from schemas.codec import decode
from schemas.errors import InvalidEvent
from schemas.records import ClockTick, InputEvent, PolicyBundle, Revocation, SourceChange
from schemas.timefmt import format_instant
from state.local_state import LocalState

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


def wall_now() -> str:
    """Wall-clock time for `invalidated_at` stamps (latency is measured against it)."""
    return format_instant(datetime.now(timezone.utc))


class Invalidator:
    """Turns batches of input messages into state changes and outbox records, transactionally."""

    def __init__(self, state: LocalState, topic_of, max_event_bytes: int = 1_000_000) -> None:
        self.state = state
        self.topic_of = topic_of  # logical name -> broker-side name
        self.max_event_bytes = max_event_bytes

    def apply(self, messages: Sequence[RawMessage]) -> None:
        """Apply a batch in one transaction; on an unexpected error, retry one by one."""
        try:
            with self.state.store.transaction():
                self._apply_all(messages)
        except Exception:  # noqa: BLE001 - one policy: isolate the poison message, never crash
            log.exception("batch of %d failed; applying one by one", len(messages))
            for message in messages:
                try:
                    with self.state.store.transaction():
                        self._apply_all([message])
                except Exception as exc:  # noqa: BLE001
                    log.exception("event at %s/%d/%d could not be applied", message.topic,
                                  message.partition, message.offset)
                    with self.state.store.transaction():
                        self.state.store.save_offset(message.topic, message.partition, message.offset + 1)
                        self._dead_letter(message, "processing_error",
                                          f"{type(exc).__name__} while applying: {exc}")

    def _apply_all(self, messages: Sequence[RawMessage]) -> None:
        store = self.state.store
        applied = store.next_offsets()
        touched: dict[str, tuple[str, dict]] = {}
        for m in messages:
            if m.offset < applied.get(m.topic, {}).get(m.partition, 0):
                store.bump("redelivered_skipped")
                continue
            store.save_offset(m.topic, m.partition, m.offset + 1)
            applied.setdefault(m.topic, {})[m.partition] = m.offset + 1
            try:
                event = decode(m.topic, m.key, m.value, position=f"{m.partition}:{m.offset}",
                               max_bytes=self.max_event_bytes)
                # The clock is idempotent by monotonicity; its ticks need no event-id ledger.
                if m.topic != "clock" and not store.claim_event(event.event_id):
                    store.bump("duplicate_events")
                    continue
                keys = self._apply_event(event)
            except InvalidEvent as exc:
                self._dead_letter(m, exc.error_class, exc.message)
                continue
            if keys is None:
                store.bump("ignored_old_versions")
                continue
            store.bump(f"applied.{m.topic}")
            cause = {"topic": m.topic, "partition": m.partition, "offset": m.offset,
                     "event_id": event.event_id}
            for plan_key, dep_key in self.state.index.affected(keys).items():
                touched.setdefault(plan_key, (dep_key, cause))
            if isinstance(event.payload, ClockTick):
                for plan_key, dep_key in self.state.index.due(event.payload.now).items():
                    touched.setdefault(plan_key, (dep_key, cause))
        self._recompile(touched)

    def _apply_event(self, event: InputEvent) -> list[str] | None:
        payload = event.payload
        catalog = self.state.catalog
        if isinstance(payload, SourceChange):
            return catalog.apply_source_change(payload)
        if isinstance(payload, PolicyBundle):
            return catalog.apply_policy(payload)
        if isinstance(payload, Revocation):
            return catalog.apply_revocation(payload)
        if isinstance(payload, ClockTick):
            return [] if self.state.store.advance_clock(payload.now) else None
        raise InvalidEvent("schema_violation", f"no handler for {type(payload).__name__}")

    def _recompile(self, touched: dict[str, tuple[str, dict]]) -> None:
        state = self.state
        now = state.store.now()
        for plan_key, (dep_key, cause) in touched.items():
            head = state.plans.head(plan_key)
            request = state.plans.request_of(plan_key)
            if head is None or request is None:
                continue
            old_id = head[0]
            try:
                compiled = compile_request(request, state.catalog, now)
            except RequestError as exc:
                log.info("plan key %s can no longer compile: %s", plan_key, exc.code)
                compiled = None
            if compiled is not None and compiled.plan_id == old_id:
                # Same outcome: refresh horizon and edges, announce nothing (over-invalidation).
                state.plans.save(compiled, now)
                state.index.replace(plan_key, compiled.dependencies)
                state.store.bump("unchanged_recompilations")
                continue
            successor = None
            if compiled is not None:
                self.store_compiled(compiled, now)
                successor = compiled.plan_id
            else:
                state.plans.drop_head(plan_key)
                state.index.drop(plan_key)
            reason = REASONS.get(dep_key.split(":", 1)[0], "source_changed")
            full_cause = dict(cause, topic=self.topic_of(cause["topic"]), dependency_key=dep_key)
            state.plans.invalidate(old_id, reason=reason, cause=full_cause, at=now, successor=successor)
            record = {"schema_version": 1, "plan_id": old_id, "plan_key": plan_key, "reason": reason,
                      "cause": full_cause, "invalidated_at": wall_now(),
                      "as_of": now and format_instant(now), "successor_plan_id": successor}
            state.outbox.add(self.topic_of("plan-invalidations"), old_id.encode(), orjson.dumps(record))
            state.store.bump("invalidations")
            log.info("invalidated plan=%s reason=%s key=%s event=%s successor=%s", old_id, reason,
                     dep_key, cause["event_id"], successor)

    def store_compiled(self, compiled, now: datetime | None) -> None:
        """Make a compilation current: plan, receipt, index edges, and both on the outbox."""
        state = self.state
        state.plans.save(compiled, now)
        state.index.replace(compiled.plan_key, compiled.dependencies)
        state.outbox.add(self.topic_of("plans"), compiled.plan_id.encode(), orjson.dumps(compiled.plan))
        state.outbox.add(self.topic_of("receipts"), compiled.receipt_id.encode(),
                         orjson.dumps(compiled.receipt))
        state.store.bump("compilations")

    def _dead_letter(self, m: RawMessage, error_class: str, message: str) -> None:
        record = {"schema_version": 1, "topic": self.topic_of(m.topic), "partition": m.partition,
                  "offset": m.offset, "error_class": error_class, "message": message,
                  "original": base64.b64encode(m.value or b"").decode()}
        self.state.outbox.add(self.topic_of("dead-letters"), m.key, orjson.dumps(record))
        self.state.store.bump(f"dead_letters.{error_class}")
        log.warning("dead-lettered %s/%d/%d: %s", m.topic, m.partition, m.offset, error_class)
