"""Plans owned by partition: only the owner recompiles, a take-over judges without recompiling, nothing is lost."""

from __future__ import annotations

import signal

import orjson
import pytest

from agents.plans.backlog import recompile_queued
from agents.stream.event_apply import EventApplier, RawMessage
from agents.plans.ownership import Ownership, WholeCatalog
from agents.plans.plan_writer import PlanWriter
from agents.web.peers import NotOwner, Peers
from agents.web.query import QueryService
from schemas.plan_partition import plan_partition
from state.local_state import LocalState
from state.parked_plans import ParkedPlans
from tests.catalog_double import SCENARIOS
from tests.conftest import eventually as _until, ATLAS_REQUEST, start_peer
from tests.events import resource, revoke_role

pytestmark = pytest.mark.timeout(240)

ATLAS = [orjson.loads(line) for line in (SCENARIOS / "atlas.jsonl").read_text().splitlines()]


class Node:
    """One worker's state and write path, in process: every node applies the same events at the same offsets."""

    def __init__(self, path) -> None:
        self.state = LocalState.open(path)
        with self.state.store.transaction():
            self.state.store.record_cluster("cluster-1")  # both replicas read one broker incarnation
        self.plans = PlanWriter(self.state, lambda name: f"x-{name}")
        self.applier = EventApplier(self.state, self.plans)
        self.parked = ParkedPlans(self.state.store, 2)
        self.ownership = Ownership(self.state, self.plans, self.state.key_changes, self.parked, 2,
                                   "x-plan-dependencies", WholeCatalog())
        self.query = QueryService(self.state, self.plans,
                                  peers=Peers(foreign_partition=self.ownership.foreign_partition))
        self.offsets: dict[tuple[str, int], int] = {}

    def apply(self, *items: dict, partition: int = 0) -> None:
        messages = []
        for item in items:
            offset = self.offsets.get((item["topic"], partition), 0)
            self.offsets[(item["topic"], partition)] = offset + 1
            messages.append(RawMessage(item["topic"], partition, offset, b"k", orjson.dumps(item["event"])))
        self.applier.apply(messages)
        # The worker's backlog loop between batches: the successors of what the batch announced.
        while recompile_queued(self.plans, 16):
            pass

    def feed(self, records: list[dict]) -> None:
        """What the plan feed does with valid records: park them, judge the unknown, the parked ones current."""
        with self.state.store.transaction():
            current = self.parked.park(records)
            known = self.state.plans.known([r["plan_id"] for r in records])
            self.ownership.adopt([r for r in records if r["plan_id"] not in known],
                                 parked={r["plan_id"] for r in current.values()})

    def own(self, *partitions: int) -> None:
        with self.state.store.transaction():
            self.ownership.change(partitions)

    def published(self, topic: str) -> list[dict]:
        return [orjson.loads(v) for _, t, _, v in self.state.outbox.pending(100_000) if t == f"x-{topic}" and v]

    def counter(self, name: str) -> int:
        return self.state.store.counters().get(name, 0)


@pytest.fixture
def nodes(tmp_path):
    a, b = Node(tmp_path / "a.duckdb"), Node(tmp_path / "b.duckdb")
    for node in (a, b):
        node.apply(*ATLAS)
    yield a, b
    a.state.close()
    b.state.close()


def _event(topic_and_event: tuple[str, dict]) -> dict:
    return {"topic": topic_and_event[0], "event": topic_and_event[1]}


def test_the_owner_publishes_what_a_take_over_needs_and_a_non_owner_refers_selects(nodes):
    a, b = nodes
    a.own(0, 1)
    b.own()
    plan = a.query.select(ATLAS_REQUEST)
    [record] = a.published("plan-dependencies")
    assert record["plan_id"] == plan["plan_id"] and "principal:maya" in record["dependencies"]
    assert not any("dependencies" in p for p in a.published("plans"))  # the keys name withheld resources
    with pytest.raises(NotOwner) as refused:
        b.query.select(ATLAS_REQUEST)
    assert refused.value.partition == plan_partition(plan["entity_id"], 2)


