"""The plan partition hash: Kafka's murmur2, identical across processes and runs."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from aiokafka.partitioner import DefaultPartitioner, murmur2 as aiokafka_murmur2

from schemas.plan_partition import murmur2, plan_partition

# org.apache.kafka.common.utils.UtilsTest.testMurmur2 (Java's signed ints).
JAVA_VECTORS = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
                b"a-little-bit-longer-string": -1486304829,
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}


def test_murmur2_matches_the_java_client():
    for data, signed in JAVA_VECTORS.items():
        assert murmur2(data) == signed & 0xFFFFFFFF


def test_plan_partition_is_the_partition_kafka_clients_pick_for_the_entity_id():
    rng = random.Random(7)
    partitions = list(range(12))
    for n in range(2000):
        entity = "".join(rng.choice("ABCxyz-_09é漢") for _ in range(rng.randrange(0, 40)))
        data = entity.encode()
        assert murmur2(data) == aiokafka_murmur2(data) & 0xFFFFFFFF, entity
        count = 1 + n % 12
        assert plan_partition(entity, count) == DefaultPartitioner()(data, partitions[:count], partitions[:count])


def test_plan_partition_is_identical_in_another_process():
    ids = [f"ENTITY-{i}" for i in range(50)] + ["ATLAS-IN-01", ""]
    here = [plan_partition(i, 7) for i in ids]
    code = ("import sys, json; from schemas.plan_partition import plan_partition; "
            f"print(json.dumps([plan_partition(i, 7) for i in {ids!r}]))")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345", "PYTHONPATH": "."}).stdout
    assert here == json.loads(there)
    assert len(set(here)) > 1


def test_plan_partition_refuses_no_partitions():
    with pytest.raises(ValueError):
        plan_partition("ATLAS-IN-01", 0)
