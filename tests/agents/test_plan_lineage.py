"""Parked plans follow each plan's lineage: across take-overs, restarts and peers, no plan is left unannounced."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

from state.local_state import LocalState
from tests.agents.test_ownership import Node, _event, nodes  # noqa: F401 - the two-node fixture
from tests.conftest import ATLAS_REQUEST
from tests.events import regrant as regrant_of, resource, revoke_role

pytestmark = pytest.mark.timeout(240)


@contextlib.contextmanager
def _restarted(node: Node, path) -> Iterator[Node]:
    """The worker's file opened by a new process; the old handle is closed first and reopened after."""
    node.state.close()
    again = Node(path)
    try:
        yield again
    finally:
        again.state.close()
        node.state = LocalState.open(path)  # for the fixture's close



def test_a_restart_judges_the_plans_peers_compiled_for_the_partitions_it_kept(nodes, tmp_path):  # noqa: F811
    """The feed parks a peer's plans before the first assignment; keeping a partition must not skip them."""
    a, b = nodes
    a.own(0, 1)
    b.own(0, 1)
    plan = b.query.select(ATLAS_REQUEST)  # a new plan key, compiled while a was down
    with _restarted(a, tmp_path / "a.duckdb") as again:
        again.offsets = dict(b.offsets)
        again.feed(b.published("plan-dependencies"))  # read before the group assigned anything
        b.own()
        again.own(0, 1)  # what the file held already: nothing is gained
        revoke = _event(revoke_role("maya", "credit_analyst"))
        again.apply(revoke)
        assert plan["plan_id"] in {r["plan_id"] for r in again.published("plan-invalidations")}


def test_a_kept_head_that_a_peer_replaced_while_the_worker_was_down_gives_way_to_its_successor(nodes, tmp_path):  # noqa: F811
    a, b = nodes
    a.own(0, 1)
    first = a.query.select(ATLAS_REQUEST)
    b.feed(a.published("plan-dependencies"))
    a.feed(a.published("plan-dependencies"))  # every feed parks its own records too
    b.own(0, 1)
    revoke = _event(revoke_role("maya", "credit_analyst"))
    b.apply(revoke)
    later = b.query.select(ATLAS_REQUEST)  # b announced a's plan and compiled its successor
    assert later["plan_id"] != first["plan_id"]
    with _restarted(a, tmp_path / "a.duckdb") as again:
        again.offsets = dict(b.offsets)
        again.feed(b.published("plan-dependencies"))
        b.own()
        again.own(0, 1)
        head = again.state.plans.head_ids([first["plan_key"]])
        assert head == {first["plan_key"]: later["plan_id"]}  # not the announced plan its file still held


def _back_to_a_then_revoked_again(a: Node, b: Node) -> set[str]:
    """a reads b's records and takes the partition back; maya is revoked again: the plan ids a announces."""
    a.feed(b.published("plan-dependencies"))
    b.own()
    a.own(0, 1)
    before = len(a.published("plan-invalidations"))
    second = _event(revoke_role("maya", "credit_analyst", delegation_version=5))
    for node in (a, b):
        node.apply(second)
    return {r["plan_id"] for r in a.published("plan-invalidations")[before:]}


def test_a_plan_compiled_again_after_it_was_invalidated_here_is_current_again_on_a_take_over(nodes):  # noqa: F811
    """A -> B -> A across hand-overs: the first owner's invalidation of A must not hide A compiled again."""
    a, b = nodes
    a.own(0, 1)
    b.own()
    first = a.query.select(ATLAS_REQUEST)
    revoke = _event(revoke_role("maya", "credit_analyst"))
    for node in (a, b):
        node.apply(revoke)
    a.query.select(ATLAS_REQUEST)  # a announced the plan and compiled its successor
    for node in (a, b):  # every feed parks every record, its own worker's included
        node.feed(a.published("plan-dependencies"))
    a.own()
    b.own(0, 1)
    regrant = _event(regrant_of("maya", 5))
    for node in (a, b):
        node.apply(regrant)
    again = b.query.select(ATLAS_REQUEST)
    assert again["plan_id"] == first["plan_id"]  # the same plan as before the revocation
    assert first["plan_id"] in _back_to_a_then_revoked_again(a, b)  # a's file holds that id as invalidated


