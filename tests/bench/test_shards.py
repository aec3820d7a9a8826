"""Reading /healthz for what a worker holds: the `shard` section where reported, today's `duty` where not."""

from __future__ import annotations

from bench import shards

ALL = {"source-changes": [0, 1, 2, 3], "policy-versions": [0, 1, 2, 3], "revocations": [0, 1, 2, 3],
       "clock": [0, 1, 2, 3]}


def _duty(parts: list[int], offsets: dict | None = None) -> dict:
    """Today's health: input duty and counters, no shard."""
    return {"duty": {t: parts for t in ALL}, "applied_offsets": offsets or {}, "counters": {}}


def _shard(parts: list[int], restoring: list[int] = (), offsets: dict | None = None, prefix: str = "") -> dict:
    return {"duty": {}, "applied_offsets": offsets or {},
            "shard": {"partitions": {f"{prefix}source-changes-by-entity": parts}, "resources": 10 * len(parts),
                      "entities": len(parts), "plans": 2 * len(parts), "restoring": list(restoring)}}


def test_without_a_shard_the_input_duty_is_what_a_worker_holds():
    assert shards.shard(_duty([0, 1])) is None and shards.restoring(_duty([0, 1])) is None
    assert shards.held(_duty([1, 0]))["source-changes"] == [0, 1] and shards.figures(_duty([0])) is None
    assert shards.shared_out([_duty([0, 1]), _duty([2, 3])], 4)
    assert not shards.shared_out([_duty([0, 1]), _duty([1, 2])], 4)  # 3 unheld, 1 twice
    assert shards.holds_all(_duty([0, 1, 2, 3]), 4) and not shards.holds_all(_duty([0, 1]), 4)
    assert shards.partitioned_topics([_duty([0, 1])]) == set()


def test_a_shard_names_its_partitions_without_the_cluster_prefix_and_its_counts():
    health = _shard([3, 2], prefix="bench1234-")
    assert shards.held(health, "bench1234-") == {"source-changes-by-entity": [2, 3]}
    assert shards.figures(health, "bench1234-") == {"partitions": {"source-changes-by-entity": [2, 3]},
                                                   "resources": 20, "entities": 2, "plans": 4, "restoring": []}


def test_partitions_still_restoring_are_not_yet_shared_out_or_held():
    assert shards.shared_out([_shard([0, 1]), _shard([2, 3])], 4)
    assert not shards.shared_out([_shard([0, 1]), _shard([2, 3], restoring=[3])], 4)
    assert not shards.shared_out([_shard([0, 1]), _shard([])], 4)
    assert not shards.shared_out([_shard([]), _shard([])], 4)  # before any assignment: nothing is shared out
    assert shards.holds_all(_shard([0, 1, 2, 3]), 4)
    assert not shards.holds_all(_shard([0, 1, 2, 3], restoring=[2]), 4) and not shards.holds_all(_shard([]), 4)


def test_a_sharded_partition_is_waited_for_only_at_its_holder():
    target = {"source-changes-by-entity": {0: 5, 1: 7}, "policy-versions": {0: 1}}
    offsets = {"source-changes-by-entity": {"0": 5}, "policy-versions": {"0": 1}}
    holder_of_0 = _shard([0], offsets=offsets)
    split = shards.partitioned_topics([holder_of_0, _shard([1])])
    assert split == {"source-changes-by-entity"}
    assert shards.behind(target, holder_of_0, split) == 0
    assert shards.behind(target, _shard([1], offsets=offsets), split) == 7
    # A replicated topic is waited for at every worker; today's builds replicate everything.
    assert shards.behind(target, _shard([0], offsets={"source-changes-by-entity": {"0": 5}}), split) == 1
    assert shards.behind(target, _duty([0], offsets=offsets), set()) == 7