def test_a_take_over_adopts_unchanged_plans_without_compiling(nodes):
    a, b = nodes
    a.own(0, 1)
    plan = a.query.select(ATLAS_REQUEST)
    b.parked.park(a.published("plan-dependencies"))
    compiled_before = b.counter("compilations")
    b.own(0, 1)
    assert b.counter("compilations") == compiled_before  # nothing recompiled
    assert b.counter("plans_taken_over") == 1 and b.state.queue.size() == 0
    served = b.query.select(ATLAS_REQUEST)
    assert served["plan_id"] == plan["plan_id"] and served["served_from"] == "cache"
    assert not b.published("plan-invalidations")


def test_an_unchanged_recompilation_moves_the_record_past_its_cause(nodes):
    """A change that leaves the plan as it was must not make a later owner announce it."""
    a, b = nodes
    a.own(0, 1)
    a.query.select(ATLAS_REQUEST)
    maya = {"topic": "source-changes", "event": {
        "event_id": "maya-again", "schema_version": 1, "occurred_at": "2026-08-29T10:00:00Z", "kind": "principal",
        "op": "upsert", "principal": {"id": "maya", "roles": ["credit_analyst"],
                                      "attributes": {"unit": "corporate-credit"}, "delegation_version": 4}}}
    a.apply(maya)  # announced first; the successor came out the same plan
    assert a.counter("announced_unchanged") == 1 and len(a.published("plan-invalidations")) == 1
    b.apply(maya)
    b.parked.park(a.published("plan-dependencies"))
    b.own(0, 1)
    assert not b.published("plan-invalidations") and b.counter("plans_taken_over") == 1


def test_a_take_over_announces_a_plan_an_applied_event_made_stale(nodes):
    """The owner died before announcing: the new owner's replica applied the event; the key's position says so."""
    a, b = nodes
    a.own(0, 1)
    plan = a.query.select(ATLAS_REQUEST)
    b.parked.park(a.published("plan-dependencies"))
    revocation = revoke_role("maya", "credit_analyst")
    b.apply(_event(revocation))  # applied by b while a still owned the plan
    b.own(0, 1)
    [announced] = b.published("plan-invalidations")
    assert announced["cause"]["event_id"] == revocation[1]["event_id"]  # subscribers correlate by it
    assert announced["plan_id"] == plan["plan_id"] and announced["cause"]["topic"] == "x-revocations"
    assert announced["cause"]["offset"] == 0 and announced["reason"] == "principal_changed"
    assert b.state.queue.size() == 1  # its successor is compiled by the backlog
    assert b.query.select(ATLAS_REQUEST)["admitted"] == []


def test_a_hand_back_stops_indexing_and_serving(nodes):
    a, _ = nodes
    a.own(0, 1)
    plan = a.query.select(ATLAS_REQUEST)
    mine = plan_partition(plan["entity_id"], 2)
    a.own(1 - mine)
    assert a.state.index.size() == 0 and a.counter("plans_handed_back") == 1
    before = len(a.published("plan-invalidations"))
    a.apply(_event(resource("approved-waiver-W2")))
    assert len(a.published("plan-invalidations")) == before  # no longer this worker's to announce
    with pytest.raises(NotOwner):
        a.query.select(ATLAS_REQUEST)


def test_a_restart_hands_back_what_the_file_held_and_no_longer_owns(nodes, tmp_path):
    a, _ = nodes
    a.own(0, 1)
    plan = a.query.select(ATLAS_REQUEST)
    mine = plan_partition(plan["entity_id"], 2)
    a.state.close()
    again = Node(tmp_path / "a.duckdb")  # the same file, a new process
    try:
        assert again.state.index.size() > 0
        again.own(1 - mine)  # the group gives it only the other partition now
        assert again.state.index.size() == 0 and again.counter("plans_handed_back") == 1
    finally:
        again.state.close()
        a.state = LocalState.open(tmp_path / "a.duckdb")  # for the fixture's close



