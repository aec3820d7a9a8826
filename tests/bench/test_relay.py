"""The bare relay measures two broker hops and a serial stage, through the embedded broker."""

from __future__ import annotations

import pytest

from bench.relay import sweep


@pytest.mark.timeout(120)
async def test_a_serial_stage_adds_at_least_its_length_to_every_record_and_none_is_lost(broker):
    bare, staged = await sweep(broker.bootstrap_servers, {}, 4, rate=100, seconds=1.0, stages_ms=(0, 25),
                               fetch_wait_ms=50)
    assert bare["events"] == staged["events"] == 100
    assert bare["count"] == staged["count"] == 100 and bare["lost"] == staged["lost"] == 0
    assert bare["stage_ms"] == 0 and staged["stage_ms"] == 25
    # Every record sat in the stage: no percentile of the staged run can be below it.
    assert 25 <= staged["p50_ms"] <= staged["p99_ms"] <= staged["max_ms"]
    assert 0 < bare["p50_ms"] < staged["p50_ms"]
