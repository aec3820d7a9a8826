"""A worker's state bytes: what counts as split by entity, and issue 28's bound for a worker of N."""

from __future__ import annotations

from bench.state_size import bound, entity_resource, replicated_only
from bench.workload import bulk, generate


def test_only_resources_of_entities_are_left_out_of_the_replicated_part():
    workload = generate(plans=4, changes=200, seed=5)
    kept = replicated_only(workload)
    every = workload.catalog + workload.changes
    assert len(kept) == len([r for r in every if not entity_resource(r)]) < len(every)
    topics = {t for t, _, _ in kept}
    assert {"policy-versions", "revocations", "clock", "source-changes"} <= topics  # principals and entities stay
    assert not any(entity_resource(r) for r in kept)
    assert all(entity_resource(r) for r in bulk(30, per_entity=10) if r[1].startswith(b"B0-"))


def test_a_worker_of_n_may_hold_the_replicated_part_and_a_share_of_the_rest():
    assert bound(100, 20, 1) == 100 and bound(100, 20, 2) == 60 and bound(100, 20, 4) == 40
    assert bound(100, 120, 2) == 120  # a replicated part measured above one worker's file: the part itself
    assert bound(None, 20, 2) is None and bound(100, None, 2) is None
