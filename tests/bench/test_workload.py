"""The bench workload's quiet plans: entities no change stream edits, so their selects stay cache hits."""

from __future__ import annotations

import orjson

from bench.workload import generate, quiet


def _entities_edited(records) -> set[str]:
    edited = set()
    for topic, _, value in records:
        doc = orjson.loads(value)
        if topic == "source-changes" and doc.get("kind") == "resource":
            edited.add(doc["resource"]["entity"])
    return edited


def test_no_change_stream_edits_a_quiet_entity_and_each_principal_asks_each_one():
    catalog, requests = quiet(3)
    quiet_entities = {orjson.loads(v)["entity"]["id"] for t, _, v in catalog if b'"kind":"entity"' in v}
    assert quiet_entities == {"Q0", "Q1", "Q2"}
    assert len(catalog) == 3 * 5 and len(requests) == 30 == len({(r["principal"], r["entity"]) for r in requests})
    for seed in (7, 100, 1_100):  # the streams of the bench's runs and selects
        stream = generate(changes=5_000, seed=seed, prefix=f"t{seed}-").changes
        edited = _entities_edited(stream)
        assert edited and not edited & quiet_entities
    assert all(orjson.loads(v)["resource"]["entity"] in quiet_entities
               for t, _, v in catalog if b'"kind":"resource"' in v)