def test_a_record_that_does_not_descend_from_the_owners_plan_never_displaces_it_unannounced(nodes):  # noqa: F811
    a, b = nodes
    a.own(0, 1)
    b.own(0, 1)  # b still thinks it owns the entity (frozen, or a select before its revocation took effect)
    revoke = _event(revoke_role("maya", "credit_analyst"))
    b.apply(revoke)  # b's replica is ahead of a's
    mine = a.query.select(ATLAS_REQUEST)
    theirs = b.query.select(ATLAS_REQUEST)
    assert theirs["plan_id"] != mine["plan_id"]
    a.feed(a.published("plan-dependencies") + b.published("plan-dependencies"))
    a.apply(revoke)  # announced when b's plan took its place, or now that it is stale
    assert mine["plan_id"] in {r["plan_id"] for r in a.published("plan-invalidations")}


def test_a_frozen_workers_late_record_does_not_hide_the_live_plan_from_a_take_over(nodes):  # noqa: F811
    from agents.plans.backlog import recompile_queued

    a, b = nodes
    a.own(0, 1)
    b.own(0, 1)  # b: frozen, behind, still thinking it owns the entity
    b.query.select(ATLAS_REQUEST)  # compiled from the state before the revocation
    b.own()
    revoke, waiver = _event(revoke_role("maya", "credit_analyst")), _event(resource("approved-waiver-W2"))
    a.apply(revoke)
    a.query.select(ATLAS_REQUEST)
    a.apply(waiver)
    live = a.published("plan-dependencies")[-1]
    topic = a.published("plan-dependencies") + b.published("plan-dependencies")  # b's record lands last
    for event in (revoke, waiver, _event(regrant_of("maya", 5))):  # a is killed first
        b.apply(event)
    b.feed(topic)
    b.own(0, 1)
    recompile_queued(b.plans, 100)
    assert live["plan_id"] in {r["plan_id"] for r in b.published("plan-invalidations")}


def _peer_recompiles_while_a_is_down(a: Node, b: Node, changes: int) -> None:
    """a compiles the plan and both park its record; then b owns the partition and the plan changes `changes` times."""
    a.own(0, 1)
    a.query.select(ATLAS_REQUEST)
    for node in (a, b):
        node.feed(a.published("plan-dependencies"))
    b.own(0, 1)
    for version in range(1, changes + 1):
        b.apply(_event(resource("approved-waiver-W2", version=version)))


def test_a_restart_announces_its_kept_head_when_a_peer_compiled_the_key_many_times_meanwhile(nodes, tmp_path):  # noqa: F811
    a, b = nodes
    _peer_recompiles_while_a_is_down(a, b, 39)  # a hot key, changed every second
    with _restarted(a, tmp_path / "a.duckdb") as again:
        again.offsets = dict(b.offsets)
        again.feed(b.published("plan-dependencies"))
        b.own()
        again.own(0, 1)
        latest = b.published("plan-dependencies")[-1]["plan_id"]
        before = len(again.published("plan-invalidations"))
        again.apply(_event(revoke_role("maya", "credit_analyst")))
        assert latest in {r["plan_id"] for r in again.published("plan-invalidations")[before:]}


def test_a_plan_compiled_again_after_an_announcement_without_successor_is_current_again(nodes):  # noqa: F811
    """A -> B -> A when A was announced stale on a take-over (no successor yet): judged by the event's position."""
    from agents.plans.backlog import recompile_queued

    a, b = nodes
    b.own(0, 1)
    a.own()
    first = b.query.select(ATLAS_REQUEST)
    for node in (a, b):
        node.feed(b.published("plan-dependencies"))
    revoke = _event(revoke_role("maya", "credit_analyst"))
    a.apply(revoke)  # b is killed before it applies the revocation
    b.own()
    a.own(0, 1)  # a announces b's plan stale, its successor queued
    a.own()  # and hands it back before compiling it
    b.apply(revoke)
    b.own(0, 1)
    recompile_queued(b.plans, 100)
    regrant = _event(regrant_of("maya", 5))
    for node in (a, b):
        node.apply(regrant)
    assert b.query.select(ATLAS_REQUEST)["plan_id"] == first["plan_id"]
    assert first["plan_id"] in _back_to_a_then_revoked_again(a, b)


