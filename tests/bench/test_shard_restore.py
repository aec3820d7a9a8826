"""The restore bench's shard: any half of the partitions holds the asked-for resources."""

from __future__ import annotations

import itertools

import orjson

from bench.shard_restore import NOT_MEASURABLE, not_measurable, shard_records
from schemas.plan_partition import plan_partition


def test_every_entity_partition_holds_an_equal_share_so_any_half_holds_the_shard():
    records = shard_records(1_000, partitions=4, gained=2, per_entity=7)
    per_partition = [0] * 4
    for _, _, value in records:
        doc = orjson.loads(value)
        if doc["kind"] == "resource":
            per_partition[plan_partition(doc["resource"]["entity"], 4)] += 1
    assert per_partition == [500] * 4
    assert all(sum(pair) == 1_000 for pair in itertools.combinations(per_partition, 2))
    entities = [orjson.loads(v)["entity"]["id"] for _, _, v in records if orjson.loads(v)["kind"] == "entity"]
    assert len(entities) == len(set(entities))


def test_a_build_without_shards_is_reported_as_not_measurable():
    assert not_measurable(100_000) == {"measured": False, "resources": 100_000, "reason": NOT_MEASURABLE}
    assert NOT_MEASURABLE.startswith("not measurable on this build")