def test_a_restart_takes_over_what_peers_compiled_meanwhile_for_its_kept_partitions(nodes, tmp_path):
    """Many keys at once, judged and restored where they lie: stale, unrestorable and evicted records included."""
    a, _ = nodes
    a.own(0, 1)
    a.query.select(ATLAS_REQUEST)
    [record] = a.published("plan-dependencies")
    old = [dict(record, plan_id=f"old-{i}", plan_key=f"pk-{i}") for i in range(30)]
    a.feed(old)  # a owned these keys before it stopped
    assert set(a.state.plans.head_ids([r["plan_key"] for r in old]).values()) == {r["plan_id"] for r in old}
    a.state.close()
    again = Node(tmp_path / "a.duckdb")
    try:
        [(topic, by_partition)] = list(record["compiled_as_of"].items())[:1]
        (partition, offset), = list(by_partition.items())[:1]
        changed = dict(record, plan_id="new-stale", plan_key="pk-0", replaces="old-0",
                       dependencies=[*record["dependencies"], "resource:changed-since"])
        compact = dict(record, plan_id="new-compact", plan_key="pk-1", replaces="old-1",
                       admitted=[dict(i, content_omitted=True) for i in record["admitted"]])
        peers = [changed, compact] + [dict(r, plan_id=f"new-{i}", replaces=r["plan_id"]) for i, r in enumerate(old)][2:]
        peers.append(dict(record, plan_id="new-evicted", plan_key="pk-evicted"))
        again.state.store.db.execute("INSERT INTO evicted_plans VALUES ('new-evicted', 'pk-evicted', NULL, '{}')")
        again.state.key_changes.record({(topic, int(partition), int(offset)): ["resource:changed-since"]})
        with again.state.store.transaction():
            again.parked.park(peers)  # the feed read them before the group assigned anything
        taken_before = again.counter("plans_taken_over")
        again.own(0, 1)  # kept: nothing is gained
        heads = again.state.plans.head_ids([f"pk-{i}" for i in range(30)] + ["pk-evicted"])
        assert heads == {"pk-0": "new-stale", "pk-1": "old-1", **{f"pk-{i}": f"new-{i}" for i in range(2, 30)}}
        announced = {r["plan_id"] for r in again.published("plan-invalidations")}
        # Every head it kept (a peer may not have announced it), the stale record and the one nobody here follows.
        assert announced == {r["plan_id"] for r in old} | {"new-stale", "new-compact"}
        assert again.state.queue.size() == 1 and again.counter("plans_taken_over") - taken_before == 28
        assert again.query.select(ATLAS_REQUEST)["plan_id"] == record["plan_id"]  # its own key still serves
    finally:
        again.state.close()
        a.state = LocalState.open(tmp_path / "a.duckdb")  # for the fixture's close

async def _owned(w) -> list[int] | None:
    return (await w.get("/healthz"))["owned_partitions"]


async def test_two_workers_split_the_plans_and_a_kill_9_loses_no_invalidation(worker, tmp_path):
    fresh = await worker.load("atlas.jsonl")
    first = await worker.select(ATLAS_REQUEST, fresh)
    peer = await start_peer(worker, tmp_path / "peer")
    try:
        async def split():
            a, b = await _owned(worker), await _owned(peer)
            return a and b and sorted(a + b) == list(range(worker.settings.partitions))
        await _until(split, what="both workers owning plan partitions")
        mine = plan_partition(first["entity_id"], worker.settings.partitions)
        owner, other = (worker, peer) if mine in await _owned(worker) else (peer, worker)

        # The non-owner refers the select to the owner, which answers from the plan it took over or compiled.
        via_other = await other.select(ATLAS_REQUEST, fresh)
        assert via_other["plan_id"] == first["plan_id"] and via_other["served_by"].endswith(owner.url[-5:])
        counts = {w.url: (await w.get("/healthz"))["counters"].get("compilations", 0) for w in (owner, other)}

        waiver = await other.publish_events(resource("approved-waiver-W2"))
        announced = await other.records("plan-invalidations", lambda rs: any(r["plan_id"] == first["plan_id"]
                                                                              for r in rs))
        # Announced before its successor was compiled: the owner compiles it (its backlog, or this select).
        assert next(r for r in announced if r["plan_id"] == first["plan_id"])["successor_plan_id"] is None
        successor = (await other.select(ATLAS_REQUEST, waiver))["plan_id"]
        assert successor != first["plan_id"]
        after = {w.url: (await w.get("/healthz"))["counters"].get("compilations", 0) for w in (owner, other)}
        assert after[owner.url] > counts[owner.url] and after[other.url] == counts[other.url]

        # The owner freezes (so it announces nothing), the revocation lands, then it is killed.
        owner.proc.send_signal(signal.SIGSTOP)
        revoked = await other.publish_events(revoke_role("maya", "credit_analyst"))
        owner.kill()
        await _until(lambda: _owns_all(other), what="the survivor owning every partition")
        announced = await other.records("plan-invalidations", lambda rs: any(r["plan_id"] == successor for r in rs))
        assert any(r["cause"]["topic"].endswith("revocations") for r in announced if r["plan_id"] == successor)
        plan = await other.select(ATLAS_REQUEST, revoked)
        assert plan["admitted"] == [] and plan["served_by"].endswith(other.url[-5:])
        counters = (await other.get("/healthz"))["counters"]
        assert counters.get("plans_taken_over", 0) + counters.get("plans_stale_on_take_over", 0) >= 1
    finally:
        for w in (worker, peer):
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
        peer.stop()