def test_an_owners_feed_behind_its_own_a_b_a_never_drops_the_live_head_unannounced(nodes):  # noqa: F811
    """H -> B -> H at the owner, its feed behind it, and a frozen peer's record for the key read in between."""
    a, b = nodes
    a.own(0, 1)
    b.own(0, 1)  # b: frozen, still thinking it owns the entity
    first = a.query.select(ATLAS_REQUEST)
    revoke, regrant = _event(revoke_role("maya", "credit_analyst")), _event(regrant_of("maya", 5))
    waiver = _event(resource("approved-waiver-W2"))
    a.apply(revoke)
    a.apply(regrant)
    own = a.published("plan-dependencies")
    assert own[-1]["plan_id"] == first["plan_id"] and len(own) == 3  # H, B, H again
    live_again = len(a.published("plan-invalidations"))  # H's first life was announced at the revocation
    for event in (revoke, regrant, waiver):
        b.apply(event)
    peer = b.query.select(ATLAS_REQUEST)  # b is ahead by the waiver
    assert peer["plan_id"] != first["plan_id"]
    a.feed(own[:2])
    a.feed([r for r in b.published("plan-dependencies") if r["plan_id"] == peer["plan_id"]])
    a.feed(own[2:])  # a's feed reads its last record late
    a.apply(waiver)  # H, live again, is stale now
    assert first["plan_id"] in {r["plan_id"] for r in a.published("plan-invalidations")[live_again:]}


def test_a_restart_whose_feed_reads_a_peers_compacted_records_after_its_first_assignment_loses_nothing(
        nodes, tmp_path):  # noqa: F811
    a, b = nodes
    _peer_recompiles_while_a_is_down(a, b, 11)
    with _restarted(a, tmp_path / "a.duckdb") as again:
        again.offsets = dict(b.offsets)
        b.own()
        again.own(0, 1)  # assigned before its feed caught up
        latest = b.published("plan-dependencies")[-1]
        again.feed([latest])  # the topic compacted the rest away
        before = len(again.published("plan-invalidations"))
        again.apply(_event(revoke_role("maya", "credit_analyst")))
        assert latest["plan_id"] in {r["plan_id"] for r in again.published("plan-invalidations")[before:]}


def test_a_plan_compiled_by_a_worker_behind_elsewhere_is_still_the_one_a_take_over_judges(nodes):  # noqa: F811
    """Records are ordered by lineage, not by summed offsets: a later plan can sum less than the one it replaced."""
    from agents.plans.backlog import recompile_queued

    a, b = nodes
    b.apply(*[_event(resource(f"other-{i}", entity="BOREAL-UK-02")) for i in range(5)], partition=1)
    b.own(0, 1)
    a.own()
    first = b.query.select(ATLAS_REQUEST)  # compiled by b, ahead of a on source-changes partition 1
    for node in (a, b):
        node.feed(b.published("plan-dependencies"))
    b.own()
    a.own(0, 1)  # a takes the plan over unchanged
    revoke = _event(revoke_role("maya", "credit_analyst"))
    a.apply(revoke)
    later = a.query.select(ATLAS_REQUEST)  # a announced b's plan and compiled its successor
    assert later["plan_id"] != first["plan_id"]
    b.apply(revoke)
    b.feed(a.published("plan-dependencies"))
    # a is killed; an event changes the plan before anyone announced it, and b takes the partition back
    b.apply(_event(resource("approved-waiver-W2")))
    b.own(0, 1)
    recompile_queued(b.plans, 100)
    announced = {r["plan_id"] for r in b.published("plan-invalidations")}
    assert later["plan_id"] in announced  # judged as the key's current plan: stale, announced


