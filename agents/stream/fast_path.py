"""Announce owned plans an edit makes stale as soon as the edit is fetched, before the writer applies it."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Awaitable, Callable, Sequence

import orjson

from agents.plans.plan_writer import wall_now
from agents.stream.raw_message import RawMessage
from compiler import dependency_keys as dk
from schemas.errors import InvalidEvent, SkippedEvent
from schemas.outbound import Cause
from schemas.records import InputEvent, Revocation, SourceChange
from schemas.shard_peek import peek
from schemas.timefmt import format_instant
from state.head_cache import Admitting, Head, HeadCache, HeadFacts, Offsets
from state.invalidations import Invalidation, reason_for

log = logging.getLogger(__name__)

Position = tuple[str, int, int]  # (logical input topic, partition, offset)
SEND_WAIT = 0.1  # seconds the writer's batch waits for the acknowledgements of its early announcements
MOST_PER_EVENT = 256  # an event that makes more held heads stale is a fan-out: the writer announces it in bulk
# Full decodes (about 0.1 ms each, on the loop) one fetched batch may spend on early announcements; past it, the
# writer announces: a flood of edits of held resources must not hold selects up for its length.
MOST_DECODES_PER_BATCH = 64
# Plan ids announced early that are remembered for selects: a file read begun before the announcement can finish
# after its event was applied and still find the plan fresh; only the last few thousand can be in such a read.
RECENT_IDS = 4096


@dataclass(frozen=True, slots=True)
class EarlyAnnouncement:
    """A plan announced stale from memory, before the writer applied the event that made it so."""

    plan_key: str
    """The plan's key."""
    plan_id: str
    """The plan announced (the key's head when the event was fetched)."""
    dependency_key: str
    """The dependency key the event changed (`resource:<id>`)."""
    event_id: str
    """The event's id."""


