"""The hot plan's edits: each a new version of the one Atlas resource, on one key (one partition)."""

from __future__ import annotations

import orjson

from bench.streaming import HOT_RESOURCE, hot_edits, log_during


def test_hot_edits_are_successive_versions_of_one_resource_on_one_key():
    edits = hot_edits(5, first_version=10)
    assert {topic for topic, _, _ in edits} == {"source-changes"} and {key for _, key, _ in edits} == {b"facility-F102"}
    bodies = [orjson.loads(v) for _, _, v in edits]
    assert [b["resource"]["version"] for b in bodies] == [10, 11, 12, 13, 14]
    assert len({b["event_id"] for b in bodies}) == 5 and len({b["resource"]["content"] for b in bodies}) == 5
    assert all(b["resource"]["id"] == HOT_RESOURCE and b["resource"]["entity"] == "ATLAS-IN-01" for b in bodies)


def test_a_log_that_shrank_without_an_idle_checkpoint_was_checkpointed_at_its_cap_inside_the_stream():
    before = {"wal_bytes": 60 * 2**20, "idle_checkpoints": 2}
    assert log_during(before, {"wal_bytes": 2**20, "idle_checkpoints": 2})["cap_checkpoint"]
    assert not log_during(before, {"wal_bytes": 2**20, "idle_checkpoints": 3})["cap_checkpoint"]  # an idle one
    assert not log_during(before, {"wal_bytes": 61 * 2**20, "idle_checkpoints": 2})["cap_checkpoint"]  # grew
    assert not log_during({}, {"wal_bytes": 2**20})["cap_checkpoint"]  # no figures before: no claim