def _announced(node: Node, since: int = 0) -> set[str]:
    return {r["plan_id"] for r in node.published("plan-invalidations")[since:]}


def _unrelated(n: int) -> list[dict]:
    return [_event(resource(f"unrelated-{i}", entity=f"NOPE-ENTITY-{i}")) for i in range(n)]


def test_a_peers_stale_record_read_further_never_pushes_the_owners_live_head_out(nodes):  # noqa: F811
    a, b = nodes
    a.own(0, 1)
    b.own(0, 1)  # b: frozen, still thinking it owns the entity
    waiver = _event(resource("approved-waiver-W2"))
    a.apply(waiver)
    live = a.query.select(ATLAS_REQUEST)
    for event in _unrelated(5):
        b.apply(event, partition=1)
    assert b.query.select(ATLAS_REQUEST)["plan_id"] != live["plan_id"]  # without the waiver, more offsets read
    before = len(a.published("plan-invalidations"))
    a.feed(a.published("plan-dependencies") + b.published("plan-dependencies"))
    assert a.state.plans.head_ids([live["plan_key"]]) == {live["plan_key"]: live["plan_id"]}
    assert live["plan_id"] not in _announced(a, before)  # the stale record was announced, not the live head


def test_a_plan_announced_without_a_position_and_served_again_by_a_peer_is_followed_on_take_back(nodes):  # noqa: F811
    """Announced for another broker incarnation (no position, no successor), compiled unchanged by a peer after."""
    a, b = nodes
    b.own(0, 1)
    a.own()
    plan = b.query.select(ATLAS_REQUEST)
    [record] = b.published("plan-dependencies")
    a.feed([dict(record, compiled_in="cluster-0")])  # a copy from before the broker was replaced
    b.own()
    a.own(0, 1)  # announced stale on arrival, its key queued
    a.own()  # handed back before its backlog ran
    b.own(0, 1)
    maya = {"topic": "source-changes", "event": {
        "event_id": "maya-again", "schema_version": 1, "occurred_at": "2026-08-29T10:00:00Z", "kind": "principal",
        "op": "upsert", "principal": {"id": "maya", "roles": ["credit_analyst"],
                                      "attributes": {"unit": "corporate-credit"}, "delegation_version": 4}}}
    for node in (a, b):
        node.apply(maya)  # b recompiles the plan unchanged: a record of this incarnation
    a.feed(b.published("plan-dependencies"))
    before = len(a.published("plan-invalidations"))
    b.own()
    a.own(0, 1)  # b served the plan again: a announces it again (or when it goes stale) and compiles its key
    for node in (a, b):
        node.apply(_event(revoke_role("maya", "credit_analyst")))
    assert plan["plan_id"] in _announced(a, before)
    assert a.state.plans.head_ids([plan["plan_key"]]) and a.state.queue.size() + a.state.index.size() > 0


@pytest.mark.timeout(120)
async def test_each_plan_dependencies_record_on_the_topic_names_the_plan_it_replaced(worker):
    """Through the broker: the first compilation replaces nothing, its successor names it; both fit the schema."""
    from tests.schema_check import validators

    check = validators(documented=True, topics=("plan-dependencies",))["plan-dependencies"]
    first = await worker.select(ATLAS_REQUEST, await worker.load("atlas.jsonl"))
    revoked = await worker.publish_events(revoke_role("maya", "credit_analyst"))
    later = await worker.select(ATLAS_REQUEST, revoked)
    assert later["plan_id"] != first["plan_id"]
    records = await worker.records("plan-dependencies",
                                   lambda rs: any(r.get("plan_id") == later["plan_id"] for r in rs))
    mine = {r["plan_id"]: r for r in records if r.get("plan_key") == first["plan_key"]}
    assert mine[first["plan_id"]]["replaces"] is None
    assert mine[later["plan_id"]]["replaces"] == first["plan_id"]
    errors = [e.message for r in mine.values() for e in check.iter_errors({k: v for k, v in r.items() if k != "_key"})]
    assert not errors, errors[:3]