class FastPath:
    """The early announcements of one worker, and what selects and the writer must know of them.

    The head cache indexes each held head under the resources it admitted and the principal it
    was compiled for. A fetched edit of such a resource, newer than the version the head
    admitted, always changes the plan (a plan id digests the versions it admitted); a fetched
    withdrawal from its principal is announced by the writer whatever it changes. Either way
    the head is stale before anything is written: it leaves the cache, its key is `waiting` until the
    writer has applied the event (a select of it waits for that, then reads what the writer left), and
    its `plan-invalidations` record is sent at once. The writer still applies the event as before and
    invalidates the plan in the file under the same cause (`announced`), and leaves out the record the broker already
    acknowledged (`acknowledged`); one sent but not acknowledged, or lost with a crash before
    the batch committed, is sent again by the writer: at least once, same cause.

    A head committed while such an event waits for the writer (a successor compiled before it)
    is announced as soon as it is held. Only plans this worker owns (`owns`) and events that
    validate are announced here; everything else (new resources, deletes, principal records,
    policies, the clock) takes the writer's path.
    """

    def __init__(self, heads: HeadCache, owns: Callable[[str], bool],
                 send: Callable[[str, bytes, bytes], Awaitable[Any]], topic_of: Callable[[str], str],
                 decode: Callable[[RawMessage], InputEvent], applied: Callable[[str, int, int], bool],
                 event_time: Callable[[], datetime | None],
                 on_latency: Callable[[float], object] | None = None,
                 behind: Callable[[], bool] = lambda: False) -> None:
        self.heads = heads
        self.owns = owns  # whether this worker owns the plans of an entity now
        self.send = send  # (topic, key, value) -> the broker's acknowledgement, awaitable
        self.topic_of = topic_of
        self.decode = decode  # raises InvalidEvent or SkippedEvent for what the writer would not apply
        self.applied = applied  # whether the replica has applied (committed) the event at a position
        self.event_time = event_time
        self.on_latency = on_latency  # seconds from an event's broker timestamp to its acknowledged announcement
        # Whether the writer is behind: then nothing is announced early, since a select of a plan announced early
        # waits for its event, and under a backlog that wait is the backlog's age (the writer announces it).
        self.behind = behind
        self._lock = threading.Lock()  # the writer thread reads what the loop writes
        self._waiting: dict[str, Position] = {}  # plan key -> the event its early announcement named
        self._announced: dict[Position, list[EarlyAnnouncement]] = {}
        self._acked: set[tuple[str, Position]] = set()  # (plan id, event) the broker acknowledged
        self._recent: OrderedDict[str, None] = OrderedDict()  # plan ids announced early, the latest RECENT_IDS
        self._inflight: set[asyncio.Future] = set()
        # resource id -> its fetched upserts not yet applied, in fetch order
        self._edits: dict[str, list[tuple[int, int, RawMessage]]] = {}  # (fetch order, version, record)
        self._revoked: dict[str, list[tuple[int, RawMessage]]] = {}  # principal -> withdrawals not yet applied
        self._seq = 0  # fetch order of the events remembered above
        self._decodes_left = MOST_DECODES_PER_BATCH  # of the fetched batch being announced
        self._loop: asyncio.AbstractEventLoop | None = None
        heads.watch(self._heads_put)
        heads.watch_stored(self._head_stored)
        self.counts: Counter[str] = Counter()

    # -- the loop's side ---------------------------------------------------------------------

    def announce(self, messages: Sequence[RawMessage]) -> int:
        """Send the announcements a fetched batch makes due from memory; how many were sent."""
        self._loop = asyncio.get_running_loop()
        self._decodes_left = MOST_DECODES_PER_BATCH
        sent = 0
        for m in messages:
            if m.topic == "source-changes":
                sent += self._resource_edit(m)
            elif m.topic == "revocations":
                sent += self._revocation(m)
        self.counts["early_announcements"] += sent
        return sent

    def _resource_edit(self, m: RawMessage) -> int:
        """An upsert of a resource: the held heads that admitted an older version of it are stale."""
        glance = peek(m.value)
        if glance is None or glance.resource_id is None:
            return 0
        self._seq += 1
        if glance.version is not None:
            # Until applied: a head committed meanwhile that admitted an older version is stale at once.
            self._edits.setdefault(glance.resource_id, []).append((self._seq, glance.version, m))
        holders = self.heads.admitting(glance.resource_id)
        if not holders or self._skipped_behind(len(holders)):
            return 0
        event = self._valid(m)
        payload = event.payload if event is not None else None
        if not isinstance(payload, SourceChange) or payload.kind != "resource" or payload.record is None:
            return 0
        version = payload.record.version  # type: ignore[union-attr]
        return self._announce(m, dk.resource(glance.resource_id), event.event_id,
                              [h for h in holders if version > h.version])

    def _revocation(self, m: RawMessage) -> int:
        """A withdrawal: every held head compiled for its principal is stale (the writer announces those too).

        Its principal is read at a glance; only a withdrawal from a principal with held heads is decoded,
        so a flood of revocations of others costs the loop a JSON parse each."""
        principal = _principal_of(m.value)
        if principal is None:
            return 0
        self._seq += 1
        self._revoked.setdefault(principal, []).append((self._seq, m))
        held = self.heads.asked_by(principal)
        if not held or self._skipped_behind(len(held)):
            return 0
        event = self._valid(m)
        if event is None or not isinstance(event.payload, Revocation) or event.payload.principal != principal:
            return 0
        return self._announce(m, dk.principal(principal), event.event_id, held)

    def _skipped_behind(self, candidates: int) -> bool:
        """Whether to leave these candidates to the writer before decoding: it is behind, or this batch spent its
        decodes (counted either way)."""
        if self.behind():
            self.counts["early_skipped_behind"] += candidates
            return True
        if self._decodes_left <= 0:
            self.counts["early_skipped_busy"] += candidates
            return True
        self._decodes_left -= 1
        return False

    def _recheck(self, plan_keys: list[str]) -> None:
        """Heads just made held: announce those that an edit or withdrawal fetched and not yet applied already
        made stale (see `_stale_at_birth`). On the loop."""
        sent = 0
        for plan_key in plan_keys:
            head = self.heads.head(plan_key)
            if head is not None:
                sent += self._stale_at_birth(plan_key, head)
        self.counts["early_announcements"] += sent
        self.counts["early_announcements_of_new_heads"] += sent

    def _recheck_stored(self, plan_key: str, head: Head, applied: Offsets) -> None:
        """A head stored and not committed yet: announced as soon as its id is known, not once it commits (events
        below `applied` are in its transaction: it reflects them, or the writer announces it under them). On the
        loop; `_recheck` leaves it alone once held."""
        sent = self._stale_at_birth(plan_key, head, applied)
        self.counts["early_announcements"] += sent
        self.counts["early_announcements_before_commit"] += sent

    def _stale_at_birth(self, plan_key: str, head: Head, applied: Offsets | None = None) -> int:
        """Announce a new head that an edit or withdrawal fetched and not yet applied already makes stale, under
        the first such event (the cause the writer names when it applies it); how many were sent (0 or 1).

        A head that lacks an event already applied is left alone: it was the key's head when that event was
        applied (the writer compiles and stores in one job), so the writer announced it under that event.
        """
        try:
            facts = head.facts or HeadFacts.of(orjson.loads(head.plan))
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
            return 0
        lacking = [(seq, m, dk.resource(rid), version) for rid, version in facts.admitted
                   for seq, newer, m in self._edits.get(rid, ()) if newer > version]
        if any(self._committed(m, applied) for _, m, _, _ in lacking):
            return 0
        if facts.principal is not None:  # a withdrawal has no version: one applied may be reflected, and is passed
            lacking += [(seq, m, dk.principal(facts.principal), 0) for seq, m in self._revoked.get(facts.principal, ())
                        if not self._committed(m, applied)]
        if not lacking:
            return 0
        _, m, dep_key, version = min(lacking, key=lambda item: item[0])
        event = self._valid(m)
        if event is None:
            return 0
        return self._announce(m, dep_key, event.event_id,
                              [Admitting(plan_key, head.plan_id, version, facts.entity_id, facts.principal)])

    def _committed(self, m: RawMessage, applied: Offsets | None = None) -> bool:
        """Whether the event is applied: as the replica knows, as the commit the head cache published says (it
        tells `_recheck` of that commit's heads before the replica hears its batch committed), or as `applied` (the
        offsets of a transaction still open) says."""
        if self.applied(*_position(m)) or (applied or {}).get(m.topic, {}).get(m.partition, 0) > m.offset:
            return True
        position = self.heads.position
        return position is not None and position[0].get(m.topic, {}).get(m.partition, 0) > m.offset

    def _heads_put(self, plan_keys: list[str]) -> None:
        """Told by the head cache on whichever thread put them; the check runs on the loop."""
        if self._loop is not None and (self._edits or self._revoked):
            self._loop.call_soon_threadsafe(self._recheck, plan_keys)

    def _head_stored(self, plan_key: str, head: Head, applied: Offsets) -> None:
        """Told by the head cache on the writer's thread as it stores a head; the check runs on the loop."""
        if self._loop is not None and (self._edits or self._revoked):
            self._loop.call_soon_threadsafe(self._recheck_stored, plan_key, head, applied)

    def _announce(self, m: RawMessage, dep_key: str, event_id: str, candidates: list[Admitting]) -> int:
        """Announce the candidates this worker owns as made stale by the event `m`; how many."""
        position = _position(m)
        stale = [h for h in candidates if h.entity_id is not None and self.owns(h.entity_id)]
        if not stale or len(stale) > MOST_PER_EVENT:
            return 0
        if self.behind():
            self.counts["early_skipped_behind"] += len(stale)
            return 0
        # Before anything is sent: no hit after it. Heads announced already go too: a select's read of the file
        # may have held one again (its event is not applied yet), and the next edit would announce it again.
        self.heads.remove_keys([h.plan_key for h in stale])
        with self._lock:  # once per plan and event, whichever check finds it first
            told = {e.plan_id for e in self._announced.get(position, ())}
        stale = [h for h in stale if h.plan_id not in told]
        if not stale:
            return 0
        early = [EarlyAnnouncement(h.plan_key, h.plan_id, dep_key, event_id) for h in stale]
        with self._lock:
            for h in stale:
                self._waiting[h.plan_key] = position
                self._recent[h.plan_id] = None
                self._recent.move_to_end(h.plan_id)
            while len(self._recent) > RECENT_IDS:
                self._recent.popitem(last=False)
            self._announced.setdefault(position, []).extend(early)
        for entry in early:
            self._send(entry, position, m.timestamp)
        return len(early)

    def _valid(self, m: RawMessage) -> InputEvent | None:
        """The event, if the writer would apply it (it validates); None, counted, if it would refuse it."""
        try:
            return self.decode(m)
        except (InvalidEvent, SkippedEvent):
            self.counts["early_skipped_invalid"] += 1
            return None

    def _send(self, entry: EarlyAnnouncement, position: Position, stamp: float | None) -> None:
        topic, partition, offset = position
        now = self.event_time()
        cause = Cause(self.topic_of(topic), entry.event_id, partition, offset, entry.dependency_key).as_wire()
        record = Invalidation(entry.plan_id, entry.plan_key, reason_for(entry.dependency_key), cause,
                              wall_now(), now and format_instant(now)).record()
        task = asyncio.ensure_future(self._deliver(entry.plan_id, position, orjson.dumps(record), stamp))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _deliver(self, plan_id: str, position: Position, value: bytes, stamp: float | None) -> None:
        try:
            ack = await self.send(self.topic_of("plan-invalidations"), plan_id.encode(), value)
            await ack
        except Exception as exc:  # noqa: BLE001 - the writer sends it again: the announcement is only late
            self.counts["early_send_failures"] += 1
            log.warning("an early announcement of plan %s was not acknowledged (%r); the writer sends it",
                        plan_id, exc, extra={"plan_id": plan_id, "reason": "early_send_failed"})
            return
        with self._lock:
            self._acked.add((plan_id, position))
        if self.on_latency is not None and stamp:
            self.on_latency(max(0.0, time.time() - stamp))

    async def settle(self, timeout: float = SEND_WAIT) -> None:
        """Wait (at most `timeout` s) for the sends in flight: the writer then leaves out what was acknowledged."""
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=timeout)

    def waiting(self, plan_key: str) -> Position | None:
        """The event a select of this key must wait for (announced stale early, not applied yet); else None."""
        position = self._waiting.get(plan_key)
        if position is None:
            return None
        if self.applied(*position):
            with self._lock:
                if self._waiting.get(plan_key) == position:
                    del self._waiting[plan_key]
            return None
        return position

    def was_announced(self, plan_id: str) -> bool:
        """Whether this plan was announced stale early (lately): a select that read it fresh read too early."""
        return plan_id in self._recent

    def forget_applied(self) -> None:
        """Drop what concerns events the replica has applied (after each committed batch)."""
        with self._lock:
            done = [p for p in self._announced if self.applied(*p)]
            for position in done:
                for entry in self._announced.pop(position):
                    self._acked.discard((entry.plan_id, position))
            for key in [k for k, p in self._waiting.items() if self.applied(*p)]:
                del self._waiting[key]
        for pending in (self._edits, self._revoked):
            for name, events in list(pending.items()):
                left = [e for e in events if not self.applied(*_position(e[-1]))]
                if left:
                    pending[name] = left
                else:
                    del pending[name]

    # -- the writer's side -------------------------------------------------------------------

    def announced(self, messages: Sequence[RawMessage]) -> dict[Position, list[EarlyAnnouncement]]:
        """The early announcements these events caused (the writer invalidates those plans under them)."""
        with self._lock:
            return {p: list(self._announced[p]) for m in messages
                    if (p := (m.topic, m.partition, m.offset)) in self._announced}

    def acknowledged(self, plan_id: str, position: Position) -> bool:
        """Whether the broker acknowledged the early announcement of this plan by this event."""
        with self._lock:
            return (plan_id, position) in self._acked

    def figures(self) -> dict[str, int]:
        """Counters and what is outstanding, for /healthz."""
        with self._lock:
            return dict(self.counts, waiting=len(self._waiting), unapplied_events=len(self._announced))


def _principal_of(value: bytes | None) -> str | None:
    """The principal a revocation names, read without validating it; None when it names none."""
    try:
        doc = orjson.loads(value) if value else None
    except orjson.JSONDecodeError:
        return None
    principal = doc.get("principal") if isinstance(doc, dict) else None
    return principal if isinstance(principal, str) else None


def _position(m: RawMessage) -> Position:
    return (m.topic, m.partition, m.offset)
