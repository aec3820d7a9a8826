"""Detect input topics whose recorded offsets belong to another broker or topic incarnation."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import OffsetOutOfRangeError

from state.key_changes import KeyChanges
from state.store import Store
from streams.incarnation import record_mark

log = logging.getLogger(__name__)

ROUTED = ("source-changes", "shared-changes", "entity-changes")  # one stream: reset and rebased together

Position = tuple[str, int]  # (logical topic, partition)


@dataclass(frozen=True)
class Recorded:
    """What the store says was consumed, read once so that a check compares like with like."""

    cluster_id: str | None
    """Cluster the offsets were recorded against (None before the first contact)."""
    applied: dict[str, dict[int, int]]
    """Next offset per input topic and partition."""
    marks: dict[Position, tuple[int, str]]
    """(offset, mark) of the last applied record per partition."""
    targets: dict[Position, int]
    """Where to read to verify each partition: the marked record, else the last applied offset."""

    @classmethod
    def read(cls, store: Store, topics: Iterable[str]) -> "Recorded":
        """Snapshot the store's offsets and marks for these topics."""
        applied = store.next_offsets()
        marks = store.offset_marks()
        targets: dict[Position, int] = {}
        for name in topics:
            for partition, nxt in applied.get(name, {}).items():
                if nxt > 0:
                    mark = marks.get((name, partition))
                    targets[(name, partition)] = mark[0] if mark and mark[0] < nxt else nxt - 1
        return cls(store.incarnation()[0], applied, marks, targets)


def judge(recorded: Recorded, cluster_id: str, topics: Iterable[str], firsts: dict[Position, tuple[int, str]],
          highwaters: dict[Position, int], out_of_range: Iterable[Position] = ()) -> dict[str, str]:
    """Logical topic -> why its recorded offsets cannot be trusted on the broker as it is now.

    `firsts` holds the first record read from each partition's seek target (offset, mark) and
    `highwaters` the partitions' end offsets as fetched; partitions missing from both are not
    judged this time. Reasons: `cluster_changed`, `end_below_applied`, `record_changed`
    (another record at an offset this worker applied) and `position_out_of_range`.
    """
    topics = list(topics)
    if recorded.cluster_id is not None and recorded.cluster_id != cluster_id:
        return {name: "cluster_changed" for name in topics}
    applied, marks, targets = recorded.applied, recorded.marks, recorded.targets
    out: dict[str, str] = {name: "position_out_of_range" for name, _ in out_of_range}
    for (name, partition), target in targets.items():
        nxt = applied[name][partition]
        end = highwaters.get((name, partition))
        first = firsts.get((name, partition))
        if end is not None and end < nxt:
            out.setdefault(name, "end_below_applied")
        elif first is not None and first[0] < target:
            out.setdefault(name, "position_out_of_range")  # the consumer fell back to the log start
        elif first is not None and first[0] == target:
            mark = marks.get((name, partition))
            if mark is not None and mark[0] == target and mark[1] != first[1]:
                out.setdefault(name, "record_changed")
    return out


def firsts_of(batch: dict, logical: dict[str, str]) -> dict[Position, tuple[int, str]]:
    """The first record of each partition in a `getmany` result, as (offset, mark)."""
    out: dict[Position, tuple[int, str]] = {}
    for tp, records in batch.items():
        if records and (logical[tp.topic], tp.partition) not in out:
            m = records[0]
            out[(logical[tp.topic], tp.partition)] = (m.offset, record_mark(m.key, m.value, m.timestamp))
    return out


async def probe(consumer: AIOKafkaConsumer, store: Store, topics: dict[str, str], cluster_id: str,
                timeout: float = 5.0) -> dict[str, str]:
    """Read each partition's seek target with an assigned consumer and judge; leaves positions moved.

    Partitions that answer nothing within `timeout` are not judged (they hold no record at the
    target and report no end yet), which at start-up only happens on an unreachable broker.
    """
    logical = {broker: name for name, broker in topics.items()}
    recorded = Recorded.read(store, topics)
    targets = recorded.targets
    if not targets:
        return judge(recorded, cluster_id, topics, {}, {})
    for (name, partition), offset in targets.items():
        consumer.seek(TopicPartition(topics[name], partition), offset)
    firsts: dict[Position, tuple[int, str]] = {}
    highwaters: dict[Position, int] = {}
    out_of_range: set[Position] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = [TopicPartition(topics[n], p) for n, p in targets if (n, p) not in out_of_range]
        try:
            batch = await consumer.getmany(*waiting, timeout_ms=200)
        except OffsetOutOfRangeError as exc:  # a consumer without a reset policy says so outright
            out_of_range.update((logical[tp.topic], tp.partition) for tp in (exc.args[0] if exc.args else {}))
            continue
        for pos, first in firsts_of(batch, logical).items():
            firsts.setdefault(pos, first)
        for name, partition in targets:
            hw = consumer.highwater(TopicPartition(topics[name], partition))
            if hw is not None:
                highwaters[(name, partition)] = hw
        if all(pos in firsts or pos in out_of_range or (pos in highwaters and highwaters[pos] <= targets[pos])
               for pos in targets):
            break
        await asyncio.sleep(0)
    return judge(recorded, cluster_id, topics, firsts, highwaters, out_of_range)


async def verify(consumer: AIOKafkaConsumer, store: Store, writes: Store, topics: dict[str, str], cluster_id: str,
                 auto_rebase: bool, run: Callable[..., Awaitable[Any]]) -> dict[str, str]:
    """Probe the recorded offsets of these topics and rebase what was reset (with `auto_rebase`); what to block.

    `store` is read beside the writer, `writes` written through `run` (on the writer). A reset of any of
    `source-changes` and its lanes rebases all three: their offsets index one stream.
    """
    resets = await probe(consumer, store, topics, cluster_id)
    if not resets:
        await run(_in_transaction, writes, writes.record_cluster, cluster_id)
        return {}
    if not auto_rebase:
        return resets
    recorded, _ = store.incarnation()
    rebased = list(resets) + [t for t in ROUTED if t in topics and t not in resets and set(resets) & set(ROUTED)]
    epoch = await run(_rebase, writes, cluster_id, rebased + (["plans"] if recorded != cluster_id else []))
    log.warning("input topics were reset (%s); offsets rebased to the new topics (epoch %d), catalog and "
                "plans kept", ", ".join(f"{t}: {why}" for t, why in sorted(resets.items())), epoch,
                extra={"reason": "input_reset", "topics": sorted(resets)})
    return {}


def _in_transaction(store: Store, fn: Callable[..., Any], *args: Any) -> Any:
    with store.transaction():
        return fn(*args)


def _rebase(store: Store, cluster_id: str, topics: list[str]) -> int:
    with store.transaction():
        epoch = store.rebase(cluster_id, topics)
        KeyChanges(store).forget(topics)  # their offsets index the old topics
        store.bump_many({"input_resets": 1})
    return epoch
