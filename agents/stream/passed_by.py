"""Resource changes a worker passes by unread (another shard's, on an input partition it does not judge), and
judging them when the group gives it their partition."""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, Callable, Collection, Sequence

from agents.stream.raw_message import RawMessage
from schemas.codec import decode
from schemas.errors import InvalidEvent, SkippedEvent
from schemas.shard_peek import Peek, peek
from state.catalog_resources import Mine, refusal

if TYPE_CHECKING:
    from agents.stream.event_apply import EventApplier

log = logging.getLogger(__name__)

Judges = Callable[[str, int], bool]
"""Whether this worker judges the records of an input partition (logical topic, partition): the group gave it."""


def every_partition(topic: str, partition: int) -> bool:
    """Every input partition is judged here (a lone applier: tests, tools)."""
    return True


def passed_by(messages: Sequence[RawMessage], applied: dict[str, dict[int, int]], mine: Mine, duty: Judges,
              held: Callable[[Collection[str]], set[str]]) -> dict[int, Peek]:
    """The messages a worker need not decode, by index, with what a glance read of each: upserts of resources about another shard's entity, read
    at a glance, on an input partition it does not judge, of a resource it does not hold (`held` of the ids).

    Applying one would change nothing here (its holder applies it), and what is wrong with it is
    judged by the duty owner of its partition. A batch with a resource change the glance cannot
    place (a delete, a CDC envelope, a tombstone, anything malformed) is decoded whole: only a
    decode tells which resource it is about, and a later change of that resource may depend on it.
    """
    candidates: dict[int, Peek] = {}
    ours: set[str] = set()  # resources this batch upserts about this worker's entities: a later move away counts
    for i, m in enumerate(messages):
        if m.topic != "source-changes" or m.offset < applied.get(m.topic, {}).get(m.partition, 0):
            continue
        glance = peek(m.value)
        if glance is None or (glance.kind == "resource" and glance.entity is None):
            return {}
        if glance.kind != "resource":
            continue
        if mine(glance.entity):
            ours.add(glance.resource_id)  # type: ignore[arg-type]
        elif not duty(m.topic, m.partition) and glance.resource_id not in ours:
            candidates[i] = glance
    if not candidates:
        return {}
    kept = held({glance.resource_id for glance in candidates.values()})  # type: ignore[misc]
    return {i: glance for i, glance in candidates.items() if glance.resource_id not in kept}


def refused_at_a_glance(glance: Peek, rules: dict[str, set[str]]) -> bool:
    """Whether the source rules refuse a resource upsert (`refused`), judged from what a glance read of it."""
    allowed = rules.get(glance.provenance_group or "")
    return allowed is not None and glance.evidence_class not in allowed


def judge_passed(applier: EventApplier, since: dict[tuple[str, int], int] | None = None) -> int:
    """Queue on standby the dead letters owed by the records passed by here on these input partitions from each
    offset on (on every partition, with no `since`); how many (on the writer, in the caller's transaction).

    Called when the group gives this worker input partitions (`since`: the group's committed
    offsets, to which their previous owner judged; what it passed by from there on is this
    worker's to judge now), and before a rebase publishes every standby letter of reset topics
    (the old records can never be judged again). Each record is judged once, as decoding it
    would have: its decode error, or its refusal by the source rules in force when it was passed by
    (the rules its batch was applied under, as a worker that decoded it judged it).
    """
    floors = None if since is None else {p: o for (topic, p), o in since.items() if topic == "source-changes"}
    rows = applier.state.passed.take("source-changes", floors)
    counts: Counter[str] = Counter(passed_by_judged=len(rows))
    for partition, offset, key, value, refused_then in rows:
        m = RawMessage("source-changes", partition, offset, key, value)
        try:
            decode(m.topic, m.key, m.value, position=f"{m.partition}:{m.offset}", max_bytes=applier.max_event_bytes,
                   cdc=applier.cdc)
        except SkippedEvent:
            continue
        except InvalidEvent as exc:
            applier.dead_letter(m, exc.error_class, exc.message, counts, standby=True)
            continue
        except Exception as exc:  # noqa: BLE001 - as `EventApplier.apply` does: one record must not block a take-on
            log.exception("judging passed-by record %s/%d/%d failed", m.topic, m.partition, m.offset)
            applier.dead_letter(m, "processing_error", f"{type(exc).__name__} while judging", counts, standby=True)
            continue
        if refused_then:
            error = refusal()
            applier.dead_letter(m, error.error_class, error.message, counts, standby=True)
    sent = sum(n for name, n in counts.items() if name.startswith("dead_letters."))
    applier.state.store.bump_many(counts)
    if rows:
        log.info("judged %d records passed by on source-changes partitions %s: %d dead letters", len(rows),
                 sorted({r[0] for r in rows}), sent, extra={"reason": "passed_by_judged"})
    return sent