async def _owns_all(w) -> bool:
    return await _owned(w) == list(range(w.settings.partitions))


def test_an_older_record_read_late_does_not_replace_the_fresh_plan_of_its_key(nodes):
    """A restart re-reads the feed: the key's old plan comes back after its successor is current here."""
    a, _ = nodes
    a.own(0, 1)
    old = a.query.select(ATLAS_REQUEST)
    [record] = a.published("plan-dependencies")
    a.apply(_event(resource("approved-waiver-W2")))  # the plan changes: its successor is current
    new = a.query.select(ATLAS_REQUEST)
    assert new["plan_id"] != old["plan_id"]
    with a.state.store.transaction():
        a.state.store.db.execute("DELETE FROM plans WHERE plan_id = ?", [old["plan_id"]])  # as after a replay
        taken = a.ownership.adopt([record])
    assert taken.stale == [old["plan_id"]]  # still judged, and announced stale
    served = a.query.select(ATLAS_REQUEST)
    assert served["plan_id"] == new["plan_id"] and served["served_from"] == "cache"
    assert a.state.queue.size() == 0  # nothing to recompile


def test_a_take_over_that_fails_changes_nothing_and_the_next_round_takes_the_plans_over(nodes, monkeypatch):
    a, b = nodes
    a.own(0, 1)
    plan = a.query.select(ATLAS_REQUEST)
    b.parked.park(a.published("plan-dependencies"))
    b.apply(_event(revoke_role("maya", "credit_analyst")))  # the dead owner never announced it
    b.ownership.follow([])

    def broken(partitions):
        raise RuntimeError("IO Error: could not write the file")

    monkeypatch.setattr(b.ownership, "take_over", broken)
    with pytest.raises(RuntimeError):
        b.ownership.follow([0, 1])
    assert b.ownership.owned == frozenset()  # still differs from the assignment: the next round retries
    assert b.published("plan-invalidations") == []
    monkeypatch.undo()
    b.ownership.follow([0, 1])
    [announced] = b.published("plan-invalidations")
    assert announced["plan_id"] == plan["plan_id"] and b.ownership.owned == frozenset({0, 1})


def test_each_plan_announced_in_one_batch_carries_its_own_cause(nodes):
    a, _ = nodes
    with a.state.store.transaction():
        a.ownership._announce_orphans([("k1", "p1"), ("k2", "p2"), ("k3", "p3")], None)
    causes = {r["plan_id"]: r["cause"] for r in a.published("plan-invalidations")}
    assert {p: c["event_id"] for p, c in causes.items()} == {"p1": "plan:p1", "p2": "plan:p2", "p3": "plan:p3"}
    assert all(c["partition"] == c["offset"] == -1 for c in causes.values())  # the wire's unknown position
