"""Resource changes a worker passes by unread (another shard's, on an input partition it does not judge), and
judging them when the group gives it their partition."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import TYPE_CHECKING, Callable, Collection, Sequence

from agents.stream.raw_message import RawMessage
from schemas.codec import decode
from schemas.errors import InvalidEvent, SkippedEvent
from schemas.records import SourceChange
from schemas.shard_peek import peek
from state.catalog_resources import Mine, refusal, refused
from streams.partitions import read_until

if TYPE_CHECKING:
    from agents.stream.event_apply import EventApplier

log = logging.getLogger(__name__)

Judges = Callable[[str, int], bool]
"""Whether this worker judges the records of an input partition (logical topic, partition): the group gave it."""


def every_partition(topic: str, partition: int) -> bool:
    """Every input partition is judged here (a lone applier: tests, tools)."""
    return True


def passed_by(messages: Sequence[RawMessage], applied: dict[str, dict[int, int]], mine: Mine, duty: Judges,
              held: Callable[[Collection[str]], set[str]]) -> set[int]:
    """Indexes of the messages a worker need not decode: upserts of resources about another shard's entity, read
    at a glance, on an input partition it does not judge, of a resource it does not hold (`held` of the ids).

    Applying one would change nothing here (its holder applies it), and what is wrong with it is
    judged by the duty owner of its partition. A batch with a resource change the glance cannot
    place (a delete, a CDC envelope, a tombstone, anything malformed) is decoded whole: only a
    decode tells which resource it is about, and a later change of that resource may depend on it.
    """
    candidates: dict[int, str] = {}
    ours: set[str] = set()  # resources this batch upserts about this worker's entities: a later move away counts
    for i, m in enumerate(messages):
        if m.topic != "source-changes" or m.offset < applied.get(m.topic, {}).get(m.partition, 0):
            continue
        glance = peek(m.value)
        if glance is None or (glance.kind == "resource" and glance.entity is None):
            return set()
        if glance.kind != "resource":
            continue
        if mine(glance.entity):
            ours.add(glance.resource_id)  # type: ignore[arg-type]
        elif not duty(m.topic, m.partition) and glance.resource_id not in ours:
            candidates[i] = glance.resource_id  # type: ignore[assignment]
    if not candidates:
        return set()
    kept = held(set(candidates.values()))
    return {i for i, rid in candidates.items() if rid not in kept}


class PassedBy:
    """Judges, when the group gives this worker input partitions, what it passed by on them since their floor.

    The group's committed offset (the floor) may lie behind what this worker applied: the
    partition's previous owner judged up to there, and no further when it died or lost the
    partition before committing. The dead letters of the events from the floor on are this
    worker's to send now: those of events it decoded wait on standby, and those it passed by
    are judged here, from `source-changes` read again, before the take-on promotes them all.
    """

    def __init__(self, applier: EventApplier, bootstrap_servers: str, topic: str, kafka: dict | None = None,
                 fetch_bytes: int = 2_000_000, stall_seconds: float = 15.0) -> None:
        self.applier = applier
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic  # broker-side `source-changes`
        self.kafka = kafka or {}
        self.fetch_bytes = fetch_bytes
        self.stall_seconds = stall_seconds

    def judge(self, floors: dict[tuple[str, int], int]) -> int:
        """Queue on standby the dead letters of the resource changes from each floor to what was applied that
        this file holds no letter for; how many (on the writer, in the take-on's transaction)."""
        store = self.applier.state.store
        applied = store.next_offsets().get("source-changes", {})
        since = {p: floor for (topic, p), floor in floors.items()
                 if topic == "source-changes" and applied.get(p, 0) > floor}
        if not since:
            return 0
        until = {p: applied[p] for p in since}
        letters = set(store.db.execute(
            "SELECT src_partition, src_offset FROM outbox WHERE topic = ? AND src_topic = 'source-changes'",
            [self.applier.plans.topic_of("dead-letters")]).fetchall())
        counts: Counter[str] = Counter()
        read = 0

        def on_batch(records: list) -> None:
            nonlocal read
            read += len(records)
            for r in records:
                glance = peek(r.value)
                # Only upserts placed at a glance are ever passed by; every other record was decoded and judged.
                if glance is None or glance.kind != "resource" or glance.entity is None or \
                        (r.partition, r.offset) in letters or r.offset < since[r.partition]:
                    continue
                m = RawMessage("source-changes", r.partition, r.offset, r.key, r.value,
                               r.timestamp / 1000 if r.timestamp else None)
                self._judge_one(m, counts)

        asyncio.run(read_until(self.bootstrap_servers, self.topic, until, on_batch, self.kafka, self.fetch_bytes,
                               self.stall_seconds, since=since))
        sent = sum(n for name, n in counts.items() if name.startswith("dead_letters."))
        counts["passed_by_judged"] += read
        store.bump_many(counts)
        log.info("judged %d records of source-changes partitions %s from the group's offsets %s: %d dead letters",
                 read, sorted(since), [since[p] for p in sorted(since)], sent,
                 extra={"partitions": sorted(since), "reason": "passed_by_judged"})
        return sent

    def _judge_one(self, m: RawMessage, counts: Counter[str]) -> None:
        """What every worker that decoded the record would have queued: its decode error, or a source refusal."""
        try:
            event = self._decode(m)
        except SkippedEvent:
            return
        except InvalidEvent as exc:
            self.applier.dead_letter(m, exc.error_class, exc.message, counts, standby=True)
            return
        change = event.payload
        if isinstance(change, SourceChange) and refused(change.record, change.unavailable,  # type: ignore[arg-type]
                                                        self.applier.state.catalog.source_rules()):
            error = refusal()
            self.applier.dead_letter(m, error.error_class, error.message, counts, standby=True)

    def _decode(self, m: RawMessage):
        """Decode as the applier does (its size bound and CDC mapping)."""
        return decode(m.topic, m.key, m.value, position=f"{m.partition}:{m.offset}",
                      max_bytes=self.applier.max_event_bytes, cdc=self.applier.cdc)
