"""What a worker's /healthz says it holds: its entity shard where the build reports one, else its input duty."""

from __future__ import annotations

from typing import Iterable, Mapping

from bench.stats import owns_all, split_between, unapplied
from streams.settings import INPUT_TOPICS

# Builds that partition state by entity report `shard` in /healthz: {"partitions": {topic: [ints]},
# "resources", "entities", "plans", "restoring": [ints]}. Older builds report only `duty` (the input
# partitions the consumer group gave the worker) and replicate everything else, so every function
# here answers from `shard` when it is there and from `duty` when it is not.


def shard(health: Mapping) -> dict | None:
    """The worker's `shard` section, or None on a build that does not report one."""
    section = health.get("shard")
    return section if isinstance(section, dict) else None


def logical(topic: str, prefix: str) -> str:
    """A topic's name without the cluster's prefix (health documents may use either)."""
    return topic[len(prefix):] if prefix and topic.startswith(prefix) else topic


def held(health: Mapping, prefix: str = "") -> dict[str, list[int]]:
    """Partitions by logical topic the worker holds: its shard's, else the input partitions of its duty."""
    section = shard(health)
    if section is None:
        return {t: sorted(p) for t, p in (health.get("duty") or {}).items()}
    return {logical(t, prefix): sorted(int(p) for p in parts) for t, parts in (section.get("partitions") or {}).items()}


def restoring(health: Mapping) -> list[int] | None:
    """Partitions the worker is still restoring; None on a build without `shard`."""
    section = shard(health)
    return None if section is None else sorted(section.get("restoring") or [])


def figures(health: Mapping, prefix: str = "") -> dict | None:
    """What a worker's shard holds (partitions, resources, entities, plans, restoring), for the report."""
    section = shard(health)
    if section is None:
        return None
    return {"partitions": held(health, prefix), "resources": section.get("resources"),
            "entities": section.get("entities"), "plans": section.get("plans"), "restoring": restoring(health)}


def shared_out(healths: Iterable[Mapping], partitions: int, prefix: str = "") -> bool:
    """Whether the workers hold every partition once each, none still restoring.

    With shards, of every topic any shard names; without, of every input topic (today's duty).
    """
    healths = list(healths)
    if not all(shard(h) is not None for h in healths):
        return split_between([h.get("duty") or {} for h in healths], INPUT_TOPICS, partitions)
    holdings = [held(h, prefix) for h in healths]
    topics = {t for holding in holdings for t in holding}
    return bool(topics) and split_between(holdings, topics, partitions) and not any(restoring(h) for h in healths)


def holds_all(health: Mapping, partitions: int, prefix: str = "") -> bool:
    """Whether one worker holds every partition (after a peer's death), none still restoring."""
    if shard(health) is None:
        return owns_all(health.get("duty") or {}, INPUT_TOPICS, partitions)
    holding = held(health, prefix)
    return bool(holding) and owns_all(holding, holding, partitions) and not restoring(health)


def partitioned_topics(healths: Iterable[Mapping], prefix: str = "") -> set[str]:
    """Topics split between workers by shard (empty on a build without `shard`: everything is replicated)."""
    return {t for h in healths if shard(h) is not None for t in held(h, prefix)}


def behind(target: Mapping[str, Mapping[int, int]], health: Mapping, split: set[str], prefix: str = "") -> int:
    """Events of `target` this worker must apply and has not: all of them, except partitions of `split`
    topics that another worker's shard holds."""
    mine = held(health, prefix)
    needed = {topic: {p: end for p, end in parts.items() if topic not in split or int(p) in mine.get(topic, ())}
              for topic, parts in target.items()}
    return unapplied(needed, health.get("applied_offsets") or {})
